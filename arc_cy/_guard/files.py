"""vLLM's judged files, found and read without importing them, and whether what an imported
module runs is compiled from its source. Standard library only."""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import re
import stat
import sys
import time
from types import CodeType

ARC_MODULE = "vllm.v1.kv_offload.cpu.policies.arc"
BASE_MODULE = "vllm.v1.kv_offload.cpu.policies.base"
CPU_MANAGER = "vllm.v1.kv_offload.cpu.manager"
TIERING_MANAGER = "vllm.v1.kv_offload.tiering.manager"
KV_OFFLOAD = "vllm.v1.kv_offload"
_POLICIES = f"{KV_OFFLOAD}.cpu.policies"  # not a caller's package
FILES = {  # the judged modules, by the names the table and the messages use
    ARC_MODULE: "arc.py",
    BASE_MODULE: "base.py",
    CPU_MANAGER: "cpu/manager.py",
    TIERING_MANAGER: "tiering/manager.py",
}


class Unjudged(Exception):
    """vLLM's code cannot be judged: a file cannot be found, read or parsed."""


class Uncompared(Exception):
    """What a module runs is not comparable without compiling: release day."""


def digest(sources: dict[str, bytes]) -> str:
    """Of the hex SHA-256s in FILES' order: ``sha256sum FILE... | cut -c1-64 | sha256sum``."""
    lines = "".join(hashlib.sha256(sources[m]).hexdigest() + "\n" for m in FILES if m in sources)
    return hashlib.sha256(lines.encode()).hexdigest()


def why(exc: BaseException | None) -> str:
    return f"{type(exc).__name__}: {exc}"


def started() -> float:
    """When this process started, in time.time()'s seconds (Linux's /proc); else -inf."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rpartition(b")")[2].split()[19])
        now = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return now + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return -float("inf")


def package_dirs(package: str) -> list[str]:
    """Where a package's modules are, importing nothing."""
    path = getattr(sys.modules.get(package), "__path__", None)
    parent, _, name = package.rpartition(".")
    if path is None and parent:
        return [os.path.join(d, name) for d in package_dirs(parent)]
    if path is None:  # a top-level search imports nothing
        path = getattr(importlib.util.find_spec(package), "submodule_search_locations", None)
    return [p for p in list(path or ()) if isinstance(p, str)]


def source_path(module: str) -> str | None:
    """An imported module's source file, else the one an import would find; None if none."""
    live, (package, _, name) = sys.modules.get(module), module.rpartition(".")
    if live is None and package not in sys.modules:
        bases = [os.path.join(d, name) for d in package_dirs(package)]
        paths = [p for b in bases for p in (b + ".py", os.path.join(b, "__init__.py"))]
        return next((p for p in paths if os.path.lexists(p)), None)
    try:  # an imported module's spec, else what its finders find (nothing imported)
        spec = getattr(live, "__spec__", None) if live else importlib.util.find_spec(module)
    except Exception as exc:
        raise Unjudged(f"{module} cannot be found ({why(exc)})") from None
    if live is None and spec is None:
        return None
    if not (isinstance(origin := getattr(spec, "origin", None), str) and origin.endswith(".py")):
        raise Unjudged(f"{module} is not loaded from a Python source file")
    return origin


def read(path: str) -> bytes:
    """A file's bytes; only a regular file is opened (a FIFO never answers)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise OSError("not a regular file")
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise Unjudged(f"cannot read {path} ({why(exc)})") from None


# A caller's mark: the manager's _policy, a policy class, the factory, or vLLM's ARC module.
_MARK = re.compile(
    rb"(?<!\w)(?:_policy|CachePolicy|ARCCachePolicy|CachePolicyFactory)(?!\w)"
    rb"|(?<!\w)policies(?:\.arc(?!\w)|\s+import\b)"
)


def find_callers(roots: list[str] | None = None) -> dict[str, tuple[str, bytes]]:
    """Each module of vllm/v1/kv_offload (or roots) but cpu/policies that has a caller's mark."""
    found: dict[str, tuple[str, bytes]] = {}
    for root in package_dirs(KV_OFFLOAD) if roots is None else roots:
        for folder, dirs, names in os.walk(root, followlinks=True):  # unreadable ones: skipped
            parts = [p for p in os.path.relpath(folder, root).split(os.sep) if p != "."]
            package = ".".join([KV_OFFLOAD, *parts])
            dirs[:] = [
                d
                for d in sorted(dirs)
                if d.isidentifier() and f"{package}.{d}" != _POLICIES
                if os.path.isfile(os.path.join(folder, d, "__init__.py"))
            ]
            for name in sorted(n for n in names if n.endswith(".py") and n[:-3].isidentifier()):
                path = os.path.join(folder, name)
                if os.path.isfile(path) and _MARK.search(source := read(path)):
                    found[f"{package}.{name[:-3]}".removesuffix(".__init__")] = (path, source)
    return found


def _key(code: CodeType) -> tuple[object, ...]:
    """A code object's bytecode (unspecialised), names and constants, its nested code's too."""
    consts = tuple(_key(c) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.co_code, code.co_names, code.co_varnames, code.co_flags, consts


def _written(path: str, source: bytes, since: float | None) -> CodeType | None:
    """The code an import of path runs now: its .pyc if valid, else the source compiled; on the
    hash path (since) None, or Uncompared where it may have changed (usage.md, "Stale bytecode")."""
    try:
        cache = importlib.util.cache_from_source(path)
        data = read(cache) if os.path.lexists(cache) else b""
    except (NotImplementedError, ValueError):
        data = b""
    st, pyc = os.stat(path), data[:4] == importlib.util.MAGIC_NUMBER
    hashed = pyc and int.from_bytes(data[4:8], "little") & 1
    stamp = (int(st.st_mtime) & 0xFFFFFFFF) | (st.st_size & 0xFFFFFFFF) << 32
    header = importlib.util.source_hash(source) if hashed else stamp.to_bytes(8, "little")
    if pyc and data[8:16] == header and isinstance(code := marshal.loads(data[16:]), CodeType):
        return code
    if since is not None:
        if hashed or st.st_ctime >= since - 0.05:  # the clocks' granularity
            raise Uncompared(path)
        return None
    try:
        return compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise Unjudged(f"cannot compile {path} ({why(exc)})") from None


def stale(sources: dict[str, tuple[str, bytes]], since: float | None = None) -> list[str]:
    """Each imported module whose function runs code not compiled from its source (a stale .pyc;
    a source replaced after the import), as the operator reads it."""
    out = []
    for module, (path, source) in sources.items():
        live = sys.modules.get(module)
        if live is None or (written := _written(path, source, since)) is None:
            continue
        todo, expected = [written], {}
        while todo:
            code = todo.pop()
            expected[code.co_qualname, code.co_firstlineno] = _key(code)
            todo += [c for c in code.co_consts if isinstance(c, CodeType)]
        mine = [v for v in vars(live).values() if isinstance(v, type) and v.__module__ == module]
        objs = [*vars(live).values(), *(o for cls in mine for o in vars(cls).values())]
        objs += [getattr(o, a, None) for o in objs for a in ("__func__", "fget")]
        for runs in (getattr(o, "__code__", None) for o in objs):
            if isinstance(runs, CodeType) and runs.co_filename == path:
                if expected.get((runs.co_qualname, runs.co_firstlineno)) != _key(runs):
                    why = f"{runs.co_qualname} runs code that is not compiled from it"
                    out.append(f"the code that runs for {path} is not its source's: {why}")
                    break
    return out
