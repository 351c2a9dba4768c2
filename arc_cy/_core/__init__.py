"""The compiled core: ``arc.pyx`` (ARC and ARC+ on C-level lists) and the
parts it is built from, each a ``.pxd`` with its struct and invariant
(``nodes``, ``table``, ``work``; ``capi`` and ``layout.h`` for the C API and
CPython's object layout), and the Python it calls (``arguments``,
``chunks``, ``views``). Importing this package imports no extension: the
selector, ``arc_cy/__init__.py``, imports ``arc_cy._core.arc``."""
