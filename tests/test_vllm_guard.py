"""The vLLM code guard (arc_cy._guard) on the installed vLLM and on copies
of its files (or of a verified release's), edited, under another version:
each judged by both routes, the plugin's name and the module path."""

from __future__ import annotations

import ast
import compileall
import importlib.util
import logging
import marshal
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from importlib import metadata
from inspect import getsource
from pathlib import Path
from typing import NamedTuple

import pytest

pytest.importorskip("vllm")  # the imports below need it


import vllm
import vllm.v1.kv_offload.cpu.manager
import vllm.v1.kv_offload.tiering.manager
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

import arc_cy
from arc_cy import ChunkStatus, _guard, plugin
from arc_cy._guard import DEPRECATED_OVERRIDE_ENV, OVERRIDE_ENV, fingerprint, lockstep, vllm_guard
from arc_cy._guard.files import ARC_MODULE, BASE_MODULE, CPU_MANAGER, TIERING_MANAGER
from arc_cy_harness import vllm_overlay
from helpers import CHOSEN, IMPLEMENTATIONS, MODULES, PLUS_MODULES, REGISTERED, REPO, edited

JUDGED = (BASE_MODULE, ARC_MODULE, CPU_MANAGER, TIERING_MANAGER)  # in import order
PACKAGES = sorted({m.rpartition(".")[0] for m in JUDGED} | {"vllm.v1.kv_offload"})
REAL = {m: Path(str(importlib.util.find_spec(m).origin)) for m in JUDGED}  # type: ignore[union-attr]
INSTALLED = metadata.version("vllm")
DATA = REPO / "tests" / "data" / "vllm"

# One comparison of evict's decision: T1 only when strictly over its target.
EVICT_COMPARISON = (
    "if virtual_t1_size >= int(self.target_t1_size):",
    "if virtual_t1_size > int(self.target_t1_size):",
)
GHOST_ADAPTATION = (
    "delta = max(1, len(self.b2) / len(self.b1))",
    "delta = max(2, len(self.b2) / len(self.b1))",
)
FIELD_ORDER = (
    '_fields_ = [("ref_cnt", ctypes.c_int32), ("chunk_id", ctypes.c_int64)]',
    '_fields_ = [("chunk_id", ctypes.c_int64), ("ref_cnt", ctypes.c_int32)]',
)
ORDERED_DICT = ("from collections import OrderedDict", "from typing import OrderedDict")
NEW_METHOD = (
    "    def _adapt_to_ghost_hit(",
    "    def pin(self, key: OffloadKey) -> None:\n"
    "        self.t1.move_to_end(key)\n\n    def _adapt_to_ghost_hit(",
)


def _shape(cls: type) -> str:
    return fingerprint._shape(ast.parse(textwrap.dedent(getsource(cls))))


# Read before a fake takes its module's place: Python 3.13's getsource finds a
# class by its module's file and its first line, which are then the fake's.
CHUNK_SHAPE = _shape(ChunkStatus)


