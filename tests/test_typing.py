"""Type checkers see arc_cy's types: mypy --strict on a consumer, pyright's
completeness score, and the compiled module's stub against both
implementations."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import arc_cy
from arc_cy._twin import arc as arc_twin
from arc_cy._twin import plus as plus_twin
from helpers import IMPLEMENTATIONS

HERE = Path(__file__).resolve().parent
PACKAGE = Path(arc_cy.__file__).resolve().parent  # the installed package


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, VIRTUAL_ENV=sys.prefix)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_mypy_strict_on_a_consumer(tmp_path: Path, mypy_cache: str) -> None:
    pytest.importorskip("mypy")
    proc = run(
        ["-m", "mypy", "--strict", "--cache-dir", mypy_cache, str(HERE / "typing" / "consumer.py")],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found in 1 source file" in proc.stdout


def test_mypy_on_arc_cy_itself(tmp_path: Path, mypy_cache: str) -> None:
    # The installed package, its own errors reported: with vLLM installed,
    # whose types the plugin and the self-check use, so here rather than in
    # the lint leg's environment.
    pytest.importorskip("mypy")
    proc = run(["-m", "mypy", "--cache-dir", mypy_cache, "-p", "arc_cy"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout


def test_pyright_verifytypes(tmp_path: Path) -> None:
    pytest.importorskip("pyright")
    proc = run(
        ["-m", "pyright", "--verifytypes", "arc_cy", "--ignoreexternal", "--outputjson"],
        cwd=tmp_path,
    )
    report = json.loads(proc.stdout)
    completeness = report["typeCompleteness"]
    assert completeness["packageRootDirectory"] == str(PACKAGE)
    assert completeness["exportedSymbolCounts"]["withKnownType"] > 0
    score = completeness["completenessScore"]
    assert score == 1.0, json.dumps(completeness["symbols"], indent=1)[:5000]


def _stub_members(cls: str = "ARCCore") -> set[str]:
    tree = ast.parse((PACKAGE / "_core" / "arc.pyi").read_text())
    core = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {n.name for n in core.body if isinstance(n, ast.FunctionDef)}


def test_stub_matches_both_implementations() -> None:
    # The stub names the core's interface: the twin's methods, the names the
    # twin keeps as vLLM's instance attributes, and the core's own.
    twin = {
        name
        for name in vars(arc_twin.ARCCachePolicy)
        if name == "__init__" or not name.startswith("__")
    }
    twin -= {"_adapt_to_ghost_hit", "_running", "_recorder", "_abc_impl"}  # the twin's own helpers
    attributes = {"cache_capacity", "target_t1_size", "t1", "t2", "b1", "b2"}
    assert attributes <= set(vars(arc_twin.ARCCachePolicy(3)))
    core_own = {"_max_entries", "_list_len", "_list_contains", "_list_getitem", "_list_iter"}
    stub = _stub_members() - {"_scan_visits"}  # a counter only the core keeps
    assert stub == twin | attributes | core_own
    # ARC+'s own members: the twin's fate attributes, read-only in the core.
    plus_stub = _stub_members("ARCPlusCachePolicy")
    fates = {"b1_returned", "b1_forgotten", "b2_returned", "b2_forgotten"}
    assert plus_stub == fates and fates <= set(vars(plus_twin.ARCPlusCachePolicy(3)))
    if "cython" not in IMPLEMENTATIONS:  # a pure build: no core to hold it
        return
    from arc_cy._core import arc as core

    for name in stub | {"_scan_visits"}:
        assert hasattr(core.ARCCachePolicy, name), name
    for name in plus_stub:
        assert isinstance(getattr(core.ARCPlusCachePolicy(3), name), int), name
    assert isinstance(core.CYTHON_VERSION, str)
