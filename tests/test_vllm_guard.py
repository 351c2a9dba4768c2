"""The vLLM code guard (arc_cy._guard): arc_cy runs where the code that
ARC runs and reads is code it verified, whatever the version string says,
and whichever route builds its policy.

Each fake vLLM here is the installed vLLM with its four judged modules
(arc.py, base.py, the CPU manager, the tiering manager) replaced, in
``sys.modules``, by copies executed from a temporary tree, some of them
edited, and labelled as a release arc_cy never verified. Each is judged by
both routes with no override: the plugin (``"eviction_policy": "arc_cy"``)
and the module path (``cache_policy_module_path``, which builds the
implementation under test through the fake's own ``CPUOffloadingManager``).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import marshal
import opcode
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from importlib import metadata
from importlib._bootstrap_external import _code_to_timestamp_pyc  # type: ignore[attr-defined]
from pathlib import Path
from types import CodeType, ModuleType

import pytest

pytest.importorskip("vllm")  # the imports below need it

import dis

import vllm
import vllm.v1.kv_offload.cpu.manager
import vllm.v1.kv_offload.tiering.manager
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

import arc_cy
from arc_cy import _base, _fingerprint, _guard, plugin
from arc_cy._fingerprint import (
    ARC_MODULE,
    BASE_MODULE,
    CPU_MANAGER,
    TIERING_MANAGER,
)
from arc_cy._guard import DEPRECATED_OVERRIDE_ENV, OVERRIDE_ENV, vllm_guard
from arc_cy._verified import VERIFIED
from helpers import CHOSEN, IMPLEMENTATIONS, MODULES, REGISTERED, REPO

JUDGED = (BASE_MODULE, ARC_MODULE, CPU_MANAGER, TIERING_MANAGER)  # in import order
REAL = {m: Path(str(importlib.util.find_spec(m).origin)) for m in JUDGED}  # type: ignore[union-attr]
INSTALLED = metadata.version("vllm")
WITHOUT_INSTALLED = tuple(e for e in VERIFIED if INSTALLED not in e["releases"])
"""The table as it was before the installed release joined it."""
PREVIOUS = max((r for e in WITHOUT_INSTALLED for r in e["releases"]), key=_fingerprint.release_key)

# One comparison of evict's decision: T1 only when strictly over its target.
EVICT_COMPARISON = (
    "if virtual_t1_size >= int(self.target_t1_size):",
    "if virtual_t1_size > int(self.target_t1_size):",
)
GHOST_ADAPTATION = (
    "delta = max(1, len(self.b2) / len(self.b1))",
    "delta = max(2, len(self.b2) / len(self.b1))",
)
KEY_ORDER = (
    "keys.sort(key=positions.__getitem__)",
    "keys.sort(key=positions.__getitem__, reverse=True)",
)
FIELD_ORDER = (
    '_fields_ = [("ref_cnt", ctypes.c_int32), ("chunk_id", ctypes.c_int64)]',
    '_fields_ = [("chunk_id", ctypes.c_int64), ("ref_cnt", ctypes.c_int32)]',
)
ORDERED_DICT = ("from collections import OrderedDict", "from typing import OrderedDict")


def _edit(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"{old!r} is not once in the file"
    return source.replace(old, new)


def _method_body(source: str, name: str, new_body: str) -> str:
    """source with method ``name``'s last line (its body: ``return``)
    replaced by new_body, at the same indentation."""
    lines = source.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if f"def {name}(" in line)
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "return")
    indent = lines[end][: len(lines[end]) - len(lines[end].lstrip())]
    lines[end] = textwrap.indent(textwrap.dedent(new_body), indent)
    return "".join(lines)


# --- the fake vLLMs -------------------------------------------------------------


class FakeVllm:
    """The installed vLLM under another version, its judged modules
    replaced by copies in a temporary tree (edited or not), executed as
    vLLM would import them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.monkeypatch = monkeypatch
        self.root = root
        self.files: dict[str, Path] = {}

    def write(
        self,
        edits: dict[str, tuple[str, str]] | None = None,
        appended: dict[str, str] | None = None,
        sources: dict[str, str] | None = None,
    ) -> FakeVllm:
        for module in JUDGED:
            source = (sources or {}).get(module) or REAL[module].read_text()
            if edits and module in edits:
                source = _edit(source, *edits[module])
            source += (appended or {}).get(module, "")
            path = self.root.joinpath(*module.split(".")).with_suffix(".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
            self.files[module] = path
        return self

    def install(self, version: str, **changes: dict) -> FakeVllm:
        """write(**changes), then load(version)."""
        return self.write(**changes).load(version)

    def load(self, version: str) -> FakeVllm:
        """Import the copies written, in place of vLLM's modules."""
        self.monkeypatch.setattr(vllm, "__version__", version)
        for module in JUDGED:
            spec = importlib.util.spec_from_file_location(module, self.files[module])
            assert spec is not None and spec.loader is not None
            fake = importlib.util.module_from_spec(spec)
            self.monkeypatch.setitem(sys.modules, module, fake)
            spec.loader.exec_module(fake)
        # arc_cy binds base.py's order_request_keys when it imports, as it
        # would have from these modules.
        ours = sys.modules[BASE_MODULE].__dict__.get("order_request_keys")
        for holder in _guard.HOLDERS:
            module = sys.modules.get(holder)
            if ours is not None and module is not None and "order_request_keys" in vars(module):
                self.monkeypatch.setattr(module, "order_request_keys", ours)
        return self


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeVllm:
    return FakeVllm(monkeypatch, tmp_path / "site")


def reset_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("pending", True), ("_result", None), ("_checked", False)):
        monkeypatch.setattr(vllm_guard, name, value)
    monkeypatch.setattr(vllm_guard, "_warned", False)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """vLLM's policy registry without arc_cy, the guard not yet run, no
    override, and the table as it is, for this test only."""
    fresh = {k: v for k, v in CachePolicyFactory._registry.items() if k != "arc_cy"}
    monkeypatch.setattr(CachePolicyFactory, "_registry", fresh)
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    monkeypatch.delenv(DEPRECATED_OVERRIDE_ENV, raising=False)
    monkeypatch.setattr(_guard, "VERIFIED", VERIFIED)
    reset_guard(monkeypatch)
    return fresh