class Guard:
    """One test's vLLM: the installed one under another version, its judged
    modules copies in a temporary tree (edited or not), imported as vLLM
    does; vLLM's registry without arc_cy, the guard not yet run, no override."""

    def __init__(self, mp: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, root: Path):
        self.monkeypatch, self.caplog, self.root = mp, caplog, root
        self.module_path, self.files = MODULES[CHOSEN], {}
        fresh = {k: v for k, v in CachePolicyFactory._registry.items() if "arc_cy" not in k}
        mp.setattr(CachePolicyFactory, "_registry", fresh)
        mp.delenv(OVERRIDE_ENV, raising=False)
        mp.delenv(DEPRECATED_OVERRIDE_ENV, raising=False)
        reset_guard(mp)

    def write(self, edits: dict | None = None, appended: dict | None = None, tree=None) -> Guard:
        for module in JUDGED:
            file = tree / Path(*module.split(".")).with_suffix(".py") if tree else REAL[module]
            source = edited(file.read_text(), *(edits or {}).get(module, ()))
            path = self.root.joinpath(*module.split(".")).with_suffix(".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source + (appended or {}).get(module, ""))
            self.files[module] = path
        return self

    def install(self, version: str, **changes) -> Guard:
        return self.write(**changes).load(version)

    def load(self, version: str) -> Guard:
        """Import the copies written, in place of vLLM's modules; the
        packages' folders are the tree's, where the guard finds them."""
        self.monkeypatch.setattr(vllm, "__version__", version)
        for module in [m for m in JUDGED if m in self.files]:
            spec = importlib.util.spec_from_file_location(module, self.files[module])
            assert spec is not None and spec.loader is not None
            fake = importlib.util.module_from_spec(spec)
            self.monkeypatch.setitem(sys.modules, module, fake)
            spec.loader.exec_module(fake)
            if hasattr(fake, "ChunkStatus") and _shape(fake.ChunkStatus) == CHUNK_SHAPE:
                fake.ChunkStatus = ChunkStatus  # one type, as where one base.py ran
        for package in PACKAGES:
            folder = self.root.joinpath(*package.split("."))
            (folder / "__init__.py").touch()
            self.monkeypatch.setattr(sys.modules[package], "__path__", [str(folder)])
        return self

    def routes(self, policy: str = "ARCCachePolicy") -> Routes:
        """Both routes on the vLLM in sys.modules, each in a fresh process's
        state (the guard not yet run)."""
        reset_guard(self.monkeypatch)
        [record] = register(self.caplog)
        registry = CachePolicyFactory._registry
        registered = ("arc_cy_plus" if "Plus" in policy else "arc_cy") in registry
        assert (record.levelno == logging.INFO) == ("arc_cy" in registry)
        registry.pop("arc_cy", None), registry.pop("arc_cy_plus", None)
        reset_guard(self.monkeypatch)
        plus = PLUS_MODULES[next(i for i, m in MODULES.items() if m == self.module_path)]
        path = plus if "Plus" in policy else self.module_path
        try:
            manager = sys.modules[CPU_MANAGER].CPUOffloadingManager(
                num_chunks=4, cache_policy=policy, cache_policy_module_path=path
            )
        except RuntimeError as exc:
            return Routes(registered, record.getMessage(), str(exc))
        assert type(manager._policy).__module__ == path
        return Routes(registered, record.getMessage(), None)


class Routes(NamedTuple):
    """What each route did on one vLLM: registered, the plugin's one log
    line, and None if the module path built the manager, else its error."""

    registered: bool
    log: str
    built: str | None


def reset_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("pending", "plus_pending", "_result", "_checked", "_warned"):
        monkeypatch.setattr(vllm_guard, name, name.endswith("pending") or None)


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path):
    """A test's vLLM, built with the chosen implementation."""
    return Guard(monkeypatch, caplog, tmp_path / "site")


@pytest.fixture
def guard_each(guard: Guard, impl: str) -> Guard:
    """A test's vLLM, once per implementation."""
    guard.module_path = MODULES[impl]
    return guard


