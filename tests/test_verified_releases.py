"""Every release the table lists runs, and release day is judged by rule,
on each verified release's own files (tests/data/vllm): a child Python finds
them instead of any installed vLLM, and the guard accepts them by their
hashes; release day's rules are checked on the same files, edited. The table
is what tools/fingerprint.py prints from them. No vLLM is needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from arc_cy import _guard
from arc_cy._guard import fingerprint
from helpers import REPO, edited

DATA = REPO / "tests" / "data" / "vllm"
RELEASES = sorted((p.name for p in DATA.iterdir() if p.is_dir()), key=_guard.release_key)
WATCHED = {"t1", "t2", "b1", "b2", "touch", "get", "target_t1_size"} | fingerprint.DYNAMIC


def _code(release: str, edits: tuple[str, ...]) -> dict[str, str]:
    """The release's ARC code, with base.py edited (old, new, ...)."""
    folder = DATA / release / "vllm/v1/kv_offload/cpu/policies"
    base = edited((folder / "base.py").read_text(), *edits)
    return fingerprint.arc_code((folder / "arc.py").read_bytes(), base.encode())[0]


CHECK = """
import json, sys
from arc_cy import _guard
def parsed(*a): raise AssertionError("parsed")
_guard.lockstep_difference = parsed
result = _guard._judge("x")
release_day = {"arc_cy._guard.fingerprint", "arc_cy._guard.lockstep", "ast", "symtable"}
assert not release_day & set(sys.modules), release_day & set(sys.modules)  # not loaded
print(json.dumps([result.verified_as, result.problems]))
"""


@pytest.mark.parametrize("release", RELEASES)
def test_a_verified_release_is_accepted_by_its_files_hashes(release: str, tmp_path: Path) -> None:
    shutil.copytree(DATA / release / "vllm", tmp_path / "vllm")
    for folder, _, _ in os.walk(tmp_path / "vllm"):
        Path(folder, "__init__.py").touch()
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # before site-packages' vllm
    proc = subprocess.run(
        [sys.executable, "-P", "-c", CHECK], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [release, []]


def test_the_verified_releases_are_each_minor_release_in_their_range() -> None:
    # The table itself is the release files' (the script's test, below; the
    # files are their record's: test_vendored.py).
    minors = [_guard.release_key(r)[:2] for r in RELEASES]
    assert minors == [(minors[0][0], m) for m in range(minors[0][1], minors[-1][1] + 1)]


NEWEST = RELEASES[-1]
BEFORE = "\n\nclass ChunkStatus"


def _new(statement: str) -> tuple[str, str]:
    """An edit of base.py that adds a statement before ChunkStatus."""
    return BEFORE, f"\n\n{statement}\n{BEFORE}"


EDITS = {  # an edit of base.py, and the objects that then differ (arc.py's: test_vllm_guard)
    "comments": (("(ABC):\n", "(ABC):  # a comment\n"), set()),
    "a-string-prefix": (('"""Return one head-to-tail', 'u"""Return one head-to-tail'), set()),
    # issues 53 and 59: an unrelated function in vLLM's style (annotated,
    # defaulted) named like a local of order_request_keys, and a default on
    # an abstract method that ARC overrides
    "an-unrelated-function": (
        _new("def positions(keys: list[OffloadKey], n: int = 0) -> int:\n    return n"),
        set(),
    ),
    "a-default-arc-overrides": (("set[OffloadKey]\n", "set[OffloadKey], d: int = 0\n"), set()),
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


@pytest.mark.parametrize("case", sorted(EDITS))
def test_what_arc_runs_or_reads_is_judged_object_by_object(case: str) -> None:
    # What does not run or read differently (the first cases) does not count.
    edits, objects = EDITS[case]
    code, theirs = _code(NEWEST, edits), _guard.verified_code(NEWEST)
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
