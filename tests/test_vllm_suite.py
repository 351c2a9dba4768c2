"""vLLM's own conformance suite: the release's
``tests/v1/kv_offload/cpu/test_manager.py`` (tests/data/vllm, from its
sdist), run with vLLM's ``arc`` resolved to arc_cy, on the compiled core
and on the twin. Every item passes, as shipped or as adapted below.

Each run is a child pytest (vLLM's file under vLLM's defaults, not this
suite's settings) whose conftest lets the guard judge the installed vLLM
first, then puts the implementation under test where vLLM's
``ARCCachePolicy`` is, which both the factory's ``"arc"`` and the file's
own ``isinstance`` checks read.

What cannot apply is adapted by one rule, not per test: arc_cy's t1, t2,
b1 and b2 are read-only views, so a test cannot put a counting
``OrderedDict`` in their place. Such a statement, and the assertions on
what the counting dict yielded, are left out; the rest of the test, its
behavioural assertions, runs as shipped. That evict examines each entry
at most once per call is arc_cy's own test
(``test_policy.py::test_each_entry_is_examined_at_most_once_per_call``).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter

import pytest

from helpers import IMPLEMENTATIONS, MODULES, PURE_ENV, REPO

pytestmark = pytest.mark.needs_vllm  # vLLM's suite runs in a child

RELEASE = "0.34.0"
SUITE = REPO / "tests/data/vllm" / RELEASE / "tests/v1/kv_offload/cpu/test_manager.py"
ITEMS = 72
"""vLLM 0.34.0's test_manager.py collects 72 items."""
VIEWS = frozenset({"t1", "t2", "b1", "b2"})
ADAPTED = {
    "TestARCPolicy::test_batch_eviction_scans_t1_and_t2_once",
    "TestARCPolicy::test_batch_eviction_falls_back_after_t1_iterator_exhausted",
    "TestARCPolicy::test_store_falls_back_to_t1_when_t2_cannot_satisfy_eviction",
}
"""The tests the rule adapts (each parametrisation included)."""

CONFTEST = """
import importlib
import os
import vllm.v1.kv_offload.cpu.policies.arc as arc

policy = importlib.import_module(os.environ["ARC_CY_SUITE_MODULE"]).ARCCachePolicy
policy(1)  # the guard judges vLLM's own code, before anything is swapped
arc.ARCCachePolicy = policy
"""


def adapt(source: str) -> tuple[str, set[str]]:
    """The suite with the rule applied, and the tests it changed."""
    tree = ast.parse(source)
    changed: set[str] = set()

    def keep(stmt: ast.stmt) -> bool:
        if isinstance(stmt, ast.Assign):
            return not any(isinstance(t, ast.Attribute) and t.attr in VIEWS for t in stmt.targets)
        if isinstance(stmt, ast.Assert):
            return not any(
                isinstance(n, ast.Attribute) and n.attr == "items_yielded" for n in ast.walk(stmt)
            )
        return True

    def strip(body: list[ast.stmt], name: str) -> list[ast.stmt]:
        kept = [s for s in body if keep(s)]
        if len(kept) != len(body):
            changed.add(name)
        for stmt in kept:
            for field in ("body", "orelse", "finalbody"):
                value = getattr(stmt, field, None)
                if isinstance(value, list) and value:
                    setattr(stmt, field, strip(value, name) or [ast.Pass()])
        return kept

    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                    item.body = strip(item.body, f"{node.name}::{item.name}")
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            node.body = strip(node.body, node.name)
    return ast.unparse(tree), changed


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Each implementation's run: outcome by item. The runs start together
    (each imports vLLM: slow) and are collected per test."""
    adapted, changed = adapt(SUITE.read_text())
    assert changed == ADAPTED, sorted(changed ^ ADAPTED)
    procs = {}
    for impl in IMPLEMENTATIONS:
        module = MODULES[impl]
        where = tmp_path_factory.mktemp(f"vllm-suite-{impl}")
        (where / "test_manager.py").write_text(adapted)
        (where / "conftest.py").write_text(CONFTEST)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARC_CY_") or k == PURE_ENV}
        env["ARC_CY_SUITE_MODULE"] = module
        procs[impl] = (
            where,
            subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    "-m",
                    "pytest",
                    "-p",
                    "no:cacheprovider",
                    "-q",
                    "-p",
                    "no:randomly",
                    f"--junitxml={where / 'out.xml'}",
                    "test_manager.py",
                ],
                cwd=where,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            ),
        )
    out = {}
    for impl, (where, proc) in procs.items():
        log, _ = proc.communicate(timeout=900)
        outcomes = {}
        for case in ET.parse(where / "out.xml").iter("testcase"):
            name = f"{case.get('classname', '').rpartition('.')[2]}::{case.get('name')}"
            name = name.removeprefix("test_manager::")
            failed = [c for c in case if c.tag in ("failure", "error", "skipped")]
            outcomes[name] = failed[0].tag if failed else "passed"
        out[impl] = {"log": log, **outcomes}
    return out


@pytest.mark.parametrize("impl", list(MODULES))
def test_vllms_own_manager_suite_passes_on_arc_cy(
    impl: str, results: dict[str, dict[str, str]]
) -> None:
    outcomes = dict(results[impl])
    log = outcomes.pop("log")
    assert len(outcomes) == ITEMS, log[-3000:]
    failed = {name: how for name, how in outcomes.items() if how != "passed"}
    assert not failed, log[-6000:]
    # The ARC tests ran on arc_cy: the factory's "arc" built it.
    assert any(name.startswith("TestARCPolicy::") for name in outcomes)
    adapted = {n for n in outcomes if n.partition("[")[0] in ADAPTED}
    assert len(adapted) == 8, sorted(adapted)


def test_the_rule_removes_only_what_it_names() -> None:
    # Simple statements compared as text: the adapted file lacks only view
    # assignments and assertions on what a counting dict yielded.
    def simple(text: str) -> Counter[str]:
        return Counter(
            ast.unparse(n)
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.stmt) and not hasattr(n, "body")
        )

    source = SUITE.read_text()
    before, after = simple(source), simple(adapt(source)[0])
    assert not after - before
    removed = before - after
    assert sum(removed.values()) > 0
    for stmt in removed:
        assert "items_yielded" in stmt or stmt.split(" = ")[0].rpartition(".")[2] in VIEWS, stmt
