"""The analysis behind arc_cy's vLLM code guard (``arc_cy._guard``; the
rule: docs/usage.md, "The guard"): which ARC code a vLLM runs, and whether its
callers ask of the policy only what ``CachePolicy`` declares.

Standard library only: ``tools/fingerprint.py`` imports it (``import
arc_cy`` loads nothing else), and the table it checks against is handed in.

- :func:`arc_code` splits ``cpu/policies/arc.py`` and ``base.py`` into the
  objects ARC runs and reads, each with a fingerprint: sha256 of its AST,
  string statements (docstrings) and positions dropped, so comments,
  docstrings and formatting do not count.
- :func:`judge_sources` judges a vLLM from its source files alone (the
  release files of ``tests/data`` are judged so).
- :func:`check_vllm_code` judges this process's vLLM: the sources of its
  modules, and that the code which runs is compiled from them (the module
  objects in ``sys.modules``, and what their loaders give). It never raises:
  what it cannot judge, it reports as such.
"""

from __future__ import annotations

import ast
import copy
import dis
import functools
import gc
import hashlib
import importlib.util
import os
import re
import stat
import sys
from collections import ChainMap
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import CodeType, FunctionType
from typing import Any

ARC_MODULE = "vllm.v1.kv_offload.cpu.policies.arc"
BASE_MODULE = "vllm.v1.kv_offload.cpu.policies.base"
CPU_MANAGER = "vllm.v1.kv_offload.cpu.manager"
TIERING_MANAGER = "vllm.v1.kv_offload.tiering.manager"
CALLER_MODULES = (CPU_MANAGER, TIERING_MANAGER)
"""The policy's callers. A release without the tiering module has no such caller."""
FILES = {
    ARC_MODULE: "arc.py",
    BASE_MODULE: "base.py",
    CPU_MANAGER: "cpu/manager.py",
    TIERING_MANAGER: "tiering/manager.py",
}
"""Each judged module by the short name that the table and messages use."""
KV_OFFLOAD = "vllm.v1.kv_offload"
"""The package whose module files are searched for the policy's callers."""
POLICIES_PACKAGE = "vllm.v1.kv_offload.cpu.policies"
"""The policies and their registry: judged by fingerprint (arc.py, base.py)
or not callers of a policy object (the rest)."""
_MENTIONS_POLICY = re.compile(
    rb"(?<!\w)(?:_policy|CachePolicy|ARCCachePolicy|CachePolicyFactory)(?!\w)"
    rb"|(?<!\w)policies(?:\.arc(?!\w)|\s+import\b)"
)
"""A caller's mark (the rule: docs/usage.md, "The guard", the callers): a
module that names the manager's policy attribute (``_policy``), a policy
class or the factory (``CachePolicy``, ``ARCCachePolicy``,
``CachePolicyFactory``), or vLLM's ARC module (``policies.arc``,
``policies import``)."""


def short_name(module: str) -> str:
    """A judged module's name in the table and messages: its file's path
    under vllm/v1/kv_offload ("cpu/manager.py"), or arc.py and base.py."""
    if module in FILES:
        return FILES[module]
    return module.removeprefix(KV_OFFLOAD + ".").replace(".", "/") + ".py"


_LEADING_DOCSTRING = re.compile(rb"\A(?:[ \t]*(?:#[^\n]*)?\r?\n)*[rRuU]?(\"\"\"|\'\'\')")


def is_caller_source(source: bytes) -> bool:
    """Whether a module's source marks it as a caller of the policy (its
    module docstring aside)."""
    lead = _LEADING_DOCSTRING.match(source)
    if lead is not None:
        end = source.find(lead.group(1), lead.end())
        if end > 0:
            source = source[end + 3 :]
    return (b"_policy" in source or b"CachePolicy" in source or b"policies" in source) and (
        _MENTIONS_POLICY.search(source) is not None
    )


def find_callers(root: str) -> dict[str, tuple[str, bytes]]:
    """The policy's callers in a vllm/v1/kv_offload directory, by their
    files alone (nothing is imported): each module file (``*.py``) of the
    package tree, outside cpu/policies, that :func:`is_caller_source`;
    module name: (path, source). Only regular files are opened; a directory that
    is not a package (no ``__init__.py``) is left out, as an import would
    leave it (its files are no modules of the tree)."""
    found: dict[str, tuple[str, bytes]] = {}
    todo = [(root, KV_OFFLOAD)]
    while todo:
        folder, package = todo.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            try:
                mode = os.stat(entry.path).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                if name.isidentifier() and os.path.isfile(os.path.join(entry.path, "__init__.py")):
                    sub = f"{package}.{name}"
                    if sub != POLICIES_PACKAGE:
                        todo.append((entry.path, sub))
                continue
            stem = name[:-3]
            if not (name.endswith(".py") and stem.isidentifier() and stat.S_ISREG(mode)):
                continue
            module = package if stem == "__init__" else f"{package}.{stem}"
            try:
                with open(entry.path, "rb") as f:
                    source = f.read()
            except OSError:
                continue
            if is_caller_source(source):
                found[module] = (entry.path, source)
    return found


DYNAMIC = frozenset(
    {
        "getattr",
        "hasattr",
        "setattr",
        "delattr",
        "vars",
        "__dict__",
        "__getattribute__",
        "attrgetter",
        "methodcaller",
        "getattr_static",
        "getmembers",
        "getmembers_static",
        "format",
        "format_map",
        "vformat",
        "get_field",
        "eval",
        "exec",
        "compile",
        # what reads, copies or rebuilds an object's state without naming it
        "__getstate__",
        "__setstate__",
        "__reduce__",
        "__reduce_ex__",
        "__getnewargs__",
        "__getnewargs_ex__",
        "__copy__",
        "__deepcopy__",
        "__getattr__",
        "__setattr__",
        "__delattr__",
        "__dir__",
        "dir",
    }
)
"""What reaches an attribute by a computed name (a format string's field
included), or an object's state as a whole: a caller may use none."""
ARC_CLASS = "ARCCachePolicy"
"""vLLM's ARC class by name: a caller may not use it (``isinstance``,
``issubclass``, a class pattern: vLLM's class is not arc_cy's)."""
_WORD = re.compile(r"[A-Za-z_]\w*")
_MODULE_CODE = "<module code>"


class Unjudged(Exception):
    """The code cannot be judged (the guard refuses it)."""


# --- fingerprints ---------------------------------------------------------------


def _is_string_statement(stmt: object) -> bool:
    # A docstring, or any other string statement: it does nothing.
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


class _Token(str):
    __slots__ = ()


