"""vLLM's judged files, found and read without importing them, and the
check that what an imported module runs is compiled from its source.
Standard library only."""

from __future__ import annotations

import importlib.util
import marshal
import os
import re
import stat
import sys
from collections.abc import Iterator
from types import CodeType

ARC_MODULE = "vllm.v1.kv_offload.cpu.policies.arc"
BASE_MODULE = "vllm.v1.kv_offload.cpu.policies.base"
CPU_MANAGER = "vllm.v1.kv_offload.cpu.manager"
TIERING_MANAGER = "vllm.v1.kv_offload.tiering.manager"
KV_OFFLOAD = "vllm.v1.kv_offload"
POLICIES_PACKAGE = "vllm.v1.kv_offload.cpu.policies"
FILES = {
    ARC_MODULE: "arc.py",
    BASE_MODULE: "base.py",
    CPU_MANAGER: "cpu/manager.py",
    TIERING_MANAGER: "tiering/manager.py",
}
"""The judged modules by the names the table and the messages use."""


class Unjudged(Exception):
    """vLLM's code cannot be judged: a file cannot be found, read or parsed."""


def short_name(module: str) -> str:
    """ "cpu/manager.py": a module's file under vllm/v1/kv_offload."""
    return FILES.get(module) or module.removeprefix(KV_OFFLOAD + ".").replace(".", "/") + ".py"


def package_dirs(package: str) -> list[str]:
    """Where a package's modules are, importing nothing: its ``__path__``
    if imported, else its parent's directories joined with its name."""
    path = getattr(sys.modules.get(package), "__path__", None)
    if path is not None:
        return [p for p in list(path) if isinstance(p, str)]
    parent, _, name = package.rpartition(".")
    if parent:
        return [os.path.join(d, name) for d in package_dirs(parent)]
    spec = importlib.util.find_spec(package)  # a top-level search imports nothing
    return [p for p in list(getattr(spec, "submodule_search_locations", None) or ())]


def source_path(module: str) -> str | None:
    """The source file of a module: an imported module's own, else the one
    an import would find in its package's directories; None if none."""
    live = sys.modules.get(module)
    if live is not None:
        origin = getattr(getattr(live, "__spec__", None), "origin", None)
        if not (isinstance(origin, str) and origin.endswith(".py")):
            raise Unjudged(f"{module} is a module object with no Python source file")
        return origin
    package, _, name = module.rpartition(".")
    for folder in package_dirs(package):
        for path in (os.path.join(folder, name + ".py"), os.path.join(folder, name, "__init__.py")):
            if os.path.lexists(path):
                return path
    return None


def read(path: str) -> bytes:
    """A file's bytes; only a regular file is opened (a FIFO never answers)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise OSError("not a regular file")
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise Unjudged(f"cannot read {path} ({type(exc).__name__}: {exc})") from None


_MARK = re.compile(
    rb"(?<!\w)(?:_policy|CachePolicy|ARCCachePolicy|CachePolicyFactory)(?!\w)"
    rb"|(?<!\w)policies(?:\.arc(?!\w)|\s+import\b)"
)
"""A caller's mark: the manager's ``_policy``, a policy class, the factory,
or vLLM's ARC module."""


def find_callers() -> dict[str, tuple[str, bytes]]:
    """The policy's callers, by their files: each module file of the
    vllm/v1/kv_offload tree, outside cpu/policies, that bears a caller's
    mark; module name -> (path, source)."""
    found: dict[str, tuple[str, bytes]] = {}
    todo = [(d, KV_OFFLOAD) for d in package_dirs(KV_OFFLOAD)]
    while todo:
        folder, package = todo.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            name, path = entry.name, entry.path
            if entry.is_dir() and name.isidentifier():
                sub = f"{package}.{name}"
                if sub != POLICIES_PACKAGE and os.path.isfile(os.path.join(path, "__init__.py")):
                    todo.append((path, sub))
            elif name.endswith(".py") and name[:-3].isidentifier() and entry.is_file():
                source = read(path)
                if _MARK.search(source):
                    stem = name[:-3]
                    found[package if stem == "__init__" else f"{package}.{stem}"] = (path, source)
    return found


# --- what an imported module runs -----------------------------------------------


def _codes(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


def _same(a: CodeType, b: CodeType) -> bool:
    """Same bytecode, names and constants (co_code is unspecialised)."""
    if (a.co_code, a.co_names, a.co_varnames, a.co_freevars, a.co_flags) != (
        b.co_code,
        b.co_names,
        b.co_varnames,
        b.co_freevars,
        b.co_flags,
    ) or len(a.co_consts) != len(b.co_consts):
        return False
    return all(
        _same(x, y) if isinstance(x, CodeType) and isinstance(y, CodeType) else x == y
        for x, y in zip(a.co_consts, b.co_consts, strict=True)
    )


def _live_functions(module: object, path: str) -> Iterator[CodeType]:
    """The code of each function the module's source defined, as bound now
    in the module and its classes."""
    name = getattr(module, "__name__", None)
    for value in list(vars(module).values()):
        objects = [value]
        if isinstance(value, type) and value.__module__ == name:
            objects = list(vars(value).values())
        for obj in objects:
            for f in (obj, getattr(obj, "__func__", None), getattr(obj, "fget", None)):
                code = getattr(f, "__code__", None)
                if isinstance(code, CodeType) and code.co_filename == path:
                    yield code


def _cached_code(path: str, source: bytes) -> CodeType | None:
    """The code of path's .pyc when its header says it is this source's, as
    Python's import checks it (a hash-based one by its hash, always)."""
    try:
        cache = importlib.util.cache_from_source(path)
        st = os.stat(cache)
        if not stat.S_ISREG(st.st_mode):
            raise Unjudged(f"its bytecode cache {cache} is not a regular file")
        with open(cache, "rb") as f:
            data = f.read()
    except (OSError, NotImplementedError, ValueError):
        return None
    if data[:4] != importlib.util.MAGIC_NUMBER:
        return None
    flags = int.from_bytes(data[4:8], "little")
    if flags & 1:
        valid = data[8:16] == importlib.util.source_hash(source)
    else:
        src = os.stat(path)
        valid = data[8:16] == (int(src.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (
            src.st_size & 0xFFFFFFFF
        ).to_bytes(4, "little")
    code = marshal.loads(data[16:]) if valid else None
    return code if isinstance(code, CodeType) else None


def not_its_source(module: str, path: str, source: bytes) -> str | None:
    """Why the code an imported module runs is not compiled from its source
    (a stale .pyc, or a source changed since it was imported); None when
    it is, or when the module is not imported. Compared with the .pyc whose
    header matches the source, or with the source compiled."""
    live = sys.modules.get(module)
    if live is None:
        return None
    code = _cached_code(path, source)
    if code is None:
        try:
            code = compile(source, path, "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            raise Unjudged(f"cannot compile {path} ({type(exc).__name__}: {exc})") from None
    expected = {(c.co_qualname, c.co_firstlineno): c for c in _codes(code)}
    for runs in _live_functions(live, path):
        written = expected.get((runs.co_qualname, runs.co_firstlineno))
        if written is None or not _same(runs, written):
            return f"{runs.co_qualname} runs code that is not compiled from it (a stale .pyc?)"
    return None
