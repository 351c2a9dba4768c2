"""arc_cy's boolean environment flags: one parser, arc_cy._flags.env_flag,
for the package, the build, the tests and the benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from arc_cy._flags import env_flag
from childproc import run_prog
from helpers import REPO

pytestmark = pytest.mark.install


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off", "False", " OFF ", "No"])
def test_false_values(value: str) -> None:
    assert env_flag("ARC_CY_X", {"ARC_CY_X": value}) is False


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "TRUE", " Yes "])
def test_true_values(value: str) -> None:
    assert env_flag("ARC_CY_X", {"ARC_CY_X": value}) is True


def test_unset_is_false() -> None:
    assert env_flag("ARC_CY_X", {}) is False


@pytest.mark.parametrize("value", ["2", "y", "enable", "-1", "ture"])
def test_anything_else_is_refused(value: str) -> None:
    with pytest.raises(ValueError) as refused:
        env_flag("ARC_CY_X", {"ARC_CY_X": value})
    assert str(refused.value) == (
        f"ARC_CY_X={value!r} is not a boolean: set it to one of 1, true, yes, on "
        "(true) or 0, false, no, off or nothing (false)"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        *(pytest.param(v, "cython", marks=pytest.mark.compiled) for v in ("false", "no", "off")),
        ("on", "python"),
    ],
)
def test_no_extensions_reads_words(value: str, expected: str) -> None:
    proc = run_prog("implementation.py", "--no-vllm", env={"ARC_CY_NO_EXTENSIONS": value})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == expected


def test_no_extensions_refuses_a_typo() -> None:
    proc = run_prog("implementation.py", "--no-vllm", env={"ARC_CY_NO_EXTENSIONS": "flase"})
    assert proc.returncode != 0
    assert "ARC_CY_NO_EXTENSIONS='flase' is not a boolean" in proc.stderr


def test_the_self_check_reports_a_typo() -> None:
    """python -m arc_cy: the message and exit status 1, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "arc_cy"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ARC_CY_NO_EXTENSIONS": "y"},
    )
    assert proc.returncode == 1, proc
    assert "implementation: NOT CHOSEN: ARC_CY_NO_EXTENSIONS='y' is not a boolean" in proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr


def test_one_parser() -> None:
    # No other file reads a boolean flag its own way: every read of an
    # ARC_CY_ flag that is a switch goes through env_flag.
    out = subprocess.run(
        [
            "git",
            "-C",
            str(REPO),
            "grep",
            "-n",
            "-E",
            r"environ\.get\(\"ARC_CY_|getenv\(\"ARC_CY_|not in \(\"\", \"0\"\)",
            "--",
            "*.py",
        ],
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    # The flags that carry a value, not a switch; the report's raw echo.
    values = (
        "arc_cy/__main__.py:",
        "ARC_CY_FUZZ_PROFILE",
        "ARC_CY_FUZZ_SEED",
        "ARC_CY_COMPAT_STAND_IN",
        "ARC_CY_BENCH_BASE",
        "ARC_CY_BENCH_COMMAND",
        "ARC_CY_SANITIZE",
    )
    assert out
    assert [line for line in out if not any(v in line for v in values)] == []