_CLOSE, _SEP, _LIST, _END = map(_Token, (")", ",", "[", "]"))


def fingerprint(node: object) -> str:
    """sha256 (128 bits, hex) of an AST node, or a list of them, without
    string statements and positions, leaving out fields that are None or
    empty (Python releases add such fields, and a fingerprint must not depend
    on the Python that computes it). Iterative: any depth the parser takes."""
    out: list[str] = []
    stack: list[object] = [node]
    push, pop, append = stack.append, stack.pop, out.append
    while stack:
        item = pop()
        kind = type(item)
        if kind is _Token:
            append(item)  # type: ignore[arg-type]
        elif isinstance(item, ast.AST):
            push(_CLOSE)
            for name in reversed(item._fields):
                value = getattr(item, name, None)
                if value is None or value == [] or (name == "kind" and kind is ast.Constant):
                    continue  # (a string's u prefix means nothing: Constant.kind)
                if kind is not ast.Constant and isinstance(value, list):
                    if isinstance(value[0], ast.stmt):
                        value = [s for s in value if not _is_string_statement(s)] or [ast.Pass()]
                push(_SEP)
                push(value)
                push(_Token(name + "="))
            push(_Token(kind.__name__))
        elif kind is list:
            push(_END)
            for value in reversed(item):  # type: ignore[call-overload]
                push(_SEP)
                push(value)
            push(_LIST)
        else:
            append(repr(item))
    return hashlib.sha256("\x00".join(out).encode()).hexdigest()[:32]


def fingerprint_source(source: str | bytes) -> str:
    """The fingerprint of a whole module (a caller's, in the table)."""
    return fingerprint(ast.parse(source))


