"""The vLLM code guard: arc_cy runs on the vLLM code it verified, not on a
version string, whichever route builds its policy.

The fake vLLMs here are the installed vLLM (0.33.0) with some of its policy
modules replaced by files in a temporary tree: those modules, as
``sys.modules`` holds them, are the temporary files (tests/test_self_check.py does
the same through an overlay on PYTHONPATH, in subprocesses).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from importlib import metadata
from importlib._bootstrap_external import _code_to_timestamp_pyc  # type: ignore[attr-defined]
from pathlib import Path

import pytest

pytest.importorskip("vllm")

import vllm
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

import arc_cy
from arc_cy import _fingerprint, plugin
from arc_cy._compat import (
    DEPRECATED_OVERRIDE_ENV,
    OVERRIDE_ENV,
    SUPPORTED_VLLM,
    VERIFIED_VLLM,
    vllm_guard,
)
from arc_cy._fingerprint import (
    ARC_MODULE,
    BASE_MODULE,
    CALLER_MODULES,
    check_vllm_code,
    fingerprint_source,
)
from helpers import REPO

CPU_MANAGER, TIERING_MANAGER = CALLER_MODULES
MODULES = (ARC_MODULE, BASE_MODULE, *CALLER_MODULES)
# The installed (real) files, found before any test replaces a module.
REAL = {m: Path(str(_fingerprint.module_spec(m).origin)) for m in MODULES}  # type: ignore[union-attr]
INSTALLED_VLLM = metadata.version("vllm")

# One changed line of ARC decision code: T1 is chosen only when strictly
# larger than its target.
ARC_DECISION = (
    "if virtual_t1_size >= int(self.target_t1_size):",
    "if virtual_t1_size > int(self.target_t1_size):",
)
# vLLM PR 57813's shape: evict takes the chunks to evict last.
BASE_EVICT = (
    "self, n: int, protected: set[OffloadKey]\n",
    "self, n: int, protected: set[OffloadKey], "
    "deprioritized: frozenset[OffloadKey] = frozenset()\n",
)
# A caller that reads the ARC policy's own state (what vLLM's arc.py has
# beyond base.py's CachePolicy).
MANAGER_CALL = (
    "self._policy.touch(keys, req_context)",
    "len(self._policy.t1); self._policy.touch(keys, req_context)",
)
PRIMARY_TIER_CALL = (
    "return self._prepare_load(keys, req_context, record_access=False)",
    "len(self._policy.t1); return self._prepare_load(keys, req_context, record_access=False)",
)


def _edit(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"{old!r} is not once in the file"
    return source.replace(old, new)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """vLLM's policy registry, emptied of arc_cy, and the guard, not yet
    run, for this test only."""
    fresh = {k: v for k, v in CachePolicyFactory._registry.items() if k != "arc_cy"}
    monkeypatch.setattr(CachePolicyFactory, "_registry", fresh)
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    monkeypatch.delenv(DEPRECATED_OVERRIDE_ENV, raising=False)
    for name, value in (("pending", True), ("_result", None), ("_warned", False)):
        monkeypatch.setattr(vllm_guard, name, value)
    return fresh


class FakeVllm:
    """The installed vLLM, with its policy modules (arc.py, base.py and the
    callers) replaced by copies in a temporary tree, some of them edited."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.monkeypatch = monkeypatch
        self.root = root
        self.files: dict[str, Path] = {}

    def install(
        self,
        version: str,
        edits: dict[str, tuple[str, str]] | None = None,
        appended: dict[str, str] | None = None,
    ) -> FakeVllm:
        self.monkeypatch.setattr(vllm, "__version__", version)
        for module in MODULES:
            source = REAL[module].read_text()
            if edits and module in edits:
                source = _edit(source, *edits[module])
            source += (appended or {}).get(module, "")
            path = self.root.joinpath(*module.split(".")).with_suffix(".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
            spec = importlib.util.spec_from_file_location(module, path)
            assert spec is not None
            # Not executed: the guard reads a module's file and the code its
            # loader gives, never the module's objects.
            self.monkeypatch.setitem(sys.modules, module, importlib.util.module_from_spec(spec))
            self.files[module] = path
        return self


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeVllm:
    return FakeVllm(monkeypatch, tmp_path / "site")


def register(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        plugin.register()
    return [r for r in caplog.records if r.name == plugin.logger.name]


def registered() -> bool:
    return "arc_cy" in CachePolicyFactory._registry


def refusal(records: list[logging.LogRecord]) -> str:
    """The plugin's refusal (it registered nothing), less its last sentence."""
    assert not registered()
    [record] = records
    assert record.levelno == logging.ERROR
    message, sep, _ = record.getMessage().rpartition(" The 'arc_cy' cache policy")
    assert sep and record.getMessage().endswith("cache policy is NOT registered.")
    assert "`.ci/vllm_compat.sh VERSION`" in message
    assert f"{OVERRIDE_ENV}=1" in message
    return message


# --- registration -------------------------------------------------------------


def test_registers_on_the_installed_vllm(
    registry: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    [record] = register(caplog)
    assert CachePolicyFactory.get_cache_policy_cls("arc_cy") is arc_cy.ARCCachePolicy
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "arc_cy: registered CPU offloading cache policy 'arc_cy' "
        f"({arc_cy.IMPLEMENTATION} implementation) on vLLM {INSTALLED_VLLM}: its "
        f"ARC and policy interface are those of verified vLLM {INSTALLED_VLLM}"
    )


@pytest.mark.parametrize("version", ["0.34.0", "0.29.1", "0.35.0.dev12+g0123abc", "unknown"])
def test_a_verified_releases_code_registers_whatever_the_version(
    version: str,
    registry: dict[str, object],
    fake: FakeVllm,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.install(version)
    [record] = register(caplog)
    assert registered()
    assert record.levelno == logging.INFO
    assert record.getMessage().endswith(
        f"on vLLM {version}: its ARC and policy interface are those of verified vLLM 0.33.0"
    )


def test_comments_docstrings_and_formatting_do_not_count(
    registry: dict[str, object], fake: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    fake.install(
        "0.34.0",
        {
            ARC_MODULE: (
                "delta = max(1, len(self.b2) / len(self.b1))",
                "delta = max(1,\n                        len(self.b2)/len(self.b1))  # reformatted",
            ),
            BASE_MODULE: (
                '"""Find chunk in data structures. Returns None if not present."""',
                '"""Another docstring."""\n        # and a comment',
            ),
        },
    )
    register(caplog)
    assert registered()


def test_a_changed_line_of_arc_decision_code_is_refused(
    registry: dict[str, object], fake: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    fake.install("0.33.0+local", {ARC_MODULE: ARC_DECISION})
    message = refusal(register(caplog))
    assert message.startswith(
        "arc_cy: vLLM 0.33.0+local's policy code is not what arc_cy has verified: "
        f"its arc.py ({fake.files[ARC_MODULE]}) differs from that of vLLM "
        "0.33.0, the nearest verified release."
    )
    assert "base.py" not in message.partition(". ")[0]


def test_a_base_that_adds_a_parameter_to_evict_is_refused(
    registry: dict[str, object], fake: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    fake.install("0.33.0", {BASE_MODULE: BASE_EVICT})
    message = refusal(register(caplog))
    assert (
        f"its base.py ({fake.files[BASE_MODULE]}) differs from that of vLLM 0.33.0, "
        "the nearest verified release." in message
    )
    assert "arc.py" not in message


@pytest.mark.parametrize(
    ("caller", "edit"),
    [(CPU_MANAGER, MANAGER_CALL), (TIERING_MANAGER, PRIMARY_TIER_CALL)],
    ids=["cpu-manager", "tiering-primary-tier"],
)
def test_a_caller_that_uses_what_base_lacks_is_refused(
    caller: str,
    edit: tuple[str, str],
    registry: dict[str, object],
    fake: FakeVllm,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.install("0.33.0", {caller: edit})
    message = refusal(register(caplog))
    line = next(
        i
        for i, text in enumerate(fake.files[caller].read_text().splitlines(), 1)
        if "self._policy.t1" in text
    )
    assert (
        f"verified: {fake.files[caller]}:{line} uses 't1', which an ARC policy "
        "has beyond base.py's CachePolicy." in message
    )
    assert "differs" not in message  # arc.py and base.py are 0.33.0's


def test_the_nearest_verified_release(fake: FakeVllm) -> None:
    # A table where 0.31.0's arc.py is the patched one: the installed pair
    # (patched arc.py, 0.33.0's base.py) mixes two verified releases, each
    # sharing one file with it. The nearest is the newest of those that is
    # not newer than the version (else the oldest).
    fake.install("0.33.0", {ARC_MODULE: ARC_DECISION})
    patched = fingerprint_source(fake.files[ARC_MODULE].read_text())
    table = {**VERIFIED_VLLM, "0.31.0": {**VERIFIED_VLLM["0.31.0"], "arc.py": patched}}
    for version, nearest, differing in [
        ("0.33.0+local", "0.33.0", "arc.py"),
        ("0.32.5", "0.31.0", "base.py"),
        ("0.29.0", "0.31.0", "base.py"),
    ]:
        result = check_vllm_code(version, table)
        assert not result.ok and result.matches == ()
        assert result.nearest == nearest, version
        assert [name for name, _ in result.differing] == [differing], version
    assert check_vllm_code("0.33.0").nearest == "0.33.0"


def test_override_registers_with_a_warning(
    registry: dict[str, object],
    fake: FakeVllm,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.install("0.33.0+local", {ARC_MODULE: ARC_DECISION})
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    records = register(caplog)
    assert CachePolicyFactory.get_cache_policy_cls("arc_cy") is arc_cy.ARCCachePolicy
    assert [r.levelno for r in records] == [logging.WARNING, logging.INFO]
    warning = records[0].getMessage()
    assert warning.startswith(
        "arc_cy: using arc_cy on vLLM 0.33.0+local's unverified policy code "
        f"because {OVERRIDE_ENV} is set (its arc.py "
    )
    assert records[1].getMessage().endswith("on vLLM 0.33.0+local: UNVERIFIED code")


@pytest.mark.parametrize("value", ["0", "false", "no", "off", ""])
def test_override_false_is_off(
    value: str,
    registry: dict[str, object],
    fake: FakeVllm,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.install("0.33.0", {BASE_MODULE: BASE_EVICT})
    monkeypatch.setenv(OVERRIDE_ENV, value)
    refusal(register(caplog))


def test_the_old_override_name_works_and_warns(
    registry: dict[str, object],
    fake: FakeVllm,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.install("0.33.0+local", {ARC_MODULE: ARC_DECISION})
    monkeypatch.setenv(DEPRECATED_OVERRIDE_ENV, "1")
    with pytest.warns(
        FutureWarning, match=f"{DEPRECATED_OVERRIDE_ENV} is deprecated; set {OVERRIDE_ENV} instead"
    ):
        register(caplog)
    assert registered()


# --- the fingerprints -----------------------------------------------------------


def test_fingerprint_is_of_the_code() -> None:
    source = REAL[ARC_MODULE].read_text()
    same = fingerprint_source(source)
    assert fingerprint_source(source.replace("\n", "  # a comment\n", 3)) == same
    assert fingerprint_source(source.replace("B1/B2", "the ghost lists", 1)) == same
    assert fingerprint_source(source.encode()) == same
    assert fingerprint_source(_edit(source, *ARC_DECISION)) != same


def test_the_table_has_the_installed_release() -> None:
    # The fingerprints of the vLLM that the suite runs on, as installed,
    # are that release's entry: the table is the code, not a guess.
    result = check_vllm_code(INSTALLED_VLLM)
    assert result.ok, result
    assert INSTALLED_VLLM in result.matches


def test_the_table_and_supported_vllm_agree() -> None:
    # SUPPORTED_VLLM (what the [vllm] extra installs) spans exactly the
    # verified releases: from the oldest to the newest's minor series, with
    # every minor series in between verified.
    releases = sorted(map(Version, VERIFIED_VLLM))
    oldest, newest = releases[0], releases[-1]
    assert SpecifierSet(SUPPORTED_VLLM) == SpecifierSet(
        f">={oldest},<{newest.major}.{newest.minor + 1}"
    )
    assert all(r in SpecifierSet(SUPPORTED_VLLM) for r in releases)
    assert {(r.major, r.minor) for r in releases} == {
        (oldest.major, m) for m in range(oldest.minor, newest.minor + 1)
    }
    for fingerprints in VERIFIED_VLLM.values():
        assert sorted(fingerprints) == ["arc.py", "base.py"]


def test_fingerprint_script_prints_the_installed_releases_entry(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-P", str(REPO / ".ci" / "fingerprint.py")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entry = VERIFIED_VLLM[INSTALLED_VLLM]
    assert (
        f'    "{INSTALLED_VLLM}": {{\n'
        f'        "arc.py": "{entry["arc.py"]}",\n'
        f'        "base.py": "{entry["base.py"]}",\n'
        "    },\n"
    ) in proc.stdout
    assert (
        "cpu/manager.py uses nothing that vLLM's ARC policy has beyond base.py's "
        "CachePolicy, and no computed attribute name" in proc.stdout
    )


def test_fingerprint_script_fails_on_a_caller_that_uses_what_base_lacks(
    tmp_path: Path,
) -> None:
    for module in MODULES:
        path = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        source = REAL[module].read_text()
        path.write_text(_edit(source, *MANAGER_CALL) if module == CPU_MANAGER else source)
    proc = subprocess.run(
        [sys.executable, "-P", str(REPO / ".ci" / "fingerprint.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "cpu/manager.py uses what base.py's CachePolicy does not define: 't1'" in proc.stdout


# --- both routes: the constructors -------------------------------------------


def test_the_module_path_route_refuses_unverified_code(
    registry: dict[str, object],
    fake: FakeVllm,
    policy_cls: type,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # "eviction_policy": "ARCCachePolicy", "cache_policy_module_path":
    # "arc_cy" never runs the plugin: the constructor refuses, with the
    # plugin's message and override.
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    fake.install("0.33.0+local", {ARC_MODULE: ARC_DECISION})
    with pytest.raises(RuntimeError) as refused:
        CPUOffloadingManager(
            num_chunks=4, cache_policy="ARCCachePolicy", cache_policy_module_path="arc_cy"
        )
    with pytest.raises(RuntimeError) as direct:
        policy_cls(4)
    assert str(direct.value) == str(refused.value)
    assert str(refused.value) == refusal(register(caplog))
    assert f"its arc.py ({fake.files[ARC_MODULE]}) differs" in str(refused.value)


def test_the_override_lets_the_constructor_build(
    registry: dict[str, object],
    fake: FakeVllm,
    policy_cls: type,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.install("0.33.0+local", {ARC_MODULE: ARC_DECISION})
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        policy_cls(4)
        policy_cls(4)
    [warning] = [r for r in caplog.records if r.name == plugin.logger.name]
    assert warning.levelno == logging.WARNING
    assert warning.getMessage().startswith("arc_cy: using arc_cy on vLLM 0.33.0+local")


def test_the_check_runs_once_per_process(
    registry: dict[str, object],
    policy_cls: type,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = []
    real = _fingerprint.check_vllm_code

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_fingerprint, "check_vllm_code", counted)
    register(caplog)
    assert registered() and vllm_guard.pending
    policy_cls(4)
    assert not vllm_guard.pending
    policy_cls(4)
    register(caplog)
    assert len(calls) == 1


def test_without_vllm_nothing_is_checked() -> None:
    # A Python where vllm does not import: arc_cy's stand-ins, and no check.
    code = (
        "import sys; sys.modules['vllm'] = None\n"
        "import arc_cy, arc_cy._fingerprint as f, arc_cy._arc_py as py\n"
        "from arc_cy._compat import vllm_guard\n"
        "def boom(*a, **k): raise AssertionError('checked')\n"
        "f.check_vllm_code = boom\n"
        "arc_cy.ARCCachePolicy(2); py.ARCCachePolicy(2)\n"
        "assert not arc_cy.HAVE_VLLM and not vllm_guard.pending\n"
        "print('ok', vllm_guard.result())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok None\n"


# --- no cache: each check reads the files -------------------------------------


def test_a_same_size_edit_that_keeps_the_timestamp_is_refused(
    registry: dict[str, object], fake: FakeVllm
) -> None:
    # As `cp -p`, `rsync -t` or a normalising image build leave it.
    fake.install("0.34.0")
    assert check_vllm_code("0.34.0").ok
    arc = fake.files[ARC_MODULE]
    before = arc.stat()
    old, new = ARC_DECISION
    arc.write_text(_edit(arc.read_text(), old, new + " "))
    os.utime(arc, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert arc.stat().st_size == before.st_size
    result = check_vllm_code("0.34.0")
    assert not result.ok and [n for n, _ in result.differing] == ["arc.py"]


def test_no_cache_file_is_read_or_written(
    registry: dict[str, object],
    fake: FakeVllm,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What a damaged cache (deep JSON, a FIFO) could do needs a cache file.
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "xdg"))
    fake.install("0.34.0")
    opened: list[str] = []
    with _recording_opens(opened):
        register(caplog)
        policy = arc_cy.ARCCachePolicy(4)
    assert registered() and policy.cache_capacity == 4
    assert not home.exists()
    assert opened and not [p for p in opened if p.startswith(str(home))]
    assert set(map(str, fake.files.values())) & set(opened)


_OPENS: list[list[str]] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _OPENS and isinstance(args[0], str):
        _OPENS[-1].append(os.path.abspath(args[0]))


sys.addaudithook(_audit)  # audit hooks cannot be removed; it records only in the block


class _recording_opens:
    def __init__(self, into: list[str]) -> None:
        self.into = into

    def __enter__(self) -> None:
        _OPENS.append(self.into)

    def __exit__(self, *exc: object) -> None:
        _OPENS.pop()


# --- the code that runs: a stale .pyc -------------------------------------------


def test_a_stale_pyc_that_changes_decisions_is_refused(
    registry: dict[str, object],
    fake: FakeVllm,
    policy_cls: type,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # arc.py is the verified source, but its .pyc, whose header matches that
    # source's mtime and size, holds changed evict decisions: it is what
    # Python runs.
    fake.install("0.34.0")
    arc = fake.files[ARC_MODULE]
    changed = compile(_edit(arc.read_text(), *ARC_DECISION), str(arc), "exec")
    spec = importlib.util.spec_from_file_location(ARC_MODULE, arc)
    assert spec is not None and spec.cached is not None and spec.loader is not None
    st = arc.stat()
    Path(spec.cached).parent.mkdir(exist_ok=True)
    Path(spec.cached).write_bytes(_code_to_timestamp_pyc(changed, int(st.st_mtime), st.st_size))
    assert spec.loader.get_code(ARC_MODULE) == changed  # type: ignore[attr-defined]
    assert fingerprint_source(arc.read_text()) == VERIFIED_VLLM["0.33.0"]["arc.py"]

    message = refusal(register(caplog))
    assert message.startswith(
        "arc_cy: vLLM 0.34.0's policy code is not what arc_cy has verified: the "
        f"code Python runs for {arc} ({spec.cached}) is not compiled from that source."
    )
    with pytest.raises(RuntimeError, match="is not compiled from that source"):
        policy_cls(4)


# --- the callers: no scan to escape ---------------------------------------------

# Ways a caller in vLLM's style reaches its policy, each reading t1 (vLLM
# arc's own state); the first four escaped the scan of attribute chains.
REACHES = {
    "annotated-parameter": "def _probe(policy: CachePolicy) -> int:\n    return len(policy.t1)\n",
    "walrus": "def _probe(manager):\n"
    "    if (policy := manager._policy) is not None:\n"
    "        return policy.t1\n",
    "tuple-assignment": "def _probe(manager):\n"
    "    policy, n = manager._policy, 1\n"
    "    return policy.t1\n",
    "for-target": "def _probe(managers):\n"
    "    for policy in (m._policy for m in managers):\n"
    "        return policy.t1\n",
    "helper-argument": "def _probe(manager):\n"
    "    return _helper(manager._policy)\n\n\n"
    "def _helper(x):\n"
    "    return x.t1\n",
    "string-attribute": "def _probe(manager):\n"
    "    return operator.attrgetter('t1')(manager._policy)\n",
    "arc_cy-only-attribute": "def _probe(manager):\n"
    "    return manager._policy._check_invariants()\n",
}


@pytest.mark.parametrize("caller", CALLER_MODULES, ids=["cpu-manager", "tiering"])
@pytest.mark.parametrize("reach", sorted(REACHES))
def test_every_way_a_caller_reaches_the_policy_is_refused(
    reach: str,
    caller: str,
    registry: dict[str, object],
    fake: FakeVllm,
    caplog: pytest.LogCaptureFixture,
) -> None:
    code = "\n\n" + REACHES[reach]
    fake.install("0.33.0", appended={caller: code})
    message = refusal(register(caplog))
    name = "_check_invariants" if reach == "arc_cy-only-attribute" else "t1"
    lines = fake.files[caller].read_text().splitlines()
    line = max(i for i, text in enumerate(lines, 1) if name in text)
    assert (
        f"{fake.files[caller]}:{line} uses {name!r}, which an ARC "
        "policy has beyond base.py's CachePolicy." in message
    )


@pytest.mark.parametrize(
    "call",
    [
        "getattr(manager._policy, name)",
        "hasattr(manager._policy, name)",
        "vars(manager._policy)",
        "manager._policy.__dict__",
    ],
)
def test_a_computed_attribute_name_is_refused(
    call: str, registry: dict[str, object], fake: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    fake.install(
        "0.33.0",
        appended={CALLER_MODULES[0]: f"\n\ndef _probe(manager, name):\n    return {call}\n"},
    )
    message = refusal(register(caplog))
    assert "which reaches attributes by a computed name" in message


def test_a_name_no_arc_policy_has_behaves_alike_on_both(
    registry: dict[str, object], fake: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    # Missing on vLLM's arc and on arc_cy alike: nothing that arc_cy could
    # decide differently (a release that adds it to arc.py or base.py
    # changes their fingerprints).
    fake.install(
        "0.33.0", {CPU_MANAGER: (MANAGER_CALL[0], "self._policy.pin(keys); " + MANAGER_CALL[0])}
    )
    register(caplog)
    assert registered()
    assert not hasattr(arc_cy.ARCCachePolicy, "pin")
