"""What the programs here share (tests/childproc.py runs them): the class
of the implementation named on the command line (helpers.py's, or vLLM's),
keys and a ready chunk, from helpers.py; --no-vllm hides vLLM first."""

from __future__ import annotations

import sys

if "--no-vllm" in sys.argv:
    # arc_cy with its stand-ins: torch and vLLM take seconds to import, and
    # the rule under test does not involve them
    sys.argv.remove("--no-vllm")
    sys.modules["vllm"] = None  # type: ignore[assignment]

from helpers import IMPLEMENTATIONS, MODULES, K, VllmARC, load_policy_class, ready

__all__ = ["IMPLEMENTATIONS", "MODULES", "K", "policy_class", "ready"]


def policy_class(impl: str) -> type:
    """The ARCCachePolicy of "cython", "python" or "vllm"."""
    if impl == "vllm":
        return VllmARC
    return load_policy_class(impl)
