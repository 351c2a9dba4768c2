"""Run a program of tests/progs/ in a child process, so that a crash (a
segfault in the compiled core) fails the test instead of killing pytest.
The child inherits the environment (the sanitizer build's PYTHONPATH and
LD_PRELOAD included) and runs with -P, as the test command does; progs/
and tests/ reach its sys.path through PYTHONPATH, ahead of what PYTHONPATH
already holds (so a program imports _child, helpers, hostile)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

PROGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "progs")
TESTS = os.path.dirname(PROGS)


def child_env(**extra: str) -> dict[str, str]:
    """os.environ with progs/ and tests/ first on PYTHONPATH, and extra."""
    env = {**os.environ, **extra}
    path = [PROGS, TESTS]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def run_prog(
    name: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """python -P tests/progs/<name> args..., its output captured; env adds
    variables to the child's environment."""
    return subprocess.run(
        [sys.executable, "-P", os.path.join(PROGS, name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(**(env or {})),
    )


def run_json(name: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> Any:
    """The JSON the program prints on its last line; fails on a crash."""
    proc = run_prog(name, *args, timeout=timeout, env=env)
    assert proc.returncode == 0, (name, args, proc.returncode, proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_modes(name: str, *args: str, timeout: float) -> tuple[dict[str, Any], str, str, str]:
    """A fuzzer that runs several modes in one child: python -P
    tests/progs/<name> args... (with --seed ARC_CY_FUZZ_SEED if set). Each
    run that passed prints ``COVERAGE <run> {json}``, so a crash fails the
    run it happened in and those after it. Returns the counts by run, how
    the child ended (a crash named), its stdout and its stderr."""
    if os.environ.get("ARC_CY_FUZZ_SEED"):
        args += ("--seed", os.environ["ARC_CY_FUZZ_SEED"])
    proc = run_prog(name, *args, timeout=timeout)
    runs = {}
    for line in proc.stdout.splitlines():
        if line.startswith("COVERAGE "):
            _, run, counts = line.split(" ", 2)
            runs[run] = json.loads(counts)
    how = f"{name} {' '.join(args)}: exit {proc.returncode}"
    if proc.returncode < 0:
        how += f", killed by {signal.Signals(-proc.returncode).name} (a crash)"
    return runs, how, proc.stdout, proc.stderr
