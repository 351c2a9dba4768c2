"""Release day: what a vLLM's ARC code is, object by object, and what its
callers use of the policy, from their sources. Standard library only.

An object is a name ``arc.py`` or ``base.py`` binds at module level, a
method of ``ARCCachePolicy`` or of ``CachePolicy``, or a class's own body
less its methods; its fingerprint is a hash of its syntax tree without
positions, docstrings or string prefixes. Judged: all of ``arc.py``; of
``base.py``, what runs when it is imported and what that and ARC's code
read (Python's own scope analysis, ``symtable``, says what a function
reads from its module), ``ChunkStatus`` and ``order_request_keys``, and the
``CachePolicy`` methods that ARC inherits or reaches through ``super()``.
"""

from __future__ import annotations

import ast
import hashlib
import symtable
from collections.abc import Iterable

ARC_CLASS = "ARCCachePolicy"
BASE_ROOTS = ("CachePolicy", "ChunkStatus", "order_request_keys")
"""What arc_cy takes from base.py (arc_cy._base)."""
DYNAMIC = frozenset(
    {"getattr", "setattr", "delattr", "vars", "__dict__", "attrgetter", "methodcaller"}
    | {"__getstate__", "__setstate__", "__reduce__", "__reduce_ex__", "__copy__", "__deepcopy__"}
)
"""Names that reach a policy's attributes by a computed name, or its state whole."""
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _shape(node: object) -> str:
    # Version-stable: 3.12's empty type_params and 3.13's dump defaults aside.
    if isinstance(node, list):
        return "[" + ",".join(map(_shape, node)) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    parts = [type(node).__name__]
    for field in node._fields:
        value = getattr(node, field, None)
        if field in ("kind", "type_comment") or (field == "type_params" and not value):
            continue
        if field == "body" and isinstance(node, (*_DEFS, ast.ClassDef)) and value:
            value = value[1:] if _is_docstring(value[0]) else value
        parts.append(f"{field}={_shape(value)}")
    return "(" + " ".join(parts) + ")"


def fingerprint(nodes: Iterable[ast.AST]) -> str:
    text = ";".join(_shape(n) for n in nodes)
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()[:12]


def reads(node: ast.stmt) -> set[str]:
    """The module-level names a statement reads, by Python's scope analysis."""
    out: set[str] = set()
    tables = [symtable.symtable(ast.unparse(node), "<judged>", "exec")]
    while tables:
        table = tables.pop()
        tables += table.get_children()
        top = table.get_type() == "module"
        out.update(
            s.get_name()
            for s in table.get_symbols()
            if s.is_referenced() and s.is_global() and not (top and s.is_local())
        )
    return out


def _bound(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (*_DEFS, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [a.asname or a.name.partition(".")[0] for a in stmt.names]
    names: list[str] = []
    for n in ast.walk(stmt):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            names.append(n.id)
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            names.append(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            names.append(n.rest)
    return list(dict.fromkeys(names)) or ["<module code>"]


def _objects(tree: ast.Module) -> dict[str, list[ast.stmt]]:
    out: dict[str, list[ast.stmt]] = {}
    for stmt in tree.body:
        if not _is_docstring(stmt):
            for name in _bound(stmt):
                out.setdefault(name, []).append(stmt)
    return out


def _runs_at_import(stmt: ast.stmt, lazy_annotations: bool) -> bool:
    if not isinstance(stmt, _DEFS):
        return True
    a = stmt.args
    annotated = stmt.returns is not None or any(
        x.annotation is not None
        for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
        if x
    )
    return bool(stmt.decorator_list or a.defaults or any(a.kw_defaults)) or (
        annotated and not lazy_annotations
    )


def _split(file: str, cls: ast.ClassDef, skip: set[str]) -> dict[str, list[ast.stmt]]:
    """A class's body less its methods, and each method not in skip."""
    rest = ast.ClassDef(
        name=cls.name,
        bases=cls.bases,
        keywords=cls.keywords,
        body=[s for s in cls.body if not isinstance(s, _DEFS)],
        decorator_list=cls.decorator_list,
    )
    out: dict[str, list[ast.stmt]] = {f"{file}:{cls.name}": [rest]}
    for s in cls.body:
        if isinstance(s, _DEFS) and s.name not in skip:
            out.setdefault(f"{file}:{cls.name}.{s.name}", []).append(s)
    return out


def arc_objects(arc_source: bytes, base_source: bytes) -> dict[str, list[ast.stmt]]:
    """Each judged object of arc.py and base.py, by name."""
    arc, base = ast.parse(arc_source), ast.parse(base_source)
    arc_names = _objects(arc)
    classes = [s for s in arc_names.get(ARC_CLASS, ()) if isinstance(s, ast.ClassDef)]
    if len(classes) != 1 or len(arc_names[ARC_CLASS]) != 1:
        raise ValueError(f"arc.py does not define {ARC_CLASS} once")
    cls = classes[0]
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
    lazy = any(
        isinstance(s, ast.ImportFrom)
        and s.module == "__future__"
        and s.names[0].name == "annotations"
        for s in base.body
    )
    base_names = _objects(base)
    todo = set(BASE_ROOTS) | {
        a.asname or a.name
        for s in arc.body
        if isinstance(s, ast.ImportFrom) and (s.module or "").endswith("base")
        for a in s.names
    }
    todo |= {n for n, stmts in base_names.items() if any(_runs_at_import(s, lazy) for s in stmts)}
    reached: set[str] = set()
    while todo:
        name = todo.pop()
        if name in reached or name not in base_names:
            continue
        reached.add(name)
        for stmt in base_names[name]:
            if isinstance(stmt, ast.ClassDef) and name == "CachePolicy":
                parts = _split("base.py", stmt, overridden)
                out.update(parts)
                todo |= {r for p in parts.values() for s in p for r in reads(s)}
            else:
                out.setdefault(f"base.py:{name}", []).append(stmt)
                todo |= reads(stmt)
    return out


def arc_code(arc_source: bytes, base_source: bytes) -> dict[str, str]:
    """Each judged object's fingerprint."""
    return {k: fingerprint(v) for k, v in sorted(arc_objects(arc_source, base_source).items())}


def policy_names(arc_source: bytes, base_source: bytes) -> set[str]:
    """The attribute names an ARC policy has: methods and ``self.x``."""
    out = {ARC_CLASS}
    for tree in (ast.parse(arc_source), ast.parse(base_source)):
        for cls in tree.body:
            if isinstance(cls, ast.ClassDef) and cls.name in (ARC_CLASS, "CachePolicy"):
                out |= {s.name for s in cls.body if isinstance(s, _DEFS)}
                out |= {
                    n.attr
                    for n in ast.walk(cls)
                    if isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == "self"
                }
    return out


def caller_uses(source: bytes, watched: set[str]) -> dict[str, int]:
    """Each watched name a caller uses (an attribute, a name, a keyword, a
    class pattern's attribute, a string that is the name), with its first
    line. Docstrings are not uses."""
    tree = ast.parse(source)
    docs = {
        id(b[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (*_DEFS, ast.ClassDef, ast.Module))
        and (b := n.body)
        and _is_docstring(b[0])
    }
    out: dict[str, int] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute):
            names = [n.attr]
        elif isinstance(n, ast.Name):
            names = [n.id]
        elif isinstance(n, ast.keyword):
            names = [n.arg or ""]
        elif isinstance(n, ast.MatchClass):
            names = n.kwd_attrs
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            names = [n.value]
        else:
            continue
        for name in names:
            if name in watched:
                line = getattr(n, "lineno", 0)
                out[name] = min(out.get(name, line), line)
    return out
