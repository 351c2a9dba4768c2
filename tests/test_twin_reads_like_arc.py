"""The twin reads like vLLM's arc.py (issues 47 and 52): the methods of each
vendored release's ARCCachePolicy are the twin's, in the same order, and
their lines are at most 1.5 times the reference's; and what a debugger
shows of a twin's method is the method itself, the algorithm: no wrapper
stands in its place (the core's busy protocol and argument checks are the
core's, docs/hardening.md)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from arc_cy._policy import METHODS
from arc_cy._twin import arc as arc_twin
from arc_cy._twin import plus as plus_twin
from helpers import REPO

pytestmark = pytest.mark.repo

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
    twin = _methods(Path(arc_twin.__file__))
    assert [name for name in twin if name in reference] == list(reference)


@pytest.mark.parametrize("arc", VENDORED, ids=lambda p: p.parts[-7])
def test_the_algorithms_lines_are_at_most_one_and_a_half_times_vllms(arc: Path) -> None:
    reference = _methods(arc)
    twin = _methods(Path(arc_twin.__file__))
    ratio = sum(twin[name] for name in reference) / sum(reference.values())
    assert ratio <= 1.5, f"{ratio:.2f} times vLLM's lines"


def _methods_of(cls: type) -> dict[str, object]:
    """The functions cls's own body defines, by name (a property's too)."""
    out: dict[str, object] = {}
    for name, attr in vars(cls).items():
        if isinstance(attr, property):
            attr = attr.fget
        if inspect.isfunction(attr):
            out[name] = attr
    return out


@pytest.mark.parametrize(
    "module", [arc_twin, plus_twin], ids=lambda m: m.__name__.removeprefix("arc_cy.")
)
def test_each_of_the_twins_methods_is_its_own_source(module) -> None:
    """inspect.getsource of each method is its text in the twin's module
    file: what a person stepping through it in a debugger steps through.
    No __wrapped__: nothing stands between the caller and the algorithm."""
    cls = getattr(module, module.__all__[0])  # the policy class
    methods = _methods_of(cls)
    public = {name for name in methods if not name.startswith("_")} | {"__init__"}
    assert {"__init__", *METHODS} <= public
    path = Path(module.__file__).resolve()
    assert path.parts[-3:] == ("arc_cy", "_twin", f"{module.__name__.split('.')[-1]}.py")
    lines = path.read_text().splitlines(keepends=True)
    for name, fn in methods.items():
        assert not hasattr(fn, "__wrapped__"), name
        assert Path(inspect.getsourcefile(fn)).resolve() == path, name
        source, first = inspect.getsourcelines(fn)
        assert source == lines[first - 1 : first - 1 + len(source)], name
        assert source[0].lstrip().startswith(f"def {name}("), name
        assert getattr(cls, name) is fn or isinstance(vars(cls)[name], property), name
