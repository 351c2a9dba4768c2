"""The vLLM code guard: is the installed vLLM's policy code what arc_cy has verified?

arc_cy's decisions are a function of the calls it receives, and the
differential tests show that they equal vLLM arc's under any sequence of the
calls of vLLM's ``CachePolicy``. So what arc_cy's correctness depends on is
not vLLM's version string but three pieces of vLLM's code:

- the oracle, ``vllm/v1/kv_offload/cpu/policies/arc.py``;
- the contract the callers use, ``cpu/policies/base.py`` (``CachePolicy``,
  ``ChunkStatus``'s layout, ``order_request_keys``);
- what the callers of a policy call on it: the CPU manager
  (``cpu/manager.py``) and the tiering primary tier
  (``tiering/manager.py``'s ``CPUPrimaryTierOffloadingManager``).

:func:`check_vllm_code` fingerprints the files of the modules that are
imported (or would be: ``importlib.util.find_spec``), so a source tree or an
overlay on ``PYTHONPATH`` is judged by what runs, and compares the
fingerprints of ``arc.py`` and ``base.py`` with those of the releases in
``arc_cy._compat.VERIFIED_VLLM`` (those ``.ci/vllm_compat.sh`` passed). A
fingerprint hashes the code, not the bytes: the AST, with docstrings and
other bare string statements dropped, so comments and formatting do not
count. It also scans the callers' ASTs for attributes they use on the policy
object that ``base.py``'s ``CachePolicy`` does not define.

The analysis of a file is cached by its stat (path, size, mtime_ns) under
the user cache directory (``$XDG_CACHE_HOME/arc_cy``, else
``~/.cache/arc_cy``); a cache that cannot be read or written is ignored.

This module uses the standard library only, so ``.ci/fingerprint.py`` can
load it on any Python.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

ARC_MODULE = "vllm.v1.kv_offload.cpu.policies.arc"
BASE_MODULE = "vllm.v1.kv_offload.cpu.policies.base"
# The callers of a policy: the CPU manager, and the tiering primary tier
# (CPUPrimaryTierOffloadingManager, a CPUOffloadingManager subclass); a
# release without the tiering module has no such caller.
CALLER_MODULES = (
    "vllm.v1.kv_offload.cpu.manager",
    "vllm.v1.kv_offload.tiering.manager",
)
FINGERPRINTED = {"arc.py": ARC_MODULE, "base.py": BASE_MODULE}
"""The files whose fingerprints must be a verified release's, by file name."""

POLICY_CLASS = "CachePolicy"
# Attributes through which a caller holds its policy (CPUOffloadingManager's
# ``self._policy: CachePolicy``); any attribute annotated ``CachePolicy`` in
# a caller counts too.
POLICY_ATTRIBUTES = frozenset({"_policy"})
# Bumped when the analysis changes: cached results of another format are
# not used.
_FORMAT = 1


# --- fingerprints -----------------------------------------------------------


def _drop_docstrings(node: ast.AST) -> None:
    for child in ast.walk(node):
        body = getattr(child, "body", None)
        if not isinstance(body, list):
            continue
        kept = [
            stmt
            for stmt in body
            if not (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            )
        ]
        if len(kept) != len(body):
            child.body = kept or [ast.Pass()]  # type: ignore[attr-defined]


def _canonical(node: object, out: list[str]) -> None:
    # Like ast.dump without positions, but leaving out fields that are None
    # or empty: Python releases add such fields (3.12's type_params), and a
    # fingerprint must not depend on the Python that computes it.
    if isinstance(node, ast.AST):
        out.append(type(node).__name__)
        out.append("(")
        for name in node._fields:
            value = getattr(node, name, None)
            if value is None or (isinstance(value, list) and not value):
                continue
            out.append(name)
            out.append("=")
            _canonical(value, out)
            out.append(",")
        out.append(")")
    elif isinstance(node, list):
        out.append("[")
        for item in node:
            _canonical(item, out)
            out.append(",")
        out.append("]")
    else:
        out.append(repr(node))