def register(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        plugin.register()
    return [r for r in caplog.records if r.name == plugin.logger.name]


def accepted(r: Routes, version: str, verified_as: str) -> None:
    assert r.registered and r.built is None, r
    assert r.log == (
        f"arc_cy: registered CPU offloading cache {REGISTERED} ({arc_cy.IMPLEMENTATION} "
        f"implementation) on vLLM {version}: its ARC code is verified vLLM {verified_as}'s"
    )


def refused(r: Routes) -> str:
    """The refusal both routes gave (the same message), less its advice."""
    assert not r.registered and r.built is not None, r
    assert r.log == r.built + " The 'arc_cy' cache policy is NOT registered."
    message, sep, advice = r.built.partition(" arc_cy reproduces vLLM arc decision")
    assert sep and "`tools/vllm_compat.sh VERSION`" in advice and f"{OVERRIDE_ENV}=1" in advice
    return message


@pytest.mark.parametrize("pyc", [False, True], ids=["no-pyc", "pyc"])
def test_the_hash_path_compiles_nothing(pyc: bool, guard: Guard) -> None:
    # Issue 59: with no .pyc (uv installs none), the stale-bytecode check
    # compiled every imported judged module. 0.34.0's files, as shipped, in
    # an overlay (arc_cy_harness.vllm_overlay) written before the process.
    tmp_path = guard.write(tree=DATA / "0.34.0").root
    shutil.copy(vllm_overlay.SITECUSTOMIZE, tmp_path / "sitecustomize.py")
    assert not pyc or compileall.compile_dir(tmp_path / "vllm", quiet=1)
    time.sleep(0.1)  # older than the process by more than the guard's clock margin
    code = (
        "import importlib, builtins, arc_cy._guard as g\n"
        f"for m in {JUDGED}: importlib.import_module(m)\n"
        "def compile(*a, **k): raise AssertionError('compiled')\n"
        "builtins.compile = g.files.compile = compile\n"
        "r = g.check_vllm_code(); print(r.verified_as, r.problems)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "FAKE_VLLM_OVERLAY": "1"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, env=env
    )
    assert proc.stdout.splitlines()[-1:] == [f"{INSTALLED} ()"], proc.stdout + proc.stderr
    assert any(tmp_path.rglob("*.pyc")) == pyc


def test_release_day_unchanged_arc_code_registers_after_a_lockstep(guard_each: Guard) -> None:
    ran = []
    real = _guard.lockstep_difference
    guard_each.monkeypatch.setattr(_guard, "lockstep_difference", lambda: ran.append(1) or real())
    reflowed = "delta = max(1,\n                len(self.b2)/len(self.b1))  # reflowed"
    docstring = '"""Find chunk in data structures. Returns None if not present."""'
    comment = '"""Another docstring, naming t1 and touch."""\n        # and a comment'
    # A caller's helper doing what a verified caller does (issue 59; vLLM's
    # style: annotated). What does not count in base.py: test_verified_releases.
    helper = "\n\ndef _get(manager: CPUOffloadingManager, key: OffloadKey) -> ChunkStatus | None:"
    guard_each.install(
        "0.35.0",
        edits={ARC_MODULE: (GHOST_ADAPTATION[0], reflowed), BASE_MODULE: (docstring, comment)},
        appended={CPU_MANAGER: helper + "\n    return manager._policy.get(key)\n"},
    )
    accepted(guard_each.routes(), "0.35.0", INSTALLED)
    assert ran  # the hashes did not match: judged on release day, and run


CHANGED = {  # an edit of vLLM's ARC code, and the object the refusal names
    "evict": (ARC_MODULE, EVICT_COMPARISON, "ARCCachePolicy.evict"),
    "ghost-hit": (ARC_MODULE, GHOST_ADAPTATION, "ARCCachePolicy._adapt_to_ghost_hit"),
    "ChunkStatus": (BASE_MODULE, FIELD_ORDER, "ChunkStatus"),
    "OrderedDict": (ARC_MODULE, ORDERED_DICT, "OrderedDict"),
    "a-new-method": (ARC_MODULE, NEW_METHOD, "ARCCachePolicy.pin"),
}


@pytest.mark.parametrize("case", sorted(CHANGED))
def test_a_changed_object_is_refused_by_name(case: str, guard_each: Guard) -> None:
    module, edit, obj = CHANGED[case]
    guard_each.install("0.35.0", edits={module: edit})
    how = "is not in" if edit is NEW_METHOD else "differs from"
    assert refused(guard_each.routes()) == (
        "arc_cy: vLLM 0.35.0's ARC code is not code arc_cy verified: "
        f"`{obj}` ({guard_each.files[module]}) {how} verified vLLM {INSTALLED}'s."
    )


REACHES = {  # what a caller does that no verified caller does (each kind: test_verified_releases)
    "arc-only-state": ("len(manager._policy.t1)", "reads 't1'"),
    "arc-only-method": ("manager._policy._adapt_to_ghost_hit(key)", "calls '_adapt_to_ghost_hit'"),
    "arc_cy-only": ("manager._policy._check_invariants()", "calls '_check_invariants'"),
    "a-method-arc-lost": ("manager._policy.touch([key], None)", "calls 'touch'"),
    "string-name": ("operator.attrgetter('b2')(manager._policy)", "calls 'attrgetter'"),
    "vllms-class": ("isinstance(manager._policy, ARCCachePolicy)", "reads 'ARCCachePolicy'"),
    "a-delete": ("del manager._policy.target_t1_size", "deletes 'target_t1_size'"),
}


@pytest.mark.parametrize("caller", [CPU_MANAGER, TIERING_MANAGER], ids=["cpu", "tiering"])
@pytest.mark.parametrize("reach", sorted(REACHES))
def test_a_caller_that_does_more_than_a_verified_caller_is_refused(
    reach: str, caller: str, guard: Guard
) -> None:
    line, does = REACHES[reach]
    probe = f"\n\ndef _probe(manager: CPUOffloadingManager, key: OffloadKey) -> None:\n    {line}\n"
    guard.install("0.35.0", appended={caller: probe})
    path = guard.files[caller]
    number = len(path.read_text().splitlines())  # the probe's last line
    assert refused(guard.routes()).startswith(  # attrgetter('b2'): "has the string 'b2'" too
        f"arc_cy: vLLM 0.35.0's ARC code is verified vLLM {INSTALLED}'s, but {path}:{number} "
        f"{does}, which no caller of verified vLLM {INSTALLED}'s ARC code does"
    )


# Issue 59: one change each to the CPU manager, needing what the core refuses
# or treating "arc" as no other policy: its edits, what the refusal says, and
# what the lockstep alone finds with the core (the twin takes what vLLM's ARC
# takes: a duplicate insert, a negative n).
NEEDS = {
    "a-resize": (
        "    def get_stats(",
        "    def resize(self, num_chunks: int) -> None:\n"
        "        self._policy.cache_capacity = num_chunks\n\n    def get_stats(",
        "writes 'cache_capacity'",
        None,  # no scheduler calls it: the caller scan refuses it
    ),
    "a-duplicate-insert": (
        "if chunk is None:\n                keys_to_store",
        "if chunk is None or chunk.is_ready:\n                keys_to_store",
        ", prepare_store(",
        "'raises ValueError'",
    ),
    "a-negative-n": ("if num_chunks_to_evict > 0:", "if True:", ", prepare_store(", "'raises"),
    "arc-treated-specially": (
        "policy_cls(cache_capacity=num_chunks)",
        "policy_cls(cache_capacity=num_chunks)\n        self._policy_name: str = cache_policy",
        "if new_store_misses:",
        'if new_store_misses and self._policy_name == "arc":',
        "has the string 'arc'",
        "left t1, t2, b1, b2, target_t1_size",
    ),
}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=[pytest.mark.compiled] * ("'raises" in str(v[-1])))
        for c, v in NEEDS.items()
    ],
)
def test_a_caller_that_needs_what_arc_cy_refuses_is_refused(case: str, guard_each: Guard) -> None:
    *edits, said, found = NEEDS[case]
    guard_each.install("0.35.0", edits={CPU_MANAGER: tuple(edits)})
    assert said in refused(guard_each.routes())
    guard_each.monkeypatch.setenv(OVERRIDE_ENV, "1")  # the lockstep alone, on the refused vLLM
    differs = lockstep.first_difference(guard_each.module_path)
    found = None if "raises" in str(found) and "_twin" in guard_each.module_path else found
    assert (differs is None) == (found is None), differs
    assert differs is None or differs.startswith("through vLLM's CPUOffloadingManager, call ")
    assert differs is None or found in differs


