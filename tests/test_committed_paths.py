"""No committed file holds an absolute path of the machine that made it
(the bench reports record paths relative to the checkout, or as <env>/...,
<python>/..., <elsewhere>/NAME: bench/benchlib.py's portable())."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO

pytestmark = pytest.mark.repo

# A machine's own places: home directories, the root's, a scratch or work
# tree, macOS's temporary folders.
MACHINE_PATH = re.compile(
    r"(?:(?<=\.\.)|(?<![\w.$}<>/-]))"  # a path's start, or ../../ climbing to one
    r"/(?:root|home|Users|work|tmp|mnt|private/var|var/folders)/[\w.+-]*"
)
# Paths a reader is told to create, not paths of a machine.
ALLOWED = {
    ("bench/base.sh", "/tmp/ab"),  # the usage line's --out example
    ("docs/development.md", "/tmp/arc-fast"),  # the fast layer's throwaway venv
}


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True
    ).stdout.decode()
    return [name for name in out.split("\0") if name]


def machine_paths(files: list[str]) -> list[tuple[str, int, str]]:
    found = []
    for name in files:
        if name == "tests/test_committed_paths.py":
            continue  # its examples below
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # binary (the plots) or deleted in the work tree
        for i, line in enumerate(text.splitlines(), 1):
            found += [(name, i, m) for m in MACHINE_PATH.findall(line) if (name, m) not in ALLOWED]
    return found


def test_no_committed_file_holds_a_machines_path() -> None:
    files = _tracked()
    assert "bench/reference/py3.11/results.json" in files
    assert machine_paths(files) == []


def test_the_pattern_finds_what_the_reports_held(tmp_path: Path) -> None:
    # What the reference reports held before, and what they hold now.
    for held in (
        "/root/.cache/arc_cy/venv-py3.11/lib/python3.11/site-packages/x.py",
        '"/work/main/bench/evict.py"',
        "/tmp/mt1m/multi_turn_1M.json",
        "../../root/.pyenv/versions/3.11.7/lib/python3.11/tracemalloc.py:0",
        "/home/me/arc_cy/bench/run.py",
    ):
        assert MACHINE_PATH.search(held), held
    for portable in (
        "<env>/lib/python3.11/site-packages/arc_cy/__init__.py",
        "bench/evict.py",
        "<elsewhere>/multi_turn_1M.json",
        "${TMPDIR:-/tmp}",
        "bench/results/tmp/evict.json",
        "$HOME/.cache/arc_cy",
    ):
        assert not MACHINE_PATH.search(portable), portable


def test_bench_records_portable_paths() -> None:
    pytest.importorskip("numpy")  # benchlib's, of the [bench] extra
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import benchlib
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert benchlib.portable(str(REPO / "bench" / "evict.py")) == "bench/evict.py"
    assert benchlib.portable(sys.prefix + "/lib/x.py") == "<env>/lib/x.py"
    assert benchlib.portable("/tmp/mt1m/out.json") == "<elsewhere>/out.json"
    argv = ["-P", str(REPO / "bench" / "run.py"), "--json", "/tmp/a/b.json"]
    assert benchlib.portable_argv(argv) == ["-P", "bench/run.py", "--json", "<elsewhere>/b.json"]
    assert not MACHINE_PATH.search(" ".join(benchlib.portable_argv([sys.executable])))
