"""Shared fixtures (every behavioural test runs on both implementations, a
test of a rule of the core's own on the core alone: core_only), GC stress,
no skips under the test command (tests/run.sh), and the pure build's run
(ARC_CY_NO_EXTENSIONS: the twin alone)."""

from __future__ import annotations

import ast
import contextlib
import functools
import gc
import importlib.util
import os
import sys

import pytest

from arc_cy._flags import env_flag
from arc_cy._guard import vllm_guard
from helpers import (
    ALL_IMPLEMENTATIONS,
    ARC_CY_DIR,
    PURE,
    PURE_ENV,
    REQUIRE_ALL_ENV,
    has_null_item,
    load_policy_class,
)


@pytest.fixture(scope="session")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One mypy cache for the session's runs: the first analyses vLLM and
    torch (about two minutes here), the next reuse that and check only
    what changed (mypy compares each module's path and contents)."""
    return str(tmp_path_factory.mktemp("mypy-cache"))


# --- no skips under the test command -----------------------------------------
#
# A test that needs vLLM is marked needs_vllm, which skips it without vLLM. A
# module that imports vLLM at its top says so once, by
# pytest.importorskip("vllm") before those imports: the mark is then given
# to each of its tests here (skips_without_vllm). One that needs mypy or pyright calls
# pytest.importorskip. A venv of arc_cy, pytest and hypothesis alone thus
# runs the rest: the fast layer, -m "not needs_vllm". tests/run.sh sets
# ARC_CY_TESTS_REQUIRE_ALL: there every skip, at collection or in a test, is
# a failure, so a broken environment cannot pass by skipping.

REQUIRE_ALL = env_flag(REQUIRE_ALL_ENV)


def _no_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        why = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        why = why.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = (
            f"skipped ({why}), and {REQUIRE_ALL_ENV} is set: the full suite may not skip"
        )


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    report = yield
    _no_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    # A failure's report parses the test's source (pytest walks its ast):
    # under GC stress's hook that takes many minutes, and stresses pytest.
    with _gc_stress_paused():
        report = yield
    _no_skip(report)
    return report


@functools.cache
def skips_without_vllm(path: str) -> bool:
    """Whether the module at ``path`` calls pytest.importorskip("vllm") in
    its top-level code."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return any(ast.unparse(node) == "pytest.importorskip('vllm')" for node in tree.body)


def pytest_itemcollected(item: pytest.Item) -> None:
    # Runs as each test is collected, so before -m selects by mark.
    module = getattr(item, "module", None)
    path = getattr(module, "__file__", None)
    if path and skips_without_vllm(path) and item.get_closest_marker("needs_vllm") is None:
        item.add_marker(pytest.mark.needs_vllm)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("needs_vllm") is not None:
        pytest.importorskip("vllm")


# --- a pure build: ARC_CY_NO_EXTENSIONS=1 tests/run.sh ------------------------
#
# The switch is arc_cy's own (helpers.PURE): tests/run.sh's build then makes
# no core, arc_cy and every child process choose the twin, and the tests of
# the compiled core (marked compiled, or taking impl "cython") are
# deselected, not skipped: counted in the summary, and no failure under
# ARC_CY_TESTS_REQUIRE_ALL. Either mode refuses to start on the other's
# build: pure asked on a build with the core would test the twin beside a
# core it never loads; the core missing in the normal mode would fail
# every compiled test one by one.


def pytest_configure(config: pytest.Config) -> None:
    core = importlib.util.find_spec("arc_cy._core.arc")
    if PURE and core is not None:
        raise pytest.UsageError(
            f"{PURE_ENV} is set, but this arc_cy has its compiled core ({core.origin}): "
            f"not a pure build. Reinstall it with {PURE_ENV}=1 (tests/run.sh does)."
        )
    if not PURE and core is None:
        import arc_cy

        raise pytest.UsageError(
            f"the arc_cy in {os.path.dirname(arc_cy.__file__)} has no compiled core "
            "(arc_cy._core.arc): build and install it (tests/run.sh does; `python -P` keeps "
            f"a source tree from shadowing it), or set {PURE_ENV}=1 to test a pure build."
        )


def compiled_only(item: pytest.Item) -> bool:
    """Whether the test needs the compiled core."""
    if item.get_closest_marker("compiled") is not None:
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("impl") == "cython"


# --- the core's own rules: core_only -------------------------------------------
#
# The compiled core keeps rules of its own (docs/hardening.md, "Rules"): its
# busy protocol, argument and chunk checks, release order, thread guard,
# refused copies. They are memory safety: a core that let user code move its
# C arrays under a held pointer, or read a chunk it cannot read, could crash
# the process. The twin cannot crash it: it is vLLM's arc.py, exposed to
# hostile input as vLLM's ARC is, and refuses only a mutating call made while
# another runs. So a test of a core rule (a module, a test or one of its
# parameters marked core_only) runs on the core alone: its twin case is
# deselected, never skipped. Behavioural tests on legal input take both.


# GC stress and the sanitizers (ARC_CY_TESTS_CORE=1: .ci/gc_stress.sh,
# .ci/sanitize.sh) look for the core's memory errors: there every test is
# core_only.
CORE_LEGS = env_flag("ARC_CY_TESTS_CORE")


def twin_of_a_core_rule(item: pytest.Item) -> bool:
    """Whether the test is a core_only test's twin case."""
    callspec = getattr(item, "callspec", None)
    return (
        (CORE_LEGS or item.get_closest_marker("core_only") is not None)
        and callspec is not None
        and callspec.params.get("impl") == "python"
    )


def pytest_report_header(config: pytest.Config) -> str:
    if PURE:
        return f"arc_cy: a pure build ({PURE_ENV}): the twin alone, compiled-only tests deselected"
    return "arc_cy: the compiled core and the twin"


PURE_DESELECTED = "arc_cy pure deselected"
PURE_DESELECTED_KEY = pytest.StashKey[int]()
CORE_ONLY_DESELECTED = "arc_cy core_only deselected"
CORE_ONLY_DESELECTED_KEY = pytest.StashKey[int]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    twin_cases = [item for item in items if twin_of_a_core_rule(item)]
    pure = [item for item in items if PURE and compiled_only(item)]
    deselected = set(twin_cases + pure)
    if deselected:
        config.hook.pytest_deselected(items=[item for item in items if item in deselected])
        items[:] = [item for item in items if item not in deselected]
    config.stash[CORE_ONLY_DESELECTED_KEY] = len(twin_cases)
    config.stash[PURE_DESELECTED_KEY] = len(pure)
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker tells the controller
        config.workeroutput[CORE_ONLY_DESELECTED] = len(twin_cases)
        config.workeroutput[PURE_DESELECTED] = len(pure)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    # Every worker collects the whole suite (--dist loadfile), so each says the same.
    output = getattr(node, "workeroutput", {})
    for name, key in (
        (PURE_DESELECTED, PURE_DESELECTED_KEY),
        (CORE_ONLY_DESELECTED, CORE_ONLY_DESELECTED_KEY),
    ):
        if output.get(name) is not None:
            node.config.stash[key] = output[name]


@pytest.fixture(params=ALL_IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> str:
    """Name of the implementation under test: "cython" or "python" (on a
    pure build, the "cython" tests are collected, then deselected)."""
    return request.param


@pytest.fixture
def policy_cls(impl: str) -> type:
    """arc_cy's ARCCachePolicy class of the implementation under test."""
    return load_policy_class(impl)


# --- GC stress: ARC_CY_GC_STRESS=1 (docs/hardening.md, "Checks") ----------
#
# For the hostile-input tests: a collection runs at every allocation of a
# container (gc.set_threshold(1)), and at the start of each one a
# gc.callbacks hook reads every young object (generations 0 and 1, where
# anything a running method just made sits) and, every 500th collection,
# every object gc.get_objects() returns. A list with NULL items, or a core
# whose tp_traverse sees a half-made entry, crashes the run.
# A list with a NULL item is read no further: it fails the test if the
# collection started in arc_cy's code or a test's, and is counted if not
# (CPython's own code fills some lists after tracking them).

GC_STRESS = env_flag("ARC_CY_GC_STRESS")
GC_STRESS_RUNS = {"collections": 0, "objects": 0, "policies": 0, "half_built_cpython": 0}
GC_STRESS_HALF_BUILT: list[str] = []  # where arc_cy's or a test's code left one

_OURS = (ARC_CY_DIR, os.path.dirname(os.path.abspath(__file__)) + os.sep)


def _read(obj: object, frame) -> None:
    # Tuples are left out: CPython fills some after tracking them, which
    # is CPython's business, not ours.
    if isinstance(obj, list) and has_null_item(obj):
        where = frame.f_code.co_filename if frame is not None else "?"
        if where.startswith(_OURS):
            GC_STRESS_HALF_BUILT.append(f"{where}:{frame.f_lineno} ({frame.f_code.co_name})")
        else:
            GC_STRESS_RUNS["half_built_cpython"] += 1
        return
    if type(obj) in (list, dict, set, frozenset):
        list(obj)
    elif isinstance(obj, (list, dict, set, frozenset)):
        list(obj.__iter__())
    for ref in gc.get_referents(obj):  # runs tp_traverse (the core's too)
        type(ref)


def _gc_stress_hook(phase: str, info: dict) -> None:
    if phase != "start":
        return
    runs = GC_STRESS_RUNS
    runs["collections"] += 1
    if runs["collections"] % 500 == 0:
        objects = gc.get_objects()
    else:
        objects = gc.get_objects(generation=0) + gc.get_objects(generation=1)
    frame = sys._getframe(1)  # what was running when the collection started
    for obj in objects:
        runs["objects"] += 1
        if type(obj).__name__ == "ARCCachePolicy":
            runs["policies"] += 1
        try:
            _read(obj, frame)
        except Exception:  # a read may fail (an iterator in use); crashes may not
            pass


GC_STRESS_UNHOOKED: list[int] = []  # the collector's thresholds outside a stressed test


@contextlib.contextmanager
def _gc_stress_paused():
    """Unhooked, at the usual thresholds, while pytest itself runs inside a
    stressed test (its reports)."""
    if _gc_stress_hook not in gc.callbacks:
        yield
        return
    gc.callbacks.remove(_gc_stress_hook)
    stressed = gc.get_threshold()
    gc.set_threshold(*GC_STRESS_UNHOOKED)
    try:
        yield
    finally:
        gc.set_threshold(*stressed)
        gc.callbacks.append(_gc_stress_hook)


@pytest.fixture(autouse=True)
def _gc_stress(request: pytest.FixtureRequest):
    if not GC_STRESS or request.node.get_closest_marker("gc_stress") is None:
        yield
        return
    if vllm_guard.pending:
        # The guard's once-per-process check, which the first policy runs,
        # parses vLLM's source: ast's C code fills lists after making them,
        # CPython's business as the tuples above are. Run it unhooked.
        vllm_guard.check()
    GC_STRESS_UNHOOKED[:] = gc.get_threshold()
    before = dict(GC_STRESS_RUNS)
    gc.callbacks.append(_gc_stress_hook)
    gc.set_threshold(1)
    try:
        yield
    finally:
        gc.set_threshold(*GC_STRESS_UNHOOKED)
        gc.callbacks.remove(_gc_stress_hook)
    half_built = GC_STRESS_HALF_BUILT[:]
    GC_STRESS_HALF_BUILT.clear()
    assert not half_built, f"a list with NULL items, made under {half_built[:3]}"
    # The hook did run, and saw objects.
    assert GC_STRESS_RUNS["collections"] > before["collections"]
    assert GC_STRESS_RUNS["objects"] > before["objects"]
    request.node.user_properties.append(
        ("gc stress", {k: GC_STRESS_RUNS[k] - before[k] for k in GC_STRESS_RUNS})
    )


# What each hostile-fuzzer run reached (test_fuzz_hostile.py) and what GC
# stress did, printed at the end of the session so CI's log shows it. They
# travel as the tests' user_properties, which pytest-xdist's workers send
# to the process that reports.
FUZZ_COVERAGE: dict[str, dict] = {}
GC_STRESS_SEEN = dict.fromkeys(GC_STRESS_RUNS, 0)


@pytest.fixture
def fuzz_coverage(request: pytest.FixtureRequest):
    """Where test_fuzz_hostile.py puts each run's COVERAGE counts."""
    counts: dict[str, dict] = {}
    yield counts
    request.node.user_properties.extend(("hostile fuzz " + run, c) for run, c in counts.items())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if name == "gc stress":
            for k, v in value.items():
                GC_STRESS_SEEN[k] += v
        elif name.startswith("hostile fuzz "):
            FUZZ_COVERAGE[name] = value


def pytest_terminal_summary(terminalreporter) -> None:
    count = terminalreporter.config.stash.get(CORE_ONLY_DESELECTED_KEY, 0)
    if count:
        terminalreporter.write_line(
            f"arc_cy: {count} twin cases of the core's own rules deselected (core_only)"
        )
    if PURE:
        count = terminalreporter.config.stash.get(PURE_DESELECTED_KEY, "?")
        terminalreporter.write_line(
            f"arc_cy: a pure build ({PURE_ENV}): {count} compiled-only tests deselected"
        )
    if GC_STRESS:
        terminalreporter.write_line(f"GC stress: {GC_STRESS_SEEN}")
    for run, counts in FUZZ_COVERAGE.items():
        terminalreporter.write_line(f"{run}: {counts}")


# For the tests that run vLLM's real scheduler (test_scheduler_e2e, test_tiering).
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Llama config.json (nothing downloaded)."""
    from arc_cy_harness.offload_stub import write_model_config

    return write_model_config(str(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="module")
def plugins_loaded() -> None:
    """vLLM's general plugins, arc_cy's included, loaded in this process."""
    import vllm.plugins

    vllm.plugins.load_general_plugins()