# --- what ARC runs and reads ----------------------------------------------------


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _bound_by(item: ast.AST) -> str | None:
    """The name one node binds in its scope, by every binding form: an
    assignment, augmented or annotated assignment, walrus, for, with or
    del target (a Name, stored or deleted), an import (as) alias, an
    except-as name, a match capture (MatchAs, MatchStar, MatchMapping's
    rest), a def or class; else None."""
    if isinstance(item, ast.Name):
        return item.id if isinstance(item.ctx, (ast.Store, ast.Del)) else None
    if isinstance(item, ast.alias):
        return (item.asname or item.name).split(".")[0]
    if isinstance(item, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
        return item.name
    if isinstance(item, ast.MatchMapping):
        return item.rest
    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return item.name
    return None


def _store_names(node: ast.AST) -> Iterator[str]:
    # The module-level names a statement binds (the rule: docs/usage.md,
    # "The guard", binding forms): what it binds in the module's scope,
    # and the names a function inside it declares global.
    stack = [node]
    while stack:
        item = stack.pop()
        name = _bound_by(item)
        if name is not None and name != "*":
            yield name
        if isinstance(item, _SCOPES):
            yield from _global_names(item)
            stack.extend(_outer_parts(item))
            continue
        stack.extend(ast.iter_child_nodes(item))


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement in body and in the statement lists nested in it
    (blocks, handlers, match cases, nested defs); no expression is walked."""
    todo: list[list[ast.stmt]] = [body]
    while todo:
        for stmt in todo.pop():
            yield stmt
            for field in ("body", "orelse", "finalbody"):
                value = getattr(stmt, field, None)
                if isinstance(value, list):
                    todo.append(value)
            for part in getattr(stmt, "handlers", None) or getattr(stmt, "cases", None) or ():
                todo.append(part.body)


def _global_names(scope: ast.AST) -> Iterator[str]:
    # The names that the functions in a def or class declare global (a
    # statement, so only statements are walked, nested defs included).
    body = getattr(scope, "body", None)
    if isinstance(body, list):
        for stmt in _statements(body):
            if isinstance(stmt, ast.Global):
                yield from stmt.names


def _outer_parts(scope: ast.AST) -> list[ast.AST]:
    # What a def, class or lambda evaluates in the scope around it:
    # decorators, defaults, annotations, bases and keywords.
    parts: list[ast.AST] = list(getattr(scope, "decorator_list", ()))
    args = getattr(scope, "args", None)
    if isinstance(args, ast.arguments):
        parts += args.defaults + [d for d in args.kw_defaults if d is not None]
        if not isinstance(scope, ast.Lambda):
            every = args.posonlyargs + args.args + args.kwonlyargs
            every += [a for a in (args.vararg, args.kwarg) if a is not None]
            parts += [a.annotation for a in every if a.annotation is not None]
    for field in ("returns", "bases", "keywords"):
        value = getattr(scope, field, None)
        parts += value if isinstance(value, list) else [value] if value is not None else []
    return parts


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _free_names(nodes: Iterable[ast.AST]) -> set[str]:
    """The names that code reads from its module (globals and builtins):
    every name it loads, less those bound locally in the function (or
    lambda, or comprehension) that reads them, or in one around it."""
    out: set[str] = set()
    # (node, the names bound in the function scopes around it)
    todo: list[tuple[ast.AST, frozenset[str]]] = [(n, frozenset()) for n in nodes]
    while todo:
        node, bound = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo += [(p, bound) for p in _outer_parts(node)]
            args = node.args
            every = (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg)
            params = {a.arg for a in every if a is not None}
            body = node.body if isinstance(node.body, list) else [node.body]
            todo += _scope(body, bound, params, out)
        elif isinstance(node, ast.ClassDef):
            todo += [(p, bound) for p in _outer_parts(node)]
            todo += _scope(node.body, bound, None, out)
        elif isinstance(node, _COMPREHENSIONS):
            first, *rest = node.generators
            todo.append((first.iter, bound))  # evaluated in the scope around it
            parts: list[ast.AST] = [first.target, *first.ifs]
            for gen in rest:
                parts += [gen.target, gen.iter, *gen.ifs]
            parts += [getattr(node, f) for f in ("elt", "key", "value") if hasattr(node, f)]
            todo += _scope(parts, bound, set(), out)
        else:
            todo += _scope([node], bound, None, out)
    return out


def _scope(
    body: list[ast.AST], bound: frozenset[str], local: set[str] | None, out: set[str]
) -> list[tuple[ast.AST, frozenset[str]]]:
    # One scope's own nodes: its loads go to out unless bound there; its
    # nested scopes are returned, with what they see bound. local: the
    # function's (or comprehension's) parameters, None for a module or
    # class body (whose names are globals, or invisible to nested scopes).
    names: set[str] = set()
    declared_global: set[str] = set()
    loads: list[str] = []
    nested: list[ast.AST] = []
    stack = list(body)
    while stack:
        item = stack.pop()
        if isinstance(item, ast.Global):
            declared_global.update(item.names)
        if isinstance(item, ast.Name) and isinstance(item.ctx, ast.Load):
            loads.append(item.id)
        else:
            name = _bound_by(item)
            if name is not None:
                names.add(name)
        if isinstance(item, (*_SCOPES, *_COMPREHENSIONS)):
            nested.append(item)
            continue
        stack.extend(ast.iter_child_nodes(item))
    seen = bound if local is None else (bound | local | names) - declared_global
    out.update(n for n in loads if n not in seen)
    return [(n, frozenset(seen)) for n in nested]


def _bindings(tree: ast.Module) -> dict[str, list[ast.stmt]]:
    """Each module-level name with the statements that bind it; statements
    that bind nothing under _MODULE_CODE."""
    out: dict[str, list[ast.stmt]] = {}
    for stmt in tree.body:
        if _is_string_statement(stmt):
            continue
        names = set(_store_names(stmt))
        for name in sorted(names) or [_MODULE_CODE]:
            binding = stmt
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                # One import binding, as if it were a statement of its own.
                binding = copy.copy(stmt)
                binding.names = [
                    a for a in stmt.names if (a.asname or a.name).split(".")[0] == name
                ]
            out.setdefault(name, []).append(binding)
    return out


def _referenced(nodes: Iterable[ast.AST]) -> set[str]:
    """The module-level names that code reads (:func:`_free_names`) or
    binds at module level."""
    nodes = list(nodes)
    return _free_names(nodes) | {n for node in nodes for n in _store_names(node)}


def _runs_at_import(stmt: ast.stmt) -> bool:
    """Whether a module-level statement runs code when its module is
    imported beyond binding a name to a function: every statement but a
    def with no decorators, defaults or annotations."""
    if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return True
    return bool(_outer_parts(stmt))


def _split_class(
    cls: ast.ClassDef,
) -> tuple[ast.ClassDef, dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]]:
    # (the class without its functions, its functions by name)
    methods: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
    header = copy.copy(cls)
    header.body = []
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            methods.setdefault(stmt.name, []).append(stmt)
        else:
            header.body.append(stmt)
    return header, methods


def _one_class(bindings: Mapping[str, list[ast.stmt]], name: str, file: str) -> ast.ClassDef:
    found = bindings.get(name, [])
    if len(found) != 1 or not isinstance(found[0], ast.ClassDef):
        raise Unjudged(f"{file} does not define {name} as one class")
    return found[0]


def class_attributes(cls: ast.ClassDef) -> frozenset[str]:
    """What a class defines: its methods, class attributes and what its
    methods assign to ``self``."""
    names = {
        n.attr
        for n in ast.walk(cls)
        if isinstance(n, ast.Attribute)
        and isinstance(n.ctx, ast.Store)
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
    }
    for stmt in cls.body:
        names.update(_store_names(stmt))
    return frozenset(names)


def _super_calls(nodes: Iterable[ast.AST], base: str) -> set[str]:
    # Base methods reached through super().X or Base.X.
    out = set()
    for node in nodes:
        for n in ast.walk(node):
            if not isinstance(n, ast.Attribute):
                continue
            value = n.value
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id == "super"
            ) or (isinstance(value, ast.Name) and value.id == base):
                out.add(n.attr)
    return out


@dataclass(frozen=True)
class ArcCode:
    """What :func:`arc_code` found in arc.py and base.py."""

    objects: Mapping[str, str]
    """Each object ARC runs or reads ("arc.py:ARCCachePolicy.evict",
    "base.py:ChunkStatus", ...) with its fingerprint."""
    methods: frozenset[str]
    """The names of ARCCachePolicy's methods."""
    arc_names: frozenset[str]
    """What vLLM's ARCCachePolicy defines (methods, attributes)."""
    base_names: frozenset[str]
    """What base.py's CachePolicy defines."""
    nodes: tuple[ast.AST, ...] = ()
    """The code itself (its syntax trees)."""

    @functools.cached_property
    def uses(self) -> frozenset[str]:
        """Every attribute and name that ARC's own code uses (read only
        when a verified method is gone: it walks every node)."""
        return frozenset(
            n.attr if isinstance(n, ast.Attribute) else n.id
            for node in self.nodes
            for n in ast.walk(node)
            if isinstance(n, (ast.Attribute, ast.Name))
        )


def arc_code(arc: ast.Module, base: ast.Module) -> ArcCode:
    """The code ARC runs and reads: ARCCachePolicy's methods and the rest of
    its class; the CachePolicy methods it inherits and does not override,
    or reaches through super(); the rest of CachePolicy's class; what
    arc.py binds at module level; and what base.py binds that this code
    uses, ChunkStatus always (its layout is what arc_cy reads).
    Raises Unjudged when a class is missing."""
    arc_bindings, base_bindings = _bindings(arc), _bindings(base)
    arc_cls = _one_class(arc_bindings, "ARCCachePolicy", "arc.py")
    base_cls = _one_class(base_bindings, "CachePolicy", "base.py")
    _one_class(base_bindings, "ChunkStatus", "base.py")
    nodes: dict[str, list[ast.AST]] = {}

    arc_header, arc_methods = _split_class(arc_cls)
    nodes["arc.py:ARCCachePolicy"] = [arc_header]
    for name, defs in arc_methods.items():
        nodes[f"arc.py:ARCCachePolicy.{name}"] = list(defs)
    for name, stmts in arc_bindings.items():
        if name != "ARCCachePolicy":
            nodes[f"arc.py:{name}"] = list(stmts)

    base_header, base_methods = _split_class(base_cls)
    arc_defined = set(arc_methods) | class_attributes(arc_header)
    reached = _super_calls([arc_cls], base_cls.name)
    nodes["base.py:CachePolicy"] = [base_header]
    for name, defs in base_methods.items():
        if name not in arc_defined or name in reached:
            nodes[f"base.py:CachePolicy.{name}"] = list(defs)

    # base.py: what it runs at import, and what of it this code reaches
    # (the rule: docs/usage.md, "The guard").
    imported_from_base = {
        a.name
        for stmt in arc.body
        if isinstance(stmt, ast.ImportFrom)
        and (
            (stmt.level == 0 and stmt.module == BASE_MODULE)
            or (stmt.level == 1 and stmt.module == BASE_MODULE.rpartition(".")[2])
        )
        for a in stmt.names
    }
    todo = imported_from_base | {"ChunkStatus", "order_request_keys", _MODULE_CODE}
    for name, stmts in base_bindings.items():
        if any(_runs_at_import(stmt) for stmt in stmts):
            todo.add(name)
    todo -= {"CachePolicy"}
    base_nodes = [n for k, v in nodes.items() if k.startswith("base.py:") for n in v]
    todo |= _referenced(base_nodes)
    seen: set[str] = {"CachePolicy"}
    while todo:
        name = todo.pop()
        if name in seen or name not in base_bindings:
            continue
        seen.add(name)
        nodes[f"base.py:{name}"] = list(base_bindings[name])
        todo |= _referenced(base_bindings[name])

    return ArcCode(
        objects={k: fingerprint(v) for k, v in sorted(nodes.items())},
        methods=frozenset(arc_methods),
        arc_names=class_attributes(arc_cls),
        base_names=class_attributes(base_cls),
        nodes=tuple(n for v in nodes.values() for n in v),
    )


# --- the callers ----------------------------------------------------------------


def _code_objects(code: CodeType) -> Iterator[CodeType]:
    stack = [code]
    while stack:
        obj = stack.pop()
        yield obj
        stack.extend(c for c in obj.co_consts if isinstance(c, CodeType))


def _doc_key(text: str) -> str:
    # A docstring as the AST and every compiler agree on it: CPython 3.13
    # compiles docstrings with their indentation stripped (the AST keeps
    # it), so lines are compared stripped.
    return "\n".join(line.strip() for line in text.strip().splitlines())


def _string_statements(tree: ast.Module) -> Iterator[ast.Expr]:
    """A module's string statements (its docstrings among them)."""
    for stmt in _statements(tree.body):
        if _is_string_statement(stmt):
            yield stmt  # type: ignore[misc]


def _docstring_texts(tree: ast.Module) -> set[str]:
    """The texts of a module's string statements (its docstrings)."""
    return {_doc_key(stmt.value.value) for stmt in _string_statements(tree)}  # type: ignore[attr-defined]


def _words(const: object, skip: set[str], out: set[str], doubtful: set[str]) -> None:
    # The identifiers in a constant's strings, tuples (keyword names, class
    # patterns) and frozensets included; skip: docstring texts, whose
    # strings go to doubtful (the same text may be a docstring and a use).
    # (Only a constant of its own can be a docstring, not one in a tuple.)
    if isinstance(const, str) and _doc_key(const) in skip:
        doubtful.add(const)
        return
    todo = [const]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            out.update(_WORD.findall(item))
        elif isinstance(item, (tuple, frozenset)):
            todo.extend(item)


def _statement_strings(tree: ast.Module) -> set[int]:
    # The ids of the string statements' constants (docstrings among them).
    return {id(stmt.value) for stmt in _string_statements(tree)}


def _docstring_counts(tree: ast.Module) -> dict[str, int]:
    # Each string statement's text (as written), with how many there are.
    counts: dict[str, int] = {}
    for stmt in _string_statements(tree):
        text = stmt.value.value  # type: ignore[attr-defined]
        counts[text] = counts.get(text, 0) + 1
    return counts


def names_used(
    tree: ast.Module, code: CodeType, wanted: Iterable[str], source: bytes | None = None
) -> dict[str, int]:
    """Which of ``wanted`` a module's code uses, each with the first line
    using it: the attributes and globals of its code, the identifiers in
    its strings (a format string's fields), keyword names and class-pattern
    attributes. A string statement (a docstring) is not a use; a string
    with a docstring's text elsewhere is."""
    wanted = frozenset(wanted)
    skip = _docstring_texts(tree)
    hits: set[str] = set()
    doubtful: set[str] = set()
    for obj in _code_objects(code):
        hits |= wanted.intersection(obj.co_names)
        words: set[str] = set()
        for const in obj.co_consts:
            if not isinstance(const, CodeType):
                _words(const, skip, words, doubtful)
        hits |= wanted.intersection(words)
    doubtful = {t for t in doubtful if wanted.intersection(_WORD.findall(t))}
    if doubtful and source is not None:
        # A text the source holds no more often than its docstrings do is
        # only theirs (a use written with escapes reaches an attribute by
        # a dynamic route, refused on its own).
        written = _docstring_counts(tree)
        doubtful = {t for t in doubtful if source.count(t.encode()) != written.get(t, -1)}
    if doubtful:
        # Only the string statements' own constants are docstrings.
        statements = _statement_strings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant):
                texts = [node.value] if id(node) not in statements else []
            elif isinstance(node, ast.keyword):
                texts = [node.arg]
            elif isinstance(node, ast.MatchClass):
                texts = list(node.kwd_attrs)
            else:
                continue
            for text in texts:
                if isinstance(text, str) and text in doubtful:
                    hits |= wanted.intersection(_WORD.findall(text))
    return _first_lines(tree, code, hits) if hits else {}


