"""The pure-Python twins: ``arc`` (vLLM's ``arc.py``, with ``mutating``)
and ``plus`` (ARC+), the compiled core's decisions for reading and
debugging (``ARC_CY_NO_EXTENSIONS=1`` selects them)."""
