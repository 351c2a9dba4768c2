"""One home per fact (issues 47, 52): the policy's docstring and method list
live in arc_cy._policy, which both implementations read; the docstring names
the releases the table verifies, the method list is vLLM's; the compiled
core imports nothing from the twin."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest

from arc_cy import _policy
from arc_cy._guard import release_key, verified
from childproc import child_env
from helpers import MODULES, REPO

pytestmark = pytest.mark.repo


def test_the_docstring_has_one_home_and_names_the_verified_range(policy_cls: type) -> None:
    releases = sorted(verified.FILES, key=release_key)
    assert policy_cls.__doc__ is _policy.POLICY_DOC
    assert f"({releases[0]} to {releases[-1]}, ``arc_cy._guard.verified``)" in policy_cls.__doc__
    # No single release is named as the one whose decisions it makes.
    assert "'s ``ARCCachePolicy``" not in policy_cls.__doc__.replace("vLLM's", "")


def test_an_implementation_imports_nothing_from_the_other(impl: str) -> None:
    # A child, with vLLM kept out (the stand-ins import in a blink): which
    # of arc_cy's modules importing the implementation brings in.
    code = (
        "import sys; sys.modules['vllm'] = None\n"
        f"import {MODULES[impl]}\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('arc_cy'))))"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        check=True,
    ).stdout.split()
    assert MODULES[impl] in out
    others = [MODULES[name] for name in MODULES if name != impl]
    assert not set(others) & set(out), out


def test_the_core_source_imports_no_twin() -> None:
    # The source too, on any build: no import or cimport names the twin.
    source = (REPO / "arc_cy" / "_core" / "arc.pyx").read_text(encoding="utf-8")
    imports = [
        line for line in source.splitlines() if re.match(r"\s*(from|import|cimport)\s", line)
    ]
    assert any("arc_cy._policy" in line for line in imports), imports
    assert [line for line in imports if "_twin" in line] == []


def test_the_method_list_is_vllms_in_every_verified_release(policy_cls: type) -> None:
    # _policy.METHODS, which the tests, the fuzzers, the harness and the
    # benchmarks derive their lists from, is what vLLM's CachePolicy has
    # across the verified releases (as each shipped it: tests/data/vllm).
    found: set[str] = set()
    for release in verified.FILES:
        path = REPO / "tests/data/vllm" / release / "vllm/v1/kv_offload/cpu/policies/base.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        (base,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CachePolicy"]
        found |= {n.name for n in base.body if isinstance(n, ast.FunctionDef)}
    assert set(_policy.METHODS) == found - {"__init__"}
    assert len(_policy.METHODS) == len(set(_policy.METHODS))
    # Each implementation has its own of every one (none is the base's).
    for name in _policy.METHODS:
        assert getattr(policy_cls, name).__qualname__.split(".")[0] != "CachePolicy", name