def _first_lines(tree: ast.Module, code: CodeType, names: set[str]) -> dict[str, int]:
    # The first line using each name (only for a refusal's message, and
    # only when something was found: it reads every instruction and node).
    used: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        if name in names and (name not in used or line < used[name]):
            used[name] = line

    for obj in _code_objects(code):
        for ins in dis.get_instructions(obj):
            if isinstance(ins.argval, str) and ins.argval in obj.co_names:
                add(ins.argval, (ins.positions.lineno if ins.positions else None) or 0)
    statements = _statement_strings(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        words: set[str] = set()
        if isinstance(node, ast.Constant):
            if id(node) not in statements:
                _words(node.value, set(), words, set())
        elif isinstance(node, ast.keyword) and node.arg:
            words.add(node.arg)
        elif isinstance(node, ast.MatchClass):
            words.update(node.kwd_attrs)
        for word in words:
            add(word, line)
    for name in names - used.keys():
        used[name] = code.co_firstlineno
    return used


def forbidden_names(code: ArcCode, policy_names: Iterable[str]) -> frozenset[str]:
    """DYNAMIC, and what an ARC policy (vLLM's, or one with policy_names)
    has beyond base.py's CachePolicy, dunders aside."""
    ours = code.arc_names | set(policy_names)
    base = code.base_names | set(dir(object))
    beyond = {n for n in ours - base if not (n.startswith("__") and n.endswith("__"))}
    return DYNAMIC | beyond | {ARC_CLASS}


def policy_attributes(code: ArcCode, policy_names: Iterable[str]) -> frozenset[str]:
    """Every attribute a policy has (CachePolicy's, vLLM's ARC's, arc_cy's),
    dunders aside: what a caller may not assign or delete."""
    every = code.base_names | code.arc_names | set(policy_names)
    return frozenset(n for n in every if not (n.startswith("__") and n.endswith("__")))


_STORE_ATTR = re.compile(
    b"[" + bytes([dis.opmap["STORE_ATTR"], dis.opmap["DELETE_ATTR"]]) + b"]", re.DOTALL
)


def _stores_attribute(code: CodeType, names: frozenset[str]) -> bool:
    # Whether any of the code stores or deletes an attribute named in
    # names (its STORE_ATTR and DELETE_ATTR instructions, read from the
    # bytecode: the AST walk that finds where is paid only then).
    extended = dis.opmap["EXTENDED_ARG"]
    for obj in _code_objects(code):
        if not names.intersection(obj.co_names):
            continue
        raw = obj.co_code
        for match in _STORE_ATTR.finditer(raw):
            at = match.start()
            if at % 2:
                continue
            arg, back = raw[at + 1], at - 2
            shift = 8
            while back >= 0 and raw[back] == extended:
                arg |= raw[back + 1] << shift
                back, shift = back - 2, shift + 8
            if arg < len(obj.co_names) and obj.co_names[arg] in names:
                return True
    return False


def attribute_writes(tree: ast.Module, code: CodeType, names: frozenset[str]) -> dict[str, int]:
    """Where a module assigns or deletes (augmented assignment included)
    an attribute named in ``names`` on anything but ``self`` or ``cls``:
    each name with its first line."""
    if not _stores_attribute(code, names):
        return {}
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and not isinstance(node.ctx, ast.Load)
            and node.attr in names
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            if node.attr not in found or node.lineno < found[node.attr]:
                found[node.attr] = node.lineno
    return found


# --- the verdict ----------------------------------------------------------------


def release_key(version: str) -> tuple[int, ...]:
    """The release numbers of a version ("0.33.0rc1+local" -> (0, 33, 0))."""
    parts = []
    for part in version.split("+")[0].split("."):
        digits = len(part) - len(part.lstrip("0123456789"))
        if digits:
            parts.append(int(part[:digits]))
        if digits < len(part) or not digits:
            break
    return tuple(parts)


def _closest(releases: Iterable[str], version: str) -> str:
    # The release named version; else the newest not newer than it; else the oldest.
    ordered = sorted(releases, key=release_key)
    if version in ordered:
        return version
    older = [r for r in ordered if release_key(r) <= release_key(version)]
    return older[-1] if older else ordered[0]


@dataclass(frozen=True)
class Change:
    """One object of the installed ARC code that is not the verified one."""

    name: str
    """The object, e.g. "arc.py:ARCCachePolicy.evict"."""
    path: str
    how: str
    """"differs", "new" (the nearest verified code has no such object) or
    "missing" (a method Python calls, which the verified code has)."""


@dataclass(frozen=True)
class Use:
    """A name a caller (or ARC's own code) must not use, where it uses it."""

    name: str
    path: str
    line: int
    why: str
    """"dynamic", "beyond" (an ARC policy has it beyond CachePolicy),
    "class" (vLLM's ARC class by name), "write" (an assignment or deletion
    of a policy attribute's name) or "gone" (a verified ARC has it, the
    installed one does not)."""
    release: str | None = None
    """For "gone": the verified release whose ARC has it."""


@dataclass(frozen=True)
class CodeCheck:
    """What the guard found for one vLLM."""

    version: str
    """The vLLM's version string (reported, never decisive)."""
    verified_as: str | None = None
    """The verified release whose ARC code this is; None if it is none's."""
    nearest: str | None = None
    """When it is none's: the verified release whose ARC code is nearest."""
    changes: tuple[Change, ...] = ()
    uses: tuple[Use, ...] = ()
    not_source: tuple[tuple[str, str], ...] = ()
    """(path, what) where the code that runs is not compiled from the source."""
    unjudged: tuple[str, ...] = ()
    """Why (part of) the code could not be judged."""

    @property
    def ok(self) -> bool:
        return (
            self.verified_as is not None
            and not self.changes
            and not self.uses
            and not self.not_source
            and not self.unjudged
        )


def judge_sources(
    version: str,
    sources: Mapping[str, bytes],
    paths: Mapping[str, str],
    verified: Sequence[Mapping[str, Any]],
    policy_names: Iterable[str],
    compiled: Mapping[str, tuple[ast.Module, CodeType]] | None = None,
) -> CodeCheck:
    """Judge a vLLM from the sources of its modules (by module name): arc.py,
    base.py and its callers, every other module given (those at the
    known paths, CALLER_MODULES, may be absent). ``verified`` is the table
    (``arc_cy._verified.VERIFIED``); ``policy_names`` arc_cy's policy's
    names; ``compiled`` each module's AST and code, when already made."""
    compiled = dict(compiled or {})
    for module, source in sources.items():
        if module not in compiled:
            tree = ast.parse(source)
            compiled[module] = (tree, compile(tree, paths[module], "exec", dont_inherit=True))
    trees = {m: tree for m, (tree, _) in compiled.items()}
    code = arc_code(trees[ARC_MODULE], trees[BASE_MODULE])
    installed = code.objects

    def shared(entry: Mapping[str, Any]) -> int:
        return sum(entry["arc"].get(k) == v for k, v in installed.items())

    matching = [e for e in verified if shared(e) == len(installed)]
    releases_of = {r: e for e in verified for r in e["releases"]}
    if matching:
        # The entry that is this code exactly, if one is; else the nearest
        # release of those that hold it (one that lost a method, say).
        exact = [e for e in matching if e["arc"] == installed] or matching
        verified_as = _closest([r for e in exact for r in e["releases"]], version)
        nearest, changes = None, []
    else:
        best = max(map(shared, verified), default=0)
        candidates = [r for e in verified if shared(e) == best for r in e["releases"]]
        verified_as, nearest = None, _closest(candidates, version) if candidates else None
        near = releases_of[nearest]["arc"] if nearest else {}
        changes = [
            Change(k, paths[ARC_MODULE if k.startswith("arc.py:") else BASE_MODULE], how)
            for k, v in installed.items()
            if near.get(k) != v
            for how in ["new" if k not in near else "differs"]
        ]

    # Methods a verified ARC has and this one lacks: no code may use them.
    # A dunder lacking (Python calls it, not code by name) is a change.
    against = matching or ([releases_of[nearest]] if nearest else [])
    prefix = "arc.py:ARCCachePolicy."
    gone: dict[str, str] = {}  # name: the verified release whose ARC has it
    for entry in against:
        for key in entry["arc"]:
            name = key[len(prefix) :]
            if key.startswith(prefix) and name not in code.methods:
                release = _closest(entry["releases"], version)
                if not (name.startswith("__") and name.endswith("__")):
                    gone.setdefault(name, release)
                elif all(c.name != key for c in changes):
                    changes.append(Change(key, paths[ARC_MODULE], "missing"))
                    nearest = nearest or verified_as or release
    if changes:
        verified_as = None
    forbidden = forbidden_names(code, policy_names) | gone.keys()
    uses: list[Use] = []
    for name in sorted(gone.keys() & code.uses if gone else ()):
        uses.append(Use(name, paths[ARC_MODULE], 0, "gone", gone[name]))
    writable = policy_attributes(code, policy_names)
    callers = [m for m in CALLER_MODULES if m in sources]
    callers += sorted(m for m in sources if m not in (ARC_MODULE, BASE_MODULE, *callers))
    for module in callers:
        tree, caller = compiled[module]
        found = names_used(tree, caller, forbidden, sources.get(module))
        trusted = bool(found) and any(  # fingerprinted only when it matters
            fingerprint(tree) in e["callers"].get(short_name(module), ()) for e in matching
        )
        writes = attribute_writes(tree, caller, writable)
        trusted = trusted or (
            bool(writes)
            and any(fingerprint(tree) in e["callers"].get(short_name(module), ()) for e in matching)
        )
        found_uses = [(name, line, None) for name, line in found.items()]
        found_uses += [(name, line, "write") for name, line in writes.items()]
        for name, line, kind in sorted(found_uses, key=lambda u: (u[1], u[0], u[2] or "")):
            why = kind or (
                "gone"
                if name in gone
                else "dynamic"
                if name in DYNAMIC
                else "class"
                if name == ARC_CLASS
                else "beyond"
            )
            if trusted and why != "gone":
                continue  # a verified caller, as that release shipped it
            uses.append(Use(name, paths[module], line, why, gone.get(name)))
    return CodeCheck(version, verified_as, nearest, tuple(changes), tuple(uses))


# --- the code that runs ---------------------------------------------------------

_CODE_FIELDS = (
    "co_argcount",
    "co_posonlyargcount",
    "co_kwonlyargcount",
    "co_nlocals",
    "co_stacksize",
    "co_flags",
    "co_code",
    "co_names",
    "co_varnames",
    "co_freevars",
    "co_cellvars",
    "co_filename",
    "co_name",
    "co_qualname",
    "co_firstlineno",
    "co_linetable",
    "co_exceptiontable",
)


def _same_constant(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is tuple:
        return len(a) == len(b) and all(map(_same_constant, a, b))  # type: ignore[arg-type]
    if type(a) in (float, complex, frozenset):
        return (
            repr(a) == repr(b)
            if type(a) is not frozenset
            else sorted(map(repr, a))
            == sorted(
                map(repr, b)  # type: ignore[call-overload]
            )
        )
    return a == b


def same_code(a: CodeType, b: CodeType, *, fresh: bool) -> bool:
    """Whether two code objects run the same, field by field, nested code
    included (``==`` ignores co_stacksize, co_qualname and co_filename, and
    reads specialised opcodes as their base). ``fresh``: neither has run,
    so their adaptive bytecode, specialisations and caches included, must
    match byte for byte too."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if type(x) is not CodeType or type(y) is not CodeType:
            return False
        if any(getattr(x, f) != getattr(y, f) for f in _CODE_FIELDS):
            return False
        if fresh and x._co_code_adaptive != y._co_code_adaptive:  # type: ignore[attr-defined]
            return False
        if len(x.co_consts) != len(y.co_consts):
            return False
        for c, d in zip(x.co_consts, y.co_consts):
            if isinstance(c, CodeType) or isinstance(d, CodeType):
                stack.append((c, d))
            elif not _same_constant(c, d):
                return False
    return True


def _functions(obj: object) -> list[object] | None:
    """The functions that a namespace entry runs, as it is bound: itself, or
    what a staticmethod, classmethod or property (those exact types) holds.
    None when it is none of these (a wrapper, a callable object, a
    descriptor of another type): its code is not a function compiled from
    the source, whatever it wraps (``__wrapped__`` is never followed)."""
    kind = type(obj)
    if kind is FunctionType:
        return [obj]
    if kind is staticmethod or kind is classmethod:
        return _functions(obj.__func__)  # type: ignore[attr-defined]
    if kind is property:
        out: list[object] = []
        for f in (obj.fget, obj.fset, obj.fdel):  # type: ignore[attr-defined]
            if f is not None:
                inner = _functions(f)
                if inner is None or type(f) is not FunctionType:
                    return None
                out += inner
        return out
    return None


_MODULE_DUNDERS = frozenset(
    {
        "__name__",
        "__doc__",
        "__package__",
        "__loader__",
        "__spec__",
        "__file__",
        "__cached__",
        "__builtins__",
        "__annotations__",
        "__annotate__",
        "__conditional_annotations__",
    }
)
"""What the import system (and the compiler) put in a module's namespace."""
_CLASS_DUNDERS = frozenset(
    {
        "__module__",
        "__qualname__",
        "__doc__",
        "__dict__",
        "__weakref__",
        "__abstractmethods__",
        "_abc_impl",
        "__annotations__",
        "__orig_bases__",
        "__parameters__",
        "__firstlineno__",
        "__static_attributes__",
        "__type_params__",
        "__annotate_func__",
        "__annotations_cache__",
    }
)
"""What Python (and ABCMeta) put in a class's namespace."""


def _bound_kind(node: ast.FunctionDef | ast.AsyncFunctionDef) -> type:
    # What a def binds in its class or module, by its decorators: a
    # staticmethod, classmethod or property (a getter, or X.setter and
    # X.deleter), else the function (other decorators are vLLM's markers,
    # typing's override and abc's abstractmethod, which return it).
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Name) and decorator.id in ("staticmethod", "classmethod"):
            return staticmethod if decorator.id == "staticmethod" else classmethod
        if (isinstance(decorator, ast.Name) and decorator.id == "property") or (
            isinstance(decorator, ast.Attribute) and decorator.attr in ("setter", "deleter")
        ):
            return property
    return FunctionType


def _literal(node: ast.AST | None, namespace: Mapping[str, object]) -> object:
    """The value a default or assignment's expression has, as the source
    writes it: a literal, or a module global it names; _OTHER when the
    guard cannot tell (the rule: docs/usage.md, "The guard")."""
    if node is None:
        return _OTHER
    if isinstance(node, ast.Name):
        return namespace.get(node.id, _OTHER)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _OTHER


def _same_value(live: object, written: object) -> bool:
    if written is _OTHER:
        return False
    return live is written or _same_constant(live, written)


def _live_problems(module: str, live: object, tree: ast.Module, compiled: CodeType) -> list[str]:
    """What in a module object does not run its source's code (the rule:
    docs/usage.md, "The guard", what is judged is what runs): each
    function and method the source defines must be bound, as it is, to a
    function with the code compiled from it, the module's globals and
    builtins, the closure and defaults the source gives it; each import
    binding must be what it imports, each literal assignment its value;
    the module holds no global its source does not bind, and ARC's and
    CachePolicy's classes no attribute their source does not define."""
    import builtins

    by_qualname: dict[str, list[CodeType]] = {}
    for code in _code_objects(compiled):
        by_qualname.setdefault(code.co_qualname, []).append(code)
    namespace = getattr(live, "__dict__", None)
    if not isinstance(namespace, dict):
        return ["it is not a module"]
    problems: list[str] = []
    if namespace.get("__builtins__") not in (builtins, builtins.__dict__):
        problems.append("its __builtins__ are not Python's")

    def check(
        entry: object, qualname: str, node: ast.FunctionDef | ast.AsyncFunctionDef, cls: object
    ) -> None:
        candidates = by_qualname.get(qualname, ())
        functions = _functions(entry)
        if functions and type(entry) is not _bound_kind(node):
            functions = None  # e.g. a def the source writes, bound as a staticmethod
        if not functions:
            problems.append(f"{qualname} is not a function compiled from its source")
            return
        for f in functions:
            code = f.__code__  # type: ignore[attr-defined]
            if not any(same_code(code, c, fresh=False) for c in candidates):
                problems.append(f"{qualname} runs code that is not its source's")
                return
            if f.__globals__ is not namespace or f.__builtins__ is not builtins.__dict__:  # type: ignore[attr-defined]
                problems.append(f"{qualname} runs with globals that are not its module's")
                return
            closure = f.__closure__  # type: ignore[attr-defined]
            if code.co_freevars == ("__class__",) and cls is not None:
                if closure is None or len(closure) != 1:
                    problems.append(f"{qualname} has a closure that is not its source's")
                    return
                try:
                    held = closure[0].cell_contents
                except ValueError:
                    held = _OTHER
                if held is not cls:
                    problems.append(f"{qualname} has a closure that is not its source's")
                    return
            elif code.co_freevars or closure is not None:
                problems.append(f"{qualname} has a closure that is not its source's")
                return
        if node is None or len(functions) != 1:
            return  # (a property's accessors: no defaults to compare)
        f = functions[0]
        args = node.args
        # Defaults are evaluated where the def is: a class body, then the module.
        scope = ChainMap(
            *([cls.__dict__] if isinstance(cls, type) else []), namespace, builtins.__dict__
        )
        written = [_literal(d, scope) for d in args.defaults]
        live_defaults = f.__defaults__ or ()  # type: ignore[attr-defined]
        kw_written = {
            a.arg: _literal(d, scope)
            for a, d in zip(args.kwonlyargs, args.kw_defaults)
            if d is not None
        }
        live_kw = f.__kwdefaults__ or {}  # type: ignore[attr-defined]
        if (
            len(live_defaults) != len(written)
            or not all(map(_same_value, live_defaults, written))
            or live_kw.keys() != kw_written.keys()
            or not all(_same_value(live_kw[k], v) for k, v in kw_written.items())
        ):
            problems.append(f"{qualname} has defaults that are not its source's")

    def walk_class(node: ast.ClassDef, cls: object, prefix: str) -> None:
        ns = getattr(cls, "__dict__", None)
        if not isinstance(cls, type) or ns is None:
            problems.append(f"{prefix} is not the class its source defines")
            return
        owner = getattr(cls, "__module__", None)
        if owner != module or getattr(cls, "__qualname__", None) != prefix:
            # Another class in its place: said once, not once per member.
            what = f"{owner}.{getattr(cls, '__qualname__', '?')}"
            problems.append(
                f"{prefix} is {what}, not the class its source defines"
                + (_ARC_CY_IN_PLACE if str(owner).partition(".")[0] == "arc_cy" else "")
            )
            return
        defined = set()
        strict = module in (ARC_MODULE, BASE_MODULE) and node.name in (
            "ARCCachePolicy",
            "CachePolicy",
        )
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.add(stmt.name)
                if stmt.name not in ns:
                    problems.append(f"{prefix}.{stmt.name} is missing")
                else:
                    check(ns[stmt.name], f"{prefix}.{stmt.name}", stmt, cls)
            elif isinstance(stmt, ast.ClassDef) and stmt.name in ns:
                defined.add(stmt.name)
                walk_class(stmt, ns[stmt.name], f"{prefix}.{stmt.name}")
            else:
                defined.update(_store_names(stmt))
                if strict:
                    _check_literal(stmt, ns, prefix + ".")
        if strict:
            for name in ns:
                if name not in defined and name not in _CLASS_DUNDERS:
                    problems.append(f"{prefix}.{name} is not in its source")

    def _check_literal(stmt: ast.stmt, ns: Mapping[str, object], prefix: str) -> None:
        # A literal assignment to one name: that name holds its value.
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            return
        if not isinstance(target, ast.Name) or counts.get(target.id, 1) != 1:
            return
        written = _literal(value, {})
        if written is not _OTHER and not _same_value(ns.get(target.id, _MISSING), written):
            problems.append(f"{prefix}{target.id} is not the value its source assigns")

    counts: dict[str, int] = {}
    for stmt in tree.body:
        for name in set(_store_names(stmt)):
            counts[name] = counts.get(name, 0) + 1
    starred = [
        sys.modules.get(stmt.module or "")
        for stmt in tree.body
        if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names)
    ]
    for name in namespace:
        if name not in counts and name not in _MODULE_DUNDERS:
            if any(name in getattr(m, "__dict__", ()) for m in starred):
                continue  # what a star import binds
            problems.append(f"{name} is a global that its source does not bind")
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if stmt.name in namespace:
                check(namespace[stmt.name], stmt.name, stmt, None)
            else:
                problems.append(f"{stmt.name} is missing")
        elif isinstance(stmt, ast.ClassDef):
            if stmt.name in namespace:
                walk_class(stmt, namespace[stmt.name], stmt.name)
            else:
                problems.append(f"{stmt.name} is missing")
        elif isinstance(stmt, ast.ImportFrom) and not stmt.level:
            source = sys.modules.get(stmt.module or "")
            for alias in stmt.names:
                bound = alias.asname or alias.name
                if alias.name == "*" or counts.get(bound) != 1:
                    continue
                if source is None or namespace.get(bound, _MISSING) is not getattr(
                    source, alias.name, _OTHER
                ):
                    problems.append(f"{bound} is not what it imports")
        else:
            _check_literal(stmt, namespace, "")
    return problems


