"""Shared fixtures (every behavioural test runs on both implementations, a
test of a rule of the core's own on the core alone: core_only), GC stress,
no skips under the test command (tests/run.sh), and the pure build's run
(ARC_CY_NO_EXTENSIONS: the twin alone). What the hooks decide of a test
lives in helper modules, which the tests import (never this one):
skips.py (which tests need vLLM, when a skip fails) and gc_stress.py."""

from __future__ import annotations

import importlib.util
import os

import pytest

import skips
from arc_cy._flags import env_flag
from helpers import (
    ALL_IMPLEMENTATIONS,
    PLUS_IMPLEMENTATIONS,
    PURE,
    PURE_ENV,
    is_plus,
    load_policy_class,
)

# GC stress's checks are asserts, which pytest rewrites (a failure shows the
# values) in a helper module only if told so before the module's import.
pytest.register_assert_rewrite("gc_stress")
import gc_stress  # noqa: E402 -- after registering it for pytest's assert rewriting


@pytest.fixture(scope="session")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One mypy cache for the session's runs: the first analyses vLLM and
    torch (about two minutes here), the next reuse that and check only
    what changed (mypy compares each module's path and contents)."""
    return str(tmp_path_factory.mktemp("mypy-cache"))


# --- no skips under the test command (skips.py says how) ----------------------


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    report = yield
    skips.no_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    # A failure's report parses the test's source (pytest walks its ast):
    # under GC stress's hook that takes many minutes, and stresses pytest.
    with gc_stress.paused():
        report = yield
    skips.no_skip(report)
    return report


def pytest_itemcollected(item: pytest.Item) -> None:
    # Runs as each test is collected, so before -m selects by mark.
    skips.mark_needs_vllm(item)


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
    return callspec is not None and callspec.params.get("impl") in ("cython", "cython-plus")


# --- the core's own rules: core_only -------------------------------------------
#
# The compiled core keeps rules of its own (docs/hardening.md, "Rules"): its
# busy protocol, argument and chunk checks, release after a call, thread guard,
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
        and callspec.params.get("impl") in ("python", "python-plus")
    )


# --- ARC and ARC+: both_policies, arc_only ---------------------------------------
#
# A test that takes impl runs on ARC's core and twin ("cython", "python"); in
# a module marked both_policies, on ARC+'s too ("cython-plus", "python-plus":
# helpers.load_policy_class), so that the hardening topics cover ARC+ as they
# cover ARC. A test there of ARC's own decisions (its target, the list a key
# lands in, its ghost hits' adaptation) is marked arc_only: its ARC+ cases are
# deselected, never skipped. On a pure build "cython-plus" is compiled-only;
# core_only deselects "python-plus" as it does "python".


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" not in metafunc.fixturenames or any(
        "impl" in _argnames(mark) for mark in metafunc.definition.iter_markers("parametrize")
    ):
        return
    names = ALL_IMPLEMENTATIONS
    # Not in GC stress and the sanitizers (CORE_LEGS): there the fuzzers drive
    # ARC+'s compiled steps, and these cases would add about 400 tests to each
    # of CI's two longest legs (tests/test_fuzz_*.py; docs/development.md, "CI").
    if metafunc.definition.get_closest_marker("both_policies") is not None and not CORE_LEGS:
        names += PLUS_IMPLEMENTATIONS
    metafunc.parametrize("impl", names, indirect=True)


def _argnames(mark: pytest.Mark) -> list[str]:
    names = mark.args[0] if mark.args else mark.kwargs["argnames"]
    return [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)


def arc_only_on_plus(item: pytest.Item) -> bool:
    """Whether the test is an arc_only test's ARC+ case."""
    callspec = getattr(item, "callspec", None)
    return (
        item.get_closest_marker("arc_only") is not None
        and callspec is not None
        and is_plus(callspec.params.get("impl", ""))
    )


