"""The test suite's own machinery: a test that needs vLLM (or mypy, pyright)
skips without it, through pytest.importorskip; under
ARC_CY_TESTS_REQUIRE_ALL, which tests/run.sh sets, conftest makes every skip
a failure (skips.py). With vLLM, the tests use vLLM's own types. And the test
modules import helper modules, never conftest or each other."""

from __future__ import annotations

import ast
import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gc_stress
from helpers import REPO, REQUIRE_ALL_ENV, has_null_item
from skips import mark_needs_vllm, skips_without_vllm

pytestmark = pytest.mark.repo

# --- the stand-ins -----------------------------------------------------------------


@pytest.mark.needs_vllm
def test_with_vllm_the_tests_use_vllms_types():
    """The full run tests what it always did: vLLM's own ChunkStatus and
    ReqContext, not the stand-ins."""
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

    import helpers

    assert helpers.ChunkStatus is ChunkStatus
    assert helpers.ReqContext is ReqContext
    # vLLM's ARC itself; where it has no touch() (0.34), a subclass that
    # adds only 0.33.0's (tests/test_vllm_releases.py checks that one)
    if helpers.ORACLE_TOUCHES:
        assert helpers.VllmARC is ARCCachePolicy
    else:
        assert helpers.VllmARC.__mro__[1] is ARCCachePolicy


@pytest.mark.needs_vllm
def test_the_req_context_stand_in_is_a_part_of_vllms():
    import dataclasses

    from vllm.v1.kv_offload.base import ReqContext

    import helpers

    ours = {f.name: (f.default, f.init) for f in dataclasses.fields(helpers.StandInReqContext)}
    theirs = {f.name: (f.default, f.init) for f in dataclasses.fields(ReqContext)}
    assert ours.items() <= theirs.items()
    for name in ("set_offload_key_position", "get_offload_key_position"):
        assert hasattr(ReqContext, name), name
    a, b = helpers.StandInReqContext(req_id="r"), ReqContext(req_id="r")
    for ctx in (a, b):
        ctx.set_offload_key_position(b"k", 7)
    assert [c.get_offload_key_position(k) for c in (a, b) for k in (b"k", b"x")] == [7, None] * 2


# --- in a child pytest, with vLLM hidden -----------------------------------------

# A test marked needs_vllm, and a module that calls pytest.importorskip("vllm") at
# its top.
MARKED = "tests/test_copy.py::test_vllms_policy_copies"
IMPORTING = "tests/test_manager.py"
MISSING = "could not import 'vllm': No module named 'vllm'"


def _pytest_without_vllm(
    tmp_path: Path, require_all: bool, *tests: str
) -> subprocess.CompletedProcess:
    # A vllm package that raises what a missing one raises, first on the path.
    fake = tmp_path / "fake" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'vllm'\", name='vllm')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_ALL_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(fake.parent), env.get("PYTHONPATH")) if p)
    if require_all:
        env[REQUIRE_ALL_ENV] = "1"
    return subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rsfE", *tests],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_without_vllm_they_skip(tmp_path):
    proc = _pytest_without_vllm(tmp_path, False, MARKED, IMPORTING)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    skips = re.findall(r"^SKIPPED \[(\d+)\] (\S+?):\d+: (.*)$", out, re.M)
    assert sorted(skips) == [
        ("1", "tests/test_manager.py", MISSING),
        ("3", "tests/conftest.py", MISSING),  # the mark's skip, at setup
    ], out[-3000:]
    assert out.splitlines()[-1].startswith("4 skipped in "), out[-3000:]


FAILS = f"skipped ({MISSING}), and {REQUIRE_ALL_ENV} is set: the full suite may not skip"


def test_under_require_all_a_skip_in_a_test_fails(tmp_path):
    proc = _pytest_without_vllm(tmp_path, True, MARKED)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert out.splitlines()[-1].startswith("3 errors in "), out[-3000:]  # at setup
    assert out.count(FAILS) >= 3, out[-3000:]


def test_under_require_all_a_skipped_module_is_a_collection_error(tmp_path):
    proc = _pytest_without_vllm(tmp_path, True, IMPORTING)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]  # interrupted: a collection error
    assert "ERROR tests/test_manager.py" in out, out[-3000:]
    assert FAILS in out, out[-3000:]


# --- "needs vLLM", said once per module ---------------------------------------------

TESTS = Path(REPO, "tests")
MODULES = sorted(p.name for p in TESTS.glob("test_*.py"))
SKIPPING = [name for name in MODULES if skips_without_vllm(str(TESTS / name))]


def _first_vllm_import(tree: ast.Module) -> int | None:
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name == "vllm" or name.startswith("vllm.") for name in names):
            return i
    return None


def test_some_modules_skip_without_vllm():
    assert {"test_manager.py", "test_differential.py", "test_tiering.py"} <= set(SKIPPING)


