"""arc_cy: a compiled ARC eviction policy for vLLM's CPU KV-cache offloading.

``arc_cy.ARCCachePolicy`` is the compiled core (``arc_cy._arc_c``) unless
``ARC_CY_NO_EXTENSIONS`` is set to a non-empty value other than ``0``, which
selects the pure-Python twin (``arc_cy._arc_py``). Both make the decisions of
vLLM 0.33.0's ``ARCCachePolicy``.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

from ._common import HAVE_VLLM, CachePolicy, ChunkStatus

__all__ = ["ARCCachePolicy", "CachePolicy", "ChunkStatus", "HAVE_VLLM", "IMPLEMENTATION"]
__version__ = "0.1.0"

IMPLEMENTATION: str

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
        warnings.warn(
            f"arc_cy: the compiled core is not available ({exc}); using the "
            "pure-Python twin, which is much slower. Reinstall with "
            "`pip install arc-cy` (a C compiler is needed to build from "
            "source), or set ARC_CY_NO_EXTENSIONS=1 to choose the twin and "
            "silence this warning.",
            RuntimeWarning,
            stacklevel=2,
        )
        from ._arc_py import ARCCachePolicy

        IMPLEMENTATION = "python"
