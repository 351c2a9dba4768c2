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
import gc
import hashlib
import importlib.util
import os
import re
import stat
import sys
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
    }
)
"""What reaches an attribute by a computed name (a format string's field
included): a caller may use none."""
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
            for inner in ast.walk(item):
                if isinstance(inner, ast.Global):
                    yield from inner.names
            stack.extend(_outer_parts(item))
            continue
        stack.extend(ast.iter_child_nodes(item))


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
    uses: frozenset[str]
    """Every attribute and name that ARC's own code uses."""


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

    uses = {
        n.attr if isinstance(n, ast.Attribute) else n.id
        for v in nodes.values()
        for node in v
        for n in ast.walk(node)
        if isinstance(n, (ast.Attribute, ast.Name))
    }
    return ArcCode(
        objects={k: fingerprint(v) for k, v in sorted(nodes.items())},
        methods=frozenset(arc_methods),
        arc_names=class_attributes(arc_cls),
        base_names=class_attributes(base_cls),
        uses=frozenset(uses),
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


def _docstring_texts(tree: ast.Module) -> set[str]:
    """The texts of a module's string statements (its docstrings), found
    through its statements alone (no expression is walked)."""
    texts: set[str] = set()
    todo: list[list[ast.stmt]] = [tree.body]
    while todo:
        for stmt in todo.pop():
            if _is_string_statement(stmt):
                texts.add(_doc_key(stmt.value.value))  # type: ignore[attr-defined]
                continue
            for field in ("body", "orelse", "finalbody"):
                value = getattr(stmt, field, None)
                if isinstance(value, list):
                    todo.append(value)
            for part in getattr(stmt, "handlers", None) or getattr(stmt, "cases", None) or ():
                todo.append(part.body)
    return texts


def _words(const: object, skip: set[str], out: set[str]) -> None:
    # The identifiers in a constant's strings, tuples (keyword names, class
    # patterns) and frozensets included; skip: docstring texts.
    todo = [const]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            if _doc_key(item) not in skip:
                out.update(_WORD.findall(item))
        elif isinstance(item, (tuple, frozenset)):
            todo.extend(item)


def names_used(tree: ast.Module, code: CodeType, wanted: Iterable[str]) -> dict[str, int]:
    """Which of ``wanted`` a module's code uses, each with the first line
    using it: the attributes and globals of its code, the identifiers in
    its strings (a format string's fields), keyword names and class-pattern
    attributes. A string statement (a docstring) is not a use."""
    wanted = frozenset(wanted)
    skip = _docstring_texts(tree)
    hits: set[str] = set()
    for obj in _code_objects(code):
        hits |= wanted.intersection(obj.co_names)
        words: set[str] = set()
        for const in obj.co_consts:
            if not isinstance(const, CodeType):
                _words(const, skip, words)
        hits |= wanted.intersection(words)
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
    skip = _docstring_texts(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        words: set[str] = set()
        if isinstance(node, ast.Constant):
            _words(node.value, skip, words)
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
    return DYNAMIC | {n for n in ours - base if not (n.startswith("__") and n.endswith("__"))}


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
    """"differs" or "new" (the nearest verified code has no such object)."""


@dataclass(frozen=True)
class Use:
    """A name a caller (or ARC's own code) must not use, where it uses it."""

    name: str
    path: str
    line: int
    why: str
    """"dynamic", "beyond" (an ARC policy has it beyond CachePolicy) or
    "gone" (a verified ARC has it, the installed one does not)."""
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
    """Judge a vLLM from the sources of its modules (by module name; the
    tiering caller may be absent). ``verified`` is the table
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
    against = matching or ([releases_of[nearest]] if nearest else [])
    prefix = "arc.py:ARCCachePolicy."
    gone: dict[str, str] = {}  # name: the verified release whose ARC has it
    for entry in against:
        for key in entry["arc"]:
            name = key[len(prefix) :]
            if key.startswith(prefix) and name not in code.methods:
                gone.setdefault(name, _closest(entry["releases"], version))
    forbidden = forbidden_names(code, policy_names) | gone.keys()
    uses: list[Use] = []
    for name in sorted(gone.keys() & code.uses):
        uses.append(Use(name, paths[ARC_MODULE], 0, "gone", gone[name]))
    for module in CALLER_MODULES:
        if module not in sources:
            continue
        tree, caller = compiled[module]
        found = names_used(tree, caller, forbidden)
        trusted = bool(found) and any(  # fingerprinted only when it matters
            fingerprint(tree) in e["callers"].get(FILES[module], ()) for e in matching
        )
        for name, line in sorted(found.items(), key=lambda u: (u[1], u[0])):
            why = "gone" if name in gone else "dynamic" if name in DYNAMIC else "beyond"
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


def _functions(obj: object) -> list[object]:
    """The functions behind a namespace entry, through staticmethod,
    classmethod, property and wrappers (``__wrapped__``, ``func``): each a
    list of the candidates along one wrapper chain, outermost first."""
    chains: list[object] = []
    todo = [obj]
    while todo and len(chains) < 16:
        item = todo.pop()
        if isinstance(item, (staticmethod, classmethod)):
            todo.append(item.__func__)
        elif isinstance(item, property):
            todo += [f for f in (item.fget, item.fset, item.fdel) if f is not None]
        else:
            chain = []
            for _ in range(16):
                if item is None:
                    break
                chain.append(item)
                item = getattr(item, "__wrapped__", None) or getattr(item, "func", None)
            chains.append(chain)
    return chains


def _is_code_entry(value: object) -> bool:
    # A class namespace entry that runs when called or read.
    return callable(value) or isinstance(value, (staticmethod, classmethod, property))


def _live_problems(module: str, live: object, tree: ast.Module, compiled: CodeType) -> list[str]:
    """What in a module object does not run its source's code: each
    function and method the source defines must be there with the code
    compiled from it; each import binding must be what it imports; and
    ARC's and CachePolicy's classes hold no other function."""
    by_qualname: dict[str, list[CodeType]] = {}
    for code in _code_objects(compiled):
        by_qualname.setdefault(code.co_qualname, []).append(code)
    namespace = getattr(live, "__dict__", None)
    if not isinstance(namespace, dict):
        return ["it is not a module"]
    problems: list[str] = []

    def check(entry: object, qualname: str) -> None:
        # Each chain of wrappers must reach, through any wrappers, a
        # function with the code compiled for that name from the source.
        candidates = by_qualname.get(qualname, ())
        for chain in _functions(entry):
            if not any(
                isinstance(f, FunctionType)
                and isinstance(f.__code__, CodeType)
                and any(same_code(f.__code__, c, fresh=False) for c in candidates)
                for f in chain
            ):
                problems.append(f"{qualname} runs code that is not its source's")
                return

    def walk_class(node: ast.ClassDef, cls: object, prefix: str) -> None:
        ns = getattr(cls, "__dict__", None)
        if not isinstance(cls, type) or ns is None:
            problems.append(f"{prefix} is not the class its source defines")
            return
        defined = set()
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.add(stmt.name)
                if stmt.name not in ns:
                    problems.append(f"{prefix}.{stmt.name} is missing")
                else:
                    check(ns[stmt.name], f"{prefix}.{stmt.name}")
            elif isinstance(stmt, ast.ClassDef) and stmt.name in ns:
                walk_class(stmt, ns[stmt.name], f"{prefix}.{stmt.name}")
        if module in (ARC_MODULE, BASE_MODULE) and node.name in ("ARCCachePolicy", "CachePolicy"):
            for name, value in ns.items():
                if name not in defined and _is_code_entry(value):
                    problems.append(f"{prefix}.{name} is not in its source")

    counts: dict[str, int] = {}
    for stmt in tree.body:
        for name in set(_store_names(stmt)):
            counts[name] = counts.get(name, 0) + 1
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if stmt.name in namespace:
                check(namespace[stmt.name], stmt.name)
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
    return problems


_MISSING, _OTHER = object(), object()


def _source_of(module: str) -> tuple[str, object, Any]:
    """(the source path, the module object in sys.modules or None, its
    loader) of a judged module. Raises Unjudged."""
    live = sys.modules.get(module)
    if live is not None:
        spec = getattr(live, "__spec__", None)
        origin = getattr(spec, "origin", None) if spec is not None else None
        origin = origin or getattr(live, "__file__", None)
        loader = getattr(spec, "loader", None)
        if not isinstance(origin, str) or not origin.endswith(".py"):
            raise Unjudged(f"{module} is a module object with no Python source file")
    else:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            raise Unjudged(f"{module} cannot be found ({type(exc).__name__}: {exc})") from None
        if spec is None:
            raise LookupError(module)
        origin, loader = spec.origin, spec.loader
        if not isinstance(origin, str) or not origin.endswith(".py"):
            raise Unjudged(f"{module} is not loaded from a Python source file")
    if not hasattr(loader, "get_code"):
        loader = importlib.util.spec_from_file_location(module, origin).loader  # type: ignore[union-attr]
    return origin, live, loader


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
    for module in (ARC_MODULE, BASE_MODULE, *CALLER_MODULES):
        try:
            path, live, loader = _source_of(module)
        except LookupError:
            if module in CALLER_MODULES:
                continue  # a release without this caller
            raise Unjudged(f"{module} cannot be found") from None
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would never answer
                raise OSError(f"{path} is not a regular file")
            with open(path, "rb") as f:
                source = f.read()
            tree = ast.parse(source)
            code = compile(tree, path, "exec", dont_inherit=True)
        except (OSError, SyntaxError, ValueError) as exc:
            raise Unjudged(f"cannot read {path} ({type(exc).__name__}: {exc})") from None
        sources[module], paths[module], compiled[module] = source, path, (tree, code)
        runs = loader.get_code(module)
        if not (isinstance(runs, CodeType) and same_code(runs, code, fresh=True)):
            not_source.append((path, "the code its loader gives is not compiled from it"))
        if live is not None:
            not_source += [(path, p) for p in _live_problems(module, live, tree, code)]
    result = judge_sources(version, sources, paths, verified, policy_names, compiled)
    if not_source:
        result = CodeCheck(**{**result.__dict__, "not_source": tuple(not_source)})
    return result