def fingerprint(tree: ast.Module) -> str:
    """The fingerprint of a parsed module: sha256 of its canonical AST,
    docstrings dropped. The tree is changed (its docstrings removed)."""
    _drop_docstrings(tree)
    out: list[str] = []
    _canonical(tree, out)
    return hashlib.sha256("".join(out).encode()).hexdigest()


def fingerprint_source(source: str | bytes) -> str:
    return fingerprint(ast.parse(source))


# --- what base.py defines, what the callers use --------------------------------


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    return []


def policy_defines(tree: ast.Module) -> frozenset[str] | None:
    """The attributes base.py's ``CachePolicy`` defines: its methods,
    class attributes and what its methods assign to ``self`` (None if
    base.py has no ``CachePolicy``)."""
    cls = _class(tree, POLICY_CLASS)
    if cls is None:
        return None
    names: set[str] = set(dir(object))
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(stmt.name)
            for node in ast.walk(stmt):
                for target in _targets(node):
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ):
                        names.add(target.attr)
        for target in _targets(stmt):
            if isinstance(target, ast.Name):
                names.add(target.id)
    return frozenset(names)


def _mentions_policy_class(annotation: ast.expr) -> bool:
    return any(
        (isinstance(n, ast.Name) and n.id == POLICY_CLASS)
        or (isinstance(n, ast.Attribute) and n.attr == POLICY_CLASS)
        or (isinstance(n, ast.Constant) and n.value == POLICY_CLASS)
        for n in ast.walk(annotation)
    )


def policy_uses(tree: ast.Module) -> dict[str, int]:
    """The attributes a caller module uses on its policy object, each with
    the first line that uses it.

    The policy object is an attribute named ``_policy`` or annotated
    ``CachePolicy`` (``self._policy``, ``manager._policy``), or a local name
    assigned one; its uses are attribute reads and calls
    (``self._policy.evict(...)``) and ``getattr``/``hasattr`` with a constant
    name.
    """
    attributes = set(POLICY_ATTRIBUTES)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Attribute)
            and _mentions_policy_class(node.annotation)
        ):
            attributes.add(node.target.attr)

    def is_policy(expr: ast.expr) -> bool:
        return (isinstance(expr, ast.Attribute) and expr.attr in attributes) or (
            isinstance(expr, ast.Name) and expr.id in aliases
        )

    aliases: set[str] = set()
    for node in ast.walk(tree):
        value = getattr(node, "value", None)
        if isinstance(value, ast.expr) and is_policy(value):
            for target in _targets(node):
                if isinstance(target, ast.Name):
                    aliases.add(target.id)

    uses: dict[str, int] = {}

    def use(name: str, line: int) -> None:
        if name not in uses or line < uses[name]:
            uses[name] = line

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_policy(node.value):
            use(node.attr, node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and is_policy(node.args[0])
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            use(node.args[1].value, node.lineno)
    return uses


def analyse_source(source: str | bytes) -> dict[str, object]:
    """Everything the guard needs from one file (JSON-able, for the cache)."""
    tree = ast.parse(source)
    defines = policy_defines(tree)
    uses = policy_uses(tree)
    return {
        "fingerprint": fingerprint(tree),  # last: it drops the docstrings
        "defines": None if defines is None else sorted(defines),
        "uses": uses,
    }


# --- the installed files ------------------------------------------------------


def module_file(name: str) -> str | None:
    """The source file of module ``name`` as Python imports it: the
    imported module's own if it is imported, else what an import would load
    (None if there is no such module)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.has_location:
        return None
    return spec.origin


def cache_dir() -> str:
    """``$XDG_CACHE_HOME/arc_cy`` (an absolute XDG_CACHE_HOME only, as the
    XDG spec says), else ``~/.cache/arc_cy``."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "arc_cy")


def _stat_key(path: str) -> list[object]:
    st = os.stat(path)
    return [path, st.st_size, st.st_mtime_ns]


def _well_formed(entry: object) -> bool:
    """Whether a cached analysis has analyse_source's shape (a damaged
    cache file is analysed again, never trusted)."""
    if not isinstance(entry, dict) or set(entry) != {"fingerprint", "defines", "uses"}:
        return False
    defines, uses = entry["defines"], entry["uses"]
    return (
        isinstance(entry["fingerprint"], str)
        and (defines is None or (isinstance(defines, list)
                                 and all(isinstance(d, str) for d in defines)))
        and isinstance(uses, dict)
        and all(isinstance(k, str) and type(v) is int for k, v in uses.items())
    )


class _Cache:
    """Analyses of files, keyed by (path, size, mtime_ns), in one JSON file
    per set of files and per this module's version."""

    def __init__(self, paths: Iterable[str]) -> None:
        key = [_FORMAT, list(sys.version_info[:2]), _stat_key(__file__)]
        key += [_stat_key(p) for p in sorted(paths)]
        digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]
        self.path = os.path.join(cache_dir(), "vllm-code", digest + ".json")
        self.key = key
        self.entries: dict[str, dict[str, object]] = {}
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            if data["key"] == key and isinstance(data["entries"], dict):
                self.entries = {
                    path: entry
                    for path, entry in data["entries"].items()
                    if _well_formed(entry)
                }
        except (OSError, ValueError, KeyError, TypeError):
            pass
        self.dirty = False

    def get(self, path: str) -> dict[str, object]:
        entry = self.entries.get(path)
        if entry is None:
            with open(path, "rb") as f:
                entry = analyse_source(f.read())
            self.entries[path] = entry
            self.dirty = True
        return entry

    def save(self) -> None:
        if not self.dirty:
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump({"key": self.key, "entries": self.entries}, f)
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass  # a cache that cannot be written only costs the next check


