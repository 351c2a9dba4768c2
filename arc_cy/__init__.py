"""arc_cy: a compiled ARC eviction policy for vLLM's CPU KV-cache offloading.

``arc_cy.ARCCachePolicy`` is the compiled core (``arc_cy._arc_c``) unless
``ARC_CY_NO_EXTENSIONS`` is set to a non-empty value other than ``0``, which
selects the pure-Python twin (``arc_cy._arc_py``). Both make the decisions of
vLLM's ``ARCCachePolicy`` for the releases in ``SUPPORTED_VLLM``.
"""

from __future__ import annotations

import os
import platform
import warnings
from typing import TYPE_CHECKING

from ._common import HAVE_VLLM, CachePolicy, ChunkStatus
from ._compat import SUPPORTED_VLLM

__all__ = [
    "ARCCachePolicy",
    "CachePolicy",
    "ChunkStatus",
    "HAVE_VLLM",
    "IMPLEMENTATION",
    "SUPPORTED_VLLM",
]
__version__ = "0.2.0"

IMPLEMENTATION: str
"""Which implementation ``ARCCachePolicy`` is: "cython" or "python"."""

if TYPE_CHECKING:
    from ._arc_py import ARCCachePolicy
elif os.environ.get("ARC_CY_NO_EXTENSIONS", "") not in ("", "0"):
    from ._arc_py import ARCCachePolicy

    IMPLEMENTATION = "python"
else:
    try:
        from ._arc_c import ARCCachePolicy

        IMPLEMENTATION = "cython"
    except ImportError as exc:
        if platform.python_implementation() == "CPython":
            # Never silent: a CPython install is meant to have the core.
            warnings.warn(
                f"arc_cy: the compiled core is not available ({exc}); using "
                "the pure-Python twin, which is much slower. Reinstall with "
                "`pip install arc-cy` (a C compiler is needed to build from "
                "source), or set ARC_CY_NO_EXTENSIONS=1 to choose the twin "
                "and silence this warning.",
                RuntimeWarning,
                stacklevel=2,
            )
        from ._arc_py import ARCCachePolicy

        IMPLEMENTATION = "python"
