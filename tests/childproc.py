"""Run a program of tests/progs/ in a child process, so that a crash (a
segfault in the compiled core) fails the test instead of killing pytest.
The child inherits the environment (the sanitizer build's PYTHONPATH and
LD_PRELOAD included) and runs with -P, as the test command does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

PROGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs")


TESTS = os.path.dirname(PROGS)
# -P keeps the source tree off sys.path; progs/ and tests/ go on it.
_START = (
    "import runpy, sys; sys.path[:0] = [{progs!r}, {tests!r}]; "
    "sys.argv[0] = {prog!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def run_prog(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    start = _START.format(progs=PROGS, tests=TESTS, prog=os.path.join(PROGS, name))
    return subprocess.run(
        [sys.executable, "-P", "-c", start, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_json(name: str, *args: str, timeout: float = 300) -> Any:
    """The JSON the program prints on its last line; fails on a crash."""
    proc = run_prog(name, *args, timeout=timeout)
    assert proc.returncode == 0, (name, args, proc.returncode, proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])