@pytest.fixture
def policy_module(impl: str) -> str:
    """cache_policy_module_path for the implementation under test."""
    return MODULES[impl]


@dataclass
class Guard:
    """One test's vLLM: the fake (written, not yet loaded), vLLM's registry
    without arc_cy and the guard not yet run (the registry fixture), with
    pytest's monkeypatch and caplog, and the module path that the
    module-path route builds (the implementation under test)."""

    fake: FakeVllm
    monkeypatch: pytest.MonkeyPatch
    caplog: pytest.LogCaptureFixture
    module_path: str

    def routes(self) -> Routes:
        """Both routes on the vLLM in sys.modules (routes())."""
        return routes(self.monkeypatch, self.caplog, self.module_path)


@pytest.fixture
def guard(
    registry: dict,
    fake: FakeVllm,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> Guard:
    """A test's vLLM, built with the chosen implementation."""
    return Guard(fake, monkeypatch, caplog, MODULES[CHOSEN])


@pytest.fixture
def guard_each(guard: Guard, policy_module: str) -> Guard:
    """A test's vLLM, once per implementation."""
    guard.module_path = policy_module
    return guard


def register(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        plugin.register()
    return [r for r in caplog.records if r.name == plugin.logger.name]


@dataclass
class Routes:
    """What each route did on one vLLM."""

    registered: bool
    log: str
    """The plugin's one log line."""
    built: str | None
    """None if the module path built the manager, else its RuntimeError."""


def routes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, module_path: str
) -> Routes:
    """Both routes on the vLLM in sys.modules, each in a fresh process's
    state (the guard not yet run)."""
    reset_guard(monkeypatch)
    records = register(caplog)
    assert len(records) == 1, [r.getMessage() for r in records]
    registered = "arc_cy" in CachePolicyFactory._registry
    assert (records[0].levelno == logging.INFO) == registered
    CachePolicyFactory._registry.pop("arc_cy", None)
    reset_guard(monkeypatch)
    manager_cls = sys.modules[CPU_MANAGER].CPUOffloadingManager
    try:
        manager = manager_cls(
            num_chunks=4, cache_policy="ARCCachePolicy", cache_policy_module_path=module_path
        )
    except RuntimeError as exc:
        built: str | None = str(exc)
    else:
        built = None
        assert type(manager._policy).__module__ == module_path
    return Routes(registered, records[0].getMessage(), built)


def accepted(r: Routes, version: str, verified_as: str) -> None:
    assert r.registered and r.built is None, r
    assert r.log == (
        f"arc_cy: registered CPU offloading cache {REGISTERED} "
        f"({arc_cy.IMPLEMENTATION} implementation) on vLLM {version}: its ARC code "
        f"is verified vLLM {verified_as}'s"
    )


def refused(r: Routes) -> str:
    """The refusal both routes gave (the same message), less its advice."""
    assert not r.registered and r.built is not None, r
    assert r.log == r.built + " The 'arc_cy' cache policy is NOT registered."
    message, sep, advice = r.built.partition(" arc_cy reproduces vLLM arc decision")
    assert sep and "`tools/vllm_compat.sh VERSION`" in advice and f"{OVERRIDE_ENV}=1" in advice
    return message


# --- what registers ---------------------------------------------------------------


def test_the_installed_vllm_registers(
    registry: dict,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    policy_module: str,
) -> None:
    accepted(routes(monkeypatch, caplog, policy_module), INSTALLED, INSTALLED)


def test_release_day_a_new_release_with_verified_arc_code_registers(
    guard_each: Guard,
) -> None:
    # The installed release's code, before its entry joined the table: its
    # ARC code is the previous release's less a method nothing calls now
    # (0.34.0's touch), its callers are new and ask only what CachePolicy has.
    guard_each.monkeypatch.setattr(_guard, "VERIFIED", WITHOUT_INSTALLED)
    guard_each.fake.install("0.35.0")
    accepted(guard_each.routes(), "0.35.0", PREVIOUS)


def test_defaults_of_base_methods_that_arc_overrides_do_not_count(
    guard_each: Guard,
) -> None:
    base = REAL[BASE_MODULE].read_text()
    base = _method_body(base, "on_store_miss", "for _ in keys:\n    pass\n")
    base = _edit(
        base, "    @abstractmethod\n    def on_request_finished(", "    def on_request_finished("
    )
    guard_each.fake.install("0.35.0", sources={BASE_MODULE: base})
    accepted(guard_each.routes(), "0.35.0", INSTALLED)


def test_a_caller_line_that_uses_base_names_only_registers(
    guard_each: Guard,
) -> None:
    guard_each.fake.install(
        "0.35.0",
        appended={
            CPU_MANAGER: "\n\ndef _resident(manager, key):\n"
            "    return manager._policy.get(key) is not None\n"
        },
    )
    accepted(guard_each.routes(), "0.35.0", INSTALLED)


def test_comments_docstrings_and_formatting_do_not_count(
    guard_each: Guard,
) -> None:
    old, _ = GHOST_ADAPTATION
    guard_each.fake.install(
        "0.35.0",
        edits={
            ARC_MODULE: (
                old,
                "delta = max(1,\n                len(self.b2)/len(self.b1))  # reflowed",
            ),
            BASE_MODULE: (
                '"""Find chunk in data structures. Returns None if not present."""',
                '"""Another docstring, naming t1 and touch."""\n        # and a comment',
            ),
        },
    )
    accepted(guard_each.routes(), "0.35.0", INSTALLED)


# --- what is refused, by what changed ---------------------------------------------


@pytest.mark.parametrize(
    ("module", "edit", "obj"),
    [
        (ARC_MODULE, EVICT_COMPARISON, "ARCCachePolicy.evict"),
        (ARC_MODULE, GHOST_ADAPTATION, "ARCCachePolicy._adapt_to_ghost_hit"),
        (BASE_MODULE, KEY_ORDER, "order_request_keys"),
        (BASE_MODULE, FIELD_ORDER, "ChunkStatus"),
        (ARC_MODULE, ORDERED_DICT, "OrderedDict"),
    ],
    ids=["evict", "ghost-hit", "order_request_keys", "ChunkStatus", "OrderedDict"],
)
def test_a_changed_object_is_refused_by_name(
    module: str,
    edit: tuple[str, str],
    obj: str,
    guard_each: Guard,
) -> None:
    guard_each.fake.install("0.35.0", edits={module: edit})
    message = refused(guard_each.routes())
    assert message == (
        "arc_cy: vLLM 0.35.0's ARC code is not code arc_cy verified: "
        f"`{obj}` ({guard_each.fake.files[module]}) differs from verified vLLM {INSTALLED}'s."
    )


def test_an_inherited_no_op_that_gains_a_body_is_refused(
    guard_each: Guard,
) -> None:
    base = _method_body(
        REAL[BASE_MODULE].read_text(), "on_request_access", "for key in keys:\n    self.get(key)\n"
    )
    guard_each.fake.install("0.35.0", sources={BASE_MODULE: base})
    message = refused(guard_each.routes())
    assert message.endswith(
        f"`CachePolicy.on_request_access` ({guard_each.fake.files[BASE_MODULE]}) differs from "
        f"verified vLLM {INSTALLED}'s."
    )


def test_a_new_method_is_refused_by_name(
    guard_each: Guard,
) -> None:
    guard_each.fake.install(
        "0.35.0",
        appended={ARC_MODULE: "\n    def pin(self, key):\n        self.t1.move_to_end(key)\n"},
    )
    message = refused(guard_each.routes())
    assert message.endswith(
        f"`ARCCachePolicy.pin` ({guard_each.fake.files[ARC_MODULE]}) is not in "
        f"verified vLLM {INSTALLED}'s."
    )


@pytest.mark.parametrize(
    ("caller", "line", "name", "why"),
    [
        (CPU_MANAGER, "manager._policy._adapt_to_ghost_hit(key)", "_adapt_to_ghost_hit", "beyond"),
        (TIERING_MANAGER, "len(manager._policy.t1)", "t1", "beyond"),
        (CPU_MANAGER, "manager._policy.touch([key], None)", "touch", "gone"),
    ],
    ids=["arc-only-method", "arc-only-state", "a-method-arc-lost"],
)
def test_a_caller_that_asks_more_than_cache_policy_is_refused(
    caller: str,
    line: str,
    name: str,
    why: str,
    guard_each: Guard,
) -> None:
    guard_each.fake.install(
        "0.35.0", appended={caller: f"\n\ndef _probe(manager, key):\n    {line}\n"}
    )
    message = refused(guard_each.routes())
    number = len(guard_each.fake.files[caller].read_text().splitlines())
    reason = {
        "beyond": "which an ARC policy has beyond base.py's CachePolicy",
        "gone": f"a method of verified vLLM {PREVIOUS}'s ARC that this vLLM's ARC lacks",
    }[why]
    assert message == (
        f"arc_cy: vLLM 0.35.0's ARC code is verified vLLM {INSTALLED}'s, but "
        f"{guard_each.fake.files[caller]}:{number} uses {name!r}, {reason}."
    )


# --- the callers: every way to reach the policy's names --------------------------

REACHES = {
    # the four caller forms of issue 26
    "annotated-parameter": "def _probe(policy: 'CachePolicy') -> int:\n    return len(policy.t1)\n",
    "walrus": "def _probe(manager):\n"
    "    if (policy := manager._policy) is not None:\n"
    "        return policy.t1\n",
    "tuple-assignment": "def _probe(manager):\n"
    "    policy, n = manager._policy, 1\n"
    "    return policy.t1\n",
    "for-target": "def _probe(managers):\n"
    "    for policy in (m._policy for m in managers):\n"
    "        return policy.t1\n",
    "helper-argument": "def _probe(manager):\n    return _helper(manager._policy)\n\n\n"
    "def _helper(x):\n    return x.t1\n",
    "string-attribute": "def _probe(manager):\n"
    "    return operator.attrgetter('t1')(manager._policy)\n",
    "arc_cy-only-attribute": "def _probe(manager):\n"
    "    return manager._policy._check_invariants()\n",
    # a class pattern keeps its keyword names in a tuple constant
    "class-pattern": "def _probe(manager):\n"
    "    match manager._policy:\n"
    "        case object(t1=lru):\n"
    "            return lru\n",
    # format strings reach attributes through their fields
    "format-field": "def _probe(manager):\n    return '{0.t1}'.format(manager._policy)\n",
    "formatter-field": "def _probe(manager):\n"
    "    import string\n"
    "    return string.Formatter().get_field('0.t1', (manager._policy,), {})\n",
}


@pytest.mark.parametrize("caller", [CPU_MANAGER, TIERING_MANAGER], ids=["cpu-manager", "tiering"])
@pytest.mark.parametrize("reach", sorted(REACHES))
def test_every_way_a_caller_reaches_the_policy_is_refused(
    reach: str,
    caller: str,
    guard: Guard,
) -> None:
    guard.fake.install("0.35.0", appended={caller: "\n\n" + REACHES[reach]})
    message = refused(guard.routes())
    name = "_check_invariants" if reach == "arc_cy-only-attribute" else "t1"
    lines = guard.fake.files[caller].read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if name in text and i > len(lines) - 8)
    assert (
        f"{guard.fake.files[caller]}:{line} uses {name!r}, which an ARC policy has beyond "
        "base.py's CachePolicy" in message
    )


