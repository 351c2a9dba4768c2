"""Every release the table lists runs: each verified vLLM release's own
files, as they ship (tests/data/vllm, from each release's sdist), are
judged by the guard's whole check and accepted, with no override.

No vLLM is needed: each release's four judged modules sit in a tree of
empty packages named vllm, which a child Python imports instead of any
installed vLLM, and the guard judges them there as it judges an installed
vLLM (what an import would run, compiled from the source it reads).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arc_cy import _fingerprint
from arc_cy._fingerprint import ARC_MODULE, BASE_MODULE, CALLER_MODULES, judge_sources
from arc_cy._guard import POLICY_NAMES, refused_message, verified_message
from arc_cy._verified import SUPPORTED_VLLM, VERIFIED
from helpers import REPO

DATA = REPO / "tests" / "data" / "vllm"
RELEASES = sorted((p.name for p in DATA.iterdir() if p.is_dir()), key=_fingerprint.release_key)
MODULES = (ARC_MODULE, BASE_MODULE, *CALLER_MODULES)

CHECK = """
import json, sys
from arc_cy import _fingerprint
from arc_cy._guard import POLICY_NAMES, refused_message
from arc_cy._verified import VERIFIED
result = _fingerprint.check_vllm_code(sys.argv[1], VERIFIED, POLICY_NAMES)
assert "vllm" not in sys.modules or not hasattr(sys.modules["vllm"], "__version__")
print(json.dumps({"ok": result.ok, "as": result.verified_as,
                  "why": "" if result.ok else refused_message(result)}))
"""


def _file(release: str, module: str) -> Path:
    return DATA / release / Path(*module.split(".")).with_suffix(".py")


def _tree(release: str, root: Path) -> Path:
    """A tree that holds the release's judged modules and nothing else of vLLM."""
    for module in MODULES:
        parts = module.split(".")
        for depth in range(1, len(parts)):
            package = root.joinpath(*parts[:depth])
            package.mkdir(exist_ok=True)
            (package / "__init__.py").touch()
        source = _file(release, module)
        if source.exists():
            root.joinpath(*parts).with_suffix(".py").write_bytes(source.read_bytes())
    return root


