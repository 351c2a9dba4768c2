"""What the programs here share (tests/childproc.py runs them): the class
of the implementation named on the command line, imported directly so that
a missing compiled core fails loudly, or vLLM's; keys; a ready chunk."""

from __future__ import annotations

import importlib
import sys

if "--no-vllm" in sys.argv:
    # arc_cy with its stand-ins: torch and vLLM take seconds to import, and
    # the rule under test does not involve them
    sys.argv.remove("--no-vllm")
    sys.modules["vllm"] = None  # type: ignore[assignment]

MODULES = {"cython": "arc_cy._arc_c", "python": "arc_cy._arc_py", "vllm": None}


def policy_class(impl: str) -> type:
    if impl == "vllm":
        from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy

        return ARCCachePolicy
    return importlib.import_module(MODULES[impl]).ARCCachePolicy


def ready(i: int):
    from arc_cy import ChunkStatus

    chunk = ChunkStatus(i)
    chunk.ref_cnt = 0
    return chunk


def K(i: int) -> bytes:
    return b"key-%d" % i
