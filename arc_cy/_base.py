"""vLLM's base classes, or arc_cy's stand-ins when vLLM does not import.

arc_cy subclasses vLLM's ``CachePolicy`` and takes vLLM's ``ChunkStatus``
and ``order_request_keys`` from here; without vLLM (or with a broken one) it
takes those of ``_standins``, which have the same layout and calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

VLLM_IMPORT_ERROR: BaseException | None = None
"""Why vLLM failed to import when it is installed but broken (else None)."""

if TYPE_CHECKING:
    # Type checkers see the stand-ins, vLLM or not: same layout, same calls.
    from ._standins import CachePolicy, ChunkStatus, order_request_keys

    HAVE_VLLM: bool
else:
    try:
        from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus

        HAVE_VLLM = True
    except Exception as exc:  # any: a broken vLLM must not break arc_cy
        HAVE_VLLM = False
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == "vllm"):
            VLLM_IMPORT_ERROR = exc  # installed, but failed to import
        # `X as X`: a re-export (arc_cy and the twins import it from here).
        from ._standins import CachePolicy as CachePolicy
        from ._standins import ChunkStatus as ChunkStatus
    try:
        if not HAVE_VLLM:
            raise ImportError
        from vllm.v1.kv_offload.cpu.policies.base import order_request_keys
    except ImportError:
        # vLLM 0.30 has no order_request_keys (0.31 added it, with
        # on_request_finished); arc_cy still subclasses its CachePolicy.
        from ._standins import order_request_keys as order_request_keys