_MISSING, _OTHER = object(), object()
_ARC_CY_IN_PLACE = (
    " (arc_cy's own class, patched into vLLM's module: leave vLLM's module as it"
    ' is and name arc_cy in the configuration instead, "eviction_policy": "arc_cy",'
    ' or "eviction_policy": "ARCCachePolicy" with "cache_policy_module_path": "arc_cy")'
)


def _package_dirs(package: str) -> list[str]:
    """Where a package's modules are, without importing it or its parents
    (the rule: docs/usage.md, "The guard", finding the files): its
    ``__path__`` if it is imported; else its parent's directories joined
    with its name; for ``vllm`` itself, what ``find_spec`` finds (a
    top-level search imports nothing)."""
    live = sys.modules.get(package)
    path = getattr(live, "__path__", None) if live is not None else None
    if path is not None:
        return [p for p in list(path) if isinstance(p, str)]
    parent, _, name = package.rpartition(".")
    if parent:
        return [os.path.join(d, name) for d in _package_dirs(parent)]
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    locations = getattr(spec, "submodule_search_locations", None) if spec else None
    return [p for p in list(locations or ()) if isinstance(p, str)]


def _source_of(module: str) -> tuple[str, object, Any]:
    """(the source path, the module object in sys.modules or None, its
    loader) of a judged module, importing nothing: an imported module's own
    spec; else what the import system's finders would find in its
    package's directories (:func:`_package_dirs`). Raises LookupError when
    there is no such module, Unjudged when it cannot be judged."""
    live = sys.modules.get(module)
    if live is not None:
        spec = getattr(live, "__spec__", None)
        origin = getattr(spec, "origin", None) if spec is not None else None
        origin = origin or getattr(live, "__file__", None)
        loader = getattr(spec, "loader", None)
        if not isinstance(origin, str) or not origin.endswith(".py"):
            raise Unjudged(f"{module} is a module object with no Python source file")
    else:
        dirs = _package_dirs(module.rpartition(".")[0])
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find(module, dirs)
            except Exception as exc:  # a finder's own failure: the import would fail
                raise Unjudged(f"{module} cannot be found ({type(exc).__name__}: {exc})") from None
            if spec is not None:
                break
        if spec is None:
            raise LookupError(module)
        origin, loader = spec.origin, spec.loader
        if not isinstance(origin, str) or not origin.endswith(".py"):
            raise Unjudged(f"{module} is not loaded from a Python source file")
    if not hasattr(loader, "get_code"):
        loader = importlib.util.spec_from_file_location(module, origin).loader  # type: ignore[union-attr]
    return origin, live, loader


