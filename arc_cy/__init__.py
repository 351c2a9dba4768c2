"""arc_cy: a compiled ARC eviction policy for vLLM's CPU KV-cache offloading.

``arc_cy.ARCCachePolicy`` is the compiled core (``arc_cy._core.arc``) unless
``ARC_CY_NO_EXTENSIONS`` is true (``1``, ``true``, ``yes``, ``on``;
``arc_cy._flags.env_flag``), which selects the pure-Python twin
(``arc_cy._twin.arc``). Both make the decisions of vLLM's ``ARCCachePolicy``
on the vLLM code arc_cy verified (``arc_cy._guard``).
``arc_cy.ARCPlusCachePolicy`` (ARC+, which hits more: its docstring) is
chosen the same way, between the core's and its twin ``arc_cy._twin.plus``.

The implementation (and vLLM's base classes) load on first use of one of
the names below, so ``import arc_cy`` alone, and ``python -m arc_cy
--help``, import no vLLM.
"""

from __future__ import annotations

import os
import platform
import warnings
from typing import TYPE_CHECKING, Any

from ._flags import env_flag
from ._guard.verified import SUPPORTED_VLLM

__all__ = [
    "ARCCachePolicy",
    "ARCPlusCachePolicy",
    "CachePolicy",
    "ChunkStatus",
    "HAVE_VLLM",
    "IMPLEMENTATION",
    "SUPPORTED_VLLM",
]
__version__ = "0.2.0"

IMPLEMENTATION: str
"""Which implementation ``ARCCachePolicy`` is: "cython" or "python"."""


def _source_tree() -> str | None:
    """The directory of this package if it is a source tree (a checkout or
    an unpacked sdist: setup.py and pyproject.toml beside it), else None."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    for name in ("setup.py", "pyproject.toml"):
        if not os.path.isfile(os.path.join(root, name)):
            return None
    return here


def _missing_core_message(error: ImportError) -> str:
    tree = _source_tree()
    shadow = (
        f"This arc_cy is the source tree {tree}, which shadows any installed "
        "arc_cy: run from another directory (or with `python -P`) to use the "
        "installed one. "
        if tree
        else ""
    )
    return (
        f"arc_cy: the compiled core is not available ({error}); using the "
        f"pure-Python twin, which is much slower. {shadow}To get the core, "
        "install from a checkout or an unpacked sdist with `pip install .` "
        "(a C compiler and the Python headers are needed), or install a wheel "
        "built on a machine that has them (`.ci/wheel.sh` or `pip wheel .`, then "
        "`pip install arc_cy-*.whl`); or set ARC_CY_NO_EXTENSIONS=1 to choose "
        "the twin and silence this warning."
    )


if TYPE_CHECKING:
    from ._twin.arc import ARCCachePolicy
    from ._twin.plus import ARCPlusCachePolicy
    from ._vllm import HAVE_VLLM, CachePolicy, ChunkStatus
else:

    def __getattr__(name: str) -> Any:
        if name not in __all__:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from . import _vllm

        names = globals()
        names.update(
            HAVE_VLLM=_vllm.HAVE_VLLM,
            CachePolicy=_vllm.CachePolicy,
            ChunkStatus=_vllm.ChunkStatus,
        )
        if env_flag("ARC_CY_NO_EXTENSIONS"):
            from ._twin.arc import ARCCachePolicy
            from ._twin.plus import ARCPlusCachePolicy

            implementation = "python"
        else:
            try:
                from ._core.arc import ARCCachePolicy, ARCPlusCachePolicy

                implementation = "cython"
            except ImportError as exc:
                if platform.python_implementation() == "CPython":
                    # Never silent: a CPython install is meant to have the core.
                    warnings.warn(_missing_core_message(exc), RuntimeWarning, stacklevel=2)
                from ._twin.arc import ARCCachePolicy
                from ._twin.plus import ARCPlusCachePolicy

                implementation = "python"
        names.update(
            ARCCachePolicy=ARCCachePolicy,
            ARCPlusCachePolicy=ARCPlusCachePolicy,
            IMPLEMENTATION=implementation,
        )
        return names[name]
