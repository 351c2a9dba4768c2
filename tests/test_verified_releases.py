"""Every release the table lists runs, and release day is judged by rule.

Each verified release's own files (tests/data/vllm, from each release's
sdist) sit in a tree of empty packages named vllm, which a child Python
finds instead of any installed vLLM: the guard accepts them by their
hashes, parsing nothing. The rules of release day (arc_cy._guard.fingerprint)
are checked on the same files, edited: no vLLM is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arc_cy import _guard
from arc_cy._guard import fingerprint, verified
from arc_cy._guard.files import FILES
from helpers import REPO

DATA = REPO / "tests" / "data" / "vllm"
RELEASES = sorted((p.name for p in DATA.iterdir() if p.is_dir()), key=_guard.release_key)
WATCHED = {"t1", "t2", "b1", "b2", "touch", "get", "target_t1_size"} | fingerprint.DYNAMIC


def _file(release: str, module: str) -> Path:
    return DATA / release / Path(*module.split(".")).with_suffix(".py")


def _code(release: str, file: str = "", edits: tuple[str, ...] = ()) -> dict[str, str]:
    """The release's ARC code, with arc.py or base.py edited (old, new, ...)."""
    texts = {}
    for name, module in (("arc", _guard.ARC_MODULE), ("base", _guard.BASE_MODULE)):
        text = _file(release, module).read_text()
        for old, new in zip(edits[::2], edits[1::2]) if name == file else ():
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        texts[name] = text.encode()
    return fingerprint.arc_code(texts["arc"], texts["base"])


CHECK = """
import json, sys
from arc_cy import _guard
def parsed(*a): raise AssertionError("parsed")
_guard.fingerprint.arc_code = _guard.lockstep_difference = parsed
result = _guard._judge("x")
print(json.dumps([result.verified_as, result.problems]))
"""