@pytest.mark.parametrize(
    "call",
    [
        "getattr(manager._policy, name)",
        "hasattr(manager._policy, name)",
        "vars(manager._policy)",
        "manager._policy.__dict__",
        "('{0.' + name + '}').format(manager._policy)",
        "'{p.x}'.format_map({'p': manager._policy})",
    ],
)
def test_a_computed_attribute_name_is_refused(
    call: str,
    guard: Guard,
) -> None:
    guard.fake.install(
        "0.35.0", appended={CPU_MANAGER: f"\n\ndef _probe(manager, name):\n    return {call}\n"}
    )
    message = refused(guard.routes())
    assert "which reaches attributes by a computed name" in message


def test_a_name_no_arc_policy_has_behaves_alike_on_both(
    guard: Guard,
) -> None:
    # Missing on vLLM's arc and on arc_cy alike: nothing arc_cy could decide
    # differently (a release that adds it to ARC changes ARC's code).
    guard.fake.install(
        "0.35.0", appended={CPU_MANAGER: "\n\ndef _probe(m):\n    m._policy.pin(1)\n"}
    )
    accepted(guard.routes(), "0.35.0", INSTALLED)
    assert not hasattr(arc_cy.ARCCachePolicy, "pin")


# --- what cannot be judged is refused, and nothing raises -------------------------


