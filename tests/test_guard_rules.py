"""The guard's rules (docs/usage.md, "The guard"), each checked over the
whole class of code it names, not one case: every binding form, every
string, every local name, every caller form. No vLLM is needed: the
analysis (arc_cy._fingerprint) judges the vendored release files
(tests/data/vllm) as edited here, in this process, with the table as it is.
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from pathlib import Path
from types import CodeType

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


@functools.lru_cache(maxsize=64)
def _compiled(source: str, path: str) -> tuple[ast.Module, CodeType]:
    # Parsed and compiled once per text (the unedited modules of each judge).
    tree = ast.parse(source)
    return tree, compile(tree, path, "exec", dont_inherit=True)


def judge(edited: dict[str, str], release: str = NEWEST) -> CodeCheck:
    paths = {m: str(_file(release, m)) for m in edited}
    data = {m: s.encode() for m, s in edited.items()}
    compiled = {m: _compiled(s, paths[m]) for m, s in edited.items()}
    return judge_sources(release, data, paths, VERIFIED, POLICY_NAMES, compiled)


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


# --- the callers: found by file, wherever they are --------------------------------

CALLER_PATHS = (
    "vllm.v1.kv_offload.cpu.manager",
    "vllm.v1.kv_offload.cpu.offloading_manager",
    "vllm.v1.kv_offload.tiering.primary",
    "vllm.v1.kv_offload.manager",
    "vllm.v1.kv_offload.tiering.fs.deep.caller",
)
USE = "\n\ndef _probe(self, key):\n    self._policy.t1.move_to_end(key)\n"


@pytest.mark.parametrize("module", CALLER_PATHS)
def test_a_caller_is_judged_at_any_path(module: str) -> None:
    # The vendored 0.34.0 CPU manager, with one ARC-only use, moved.
    edited = sources()
    manager = edited.pop(CALLER_MODULES[0]) + USE
    edited[module] = manager
    result = judge(edited)
    assert [(u.name, u.why) for u in result.uses] == [("t1", "beyond")], result
    assert result.uses[0].line == len(manager.splitlines())
    assert (
        _fingerprint.short_name(module)
        == module.removeprefix("vllm.v1.kv_offload.").replace(".", "/") + ".py"
    )


def _tree(root: Path, files: dict[str, str]) -> Path:
    # A vllm/v1/kv_offload tree: each file's folders are packages.
    root.mkdir(parents=True)
    for name, text in files.items():
        path = root.joinpath(*name.split("/"))
        for parent in reversed(path.parents):
            if parent != root and root in parent.parents:
                parent.mkdir(exist_ok=True)
                (parent / "__init__.py").touch()
        path.write_text(text)
    return root


def test_the_callers_are_every_module_file_that_marks_the_policy(tmp_path: Path) -> None:
    import os

    marks = [
        "self._policy.get(k)",
        "from .policies.base import CachePolicy",
        "from vllm.v1.kv_offload.cpu.policies import arc",
        "return CachePolicyFactory.get_cache_policy_cls(k)",
        "return policies.arc.ARCCachePolicy",
    ]
    files = {f"cpu/m{i}.py": f"def f(self, k):\n    {m}\n" for i, m in enumerate(marks)}
    files |= {
        "tiering/a/b/deep.py": "p = manager._policy\n",
        "tiering/a/b/__init__.py": "policy = manager._policy\n",
        "plain.py": "cache_policy = eviction_policy = 1\n",  # no mark
        "doc.py": '"""Takes a CachePolicy."""\nfrom .cpu.policies.base import ChunkStatus\n',
        "cpu/policies/lru.py": "self._policy = None\n",  # the policies package
    }
    root = _tree(tmp_path / "kv_offload", files)
    (root / "loose").mkdir()  # not a package: no module of the tree
    (root / "loose" / "x.py").write_text("self._policy.t1\n")
    os.mkfifo(root / "tiering" / "fifo.py")  # never opened
    found = _fingerprint.find_callers(str(root))
    assert sorted(found) == sorted(
        [f"vllm.v1.kv_offload.cpu.m{i}" for i in range(len(marks))]
        + ["vllm.v1.kv_offload.tiering.a.b.deep", "vllm.v1.kv_offload.tiering.a.b"]
    )
    for path, text in found.values():
        assert Path(path).read_bytes() == text and _fingerprint.is_caller_source(text)


# --- the callers: what arc_cy cannot honour is refused ----------------------------


def _policy_attributes() -> list[str]:
    trees = {m: ast.parse(s) for m, s in sources().items()}
    code = _fingerprint.arc_code(trees[ARC_MODULE], trees[BASE_MODULE])
    return sorted(_fingerprint.policy_attributes(code, POLICY_NAMES))


WRITES = {
    "assign": "manager._policy.{} = value",
    "augmented": "manager._policy.{} += value",
    "annotated": "manager._policy.{}: int = value",
    "delete": "del manager._policy.{}",
    "alias": "policy = manager._policy\n    policy.{} = value",
    "for-target": "for manager._policy.{} in [value]:\n        pass",
}


@pytest.mark.parametrize("form", sorted(WRITES))
def test_a_write_to_any_policy_attribute_is_refused(form: str) -> None:
    names = _policy_attributes()
    assert {"cache_capacity", "t1", "target_t1_size", "get"} <= set(names)
    edited = sources()
    for name in names:  # one probe per name, all in one caller
        line = WRITES[form].format(name)
        edited[CALLER_MODULES[0]] += f"\n\ndef _probe_{name}(manager, value):\n    {line}\n"
    result = judge(edited)
    assert {u.name for u in result.uses if u.why == "write"} == set(names), result


def test_a_write_to_its_own_attribute_is_not_a_use() -> None:
    edited = sources()
    edited[CALLER_MODULES[0]] += (
        "\n\nclass _Own:\n    def f(self):\n        self.t2 = self.get = 1\n"
    )
    result = judge(edited)
    assert not [u for u in result.uses if u.why == "write"]


ARC_CLASS_USES = {
    "isinstance": "isinstance(policy, ARCCachePolicy)",
    "issubclass": "issubclass(type(policy), arc.ARCCachePolicy)",
    "type-is": "type(policy) is ARCCachePolicy",
    "class-pattern": "match policy:\n        case ARCCachePolicy():\n            pass",
    "dotted-pattern": "match policy:\n        case arc.ARCCachePolicy(t=1):\n            pass",
    "string": "'ARCCachePolicy' in repr(type(policy))",
}


@pytest.mark.parametrize("use", sorted(ARC_CLASS_USES))
def test_vllms_arc_class_by_name_is_refused(use: str) -> None:
    edited = sources()
    edited[CALLER_MODULES[1]] += f"\n\ndef _probe(policy):\n    {ARC_CLASS_USES[use]}\n"
    result = judge(edited)
    assert ("ARCCachePolicy", "class") in {(u.name, u.why) for u in result.uses}, result


def test_every_dynamic_route_is_refused() -> None:
    # Computed names, and an object's state reached whole (pickling, copying).
    state = {"__getstate__", "__reduce__", "__reduce_ex__", "__copy__", "__deepcopy__", "__dir__"}
    assert {"getattr", "vars", "__dict__", "format", *state} <= _fingerprint.DYNAMIC
    edited = sources()
    for i, name in enumerate(sorted(_fingerprint.DYNAMIC)):
        edited[CALLER_MODULES[0]] += (
            f"\n\ndef _probe{i}(manager):\n    return manager._policy.{name}\n"
        )
    result = judge(edited)
    assert {u.name for u in result.uses if u.why == "dynamic"} == _fingerprint.DYNAMIC


@pytest.mark.parametrize("where", ["function", "class", "module"])
def test_a_string_equal_to_a_docstring_is_still_a_use(where: str) -> None:
    # Only the docstring itself is skipped, not every string with its text.
    edited = sources()
    probe = {
        "function": 'def _probe(p):\n    """t1"""\n    match p:\n        case object(t1=x):\n'
        "            return x\n",
        "class": 'class _Probe:\n    """t1"""\n\n    key = "t1"\n',
        "module": '_KEY = "t1"\n',
    }[where]
    if where == "module":
        edited[CALLER_MODULES[0]] = '"""t1"""\n' + edited[CALLER_MODULES[0]]
    edited[CALLER_MODULES[0]] += "\n\n" + probe
    result = judge(edited)
    assert "t1" in {u.name for u in result.uses}, result
    only_doc = sources()
    only_doc[CALLER_MODULES[0]] += '\n\ndef _doc(p):\n    """t1"""\n    return p\n'
    assert judge(only_doc).ok


# --- what the refusal says ----------------------------------------------------------


def test_a_dunder_arc_lost_is_a_change_not_a_callers_use() -> None:
    # 0.34.0 with ARC's __init__ gone: ARC runs CachePolicy's. That is a
    # change of ARC's code, not a name the managers (whose own `def
    # __init__` bind it) or arc.py use.
    from arc_cy._guard import refused_message

    edited = sources()
    arc = edited[ARC_MODULE]
    start = arc.index("    def __init__(")
    end = arc.index("\n    @", start)
    edited[ARC_MODULE] = arc[:start] + arc[end + 1 :]
    result = judge(edited)
    assert result.verified_as is None and not result.uses
    assert [(c.name, c.how) for c in result.changes] == [
        ("arc.py:ARCCachePolicy.__init__", "missing")
    ]
    message = refused_message(result)
    assert "is not code arc_cy verified: `ARCCachePolicy.__init__`" in message
    assert f"is missing, which verified vLLM {NEWEST}'s has." in message