@pytest.mark.parametrize("name", MODULES)
def test_needs_vllm_is_said_once(name):
    """A module that imports vLLM at its top first calls
    pytest.importorskip("vllm"); one that does never also marks itself
    needs_vllm (conftest does)."""
    tree = ast.parse((TESTS / name).read_text(encoding="utf-8"))
    first_import = _first_vllm_import(tree)
    skips = [
        i for i, node in enumerate(tree.body) if ast.unparse(node) == "pytest.importorskip('vllm')"
    ]
    if first_import is not None:
        assert skips and skips[0] < first_import, (skips, first_import)
    if skips:
        for node in tree.body:
            if isinstance(node, ast.Assign) and "pytestmark" in ast.unparse(node.targets[0]):
                assert "needs_vllm" not in ast.unparse(node), ast.unparse(node)


class _Item:
    """What mark_needs_vllm (conftest's hook) reads of a collected test."""

    def __init__(self, path: str) -> None:
        self.module = type("M", (), {"__file__": path})
        self.marks: list[str] = []

    def get_closest_marker(self, name: str):
        return name if name in self.marks else None

    def add_marker(self, mark) -> None:
        self.marks.append(mark.name)


@pytest.mark.parametrize("name", ["test_tiering.py", "test_suite.py"])
def test_conftest_marks_their_tests(name):
    """Each test of such a module gets needs_vllm as it is collected, so
    that -m "not needs_vllm" deselects it (.ci/fast.sh); no other does."""
    item = _Item(str(TESTS / name))
    mark_needs_vllm(item)
    assert item.marks == (["needs_vllm"] if name in SKIPPING else [])


def test_this_session_s_tests_are_marked(request):
    for item in request.session.items:
        path = getattr(getattr(item, "module", None), "__file__", None)
        if path and os.path.basename(path) in SKIPPING:
            assert item.get_closest_marker("needs_vllm") is not None, item.nodeid


# --- what GC stress reads (docs/hardening.md, "Checks") ------------------------------


def _half_built(kind: type):
    """A list or tuple of 3 NULL items, as CPython's C code makes one before
    it fills it."""
    new = getattr(ctypes.pythonapi, "PyList_New" if kind is list else "PyTuple_New")
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_ssize_t]
    return new(3)


@pytest.mark.parametrize("kind", [list, tuple])
def test_a_null_item_is_seen_without_reading_it(kind):
    assert has_null_item(_half_built(kind))
    assert not has_null_item(kind([1, 2, 3]))
    assert not has_null_item(kind())


def test_gc_stress_counts_cpythons_half_built_lists_and_fails_ours():
    """The hook reads no list with a NULL item (reading one would crash).
    Seen while CPython's code runs, it is counted; while a test's or
    arc_cy's runs, the test fails."""
    half = _half_built(list)
    space: dict = {}
    exec(compile("import sys\nframe = sys._getframe()", "<cpython>", "exec"), space)
    before = dict(gc_stress.GC_STRESS_RUNS)
    gc_stress.read(half, space["frame"])
    assert gc_stress.GC_STRESS_RUNS["half_built_cpython"] == before["half_built_cpython"] + 1
    assert not gc_stress.GC_STRESS_HALF_BUILT
    try:
        gc_stress.read(half, sys._getframe())
        assert gc_stress.GC_STRESS_HALF_BUILT == [
            f"{__file__}:{sys._getframe().f_lineno - 2} "
            "(test_gc_stress_counts_cpythons_half_built_lists_and_fails_ours)"
        ]
    finally:
        gc_stress.GC_STRESS_HALF_BUILT.clear()


# --- what the test modules import (issue 20) ----------------------------------------


def _imported(tree: ast.Module) -> set[str]:
    """What a module imports, anywhere in it, by dotted name (``from a
    import b`` gives both ``a`` and ``a.b``: b may be a module)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _wrong_imports(source: str) -> set[str]:
    """What a test module's source imports of conftest or of a test module."""
    return {
        imported
        for imported in _imported(ast.parse(source))
        if any(part == "conftest" or part.startswith("test_") for part in imported.split("."))
    }


@pytest.mark.parametrize("name", MODULES)
def test_a_test_module_imports_no_conftest_nor_another_test_module(name):
    """What the tests share lives in helper modules (helpers.py, hostile.py,
    childproc.py, skips.py, gc_stress.py, ...), never in conftest.py or a
    test module."""
    assert not _wrong_imports((TESTS / name).read_text(encoding="utf-8"))


def test_the_import_check_sees_them():
    source = (
        "import conftest\nfrom conftest import x\nimport test_plus\n"
        "def f():\n    from test_gc import y\n"
        "from tests import test_views\nimport helpers, skips\nfrom gc_stress import read\n"
    )
    assert _wrong_imports(source) == {
        "conftest",
        "conftest.x",
        "test_plus",
        "test_gc",
        "test_gc.y",
        "tests.test_views",
    }
