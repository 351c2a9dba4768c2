"""What `import arc_cy` gives: the compiled core, or the pure twin with
ARC_CY_NO_EXTENSIONS set or (with a warning) when the core cannot be
imported; and, without vLLM, arc_cy's stand-in ChunkStatus with vLLM's
layout. Each import runs in a child process (tests/progs/)."""

from __future__ import annotations

import ast
import ctypes
import json
import re
from pathlib import Path

import pytest

from childproc import run_prog
from helpers import REPO

pytestmark = [pytest.mark.sdist, pytest.mark.install]


@pytest.mark.parametrize(
    "value,expected",
    [
        pytest.param("", "cython", marks=pytest.mark.compiled),
        pytest.param("0", "cython", marks=pytest.mark.compiled),
        ("1", "python"),
        ("yes", "python"),
    ],
)
def test_no_extensions_variable(value, expected):
    proc = run_prog("implementation.py", env={"ARC_CY_NO_EXTENSIONS": value})
    assert proc.returncode == 0, proc.stderr
    module = {"cython": "arc_cy._core.arc", "python": "arc_cy._twin.arc"}[expected]
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


@pytest.mark.needs_vllm
def test_chunk_stand_in_matches_vllm_layout():
    """Without vLLM, _vllm takes the stand-in ChunkStatus: same fields,
    sizes, offsets and initial values as vLLM's."""
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus as Vllm

    from arc_cy import _vllm

    assert _vllm.ChunkStatus is Vllm  # vLLM is installed here
    proc = run_prog("stand_in_layout.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == layout(Vllm)


def _imports(path: Path) -> set[str]:
    """The arc_cy modules a source file imports, anywhere in it (a
    function-level import is still an edge: it runs on the way)."""
    text = path.read_text()
    if path.suffix == ".pyx":  # Cython: its Python-level imports are Python syntax
        text = "\n".join(
            m.group(0)
            for m in re.finditer(
                r"^[ \t]*(?:from\s+[\w.]+\s+import\s+(?:\([^)]*\)|.*)|import\s+.*)$", text, re.M
            )
            if "cimport" not in m.group(0)
        )
        text = "\n".join(line.strip() for line in text.splitlines())
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            base = "arc_cy" if node.level else (node.module or "")
            if node.level and node.module:
                base = f"arc_cy.{node.module}"
            if base == "arc_cy":
                found |= {f"arc_cy.{a.name}" for a in node.names}
            elif base.startswith("arc_cy."):
                found.add(base)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "arc_cy":
                    found.add("arc_cy.__init__")
                elif alias.name.startswith("arc_cy."):
                    found.add(alias.name)
    return found


def test_the_package_has_no_import_circle() -> None:
    # The guard in its own room (arc_cy/_guard/): its analysis and its table
    # import nothing of arc_cy, and the check imports an implementation only
    # when it runs (its lockstep, in a function).
    package = REPO / "arc_cy"
    files = [p for p in package.rglob("*") if p.suffix in (".py", ".pyx")]
    modules = {
        "arc_cy."
        + ".".join(p.relative_to(package).with_suffix("").parts).removesuffix(".__init__"): p
        for p in files
    }
    edges = {m: _imports(p) & modules.keys() for m, p in modules.items()}

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in edges.get(node, ()):
                if nxt == start:
                    return [*path, nxt]
                if nxt not in path:
                    stack.append((nxt, [*path, nxt]))
        return None

    for room in ("files", "fingerprint", "lockstep", "verified"):  # the standard library only
        assert edges[f"arc_cy._guard.{room}"] <= {"arc_cy._guard.files"}
    for module in edges:
        assert cycle_from(module) is None, " -> ".join(cycle_from(module) or [])