def pytest_report_header(config: pytest.Config) -> str:
    if PURE:
        return f"arc_cy: a pure build ({PURE_ENV}): the twin alone, compiled-only tests deselected"
    return "arc_cy: the compiled core and the twin"


PURE_DESELECTED = "arc_cy pure deselected"
PURE_DESELECTED_KEY = pytest.StashKey[int]()
CORE_ONLY_DESELECTED = "arc_cy core_only deselected"
CORE_ONLY_DESELECTED_KEY = pytest.StashKey[int]()
ARC_ONLY_DESELECTED = "arc_cy arc_only deselected"
ARC_ONLY_DESELECTED_KEY = pytest.StashKey[int]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    twin_cases = [item for item in items if twin_of_a_core_rule(item)]
    pure = [item for item in items if PURE and compiled_only(item)]
    deselected = set(twin_cases + pure)
    plus_cases = [item for item in items if item not in deselected and arc_only_on_plus(item)]
    deselected.update(plus_cases)
    if deselected:
        config.hook.pytest_deselected(items=[item for item in items if item in deselected])
        items[:] = [item for item in items if item not in deselected]
    config.stash[CORE_ONLY_DESELECTED_KEY] = len(twin_cases)
    config.stash[PURE_DESELECTED_KEY] = len(pure)
    config.stash[ARC_ONLY_DESELECTED_KEY] = len(plus_cases)
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker tells the controller
        config.workeroutput[CORE_ONLY_DESELECTED] = len(twin_cases)
        config.workeroutput[PURE_DESELECTED] = len(pure)
        config.workeroutput[ARC_ONLY_DESELECTED] = len(plus_cases)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    # Every worker collects the whole suite (--dist loadfile), so each says the same.
    output = getattr(node, "workeroutput", {})
    for name, key in (
        (PURE_DESELECTED, PURE_DESELECTED_KEY),
        (CORE_ONLY_DESELECTED, CORE_ONLY_DESELECTED_KEY),
        (ARC_ONLY_DESELECTED, ARC_ONLY_DESELECTED_KEY),
    ):
        if output.get(name) is not None:
            node.config.stash[key] = output[name]


@pytest.fixture
def impl(request: pytest.FixtureRequest) -> str:
    """Name of the implementation under test: "cython" or "python", and in
    a both_policies module "cython-plus" or "python-plus" (pytest_generate_tests;
    on a pure build, the compiled ones are collected, then deselected)."""
    return request.param


@pytest.fixture
def policy_cls(impl: str) -> type:
    """arc_cy's policy class of the implementation under test: ARCCachePolicy,
    or ARCPlusCachePolicy for a "-plus" impl."""
    return load_policy_class(impl)


# --- GC stress: ARC_CY_GC_STRESS=1 (gc_stress.py) ----------------------------


@pytest.fixture(autouse=True)
def _gc_stress(request: pytest.FixtureRequest):
    if not gc_stress.GC_STRESS or request.node.get_closest_marker("gc_stress") is None:
        yield
        return
    with gc_stress.stressed() as done:
        yield
    request.node.user_properties.append(("gc stress", done))


# What each hostile-fuzzer run reached (test_fuzz_hostile.py) and what GC
# stress did, printed at the end of the session so CI's log shows it. They
# travel as the tests' user_properties, which pytest-xdist's workers send
# to the process that reports.
FUZZ_COVERAGE: dict[str, dict] = {}
GC_STRESS_SEEN = dict.fromkeys(gc_stress.GC_STRESS_RUNS, 0)


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
    count = terminalreporter.config.stash.get(ARC_ONLY_DESELECTED_KEY, 0)
    if count:
        terminalreporter.write_line(
            f"arc_cy: {count} ARC+ cases of tests of ARC's own decisions deselected (arc_only)"
        )
    if PURE:
        count = terminalreporter.config.stash.get(PURE_DESELECTED_KEY, "?")
        terminalreporter.write_line(
            f"arc_cy: a pure build ({PURE_ENV}): {count} compiled-only tests deselected"
        )
    if gc_stress.GC_STRESS:
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
