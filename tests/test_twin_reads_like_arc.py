"""The twin reads like vLLM's arc.py (issue 47): the methods of each
vendored release's ARCCachePolicy are the twin's, in the same order, and
their lines are at most 1.5 times the reference's. The busy protocol and
the argument checks are not in them: arc_cy/_busy.py generates them
(docs/hardening.md, rule 2)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from arc_cy import _arc_py
from helpers import REPO

VENDORED = sorted(
    (REPO / "tests" / "data" / "vllm").glob("*/vllm/v1/kv_offload/cpu/policies/arc.py")
)


def _methods(path: Path) -> dict[str, int]:
    """ARCCachePolicy's methods, in their order, and the lines of each."""
    tree = ast.parse(path.read_text())
    (cls,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ARCCachePolicy")
    return {
        f.name: f.end_lineno - f.lineno + 1
        for f in cls.body
        if isinstance(f, ast.FunctionDef) and f.end_lineno is not None
    }


def test_every_release_is_vendored() -> None:
    assert [p.parts[-7] for p in VENDORED] == ["0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]


@pytest.mark.parametrize("arc", VENDORED, ids=lambda p: p.parts[-7])
def test_the_twin_has_vllms_methods_in_vllms_order(arc: Path) -> None:
    reference = _methods(arc)
    twin = _methods(Path(_arc_py.__file__))
    assert [name for name in twin if name in reference] == list(reference)


@pytest.mark.parametrize("arc", VENDORED, ids=lambda p: p.parts[-7])
def test_the_algorithms_lines_are_at_most_one_and_a_half_times_vllms(arc: Path) -> None:
    reference = _methods(arc)
    twin = _methods(Path(_arc_py.__file__))
    ratio = sum(twin[name] for name in reference) / sum(reference.values())
    assert ratio <= 1.5, f"{ratio:.2f} times vLLM's lines"