class _NoCache:
    def get(self, path: str) -> dict[str, object]:
        with open(path, "rb") as f:
            return analyse_source(f.read())

    def save(self) -> None:
        pass


# --- the verdict --------------------------------------------------------------


@dataclass(frozen=True)
class CodeCheck:
    """What :func:`check_vllm_code` found."""

    version: str
    """The installed vLLM's version string (reported, never decisive)."""
    matches: tuple[str, ...]
    """The verified releases whose arc.py and base.py the installed ones are."""
    differing: tuple[tuple[str, str], ...] = ()
    """(file name, path) of each fingerprinted file that is not the nearest
    verified release's."""
    nearest: str | None = None
    """The verified release nearest the installed code, when none matches."""
    unknown_uses: tuple[tuple[str, str, int], ...] = ()
    """(attribute, caller path, line) of each policy attribute a caller uses
    that base.py's CachePolicy does not define."""
    unreadable: tuple[str, ...] = field(default=())
    """Modules whose source file could not be found or read."""

    @property
    def ok(self) -> bool:
        return bool(self.matches) and not self.unknown_uses and not self.unreadable


def _release_key(version: str) -> tuple[int, ...]:
    # The release numbers of a version ("0.33.0rc1+local" -> (0, 33, 0));
    # orders the table and finds the nearest release, nothing more.
    parts = []
    for part in version.split("+")[0].split("."):
        leading = len(part) - len(part.lstrip("0123456789"))
        if leading:
            parts.append(int(part[:leading]))
        if leading < len(part) or not leading:
            break
    return tuple(parts)


def _nearest(
    fingerprints: Mapping[str, str],
    verified: Mapping[str, Mapping[str, str]],
    version: str,
) -> str:
    # The verified release sharing the most fingerprinted files with the
    # installed code; among those, the newest not newer than the installed
    # version, else the oldest.
    def shared(release: str) -> int:
        return sum(verified[release].get(f) == fp for f, fp in fingerprints.items())

    best = max(shared(r) for r in verified)
    candidates = sorted((r for r in verified if shared(r) == best), key=_release_key)
    installed = _release_key(version)
    older = [r for r in candidates if _release_key(r) <= installed]
    return older[-1] if older else candidates[0]