def _cache_of(path: str, live: object) -> list[str]:
    # The bytecode caches an import of path reads: its spec's, and the one
    # Python's loader derives from the source path.
    out = []
    spec = getattr(live, "__spec__", None) if live is not None else None
    cached = getattr(spec, "cached", None)
    if isinstance(cached, str):
        out.append(cached)
    try:
        out.append(importlib.util.cache_from_source(path))
    except (NotImplementedError, ValueError):
        pass
    return out


def _regular_or_absent(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def check_vllm_code(
    version: str, verified: Sequence[Mapping[str, Any]], policy_names: Iterable[str]
) -> CodeCheck:
    """Judge the vLLM this process runs (the module docstring). Never raises.

    The collector is paused while it runs: the ASTs and code it makes hold
    no cycles and go with their last reference, and in a process that has
    imported vLLM and torch, a full collection that they would set off
    costs ten times the check."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _check_vllm_code(version, verified, policy_names)
    except Unjudged as exc:
        return CodeCheck(version, unjudged=(str(exc),))
    except (Exception, RecursionError, MemoryError) as exc:
        return CodeCheck(version, unjudged=(f"{type(exc).__name__}: {exc}",))
    finally:
        if enabled:
            gc.enable()


def _check_vllm_code(
    version: str, verified: Sequence[Mapping[str, Any]], policy_names: Iterable[str]
) -> CodeCheck:
    sources: dict[str, bytes] = {}
    paths: dict[str, str] = {}
    compiled: dict[str, tuple[ast.Module, CodeType]] = {}
    not_source: list[tuple[str, str]] = []
    located: dict[str, tuple[str, object, Any]] = {}
    for module in (ARC_MODULE, BASE_MODULE, *CALLER_MODULES):
        try:
            located[module] = _source_of(module)
        except LookupError:
            if module in CALLER_MODULES:
                continue  # a release without this caller
            raise Unjudged(f"{module} cannot be found") from None
    # The callers wherever they are (the rule: docs/usage.md, "The guard").
    scanned: dict[str, bytes] = {}
    for root in _package_dirs(KV_OFFLOAD):
        for module, (path, text) in find_callers(root).items():
            scanned[path] = text
            if module in located:
                continue
            try:
                located[module] = _source_of(module)
            except LookupError:
                located[module] = (path, None, None)
    for module, (path, live, loader) in located.items():
        try:
            if path in scanned:
                source = scanned[path]
            else:
                if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would never answer
                    raise OSError(f"{path} is not a regular file")
                with open(path, "rb") as f:
                    source = f.read()
            tree = ast.parse(source)
            code = compile(tree, path, "exec", dont_inherit=True)
        except (OSError, SyntaxError, ValueError) as exc:
            raise Unjudged(f"cannot read {path} ({type(exc).__name__}: {exc})") from None
        sources[module], paths[module], compiled[module] = source, path, (tree, code)
        if loader is None:
            loader = importlib.util.spec_from_file_location(module, path).loader  # type: ignore[union-attr]
        caches = _cache_of(path, live)
        odd = [c for c in caches if not _regular_or_absent(c)]
        if odd:
            # The loader would open it, and a FIFO would never answer.
            raise Unjudged(f"its bytecode cache {odd[0]} is not a regular file")
        runs = loader.get_code(module)
        if not (isinstance(runs, CodeType) and same_code(runs, code, fresh=True)):
            not_source.append((path, "the code its loader gives is not compiled from it"))
        if live is not None:
            not_source += [(path, p) for p in _live_problems(module, live, tree, code)]
    result = judge_sources(version, sources, paths, verified, policy_names, compiled)
    if not_source:
        result = CodeCheck(**{**result.__dict__, "not_source": tuple(not_source)})
    return result
