"""Release day: what a vLLM's ARC code is, object by object, and what its
callers do with a policy (docs/usage.md, "The guard"). Standard library only."""

from __future__ import annotations

import ast
import copy
import hashlib
import symtable
from typing import Any

ARC_CLASS = "ARCCachePolicy"
BASE_ROOTS = {"CachePolicy", "ChunkStatus", "order_request_keys"}  # what arc_cy takes
# What reaches a policy's attributes by a computed name, or its state whole:
DYNAMIC = frozenset(
    "getattr setattr delattr vars __dict__ attrgetter methodcaller __getstate__ __setstate__ "
    "__reduce__ __reduce_ex__ __copy__ __deepcopy__".split()
)
POLICY_NAMES = frozenset({"lru", "arc", "arc_cy", "arc_cy_plus"})  # as the factory names them
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (*_DEFS, ast.ClassDef, ast.Module)
_READS: tuple[type, ...] = (ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Tuple)
_READS += (ast.List, ast.BinOp, ast.UnaryOp, ast.expr_context, ast.operator, ast.unaryop)


def _doc(body: list[ast.stmt]) -> ast.Constant | None:
    value = getattr(body[0], "value", None) if body and isinstance(body[0], ast.Expr) else None
    return value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None


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
        symbols = [s for s in t.get_symbols() if s.is_referenced() and s.is_global()]
        reads |= {s.get_name() for s in symbols if not (t is table and s.is_local())}
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
    """All but a def without decorators whose defaults and annotations
    (unless lazy) only read names and constants."""
    if not isinstance(stmt, _DEFS):
        return True
    a = stmt.args
    args = [x for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x]
    runs = [*a.defaults, *a.kw_defaults] + ([] if lazy else [stmt.returns, *args])
    nodes = [n for e in runs if e for n in ast.walk(e) if not isinstance(n, ast.arg)]
    return bool(stmt.decorator_list) or any(not isinstance(n, _READS) for n in nodes)


def arc_code(arc_source: bytes, base_source: bytes) -> tuple[dict[str, str], set[str]]:
    """Each judged object of arc.py and base.py: name -> fingerprint; and the
    names vLLM's ARC policy has (its methods and ``self.x``)."""
    arc, base = ast.parse(arc_source), ast.parse(base_source)
    arc_names, base_names = _objects(arc), _objects(base)
    [cls] = arc_names.get(ARC_CLASS) or [ast.Pass()]
    if not isinstance(cls, ast.ClassDef):
        raise ValueError(f"arc.py does not define {ARC_CLASS} once")
    out = _split("arc.py", cls, set())
    out.update((f"arc.py:{n}", s) for n, s in arc_names.items() if n != ARC_CLASS)
    attrs = [(n.attr, n.value) for n in ast.walk(cls) if isinstance(n, ast.Attribute)]
    supers = {a for a, v in attrs if getattr(getattr(v, "func", 0), "id", 0) == "super"}
    methods = {s.name for s in cls.body if isinstance(s, _DEFS)}
    names = {ARC_CLASS, *methods, *(a for a, v in attrs if getattr(v, "id", None) == "self")}
    overridden = methods - supers  # what ARC reaches through super() is CachePolicy's
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
    shapes = {k: ";".join(map(_shape, v)).encode() for k, v in sorted(out.items())}
    fps = {k: hashlib.md5(s, usedforsecurity=False).hexdigest()[:12] for k, s in shapes.items()}
    return fps, names


def caller_uses(source: bytes, watched: set[str]) -> dict[str, int]:
    """Each use a caller makes of a watched name, ``kind:name`` -> the first line that makes it."""
    tree = ast.parse(source)
    docs = {id(d) for n in ast.walk(tree) if isinstance(n, _SCOPES) and (d := _doc(n.body))}
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    out: dict[str, int] = {}
    for n in ast.walk(tree):
        uses: list[tuple[str, object]] = [("read", a) for a in getattr(n, "kwd_attrs", ())]
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            uses.append(("string", n.value))
        elif isinstance(n, ast.keyword):
            uses.append(("keyword", n.arg))
        elif isinstance(n, ast.Attribute) or isinstance(n, ast.Name) and type(n.ctx) is ast.Load:
            kind = {ast.Store: "write", ast.Del: "delete"}.get(type(n.ctx), "read")
            name = n.attr if isinstance(n, ast.Attribute) else n.id
            uses.append(("call" if id(n) in called else kind, name))
        for kind, used in uses:
            if used in watched or kind == "string" and used in POLICY_NAMES:
                key = f"{kind}:{used}"
                out[key] = min(out.get(key, n.lineno), n.lineno)  # type: ignore[attr-defined]
    return out