def check_vllm_code(
    version: str,
    verified: Mapping[str, Mapping[str, str]] | None = None,
    *,
    cache: bool = True,
    find: Callable[[str], str | None] = module_file,
) -> CodeCheck:
    """Check the installed vLLM's policy code (see the module docstring).

    ``version`` is only reported; ``verified`` defaults to
    ``arc_cy._compat.VERIFIED_VLLM``; ``find`` maps a module name to its
    source file; ``cache=False`` analyses every file afresh.
    """
    if verified is None:
        from ._compat import VERIFIED_VLLM as verified
    files = {name: find(module) for name, module in FINGERPRINTED.items()}
    callers = [p for p in (find(m) for m in CALLER_MODULES) if p is not None]
    unreadable = [FINGERPRINTED[n] for n, p in files.items() if p is None]
    present = [p for p in files.values() if p is not None] + callers
    store: _Cache | _NoCache = _NoCache()
    if cache:
        try:
            store = _Cache(present)
        except OSError:
            pass
    entries: dict[str, dict[str, object]] = {}
    for path in present:
        try:
            entries[path] = store.get(path)
        except (OSError, SyntaxError, ValueError, RecursionError):
            unreadable.append(path)
    store.save()
    if unreadable:
        return CodeCheck(version, (), unreadable=tuple(unreadable))

    fingerprints = {n: str(entries[p]["fingerprint"]) for n, p in files.items() if p}
    matches = tuple(
        sorted(
            (
                r
                for r, fps in verified.items()
                if all(fps.get(n) == fp for n, fp in fingerprints.items())
            ),
            key=_release_key,
        )
    )
    differing: tuple[tuple[str, str], ...] = ()
    nearest = None
    if not matches:
        nearest = _nearest(fingerprints, verified, version)
        differing = tuple(
            (n, str(files[n]))
            for n, fp in fingerprints.items()
            if verified[nearest].get(n) != fp
        )

    base_path = files["base.py"]
    assert base_path is not None
    defines = entries[base_path]["defines"]
    defined = set(defines) if isinstance(defines, list) else set()
    unknown: list[tuple[str, str, int]] = []
    for path in callers:
        uses = entries[path]["uses"]
        assert isinstance(uses, dict)
        for name, line in sorted(uses.items(), key=lambda item: item[1]):
            if name not in defined:
                unknown.append((name, path, int(line)))
    return CodeCheck(
        version,
        matches,
        differing=differing,
        nearest=nearest,
        unknown_uses=tuple(unknown),
    )


# --- what the operator reads --------------------------------------------------


def _releases(releases: Iterable[str]) -> str:
    names = [f"vLLM {r}" for r in releases]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def matched_message(result: CodeCheck) -> str:
    """How the installed code matches, e.g. "its ARC and policy interface
    are those of verified vLLM 0.33.0"."""
    return f"its ARC and policy interface are those of verified {_releases(result.matches)}"


def _reasons(result: CodeCheck) -> str:
    reasons = []
    if result.unreadable:
        reasons.append(
            "arc_cy cannot read the source of " + ", ".join(result.unreadable)
        )
    for name, path in result.differing:
        reasons.append(
            f"its {name} ({path}) differs from that of vLLM {result.nearest}, "
            "the nearest verified release"
        )
    for attr, path, line in result.unknown_uses:
        reasons.append(
            f"{path}:{line} uses the policy's {attr!r}, which base.py's "
            "CachePolicy does not define"
        )
    return "; ".join(reasons)


def refused_message(result: CodeCheck, override_env: str) -> str:
    """Why the installed vLLM's code is refused, and what to do about it."""
    from ._compat import VERIFIED_VLLM

    verified = ", ".join(sorted(VERIFIED_VLLM, key=_release_key))
    return (
        f"arc_cy: vLLM {result.version}'s policy code is not what arc_cy has "
        f"verified: {_reasons(result)}. arc_cy reproduces vLLM arc decision "
        f"for decision on the code of the releases it verified ({verified}). "
        "Install one of them, or verify this vLLM from an arc_cy checkout with "
        "`.ci/vllm_compat.sh VERSION` (docs/usage.md#vllm-versions), or set "
        f"{override_env}=1 to use arc_cy anyway, unverified."
    )


def overridden_message(result: CodeCheck, override_env: str) -> str:
    """What the operator reads when the override lets unverified code in."""
    return (
        f"arc_cy: using arc_cy on vLLM {result.version}'s unverified policy "
        f"code because {override_env} is set ({_reasons(result)})"
    )