def test_a_caller_moved_in_the_tree_is_judged(guard: Guard) -> None:
    # Found by its marks and judged where it is; the lockstep cannot build it.
    guard.install("0.35.0")
    old = guard.files[CPU_MANAGER]
    moved = old.parent / "offloading" / "manager.py"
    moved.parent.mkdir()
    (moved.parent / "__init__.py").touch()
    moved.write_text(
        old.read_text()
        + "\n\ndef _probe(self: CPUOffloadingManager) -> None:\n    self._policy.t1.clear()\n"
    )
    old.unlink()
    guard.monkeypatch.delitem(sys.modules, CPU_MANAGER)
    result = _guard.check_vllm_code()
    assert result is not None and result.problems == (
        f"{moved}:{len(moved.read_text().splitlines())} reads 't1', which no caller of "
        f"verified vLLM {INSTALLED}'s ARC code does",
    )
    moved.write_text(moved.read_text().split("\n\ndef _probe")[0])
    [why] = _guard.check_vllm_code().problems  # type: ignore[union-attr]
    assert why.startswith(
        f"arc_cy cannot judge it: ModuleNotFoundError: No module named '{CPU_MANAGER}'"
    )


def test_decisions_that_differ_are_refused_naming_the_first_call(guard_each: Guard) -> None:
    # vLLM's ARC class, one whose evict differs from its source: a stand-in
    # for a release whose change the fingerprint cannot see.
    guard_each.install("0.35.0", appended={CPU_MANAGER: "\n# a comment\n"})
    arc = sys.modules[ARC_MODULE]

    class Other(arc.ARCCachePolicy):  # type: ignore[name-defined,misc]
        def evict(self, n, protected):  # type: ignore[no-untyped-def]
            return super().evict(n, protected | set(list(self.t1)[:1]))

    guard_each.monkeypatch.setattr(arc, "ARCCachePolicy", Other)
    message = refused(guard_each.routes())
    assert message.startswith(
        f"arc_cy: vLLM 0.35.0's ARC code is verified vLLM {INSTALLED}'s, but arc_cy decides "
        "otherwise than this vLLM's ARC through vLLM's CPUOffloadingManager, call "
    )
    assert ", prepare_store(" in message and '"arc" answered ' in message


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_the_lockstep_reaches_what_it_compares(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: Counter[str] = Counter()
    arc = sys.modules[ARC_MODULE].ARCCachePolicy

    def counting(real, what):  # type: ignore[no-untyped-def]
        def method(self, *args):  # type: ignore[no-untyped-def]
            result = real(self, *args)
            seen.update([what(self, result, *args), "t2-full" * (len(self.t2) >= 8)])
            return result

        return method

    for name, what in {
        "evict": lambda self, result, *a: "evicted" if result else "failed",
        "_adapt_to_ghost_hit": lambda self, hit, key: "b1-hit" if key in self.b1 else "b2-hit",
        "remove": lambda *a: "removed",
        "on_request_finished": lambda *a: "finished",
        "clear": lambda *a: "cleared",
    }.items():
        monkeypatch.setattr(arc, name, counting(getattr(arc, name), what))
    assert lockstep.first_difference(MODULES[impl]) is None
    del seen[""]  # the calls with t2 not full
    assert len(seen) == 8 and min(seen.values()) >= 5, seen  # the CPU manager and the tier


@pytest.mark.parametrize("how", ["replaced-after-import", "unchecked-hash-pyc"])
def test_code_that_is_not_its_sources_is_refused(how: str, guard: Guard) -> None:
    # What runs is arc.py with evict changed: imported before vLLM 0.34.0's
    # own file replaced it (an upgrade under a running process), or from an
    # unchecked hash-based .pyc after the source changed.
    guard.write()
    arc = guard.files[ARC_MODULE]
    real = arc.read_text()
    guard.monkeypatch.setattr(sys, "dont_write_bytecode", True)
    if how == "replaced-after-import":
        arc.write_text(edited(real, *EVICT_COMPARISON))
        guard.load("0.34.0")
        arc.write_text(real)
    else:
        code = compile(edited(real, *EVICT_COMPARISON), str(arc), "exec", dont_inherit=True)
        cache = Path(importlib.util.cache_from_source(str(arc)))  # hash-based, unchecked
        cache.parent.mkdir(exist_ok=True)
        header = b"\1\0\0\0" + importlib.util.source_hash(arc.read_bytes())
        cache.write_bytes(importlib.util.MAGIC_NUMBER + header + marshal.dumps(code))
        arc.write_text(real + "\n")
        guard.load("0.35.0")
    message = refused(guard.routes())
    assert f"the code that runs for {arc} is not its source's: ARCCachePolicy.evict" in message


@pytest.mark.parametrize("damage", ["truncated", "binary", "fifo", "directory", "missing"])
def test_a_damaged_source_is_refused_and_neither_crashes_nor_hangs(
    damage: str, guard: Guard
) -> None:
    arc = guard.write().files.pop(ARC_MODULE)  # not imported: found in its package's folder
    if damage in ("truncated", "binary"):
        text = arc.read_text().split("def evict")[0] + "def ev"
        arc.write_bytes(text.encode() if damage == "truncated" else b"\x00\xff" * 100)
    else:
        arc.unlink()
        os.mkfifo(arc) if damage == "fifo" else arc.mkdir() if damage == "directory" else None
    guard.load("0.35.0")
    guard.monkeypatch.delitem(sys.modules, ARC_MODULE)
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.append(_guard.check_vllm_code()), daemon=True)
    worker.start()
    worker.join(60)
    assert results, "the check hangs"
    assert isinstance(results[0], _guard.CodeCheck) and not results[0].ok
    assert results[0].problems[0].startswith("arc_cy cannot judge it: "), results
    refused(guard.routes())


