"""The vLLM code guard: arc_cy registers on the vLLM code it verified, not
on a version string.

The fake vLLMs here are the installed vLLM (0.33.0) with some of its policy
modules replaced by files in a temporary tree: those modules, as
``sys.modules`` holds them, are the temporary files (tests/test_main.py does
the same through an overlay on PYTHONPATH, in subprocesses).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import vllm
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

import arc_cy
from arc_cy import _fingerprint, plugin
from arc_cy._compat import OVERRIDE_ENV, SUPPORTED_VLLM, VERIFIED_VLLM
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
REAL = {m: Path(str(_fingerprint.module_file(m))) for m in MODULES}
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
MANAGER_CALL = (
    "self._policy.touch(keys, req_context)",
    "self._policy.pin_in_flight_chunks(keys); self._policy.touch(keys, req_context)",
)
PRIMARY_TIER_CALL = (
    "return self._prepare_load(keys, req_context, record_access=False)",
    "self._policy.pin_in_flight_chunks(keys); "
    "return self._prepare_load(keys, req_context, record_access=False)",
)


def _edit(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"{old!r} is not once in the file"
    return source.replace(old, new)


@pytest.fixture
def registry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> dict[str, object]:
    """vLLM's policy registry, emptied of arc_cy for this test only; the
    guard's cache in a temporary directory."""
    fresh = {k: v for k, v in CachePolicyFactory._registry.items() if k != "arc_cy"}
    monkeypatch.setattr(CachePolicyFactory, "_registry", fresh)
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return fresh


class FakeVllm:
    """The installed vLLM, with its policy modules (arc.py, base.py and the
    callers) replaced by copies in a temporary tree, some of them edited."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.monkeypatch = monkeypatch
        self.root = root
        self.files: dict[str, Path] = {}

    def install(
        self, version: str, edits: dict[str, tuple[str, str]] | None = None
    ) -> FakeVllm:
        self.monkeypatch.setattr(vllm, "__version__", version)
        for module in MODULES:
            source = REAL[module].read_text()
            if edits and module in edits:
                source = _edit(source, *edits[module])
            path = self.root.joinpath(*module.split(".")).with_suffix(".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
            spec = importlib.util.spec_from_file_location(module, path)
            assert spec is not None
            # Not executed: the guard reads a module's file, never its objects.
            self.monkeypatch.setitem(
                sys.modules, module, importlib.util.module_from_spec(spec)
            )
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
    assert not registered()
    [record] = records
    assert record.levelno == logging.ERROR
    message = record.getMessage()
    assert message.endswith("The 'arc_cy' cache policy is NOT registered.")
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
        f"on vLLM {version}: its ARC and policy interface are those of "
        "verified vLLM 0.33.0"
    )


def test_comments_docstrings_and_formatting_do_not_count(
    registry: dict[str, object], fake: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    fake.install(
        "0.34.0",
        {
            ARC_MODULE: (
                "delta = max(1, len(self.b2) / len(self.b1))",
                "delta = max(1,\n                        len(self.b2)/len(self.b1))"
                "  # reformatted",
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
        if "pin_in_flight_chunks" in text
    )
    assert (
        f"verified: {fake.files[caller]}:{line} uses the policy's "
        "'pin_in_flight_chunks', which base.py's CachePolicy does not define."
        in message
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
        result = check_vllm_code(version, table, cache=False)
        assert not result.ok and result.matches == ()
        assert result.nearest == nearest, version
        assert [name for name, _ in result.differing] == [differing], version
    assert check_vllm_code("0.33.0", cache=False).nearest == "0.33.0"


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


def test_override_zero_is_off(
    registry: dict[str, object],
    fake: FakeVllm,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.install("0.33.0", {BASE_MODULE: BASE_EVICT})
    monkeypatch.setenv(OVERRIDE_ENV, "0")
    refusal(register(caplog))


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
    result = check_vllm_code(INSTALLED_VLLM, cache=False)
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
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entry = VERIFIED_VLLM[INSTALLED_VLLM]
    assert (
        f'    "{INSTALLED_VLLM}": {{\n'
        f'        "arc.py": "{entry["arc.py"]}",\n'
        f'        "base.py": "{entry["base.py"]}",\n'
        "    },\n"
    ) in proc.stdout
    assert "manager.py uses clear, evict, get, insert" in proc.stdout


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
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "NOT defined by base.py's CachePolicy: pin_in_flight_chunks" in proc.stdout


# --- the cache ------------------------------------------------------------------


def test_cache_by_file_stat(
    registry: dict[str, object],
    fake: FakeVllm,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    fake.install("0.34.0")
    assert check_vllm_code("0.34.0").ok
    [cached] = (tmp_path / "cache" / "arc_cy" / "vllm-code").iterdir()
    entries = json.loads(cached.read_text())["entries"]
    assert sorted(entries) == sorted(str(p) for p in fake.files.values())

    # Unchanged files: nothing is parsed again.
    def no_parsing(source: object) -> dict[str, object]:
        raise AssertionError("parsed a file whose stat is cached")

    with monkeypatch.context() as m:
        m.setattr(_fingerprint, "analyse_source", no_parsing)
        assert check_vllm_code("0.34.0").ok

    # A changed file (its size and mtime change) is analysed again.
    arc = fake.files[ARC_MODULE]
    arc.write_text(_edit(arc.read_text(), *ARC_DECISION))
    result = check_vllm_code("0.34.0")
    assert not result.ok and [n for n, _ in result.differing] == ["arc.py"]


def test_a_cache_that_cannot_be_written_is_harmless(
    registry: dict[str, object],
    fake: FakeVllm,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    fake.install("0.34.0")
    register(caplog)
    assert registered()


def test_a_damaged_cache_is_analysed_again(
    registry: dict[str, object], fake: FakeVllm, tmp_path: Path
) -> None:
    fake.install("0.34.0", {ARC_MODULE: ARC_DECISION})
    assert not check_vllm_code("0.34.0").ok
    [cached] = (tmp_path / "cache" / "arc_cy" / "vllm-code").iterdir()
    data = json.loads(cached.read_text())
    arc = str(fake.files[ARC_MODULE])
    # A verified fingerprint in a damaged entry is not trusted ...
    data["entries"][arc] = {"fingerprint": VERIFIED_VLLM["0.33.0"]["arc.py"]}
    cached.write_text(json.dumps(data))
    assert not check_vllm_code("0.34.0").ok
    # ... and a file that is not JSON is no error.
    cached.write_text("{not json")
    result = check_vllm_code("0.34.0")
    assert [n for n, _ in result.differing] == ["arc.py"]