@pytest.mark.parametrize("release", RELEASES)
def test_a_verified_release_is_accepted_as_it_ships(release: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARC_CY_ALLOW_UNVERIFIED_VLLM"}
    env["PYTHONPATH"] = str(_tree(release, tmp_path))  # before site-packages' vllm
    proc = subprocess.run(
        [sys.executable, "-P", "-c", CHECK, release],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result == {"ok": True, "as": release, "why": ""}, result["why"]


def test_the_table_lists_the_releases_whose_files_are_here() -> None:
    # A release joins the table with its files (the test above judges them).
    listed = sorted((r for e in VERIFIED for r in e["releases"]), key=_fingerprint.release_key)
    assert listed == RELEASES
    # One entry per distinct ARC code.
    codes = [tuple(sorted(e["arc"].items())) for e in VERIFIED]
    assert len(set(codes)) == len(codes)


def test_supported_vllm_spans_the_verified_releases() -> None:
    # SUPPORTED_VLLM (what the [vllm] extra installs) spans exactly the
    # verified releases: the oldest to the newest's minor series, with each
    # minor series between them verified.
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    releases = sorted(map(Version, RELEASES))
    oldest, newest = releases[0], releases[-1]
    assert SpecifierSet(SUPPORTED_VLLM) == SpecifierSet(
        f">={oldest},<{newest.major}.{newest.minor + 1}"
    )
    assert {(r.major, r.minor) for r in releases} == {
        (oldest.major, m) for m in range(oldest.minor, newest.minor + 1)
    }


def _judge(release: str, table: tuple[dict, ...], version: str | None = None):  # type: ignore[no-untyped-def]
    sources = {m: _file(release, m).read_bytes() for m in MODULES if _file(release, m).exists()}
    paths = {m: str(_file(release, m)) for m in sources}
    return judge_sources(version or release, sources, paths, table, POLICY_NAMES)


def test_release_day_the_newest_release_before_its_entry() -> None:
    # The newest release's files, judged by the table as it was before that
    # release joined: its ARC code is the previous entry's (0.34.0 only lost
    # touch, which nothing calls), and its callers ask only what
    # CachePolicy has. So it runs the day it ships.
    newest = RELEASES[-1]
    before = tuple(e for e in VERIFIED if newest not in e["releases"])
    result = _judge(newest, before, version=newest)
    assert result.ok, refused_message(result)
    assert result.verified_as == RELEASES[-2]
    assert verified_message(result) == f"its ARC code is verified vLLM {RELEASES[-2]}'s"


def test_a_verified_caller_is_judged_as_it_shipped() -> None:
    # 0.30.0's tiering primary tier calls the manager's on_request_finished,
    # a name arc_cy's policy has and 0.30.0's CachePolicy lacks: a scan of
    # names cannot tell the two apart. The table holds that caller as
    # shipped, so 0.30.0 runs; without it in the table, the refusal says
    # which release the ARC code is and what refused, never a contradiction.
    assert _judge("0.30.0", VERIFIED).ok
    stripped = tuple(
        {**e, "callers": {k: () for k in e["callers"]}} if "0.30.0" in e["releases"] else e
        for e in VERIFIED
    )
    result = _judge("0.30.0", stripped)
    assert not result.ok and result.verified_as == "0.30.0"
    line = next(
        i
        for i, text in enumerate(_file("0.30.0", CALLER_MODULES[1]).read_text().splitlines(), 1)
        if "on_request_finished" in text
    )
    assert refused_message(result).startswith(
        "arc_cy: vLLM 0.30.0's ARC code is verified vLLM 0.30.0's, but "
        f"{_file('0.30.0', CALLER_MODULES[1])}:{line} uses 'on_request_finished', which an "
        "ARC policy has beyond base.py's CachePolicy."
    )


def test_a_verified_caller_with_another_arc_code_is_scanned() -> None:
    # A caller is trusted only beside the ARC code it shipped with: 0.33.0's
    # manager calls touch, which 0.34.0's ARC lost.
    sources = {m: _file("0.34.0", m).read_bytes() for m in MODULES}
    sources[CALLER_MODULES[0]] = _file("0.33.0", CALLER_MODULES[0]).read_bytes()
    paths = {m: f"/{m}.py" for m in MODULES}
    result = judge_sources("0.34.0", sources, paths, VERIFIED, POLICY_NAMES)
    assert not result.ok
    assert {(u.name, u.why, u.release) for u in result.uses} == {("touch", "gone", "0.33.0")}


def test_fingerprints_do_not_depend_on_formatting() -> None:
    source = _file(RELEASES[-1], ARC_MODULE).read_text()
    base = ast.parse(_file(RELEASES[-1], BASE_MODULE).read_text())
    same = _fingerprint.arc_code(ast.parse(source), base).objects
    reformatted = source.replace("\n", "  # a comment\n", 3).replace("B1/B2", "the ghost lists")
    assert _fingerprint.arc_code(ast.parse(reformatted), base).objects == same
    changed = source.replace(
        "if virtual_t1_size >= int(self.target_t1_size):",
        "if virtual_t1_size > int(self.target_t1_size):",
    )
    differ = _fingerprint.arc_code(ast.parse(changed), base).objects
    assert [k for k in same if same[k] != differ[k]] == ["arc.py:ARCCachePolicy.evict"]


def test_fingerprint_script_prints_the_table_from_the_release_files() -> None:
    # tools/fingerprint.py, given every release's files, prints the table
    # arc_cy/_verified.py holds: the table is what the files are.
    proc = subprocess.run(
        [
            sys.executable,
            "-P",
            str(REPO / "tools" / "fingerprint.py"),
            *map(str, map(DATA.joinpath, RELEASES)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = proc.stdout.partition("arc_cy/_verified.py, with these releases:\n\n")[2].strip()
    assert printed and printed in (REPO / "arc_cy" / "_verified.py").read_text()
    for release in RELEASES:
        assert (
            f"vLLM {release} ({DATA / release}):\n    its ARC code is verified vLLM {release}'s\n"
            in proc.stdout
        )
