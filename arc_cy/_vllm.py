"""vLLM's base classes, or arc_cy's stand-ins when vLLM does not import.

arc_cy subclasses vLLM's ``CachePolicy`` and takes vLLM's ``ChunkStatus``
and ``order_request_keys`` from here; without vLLM (or with a broken one) it
takes those of ``_vllm_standins``, which have the same layout and calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

VLLM_IMPORT_ERROR: BaseException | None = None
"""Why vLLM, or its policy module, failed to import when vLLM is installed
(else None)."""

if TYPE_CHECKING:
    # Type checkers see the stand-ins, vLLM or not: same layout, same calls.
    from ._vllm_standins import CachePolicy as CachePolicy
    from ._vllm_standins import ChunkStatus as ChunkStatus
    from ._vllm_standins import order_request_keys as order_request_keys

    HAVE_VLLM: bool
    VLLM_IMPORTED: bool
else:
    # VLLM_IMPORTED: `import vllm` works, so this can be a vLLM process and
    # the guard judges its code. HAVE_VLLM: arc_cy also has vLLM's classes.
    try:
        import vllm  # noqa: F401 -- imported to learn whether it imports

        VLLM_IMPORTED = True
    except Exception as exc:  # any: a broken vLLM must not break arc_cy
        VLLM_IMPORTED = False
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == "vllm"):
            VLLM_IMPORT_ERROR = exc  # installed, but failed to import
    try:
        if not VLLM_IMPORTED:
            raise ImportError
        from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus

        HAVE_VLLM = True
    except Exception as exc:  # any, as above: the guard refuses such a vLLM
        HAVE_VLLM = False
        if VLLM_IMPORTED:
            VLLM_IMPORT_ERROR = exc
        # `X as X`: a re-export (arc_cy and the twins import it from here).
        from ._vllm_standins import CachePolicy as CachePolicy
        from ._vllm_standins import ChunkStatus as ChunkStatus
    try:
        if not HAVE_VLLM:
            raise ImportError
        from vllm.v1.kv_offload.cpu.policies.base import order_request_keys
    except ImportError:
        # vLLM 0.30 has no order_request_keys (0.31 added it, with
        # on_request_finished); arc_cy still subclasses its CachePolicy.
        from ._vllm_standins import order_request_keys as order_request_keys
