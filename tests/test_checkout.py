"""What a new user runs in a checkout's root: the scripts' answers, and a
type check of a consumer from there (python -m arc_cy from the root:
tests/test_self_check.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import PURE_ENV, REPO

pytestmark = pytest.mark.install


def run(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 120, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bench_help_answers_at_once_and_builds_nothing(tmp_path: Path) -> None:
    env_dir = tmp_path / "env"
    for flag in ("--help", "-h"):
        start = time.monotonic()
        proc = run(["bench/run.sh", "--full", flag], env={"ARC_CY_ENV": str(env_dir)})
        took = time.monotonic() - start
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.startswith("usage: bench/run.sh [-h] [--full]")
        assert "--reference" in proc.stdout
        assert not env_dir.exists()  # no environment made, nothing synced
        assert "arc_cy: " not in proc.stderr  # .ci/env.sh never ran
        assert took < 10, took


def _full_version(python: str) -> str:
    return run([python, str(REPO / "tests" / "progs" / "python_version.py")]).stdout.strip()


def test_find_python_takes_a_full_version() -> None:
    minor = "{}.{}".format(*sys.version_info[:2])
    found = run([".ci/find-python", minor])
    assert found.returncode == 0, found.stderr
    python = found.stdout.strip()
    release = _full_version(python)
    assert release.startswith(minor + ".")
    exact = run([".ci/find-python", release])
    assert exact.returncode == 0, exact.stderr
    assert _full_version(exact.stdout.strip()) == release


def test_find_python_names_what_it_accepts() -> None:
    minor = "{}.{}".format(*sys.version_info[:2])
    missing = run([".ci/find-python", f"{minor}.999"])
    assert missing.returncode == 2
    assert f"no CPython {minor}.999 interpreter found" in missing.stderr
    wrong = run([".ci/find-python", "no-such-python"])
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == (
        "arc_cy: ARC_CY_BASE_PYTHON=no-such-python is not a CPython interpreter "
        "that runs here; ARC_CY_BASE_PYTHON takes a version (3.12 or 3.12.1) or a "
        "CPython interpreter's path or command"
    )


def test_mypy_strict_on_a_consumer_from_the_checkout_root(mypy_cache: str) -> None:
    pytest.importorskip("mypy")
    # From the root, mypy finds the source tree's arc_cy (its modules and the
    # core's stub, _core/arc.pyi) before the installed one: it too must serve.
    env = {
        "VIRTUAL_ENV": sys.prefix,
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
    }
    proc = run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            mypy_cache,
            "tests/typing/consumer.py",
        ],
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found in 1 source file" in proc.stdout


@pytest.mark.compiled
def test_a_pure_run_refuses_a_build_with_the_core() -> None:
    # The pure switch beside an installed core would test the twin and call
    # it a pure build: the suite stops before collecting (pytest's usage error).
    proc = run(
        [sys.executable, "-P", "-m", "pytest", "--collect-only", "-q", "tests/test_env_flag.py"],
        env={PURE_ENV: "1"},
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert f"{PURE_ENV} is set, but this arc_cy has its compiled core" in proc.stderr
    assert "test_env_flag" not in proc.stdout  # nothing collected