def test_a_vllm_whose_policy_module_lacks_what_arc_cy_needs_is_refused(
    registry: dict, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # vllm imports, but its base.py gives no ChunkStatus (arc_cy fell back
    # to its stand-ins): unverified, never "no vLLM", and register() does
    # not raise (vLLM calls general plugins without a try).
    monkeypatch.setattr(_base, "HAVE_VLLM", False)
    monkeypatch.setattr(_base, "VLLM_IMPORT_ERROR", ImportError("cannot import name 'ChunkStatus'"))
    r = routes(monkeypatch, caplog, MODULES["python"])
    assert refused(r) == (
        f"arc_cy: vLLM {INSTALLED}'s ARC code is not code arc_cy verified: arc_cy cannot "
        "judge it: its policy module does not give arc_cy CachePolicy and ChunkStatus "
        "(ImportError: cannot import name 'ChunkStatus')."
    )


def _loaded_from(monkeypatch: pytest.MonkeyPatch, module: str, path: Path) -> None:
    """module is not imported yet, and an import would load it from path:
    the guard judges what that import would run."""

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, target_path=None, target=None):  # type: ignore[no-untyped-def]
            return importlib.util.spec_from_file_location(name, path) if name == module else None

    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, module)


def test_a_deep_ast_is_refused_without_raising(
    guard: Guard,
) -> None:
    guard.fake.write(appended={ARC_MODULE: "\nLIMIT = " + "- " * 1500 + "1\n"})
    _loaded_from(guard.monkeypatch, ARC_MODULE, guard.fake.files[ARC_MODULE])
    reset_guard(guard.monkeypatch)
    [record] = register(guard.caplog)
    assert record.levelno == logging.ERROR and "NOT registered" in record.getMessage()
    result = vllm_guard.result()
    assert result is not None and not result.ok
    assert result.unjudged or [c.name for c in result.changes] == ["arc.py:LIMIT"]
    with pytest.raises(RuntimeError):
        arc_cy.ARCCachePolicy(4)


@pytest.mark.parametrize("damage", ["truncated", "binary", "fifo", "directory", "missing"])
def test_a_damaged_source_neither_crashes_nor_hangs(
    damage: str,
    guard: Guard,
) -> None:
    guard.fake.write()
    arc = guard.fake.files[ARC_MODULE]
    if damage == "truncated":
        source = arc.read_text()
        arc.write_text(source[: source.index("def evict") + len("def ev")])
    elif damage == "binary":
        arc.write_bytes(b"\x00\xff" * 100)
    else:
        arc.unlink()
        if damage == "fifo":
            os.mkfifo(arc)
        elif damage == "directory":
            arc.mkdir()
    _loaded_from(guard.monkeypatch, ARC_MODULE, arc)
    reset_guard(guard.monkeypatch)
    [record] = register(guard.caplog)  # a FIFO's open would block: the guard never opens it
    assert record.levelno == logging.ERROR
    result = vllm_guard.result()
    assert result is not None and result.unjudged and not result.ok


# --- what runs is what was judged --------------------------------------------------


def _pyc_for(path: Path, code: CodeType | bytes) -> Path:
    """Write code as path's bytecode, with a header that matches path."""
    spec = importlib.util.spec_from_file_location("x", path)
    assert spec is not None and spec.cached is not None
    st = path.stat()
    data = code if isinstance(code, bytes) else marshal.dumps(code)
    header = _code_to_timestamp_pyc(compile("", "", "exec"), int(st.st_mtime), st.st_size)[:16]
    Path(spec.cached).parent.mkdir(exist_ok=True)
    Path(spec.cached).write_bytes(header + data)
    return Path(spec.cached)


def _replace_code(code: CodeType, qualname: str, **changes: object) -> CodeType:
    """code with the nested code object named qualname replaced."""
    if code.co_qualname == qualname:
        return code.replace(**changes)  # type: ignore[arg-type]
    consts = tuple(
        _replace_code(c, qualname, **changes) if isinstance(c, CodeType) else c
        for c in code.co_consts
    )
    return code.replace(co_consts=consts)


