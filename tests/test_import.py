"""What `import arc_cy` gives: the compiled core, or the pure twin with
ARC_CY_NO_EXTENSIONS set or (with a warning) when the core cannot be
imported; and, without vLLM, arc_cy's stand-in ChunkStatus with vLLM's
layout. Each import runs in a child process (tests/progs/)."""

from __future__ import annotations

import ctypes
import json

import pytest

from childproc import run_prog


@pytest.mark.parametrize(
    "value,expected",
    [("", "cython"), ("0", "cython"), ("1", "python"), ("yes", "python")],
)
def test_no_extensions_variable(value, expected):
    proc = run_prog("implementation.py", env={"ARC_CY_NO_EXTENSIONS": value})
    assert proc.returncode == 0, proc.stderr
    module = {"cython": "arc_cy._arc_c", "python": "arc_cy._arc_py"}[expected]
    assert proc.stdout.split() == [expected, module]


def test_missing_extension_warns_and_falls_back():
    proc = run_prog("missing_core.py", env={"ARC_CY_NO_EXTENSIONS": ""})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "python"
    assert "compiled core is not available" in lines[1]


def layout(cs) -> dict:
    c = cs(7)
    return {
        "fields": [[f[0], ctypes.sizeof(f[1]), getattr(cs, f[0]).offset] for f in cs._fields_],
        "size": ctypes.sizeof(cs),
        "align": ctypes.alignment(cs),
        "init": [c.ref_cnt, c.chunk_id, c.is_ready],
    }


def test_chunk_stand_in_matches_vllm_layout():
    """Without vLLM, _base takes the stand-in ChunkStatus: same fields,
    sizes, offsets and initial values as vLLM's."""
    pytest.importorskip("vllm")
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus as Vllm

    from arc_cy import _base

    assert _base.ChunkStatus is Vllm  # vLLM is installed here
    proc = run_prog("stand_in_layout.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == layout(Vllm)