@pytest.mark.parametrize("release", RELEASES)
def test_a_verified_release_is_accepted_by_its_files_hashes(release: str, tmp_path: Path) -> None:
    for module in FILES:
        parts = module.split(".")
        for depth in range(1, len(parts)):
            tmp_path.joinpath(*parts[:depth]).mkdir(exist_ok=True)
            tmp_path.joinpath(*parts[:depth], "__init__.py").touch()
        tmp_path.joinpath(*parts).with_suffix(".py").write_bytes(
            _file(release, module).read_bytes()
        )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # before site-packages' vllm
    proc = subprocess.run(
        [sys.executable, "-P", "-c", CHECK], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [release, []]


def test_the_tables_hashes_are_the_recorded_files() -> None:
    record = json.loads((DATA / "record.json").read_text())
    shipped = {
        release: {
            FILES[m]: entry["files"][f"{m.replace('.', '/')}.py"]
            for m in FILES
            if f"{m.replace('.', '/')}.py" in entry["files"]
        }
        for release, entry in record.items()
    }
    assert verified.FILES == shipped
    assert sorted(verified.FILES, key=_guard.release_key) == RELEASES


def test_supported_vllm_spans_the_verified_releases() -> None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    releases = sorted(map(Version, RELEASES))
    oldest, newest = releases[0], releases[-1]
    expected = f">={oldest},<{newest.major}.{newest.minor + 1}"
    assert SpecifierSet(verified.SUPPORTED_VLLM) == SpecifierSet(expected)
    assert {(r.major, r.minor) for r in releases} == {
        (oldest.major, m) for m in range(oldest.minor, newest.minor + 1)
    }


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_is_its_own_code_on_release_day(release: str) -> None:
    assert _code(release) == _guard.verified_code(release)


NEWEST = RELEASES[-1]
BEFORE = "\n\nclass ChunkStatus"


def _new(statement: str) -> tuple[str, str]:
    """An edit of base.py that adds a statement before ChunkStatus."""
    return BEFORE, f"\n\n{statement}\n{BEFORE}"


SAME = {
    "comments": ("arc", ("(CachePolicy):\n", "(CachePolicy):  # a comment\n")),
    "a-string-prefix": ("base", ('"""Return one head-to-tail', 'u"""Return one head-to-tail')),
    # issues 53 and 59: an unrelated function in vLLM's style (annotated,
    # defaulted) named like a local of order_request_keys, and a default on
    # an abstract method that ARC overrides
    "an-unrelated-function": (
        "base",
        _new("def positions(keys: list[OffloadKey], n: int = 0) -> int:\n    return n"),
    ),
    "a-default-arc-overrides": ("base", ("set[OffloadKey]\n", "set[OffloadKey], d: int = 0\n")),
}
CHANGED = {  # base.py edited: the objects that differ
    "order_request_keys": (("positions.__getitem__)", "positions.get)"), {"order_request_keys"}),
    "a-match-capture": (_new("match 0:\n    case len:\n        pass"), {"len"}),
    "a-decorated-function": (_new("@print\ndef f() -> None:\n    pass"), {"f"}),
    "a-default-that-calls": (_new("def f(x: int = print()) -> None:\n    pass"), {"f"}),
    "an-annotation-that-rebinds": (
        _new("def f(x: (ChunkStatus := int)) -> None:\n    pass"),
        {"f", "ChunkStatus"},
    ),
    "a-reached-helper": (
        (
            "keys = [key",
            "keys = [helper(key)",
            *_new("def helper(k: OffloadKey) -> OffloadKey:\n    return k"),
        ),
        {"order_request_keys", "helper"},
    ),
    "an-inherited-no-op": (
        ('transitions to 0."""\n        return', 'transitions to 0."""\n        self.get(key)'),
        {"CachePolicy.mark_evictable"},
    ),
}


@pytest.mark.parametrize("case", sorted(SAME))
def test_what_does_not_run_or_read_differently_does_not_count(case: str) -> None:
    assert _code(NEWEST, *SAME[case]) == _guard.verified_code(NEWEST)


@pytest.mark.parametrize("case", sorted(CHANGED))
def test_what_arc_runs_or_reads_is_judged_object_by_object(case: str) -> None:
    edits, objects = CHANGED[case]
    code, theirs = _code(NEWEST, "base", edits), _guard.verified_code(NEWEST)
    changed = {k for k in code.keys() | theirs.keys() if code.get(k) != theirs.get(k)}
    assert changed == {f"base.py:{o}" for o in objects}


USES = {  # a use is its kind and the name
    "a-read": ("len(self._policy.t1)", {"read:t1"}),
    "a-call": ("self._policy.touch([])", {"call:touch"}),
    "a-write": ("self._policy.target_t1_size += 1", {"write:target_t1_size"}),
    "a-delete": ("del self._policy.b1", {"delete:b1"}),
    "a-computed-name": ("getattr(self._policy, name)", {"call:getattr"}),
    "a-string-name": ("getattr(self._policy, 'b2')", {"call:getattr", "string:b2"}),
    "a-policy-name": ('if name == "arc":\n        pass', {"string:arc"}),
    "a-class-pattern": ("match p:\n        case object(t2=x):\n            pass", {"read:t2"}),
    "a-keyword": ("f(target_t1_size=1)", {"keyword:target_t1_size"}),
    "a-docstring-is-not-a-use": ('"""t1 and b2 of the policy, "arc"."""', set()),
    "a-local-name-is-not-a-use": ("t1 = touch = 1", set()),
}


@pytest.mark.parametrize("case", sorted(USES))
def test_a_callers_uses_are_every_form_of_a_watched_name(case: str) -> None:
    line, names = USES[case]
    source = f"def f(self, p, name):\n    {line}\n".encode()
    assert set(fingerprint.caller_uses(source, WATCHED)) == names


def test_fingerprint_script_prints_the_table_from_the_release_files() -> None:
    script = str(REPO / "tools" / "fingerprint.py")
    trees = [str(DATA / r) for r in RELEASES]
    proc = subprocess.run([sys.executable, "-P", script, *trees], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = proc.stdout.partition("arc_cy/_guard/verified.py, with these releases:\n\n")[2]
    assert printed.strip() == (REPO / "arc_cy" / "_guard" / "verified.py").read_text().strip()
    for release in RELEASES:
        said = f"vLLM {release} ({DATA / release}):\n    its ARC code is verified vLLM {release}'s"
        assert said in proc.stdout