def test_arc_plus_is_not_built_where_the_manager_never_calls_its_hook(guard_each: Guard) -> None:
    # Issue 59: vLLM 0.30.0's own files, whose manager never calls
    # on_request_finished: ARC+ would never admit a block once the pool is
    # full. Both routes refuse it with one message; ARC is unaffected.
    guard_each.install("0.30.0", tree=DATA / "0.30.0")
    r = guard_each.routes("ARCPlusCachePolicy")
    why = (
        'ARC+ ("arc_cy_plus", ARCPlusCachePolicy) learns in on_request_finished, which vLLM '
        "0.30.0's manager never calls: it would stop admitting blocks once the pool is full. "
        'Use "arc_cy" instead, or "ARCCachePolicy" with "cache_policy_module_path": "arc_cy"'
    )
    assert not r.registered and r.built == f"arc_cy: {why}."
    assert r.log == (
        f"arc_cy: registered CPU offloading cache policy 'arc_cy' ({arc_cy.IMPLEMENTATION} "
        f"implementation) on vLLM 0.30.0: its ARC code is verified vLLM 0.30.0's; not "
        f"'arc_cy_plus': {why}."
    )
    assert guard_each.routes().built is None


def test_the_override_registers_with_a_warning_and_its_old_name_still_works(guard: Guard) -> None:
    guard.install("0.35.0", edits={ARC_MODULE: EVICT_COMPARISON})
    guard.monkeypatch.setenv(OVERRIDE_ENV, "0")  # false (each false value: test_env_flag.py)
    refused(guard.routes())
    guard.monkeypatch.setenv(OVERRIDE_ENV, "maybe")  # the plugin logs it: test_plugin.py
    with pytest.raises(ValueError, match="is not a boolean"):
        arc_cy.ARCCachePolicy(4)
    guard.monkeypatch.setenv(OVERRIDE_ENV, "1")
    records = register(guard.caplog)
    assert CachePolicyFactory.get_cache_policy_cls("arc_cy") is arc_cy.ARCCachePolicy
    assert [r.levelno for r in records] == [logging.WARNING, logging.INFO]
    assert records[0].getMessage() == (
        f"arc_cy: using arc_cy on vLLM 0.35.0's unverified code because {OVERRIDE_ENV} is set "
        f"(`ARCCachePolicy.evict` ({guard.files[ARC_MODULE]}) differs from verified vLLM "
        f"{INSTALLED}'s)"
    )
    assert records[1].getMessage().endswith("on vLLM 0.35.0: UNVERIFIED code")
    CachePolicyFactory._registry.pop("arc_cy")
    reset_guard(guard.monkeypatch)
    guard.monkeypatch.delenv(OVERRIDE_ENV)
    guard.monkeypatch.setenv(DEPRECATED_OVERRIDE_ENV, "1")
    with pytest.warns(FutureWarning, match=f"{DEPRECATED_OVERRIDE_ENV} is deprecated"):
        register(guard.caplog)
    assert "arc_cy" in CachePolicyFactory._registry


