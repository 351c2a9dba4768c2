"""Which tests need vLLM, and when a skip is a failure: what conftest.py's
hooks decide of a collected test and of a report, as plain functions of
them (conftest.py wires them to pytest; test_suite.py tests them)."""

from __future__ import annotations

import ast
import functools

import pytest

from arc_cy._flags import env_flag
from helpers import REQUIRE_ALL_ENV

# --- no skips under the test command -----------------------------------------
#
# A test that needs vLLM is marked needs_vllm, which skips it without vLLM. A
# module that imports vLLM at its top says so once, by
# pytest.importorskip("vllm") before those imports: the mark is then given
# to each of its tests here (skips_without_vllm). One that needs mypy or pyright calls
# pytest.importorskip. A venv of arc_cy, pytest and hypothesis alone thus
# runs the rest: the fast layer, -m "not needs_vllm". tests/run.sh sets
# ARC_CY_TESTS_REQUIRE_ALL: there every skip, at collection or in a test, is
# a failure, so a broken environment cannot pass by skipping.

REQUIRE_ALL = env_flag(REQUIRE_ALL_ENV)


def no_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    """Under ARC_CY_TESTS_REQUIRE_ALL, a skipped report made a failure."""
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        longrepr = report.longrepr
        why = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        why = why.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = (
            f"skipped ({why}), and {REQUIRE_ALL_ENV} is set: the full suite may not skip"
        )


@functools.cache
def skips_without_vllm(path: str) -> bool:
    """Whether the module at ``path`` calls pytest.importorskip("vllm") in
    its top-level code."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return any(ast.unparse(node) == "pytest.importorskip('vllm')" for node in tree.body)


def mark_needs_vllm(item: pytest.Item) -> None:
    """Gives needs_vllm to a collected test of a module that skips without
    vLLM, unless it has the mark already."""
    module = getattr(item, "module", None)
    path = getattr(module, "__file__", None)
    if path and skips_without_vllm(path) and item.get_closest_marker("needs_vllm") is None:
        item.add_marker(pytest.mark.needs_vllm)