def _specialised(code: CodeType) -> bytes:
    """code marshalled, with evict's first LOAD_ATTR written as one of its
    specialised forms (what ``==`` and ``co_code`` read as the base)."""
    names = getattr(opcode, "_specialized_opmap", None) or getattr(dis, "_all_opmap", {})
    special = next(v for k, v in names.items() if k.startswith("LOAD_ATTR_"))
    data = marshal.dumps(code)
    evict = _find(code, "ARCCachePolicy.evict")
    raw = evict.co_code
    at = next(i for i in range(0, len(raw), 2) if raw[i] == opcode.opmap["LOAD_ATTR"])
    assert data.count(raw) == 1
    return data.replace(raw, raw[:at] + bytes([special]) + raw[at + 1 :])


def _find(code: CodeType, qualname: str) -> CodeType:
    todo = [code]
    while todo:
        c = todo.pop()
        if c.co_qualname == qualname:
            return c
        todo += [k for k in c.co_consts if isinstance(k, CodeType)]
    raise LookupError(qualname)


@pytest.mark.parametrize("craft", ["changed-decision", "stacksize", "qualname", "specialised"])
@pytest.mark.parametrize("imported", [False, True], ids=["not-imported", "imported"])
def test_bytecode_that_does_not_run_its_source_is_refused(
    craft: str,
    imported: bool,
    guard: Guard,
) -> None:
    # arc.py is the verified source; its .pyc, whose header matches it, runs
    # otherwise. Code equality (==) would pass all but the first.
    guard.fake.write()
    arc = guard.fake.files[ARC_MODULE]
    source = arc.read_text()
    good = compile(source, str(arc), "exec", dont_inherit=True)
    if craft == "changed-decision":
        pyc = _pyc_for(arc, compile(_edit(source, *EVICT_COMPARISON), str(arc), "exec"))
    elif craft == "stacksize":
        stack = _find(good, "ARCCachePolicy.evict").co_stacksize
        pyc = _pyc_for(arc, _replace_code(good, "ARCCachePolicy.evict", co_stacksize=stack - 1))
    elif craft == "qualname":
        pyc = _pyc_for(arc, _replace_code(good, "ARCCachePolicy.evict", co_qualname="evict"))
    else:
        pyc = _pyc_for(arc, _specialised(good))
    spec = importlib.util.spec_from_file_location(ARC_MODULE, arc)
    runs = spec.loader.get_code(ARC_MODULE)  # type: ignore[union-attr]
    if craft != "changed-decision":
        assert runs == good  # what the old check compared
    if imported:
        guard.fake.load("0.35.0")  # imports arc.py: from that .pyc
        assert sys.modules[ARC_MODULE].__spec__.cached == str(pyc)
    else:
        _loaded_from(guard.monkeypatch, ARC_MODULE, arc)
    message = refused(guard.routes())
    assert (
        f"the code that runs for {arc} is not its source's: the code its loader gives is "
        "not compiled from it" in message
    )


def test_a_monkeypatched_method_is_refused(
    guard: Guard,
) -> None:
    guard.fake.install("0.35.0")
    arc = sys.modules[ARC_MODULE]
    guard.monkeypatch.setattr(arc.ARCCachePolicy, "evict", lambda self, n, protected: None)
    message = refused(guard.routes())
    assert message.endswith(
        f"the code that runs for {guard.fake.files[ARC_MODULE]} is not its source's: "
        "ARCCachePolicy.evict runs code that is not its source's."
    )


@pytest.mark.parametrize("swap", ["no-spec", "no-file", "real-spec"])
def test_a_caller_module_swapped_into_sys_modules_is_judged_by_what_runs(
    swap: str,
    guard: Guard,
) -> None:
    guard.fake.install(
        "0.35.0", appended={CPU_MANAGER: "\n\ndef _probe(m):\n    return m._policy.t1\n"}
    )
    module = sys.modules[CPU_MANAGER]
    if swap == "no-spec":
        guard.monkeypatch.setattr(module, "__spec__", None)  # __file__ remains: judged by it
        expected = "uses 't1', which an ARC policy has beyond base.py's CachePolicy"
    elif swap == "no-file":
        guard.monkeypatch.setattr(module, "__spec__", None)
        guard.monkeypatch.delattr(module, "__file__")
        expected = f"cannot judge it: {CPU_MANAGER} is a module object with no Python source file"
    else:
        # The module that runs carries the real manager's spec and file.
        swapped = ModuleType(CPU_MANAGER)
        swapped.__dict__.update(module.__dict__)
        swapped.__spec__ = importlib.util.spec_from_file_location(CPU_MANAGER, REAL[CPU_MANAGER])
        swapped.__file__ = str(REAL[CPU_MANAGER])
        guard.monkeypatch.setitem(sys.modules, CPU_MANAGER, swapped)
        expected = "CPUOffloadingManager.__init__ runs code that is not its source's"
    reset_guard(guard.monkeypatch)
    [record] = register(guard.caplog)
    assert record.levelno == logging.ERROR
    assert expected in record.getMessage()