def test_the_installed_vllm_is_accepted_by_its_hashes_once_per_process(
    guard: Guard, policy_cls: type
) -> None:
    def parsed(*args: object) -> None:
        raise AssertionError("a verified release's files were parsed")

    calls = []
    real = _guard.check_vllm_code
    guard.monkeypatch.setattr(_guard, "check_vllm_code", lambda: calls.append(1) or real())
    guard.monkeypatch.setattr(fingerprint, "arc_code", parsed)
    guard.monkeypatch.setattr(_guard, "lockstep_difference", parsed)
    accepted(guard.routes(), INSTALLED, INSTALLED)  # each route in a fresh process's state
    reset_guard(guard.monkeypatch)
    calls.clear()
    register(guard.caplog)
    assert "arc_cy" in CachePolicyFactory._registry and vllm_guard.pending
    policy_cls(4)
    assert not vllm_guard.pending
    policy_cls(4)
    register(guard.caplog)
    assert len(calls) == 1


def test_without_vllm_nothing_is_checked() -> None:
    code = (
        "import sys; sys.modules['vllm'] = None\n"
        "import importlib, arc_cy, arc_cy._guard as g\n"
        "def boom(*a, **k): raise AssertionError('checked')\n"
        "g._judge = boom\n"
        f"for m, p in {[(MODULES[i], PLUS_MODULES[i]) for i in IMPLEMENTATIONS]}:\n"
        "    importlib.import_module(m).ARCCachePolicy(2)\n"
        "    importlib.import_module(p).ARCPlusCachePolicy(2)\n"
        "assert not arc_cy.HAVE_VLLM and not g.vllm_guard.pending\n"
        "print('ok', g.vllm_guard.result())\n"
    )
    proc = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok None\n"
