"""The guard's rules (docs/usage.md, "The guard"), each checked over the
whole class of code it names, not one case: every binding form, every
string, every local name, every caller form. No vLLM is needed: the
analysis (arc_cy._fingerprint) judges the vendored release files
(tests/data/vllm) as edited here, in this process, with the table as it is.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

from arc_cy import _fingerprint
from arc_cy._fingerprint import ARC_MODULE, BASE_MODULE, CALLER_MODULES, CodeCheck, judge_sources
from arc_cy._guard import POLICY_NAMES
from arc_cy._verified import VERIFIED
from helpers import REPO

DATA = REPO / "tests" / "data" / "vllm"
RELEASES = sorted((p.name for p in DATA.iterdir() if p.is_dir()), key=_fingerprint.release_key)
NEWEST = RELEASES[-1]
MODULES = (ARC_MODULE, BASE_MODULE, *CALLER_MODULES)


def _file(release: str, module: str) -> Path:
    return DATA / release / Path(*module.split(".")).with_suffix(".py")


def sources(release: str = NEWEST) -> dict[str, str]:
    """The release's judged modules, as they ship."""
    return {m: _file(release, m).read_text() for m in MODULES if _file(release, m).exists()}


def judge(edited: dict[str, str], release: str = NEWEST) -> CodeCheck:
    paths = {m: str(_file(release, m)) for m in edited}
    data = {m: s.encode() for m, s in edited.items()}
    return judge_sources(release, data, paths, VERIFIED, POLICY_NAMES)


def test_each_release_as_it_ships_is_accepted() -> None:
    for release in RELEASES:
        result = judge(sources(release), release)
        assert result.ok and result.verified_as == release, result


# --- base.py: what runs at import is judged, by every binding form -------------
#
# Each form rebinds, at base.py's module level, `len`: a builtin that
# order_request_keys (which arc_cy runs) reads. The rule names every AST
# node that binds a name; the forms must cover each one this Python has.

BINDING_FORMS = {
    "Name": "len = lambda x: 0\n",
    "AugAssign": "len += 0\n",
    "AnnAssign": "len: object = lambda x: 0\n",
    "NamedExpr": "(len := lambda x: 0)\n",
    "alias": "from os.path import getsize as len\n",
    "Import": "import os as len\n",
    "For": "for len in [lambda x: 0]:\n    pass\n",
    "With": "with open(__file__) as len:\n    pass\n",
    "ExceptHandler": "try:\n    pass\nexcept Exception as len:\n    pass\n",
    "Delete": "del len\n",
    "Global": "def _rebind():\n    global len\n    len = None\n",
    "MatchAs": "match 1:\n    case len:\n        pass\n",
    "MatchStar": "match [1]:\n    case [*len]:\n        pass\n",
    "MatchMapping": "match {}:\n    case {**len}:\n        pass\n",
    "FunctionDef": "def len(x):\n    return 0\n",
    "AsyncFunctionDef": "async def len(x):\n    return 0\n",
    "ClassDef": "class len:\n    pass\n",
    "TypeAlias": "type len = int\n",
    # binds no name: module code, which runs at import
    "globals": 'globals()["len"] = lambda x: 0\n',
    "attribute": "import collections\ncollections.OrderedDict = dict\n",
    "setattr": 'import builtins\nsetattr(builtins, "len", lambda x: 0)\n',
}
NOT_MODULE_BINDINGS = {"Nonlocal", "TypeVar", "ParamSpec", "TypeVarTuple"}
"""Nodes that bind no name of the module: nonlocal (a function's), type
parameters (their own scope)."""


def _binding_node_types() -> set[str]:
    # Every AST node type with a field that names what it binds.
    return {
        name
        for name in dir(ast)
        if isinstance(getattr(ast, name), type)
        and issubclass(getattr(ast, name), ast.AST)
        and {"name", "rest", "asname", "id", "names"} & set(getattr(ast, name)._fields)
    }


def _parses(snippet: str) -> bool:
    try:
        ast.parse(snippet)
    except SyntaxError:
        return False  # (type aliases: Python 3.12 and later)
    return True


FORMS = {k: v for k, v in BINDING_FORMS.items() if _parses(v)}


def test_the_binding_forms_cover_every_binding_node() -> None:
    found = {type(n).__name__ for s in FORMS.values() for n in ast.walk(ast.parse(s))}
    assert _binding_node_types() - NOT_MODULE_BINDINGS <= found


@pytest.mark.parametrize("where", ["end", "start"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_base_module_code_is_judged_by_every_binding_form(form: str, where: str) -> None:
    edited = sources()
    base = edited[BASE_MODULE]
    imports_end = base.index("\n\n\n")  # after the imports
    snippet = "\n" + FORMS[form]
    if where == "end":
        edited[BASE_MODULE] = base + "\n\n" + FORMS[form]
    else:
        edited[BASE_MODULE] = base[:imports_end] + "\n" + snippet + base[imports_end:]
    result = judge(edited)
    assert not result.ok and result.changes, form
    assert all(c.name.startswith("base.py:") for c in result.changes)


# --- unchanged code is accepted ---------------------------------------------------


def _u_prefixed(source: str) -> str:
    # Every plain string literal written with a u prefix.
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        text = tok.string
        if tok.type == tokenize.STRING and text[0] in "\"'":
            text = "u" + text
        out.append((tok.type, text))
    return tokenize.untokenize(out)


@pytest.mark.parametrize("release", RELEASES)
def test_string_prefixes_do_not_count(release: str) -> None:
    edited = {m: _u_prefixed(s) for m, s in sources(release).items()}
    kinds = {
        n.kind for n in ast.walk(ast.parse(edited[BASE_MODULE])) if isinstance(n, ast.Constant)
    }
    assert "u" in kinds  # the same tree, but for Constant.kind
    result = judge(edited, release)
    assert result.ok and result.verified_as == release, result


def _function_locals(tree: ast.Module) -> set[str]:
    # The names bound inside base.py's functions and methods.
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            every = (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
            names |= {a.arg for a in every if a is not None}
            body = node.body if isinstance(node.body, list) else [node.body]
            for stmt in body:
                names |= {
                    n.id
                    for n in ast.walk(stmt)
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                }
    return names


def test_a_base_function_named_like_a_local_is_not_reached() -> None:
    # An unrelated base.py function (no decorator, default or annotation:
    # its def runs nothing at import) is not ARC's code, whatever its name.
    base = sources()[BASE_MODULE]
    tree = ast.parse(base)
    module_names = _fingerprint._free_names(tree.body) | set(_fingerprint._bindings(tree))
    names = sorted(_function_locals(tree) - module_names - {"self"})
    assert {"key", "keys", "position"} <= set(names)
    for name in names:
        edited = sources()
        edited[BASE_MODULE] = base + f"\n\ndef {name}(*args):\n    return args\n"
        result = judge(edited)
        assert result.ok, (name, result)


def test_a_free_name_is_followed_whatever_scope_reads_it() -> None:
    free = _fingerprint._free_names
    tree = ast.parse(
        "def f(a, *, b=d0):\n"
        "    global g\n"
        "    g = 1\n"
        "    x = [y for y in a if z(y)]\n"
        "    (w := 2)\n"
        "    return lambda q: q + w + x + u + g + b\n"
        "class C(B):\n"
        "    c = 1\n"
        "    def m(self):\n"
        "        return c\n"
    )
    assert free(tree.body) == {"d0", "z", "u", "g", "B", "c"}
