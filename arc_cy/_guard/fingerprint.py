"""Release day: what a vLLM's ARC code is, object by object, and what its
callers use of the policy, from their sources. Standard library only.

An object is a name that arc.py or base.py binds at module level, a method
of ``ARCCachePolicy`` or ``CachePolicy``, or a class's body less its
methods; its fingerprint hashes its syntax tree without positions,
docstrings or string prefixes. Judged: all of arc.py; of base.py, what
runs at import, what that and ARC's code read (Python's own scope
analysis, ``symtable``, says what binds and reads a module name),
``ChunkStatus``, ``order_request_keys``, and the ``CachePolicy`` methods
that ARC inherits or reaches through ``super()``.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import symtable
from typing import Any

ARC_CLASS = "ARCCachePolicy"
BASE_ROOTS = {"CachePolicy", "ChunkStatus", "order_request_keys"}  # what arc_cy takes
DYNAMIC = frozenset(
    {"getattr", "setattr", "delattr", "vars", "__dict__", "attrgetter", "methodcaller"}
    | {"__getstate__", "__setstate__", "__reduce__", "__reduce_ex__", "__copy__", "__deepcopy__"}
)
"""Names that reach a policy's attributes by a computed name, or its state whole."""
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (*_DEFS, ast.ClassDef, ast.Module)


def _doc(body: list[ast.stmt]) -> ast.Constant | None:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        return first.value if isinstance(first.value.value, str) else None
    return None


def _shape(node: object) -> str:
    # Stable across 3.11 to 3.13: 3.12's empty type_params are left out.
    if isinstance(node, list):
        return "[" + ",".join(map(_shape, node)) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    parts = [type(node).__name__]
    for field in node._fields:
        value: Any = getattr(node, field, None)
        if field in ("kind", "type_comment") or (field == "type_params" and not value):
            continue
        if field == "body" and isinstance(node, _SCOPES) and _doc(value):
            value = value[1:]
        parts.append(f"{field}={_shape(value)}")
    return "(" + " ".join(parts) + ")"


def _scope(stmt: ast.AST) -> tuple[list[str], set[str]]:
    """(the module names a statement binds, those it and its functions read)."""
    table = symtable.symtable(ast.unparse(stmt), "<judged>", "exec")
    bound = [s.get_name() for s in table.get_symbols() if s.is_local()]
    reads, tables = set(), [table]
    while tables:
        t = tables.pop()
        tables += t.get_children()
        reads |= {
            s.get_name()
            for s in t.get_symbols()
            if s.is_referenced() and s.is_global() and not (t is table and s.is_local())
        }
    return bound, reads


def _objects(tree: ast.Module) -> dict[str, list[ast.stmt]]:
    out: dict[str, list[ast.stmt]] = {}
    for stmt in tree.body[1:] if _doc(tree.body) else tree.body:
        for name in _scope(stmt)[0] or ["<module code>"]:
            out.setdefault(name, []).append(stmt)
    return out


def _split(file: str, cls: ast.ClassDef, skip: set[str]) -> dict[str, list[ast.stmt]]:
    """A class's body less its methods, and each method not in skip."""
    rest = copy.copy(cls)
    rest.body = [s for s in cls.body if not isinstance(s, _DEFS)]
    out: dict[str, list[ast.stmt]] = {f"{file}:{cls.name}": [rest]}
    for s in cls.body:
        if isinstance(s, _DEFS) and s.name not in skip:
            out.setdefault(f"{file}:{cls.name}.{s.name}", []).append(s)
    return out


def _runs_at_import(stmt: ast.stmt, lazy: bool) -> bool:
    """Whether a statement runs anything at import: all but a def with no
    decorator or default, and no annotation unless annotations are lazy."""
    if not isinstance(stmt, _DEFS):
        return True
    a = stmt.args
    args = [x for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x]
    annotated = stmt.returns is not None or any(x.annotation for x in args)
    return bool(stmt.decorator_list or a.defaults or any(a.kw_defaults) or annotated and not lazy)


def arc_code(arc_source: bytes, base_source: bytes) -> dict[str, str]:
    """Each judged object of arc.py and base.py: name -> fingerprint."""
    arc, base = ast.parse(arc_source), ast.parse(base_source)
    arc_names, base_names = _objects(arc), _objects(base)
    [cls] = arc_names.get(ARC_CLASS) or [ast.Pass()]
    if not isinstance(cls, ast.ClassDef):
        raise ValueError(f"arc.py does not define {ARC_CLASS} once")
    out = _split("arc.py", cls, set())
    out.update((f"arc.py:{n}", s) for n, s in arc_names.items() if n != ARC_CLASS)
    supers = {
        n.func.attr
        for n in ast.walk(cls)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Call)
        and getattr(n.func.value.func, "id", None) == "super"
    }
    overridden = {s.name for s in cls.body if isinstance(s, _DEFS)} - supers
    lazy = "annotations" in base_names and "__future__" in ast.unparse(base_names["annotations"][0])
    imports = ast.Module([s for s in arc.body if isinstance(s, ast.ImportFrom)], [])
    todo = BASE_ROOTS | set(_scope(imports)[0])
    todo |= {n for n, stmts in base_names.items() if any(_runs_at_import(s, lazy) for s in stmts)}
    reached: set[str] = set()
    while todo:
        name = todo.pop()
        if name in reached or name not in base_names:
            continue
        reached.add(name)
        for stmt in base_names[name]:
            parts = {f"base.py:{name}": [stmt]}
            if name == "CachePolicy" and isinstance(stmt, ast.ClassDef):
                parts = _split("base.py", stmt, overridden)
            for key, stmts in parts.items():
                out.setdefault(key, []).extend(stmts)
                todo |= {r for s in stmts for r in _scope(s)[1]}
    return {k: _fingerprint(v) for k, v in sorted(out.items())}


def _fingerprint(nodes: list[ast.stmt]) -> str:
    text = ";".join(map(_shape, nodes))
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()[:12]


def arc_names(arc_source: bytes) -> set[str]:
    """The names vLLM's ARC policy has: its methods and ``self.x``."""
    [cls] = [
        s for s in ast.parse(arc_source).body if isinstance(s, ast.ClassDef) and s.name == ARC_CLASS
    ]
    out = {ARC_CLASS} | {s.name for s in cls.body if isinstance(s, _DEFS)}
    self = (n for n in ast.walk(cls) if isinstance(n, ast.Attribute))
    return out | {n.attr for n in self if getattr(n.value, "id", None) == "self"}


def caller_uses(source: bytes, watched: set[str]) -> dict[str, int]:
    """Each watched name a caller uses (an attribute, a name, a keyword, a
    class pattern's attribute, a string that is the name; a docstring is
    not a use), with the first line that does."""
    tree = ast.parse(source)
    docs = {id(d) for n in ast.walk(tree) if isinstance(n, _SCOPES) and (d := _doc(n.body))}
    out: dict[str, int] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            names = [n.value]
        else:
            attrs = ("attr", "id", "arg") if not isinstance(n, ast.MatchClass) else ()
            names = [getattr(n, a, None) for a in attrs] + list(getattr(n, "kwd_attrs", ()))
        for name in names:
            if name in watched:
                out[name] = min(out.get(name, n.lineno), n.lineno)  # type: ignore[attr-defined]
    return out