def test_a_same_size_edit_that_keeps_the_timestamp_is_refused(
    registry: dict, fake: FakeVllm
) -> None:
    # As `cp -p`, `rsync -t` or a normalising image build leave it: the
    # check reads the source, not its size and time.
    fake.install("0.35.0")
    assert _guard.check_vllm_code().ok  # type: ignore[union-attr]
    arc = fake.files[ARC_MODULE]
    before = arc.stat()
    old, new = EVICT_COMPARISON
    arc.write_text(_edit(arc.read_text(), old, new + " "))
    os.utime(arc, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert arc.stat().st_size == before.st_size
    result = _guard.check_vllm_code()
    assert result is not None and not result.ok
    assert [c.name for c in result.changes] == ["arc.py:ARCCachePolicy.evict"]


_OPENS: list[list[str]] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _OPENS and isinstance(args[0], str):
        _OPENS[-1].append(os.path.abspath(args[0]))


sys.addaudithook(_audit)  # audit hooks cannot be removed; it records only when asked


def test_no_cache_file_is_read_or_written(
    tmp_path: Path,
    guard: Guard,
) -> None:
    home = tmp_path / "home"
    guard.monkeypatch.setenv("HOME", str(home))
    guard.monkeypatch.setenv("XDG_CACHE_HOME", str(home / "xdg"))
    guard.fake.install("0.35.0")
    opened: list[str] = []
    _OPENS.append(opened)
    try:
        register(guard.caplog)
        policy = arc_cy.ARCCachePolicy(4)
    finally:
        _OPENS.pop()
    assert "arc_cy" in CachePolicyFactory._registry and policy.cache_capacity == 4
    assert not home.exists()
    assert set(map(str, guard.fake.files.values())) <= set(opened)


# --- the override, once per process, and no vLLM -----------------------------------


def test_override_registers_with_a_warning(
    guard: Guard,
) -> None:
    guard.fake.install("0.35.0", edits={ARC_MODULE: EVICT_COMPARISON})
    guard.monkeypatch.setenv(OVERRIDE_ENV, "1")
    records = register(guard.caplog)
    assert CachePolicyFactory.get_cache_policy_cls("arc_cy") is arc_cy.ARCCachePolicy
    assert [r.levelno for r in records] == [logging.WARNING, logging.INFO]
    assert (
        records[0]
        .getMessage()
        .startswith(
            f"arc_cy: using arc_cy on vLLM 0.35.0's unverified code because {OVERRIDE_ENV} is set "
            f"(`ARCCachePolicy.evict` ({guard.fake.files[ARC_MODULE]}) differs"
        )
    )
    assert records[1].getMessage().endswith("on vLLM 0.35.0: UNVERIFIED code")


@pytest.mark.parametrize("value", ["0", "false", "no", "off", ""])
def test_override_false_is_off(
    value: str,
    guard: Guard,
) -> None:
    guard.fake.install("0.35.0", edits={ARC_MODULE: EVICT_COMPARISON})
    guard.monkeypatch.setenv(OVERRIDE_ENV, value)
    refused(guard.routes())


def test_a_bad_override_value_does_not_raise_from_the_plugin(
    guard: Guard,
) -> None:
    guard.fake.install("0.35.0", edits={ARC_MODULE: EVICT_COMPARISON})
    guard.monkeypatch.setenv(OVERRIDE_ENV, "maybe")
    [record] = register(guard.caplog)
    assert record.levelno == logging.ERROR
    assert f"{OVERRIDE_ENV}='maybe' is not a boolean" in record.getMessage()
    with pytest.raises(ValueError, match="is not a boolean"):
        arc_cy.ARCCachePolicy(4)


def test_the_old_override_name_works_and_warns(
    guard: Guard,
) -> None:
    guard.fake.install("0.35.0", edits={ARC_MODULE: EVICT_COMPARISON})
    guard.monkeypatch.setenv(DEPRECATED_OVERRIDE_ENV, "1")
    with pytest.warns(FutureWarning, match=f"{DEPRECATED_OVERRIDE_ENV} is deprecated"):
        register(guard.caplog)
    assert "arc_cy" in CachePolicyFactory._registry


def test_the_check_runs_once_per_process(
    registry: dict,
    policy_cls: type,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = []
    real = _guard.check_vllm_code

    def counted() -> object:
        calls.append(1)
        return real()

    monkeypatch.setattr(_guard, "check_vllm_code", counted)
    register(caplog)
    assert "arc_cy" in CachePolicyFactory._registry and vllm_guard.pending
    policy_cls(4)
    assert not vllm_guard.pending
    policy_cls(4)
    register(caplog)
    assert len(calls) == 1


def test_without_vllm_nothing_is_checked() -> None:
    code = (
        "import sys; sys.modules['vllm'] = None\n"
        "import importlib, arc_cy, arc_cy._fingerprint as f\n"
        "from arc_cy._guard import vllm_guard\n"
        "def boom(*a, **k): raise AssertionError('checked')\n"
        "f.check_vllm_code = boom\n"
        f"for m in {[MODULES[name] for name in IMPLEMENTATIONS]}:\n"
        "    importlib.import_module(m).ARCCachePolicy(2)\n"
        "assert not arc_cy.HAVE_VLLM and not vllm_guard.pending\n"
        "print('ok', vllm_guard.result())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok None\n"


# --- the table, the names, the script ----------------------------------------------


@pytest.mark.compiled  # the names of both together
def test_policy_names_are_what_both_implementations_define() -> None:
    # The guard imports neither implementation: POLICY_NAMES stands for
    # them. (_abc_impl: ABC's bookkeeping, which every CachePolicy has.)
    from arc_cy import _arc_c, _arc_py

    for cls in (_arc_c.ARCCachePolicy, _arc_py.ARCCachePolicy):
        own = {
            name
            for klass in cls.__mro__
            if klass not in _base.CachePolicy.__mro__
            for name in vars(klass)
            if not (name.startswith("__") and name.endswith("__")) and name != "_abc_impl"
        }
        assert own <= _guard.POLICY_NAMES, sorted(own - _guard.POLICY_NAMES)
    both = {
        name
        for cls in (_arc_c.ARCCachePolicy, _arc_py.ARCCachePolicy)
        for klass in cls.__mro__
        if klass not in _base.CachePolicy.__mro__
        for name in vars(klass)
    }
    assert _guard.POLICY_NAMES <= both, sorted(_guard.POLICY_NAMES - both)


def test_the_check_reads_each_source_of_the_tree_once() -> None:
    # What it costs is measured in bench/guard.py, not here. It reads the
    # module files of vllm/v1/kv_offload (to find the callers), the judged
    # ones among them, and each once.
    opened: list[str] = []
    _OPENS.append(opened)
    try:
        assert _guard.check_vllm_code().ok  # type: ignore[union-attr]
    finally:
        _OPENS.pop()
    sources = [p for p in opened if p.endswith(".py")]
    tree = REAL[BASE_MODULE].parents[2]  # vllm/v1/kv_offload
    assert len(sources) == len(set(sources)), sources
    assert set(map(str, REAL.values())) <= set(sources)
    assert all(Path(p).is_relative_to(tree) for p in sources), sources


def test_fingerprint_script_prints_the_table_as_it_is(tmp_path: Path) -> None:
    # The installed release is in the table: the script, run on it, prints
    # arc_cy/_verified.py's table unchanged.
    proc = subprocess.run(
        [sys.executable, "-P", str(REPO / "tools" / "fingerprint.py")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"    its ARC code is verified vLLM {INSTALLED}'s\n" in proc.stdout
    assert "cpu/manager.py uses nothing the guard forbids" in proc.stdout
    table = (REPO / "arc_cy" / "_verified.py").read_text()
    printed = proc.stdout.partition("arc_cy/_verified.py, with these releases:\n\n")[2]
    assert printed.strip() and printed.strip() in table


def test_an_indented_docstring_is_not_a_use_on_every_python():
    """CPython 3.13 compiles a docstring with its indentation stripped
    (the AST keeps it): 0.34.0's tiering manager names touch in such a
    docstring, and 3.13 counted it as a use. A string that is not a
    docstring still is one."""
    import ast

    from arc_cy._fingerprint import names_used

    source = (
        "class Tier:\n"
        "    def release(self):\n"
        '        """Release writes.\n\n'
        "        Nothing here calls touch; the policy's get and remove do.\n"
        '        """\n'
        "        return self.policy.get\n"
    )
    code = compile(source, "tier.py", "exec")
    assert names_used(ast.parse(source), code, {"touch", "get"}) == {"get": 7}
    used = source.replace("return self.policy.get", "return 'touch'")
    assert names_used(ast.parse(used), compile(used, "tier.py", "exec"), {"touch"}) == {"touch": 7}


# --- what runs is judged as it is bound (issue 46) ----------------------------------


def _arc_copy() -> tuple[ModuleType, object, CodeType]:
    """A fresh copy of the installed arc.py's module (not in sys.modules),
    its tree and its code: what the live check is given."""
    import ast

    spec = importlib.util.spec_from_file_location(ARC_MODULE, REAL[ARC_MODULE])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tree = ast.parse(REAL[ARC_MODULE].read_bytes())
    code = compile(tree, str(REAL[ARC_MODULE]), "exec", dont_inherit=True)
    assert _fingerprint._live_problems(ARC_MODULE, module, tree, code) == []
    return module, tree, code


def _cell(value: object) -> object:
    return (lambda: value).__closure__[0]  # type: ignore[index]


def _patches(f: object) -> dict[str, object]:
    """Every way to bind, in a method's place, something that is not the
    function its source compiles to (with the same code where it can)."""
    import functools
    from types import FunctionType

    assert isinstance(f, FunctionType)

    def copy(**changes: object) -> FunctionType:
        g = FunctionType(
            f.__code__,
            changes.get("globals", f.__globals__),  # type: ignore[arg-type]
            f.__name__,
            f.__defaults__,
            changes.get("closure", f.__closure__),  # type: ignore[arg-type]
        )
        g.__kwdefaults__ = f.__kwdefaults__
        return g

    out: dict[str, object] = {
        "wraps": functools.wraps(f)(lambda *a, **k: f(*a, **k)),
        "other-globals": copy(globals=dict(f.__globals__)),
        "staticmethod": staticmethod(f),
        "classmethod": classmethod(f),
        "property": property(f),
        "partialmethod": functools.partialmethod(f),
    }
    defaults = copy()
    defaults.__defaults__ = (*(f.__defaults__ or ()), None)
    out["defaults"] = defaults
    kwdefaults = copy()
    kwdefaults.__kwdefaults__ = {**(f.__kwdefaults__ or {}), "extra": None}
    out["kwdefaults"] = kwdefaults
    if f.__code__.co_freevars == ("__class__",):
        out["closure"] = copy(closure=(_cell(object),))
    return out


def test_every_method_patched_in_any_way_is_refused() -> None:
    # Each method of vLLM's ARCCachePolicy, each patch: refused, by name,
    # whatever the patch wraps (a __wrapped__ chain is never followed).
    from types import FunctionType

    module, tree, code = _arc_copy()
    cls = module.ARCCachePolicy
    methods = {k: v for k, v in vars(cls).items() if type(v) is FunctionType}
    assert {"evict", "insert", "__init__"} <= set(methods)
    kinds = set()
    for name, f in methods.items():
        for kind, patch in _patches(f).items():
            kinds.add(kind)
            setattr(cls, name, patch)
            try:
                problems = _fingerprint._live_problems(ARC_MODULE, module, tree, code)
            finally:
                setattr(cls, name, f)
            assert any(p.startswith(f"ARCCachePolicy.{name} ") for p in problems), (name, kind)
    assert "closure" in kinds  # (a method with super() has one)


def test_a_global_its_source_does_not_bind_is_refused() -> None:
    # Every builtin name (each shadows the builtin for every method), and
    # any other name.
    import builtins

    module, tree, code = _arc_copy()
    for name in [*dir(builtins), "anything"]:
        if name in vars(module):
            continue  # (__name__, __doc__, ...: the module's own)
        setattr(module, name, object())
        try:
            problems = _fingerprint._live_problems(ARC_MODULE, module, tree, code)
        finally:
            delattr(module, name)
        assert f"{name} is a global that its source does not bind" in problems, name


def test_a_class_attribute_its_source_does_not_define_is_refused() -> None:
    # A data descriptor, a plain value or a function: whatever the name.
    module, tree, code = _arc_copy()
    cls = module.ARCCachePolicy
    names = sorted(_guard.POLICY_NAMES | {"__getattribute__", "__setattr__", "__getattr__"})
    for name in names:
        for value in (property(lambda self: 0), 0, lambda self: None):
            before = vars(cls).get(name, _MISSING)
            setattr(cls, name, value)
            try:
                problems = _fingerprint._live_problems(ARC_MODULE, module, tree, code)
            finally:
                if before is _MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, before)
            assert any(p.startswith(f"ARCCachePolicy.{name} ") for p in problems), (name, value)


_MISSING = object()
HELD = [
    h for h in _guard.HOLDERS if "order_request_keys" in vars(sys.modules.get(h) or ModuleType("x"))
]


@pytest.mark.parametrize("holder", HELD)
def test_an_order_request_keys_replaced_before_arc_cy_imported_is_refused(
    holder: str, registry: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    import functools

    real = sys.modules[BASE_MODULE].order_request_keys
    wrapper = functools.wraps(real)(lambda *a, **k: list(reversed(real(*a, **k))))
    monkeypatch.setattr(sys.modules[holder], "order_request_keys", wrapper)
    result = _guard.check_vllm_code()
    assert result is not None and not result.ok
    assert any(holder in what and "replaced before arc_cy" in what for _, what in result.not_source)


@pytest.mark.parametrize(
    "replacement", ["arc_cy._arc_c", "arc_cy._arc_py", "vllm.v1.kv_offload.cpu.policies.lru"]
)
def test_arc_replaced_by_another_class_is_said_once(
    replacement: str,
    guard: Guard,
) -> None:
    if replacement == "arc_cy._arc_c" and "cython" not in IMPLEMENTATIONS:
        replacement = "arc_cy._arc_py"
    guard.fake.install("0.35.0")
    module = importlib.import_module(replacement)
    cls = next(
        v for k, v in vars(module).items() if k.endswith("CachePolicy") and k != "CachePolicy"
    )
    guard.monkeypatch.setattr(sys.modules[ARC_MODULE], "ARCCachePolicy", cls)
    message = refused(guard.routes())
    said = (
        f"ARCCachePolicy is {cls.__module__}.{cls.__qualname__}, not the class its source defines"
    )
    assert message.count(said) == 1 and "is missing" not in message, message
    advice = '"eviction_policy": "arc_cy"'
    assert (advice in message) == replacement.startswith("arc_cy"), message


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink-to-fifo"])
@pytest.mark.parametrize("imported", [False, True], ids=["not-imported", "imported"])
def test_a_bytecode_cache_that_is_not_a_regular_file_is_never_opened(
    kind: str, imported: bool, registry: dict, fake: FakeVllm, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    fake.write()
    arc = fake.files[ARC_MODULE]
    if imported:
        fake.load("0.35.0")
    else:
        _loaded_from(monkeypatch, ARC_MODULE, arc)
    cache = Path(importlib.util.cache_from_source(str(arc)))
    cache.parent.mkdir(exist_ok=True)
    if cache.exists():
        cache.unlink()
    if kind == "directory":
        cache.mkdir()
    else:
        fifo = cache if kind == "fifo" else cache.with_name("elsewhere")
        os.mkfifo(fifo)
        if kind == "symlink-to-fifo":
            cache.symlink_to(fifo)
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.append(_guard.check_vllm_code()), daemon=True)
    worker.start()
    worker.join(60)
    assert results, "the check hangs on the bytecode cache"
    result = results[0]
    assert result is not None and not result.ok  # type: ignore[attr-defined]
    assert result.unjudged == (f"its bytecode cache {cache} is not a regular file",)  # type: ignore[attr-defined]


def test_a_tiering_package_that_fails_to_import_does_not_refuse(
    registry: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tier backend's optional dependency missing: the tiering package's
    # __init__ raises. The guard imports nothing: it finds the tiering
    # manager's file in its package's directory and judges it.
    package = TIERING_MANAGER.rpartition(".")[0]

    class Broken(importlib.abc.Loader):
        def create_module(self, spec):  # type: ignore[no-untyped-def]
            return None

        def exec_module(self, module):  # type: ignore[no-untyped-def]
            raise ImportError("No module named 'an_optional_backend'")

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, target_path=None, target=None):  # type: ignore[no-untyped-def]
            if name == package:
                return importlib.util.spec_from_loader(name, Broken(), is_package=True)
            return None

    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    with pytest.raises(ImportError):
        importlib.import_module(TIERING_MANAGER)
    result = _guard.check_vllm_code()
    assert result is not None and result.ok, _guard.reasons(result)  # type: ignore[arg-type]
    assert package not in sys.modules


def test_a_caller_moved_in_the_tree_is_judged(
    registry: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A release that moves the CPU manager (cpu/offloading_manager.py, in
    # another directory of the kv_offload package) is judged there.
    import vllm.v1.kv_offload as kv_offload

    extra = tmp_path / "kv_offload"
    (extra / "cpu").mkdir(parents=True)
    (extra / "cpu" / "__init__.py").touch()
    moved = extra / "cpu" / "offloading_manager.py"
    moved.write_text(
        REAL[CPU_MANAGER].read_text()
        + "\n\ndef _probe(self, key):\n    self._policy.t1.move_to_end(key)\n"
    )
    monkeypatch.setattr(kv_offload, "__path__", [*kv_offload.__path__, str(extra)])
    result = _guard.check_vllm_code()
    assert result is not None and not result.ok
    line = len(moved.read_text().splitlines())
    assert [(u.name, u.path, u.line) for u in result.uses] == [("t1", str(moved), line)]
