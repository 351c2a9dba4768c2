"""The vLLM code guard: is the code this Python runs for vLLM's policies
code that arc_cy has verified?

arc_cy's decisions equal vLLM arc's under any sequence of ``CachePolicy``
calls (the differential tests). So what its correctness depends on is not
vLLM's version string but vLLM's code:

- ``cpu/policies/arc.py`` (the oracle) and ``cpu/policies/base.py`` (the
  contract): their fingerprints must be a release's in
  ``arc_cy._compat.VERIFIED_VLLM``. A fingerprint is sha256 of the AST,
  docstrings dropped, so comments and formatting do not count.
- What Python runs for arc.py and base.py is the code object their loader
  gives (``loader.get_code``: a ``.pyc`` when its header matches). It must
  equal the code compiled from the fingerprinted source: a stale ``.pyc``
  never runs unverified.
- The callers (the CPU manager, the tiering primary tier) are judged by the
  code their loader gives, with no data flow: it may use no name (an
  attribute, a global, a word in a string) that an ARC policy, vLLM's or
  arc_cy's, has beyond base.py's ``CachePolicy``, and none in ``DYNAMIC``
  (a computed attribute name). Through whatever name or route a caller
  holds its policy, any other attribute is one that neither ARC policy has,
  so it behaves the same on both (it is missing on both).

Nothing is cached: each check reads and parses the files afresh. This
module uses the standard library only (``.ci/fingerprint.py`` loads it on
any Python).
"""

from __future__ import annotations

import ast
import dis
import hashlib
import importlib.util
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from types import CodeType

ARC_MODULE = "vllm.v1.kv_offload.cpu.policies.arc"
BASE_MODULE = "vllm.v1.kv_offload.cpu.policies.base"
# A release without the tiering module has no such caller.
CALLER_MODULES = (
    "vllm.v1.kv_offload.cpu.manager",
    "vllm.v1.kv_offload.tiering.manager",
)
FINGERPRINTED = {"arc.py": ARC_MODULE, "base.py": BASE_MODULE}
"""The files whose fingerprints must be a verified release's, by file name."""

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
        "eval",
        "exec",
        "compile",
    }
)
"""What reaches an attribute by a computed name: a caller may use none."""
_WORD = re.compile(r"[A-Za-z_]\w*")


def fingerprint(tree: ast.Module) -> str:
    """sha256 of a module's AST without docstrings and positions, leaving
    out fields that are None or empty (Python releases add such fields, and
    a fingerprint must not depend on the Python that computes it)."""
    out: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, ast.AST):
            out.append(type(node).__name__ + "(")
            for name in node._fields:
                value = getattr(node, name, None)
                if name == "body" and isinstance(value, list):
                    value = [s for s in value if not _is_docstring(s)] or [ast.Pass()]
                if value is None or value == []:
                    continue
                out.append(name + "=")
                walk(value)
                out.append(",")
            out.append(")")
        elif isinstance(node, list):
            out.append("[")
            for item in node:
                walk(item)
                out.append(",")
            out.append("]")
        else:
            out.append(repr(node))

    walk(tree)
    return hashlib.sha256("".join(out).encode()).hexdigest()


def _is_docstring(stmt: object) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def fingerprint_source(source: str | bytes) -> str:
    return fingerprint(ast.parse(source))


def class_attributes(tree: ast.Module, name: str) -> frozenset[str] | None:
    """What class ``name`` of a module defines: its methods, class attributes
    and what its methods assign to ``self`` (None if there is no such class)."""
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if cls is None:
        return None
    names = {
        n.attr
        for n in ast.walk(cls)
        if isinstance(n, ast.Attribute)
        and isinstance(n.ctx, ast.Store)
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
    }
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(stmt.name)
        for target in getattr(stmt, "targets", [getattr(stmt, "target", None)]):
            if isinstance(target, ast.Name):
                names.add(target.id)
    return frozenset(names)


def _code_objects(code: CodeType) -> Iterable[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _code_objects(const)


def mentions(code: CodeType) -> dict[str, CodeType]:
    """Every name a module's code uses (attributes, globals) and every
    identifier in its strings, each with the first code object using it."""
    names: dict[str, CodeType] = {}
    for obj in _code_objects(code):
        for name in obj.co_names:
            names.setdefault(name, obj)
        for const in obj.co_consts:
            if isinstance(const, str):
                for word in _WORD.findall(const):
                    names.setdefault(word, obj)
    return names


def _line(code: CodeType, name: str) -> int:
    # The first line of code that uses name (a refusal's message only).
    for ins in dis.get_instructions(code):
        if isinstance(ins.argval, str) and name in _WORD.findall(ins.argval):
            if ins.positions and ins.positions.lineno:
                return ins.positions.lineno
    return code.co_firstlineno


def beyond_base(
    arc: ast.Module, base: ast.Module, policy_names: Iterable[str] = ()
) -> frozenset[str]:
    """The names a caller may not use: DYNAMIC, and what vLLM arc's
    ARCCachePolicy (or one with policy_names) has beyond base.py's
    CachePolicy, dunders aside."""
    ours = (class_attributes(arc, "ARCCachePolicy") or frozenset()) | set(policy_names)
    base_names = (class_attributes(base, "CachePolicy") or frozenset()) | set(dir(object))
    return DYNAMIC | {n for n in ours - base_names if not (n.startswith("__") and n.endswith("__"))}


def caller_uses(code: CodeType, beyond: frozenset[str]) -> list[tuple[str, int]]:
    """(name, line) of each name in beyond that a caller's code uses."""
    return sorted(
        ((n, _line(obj, n)) for n, obj in mentions(code).items() if n in beyond),
        key=lambda use: (use[1], use[0]),
    )


def module_spec(module: str) -> ModuleSpec | None:
    # The imported module's spec if it is imported, else what an import
    # would load (None if there is no such module).
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.has_location or not spec.origin:
        return None
    if not hasattr(spec.loader, "get_code"):
        raise ImportError(f"{spec.origin} is not loaded from Python code")
    return spec


def load_source(spec: ModuleSpec) -> tuple[ast.Module, str | None]:
    """(the AST of a module's source, the bytecode file its loader runs
    instead of that source's code, or None). Raises OSError, SyntaxError,
    ValueError or ImportError when it cannot be read."""
    with open(str(spec.origin), "rb") as f:
        source = f.read()
    runs = spec.loader.get_code(spec.name)  # type: ignore[union-attr]
    compiled = compile(source, str(spec.origin), "exec", dont_inherit=True)
    return ast.parse(source), None if runs == compiled else (spec.cached or "its bytecode")


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
    """(name, caller path, line) of each name in DYNAMIC, or an ARC policy
    has beyond base.py's CachePolicy, that a caller's code uses."""
    unreadable: tuple[str, ...] = ()
    """Modules whose source could not be found or read."""
    stale: tuple[tuple[str, str], ...] = ()
    """(source, bytecode) of each file whose loaded code is not its source's."""

    @property
    def ok(self) -> bool:
        return bool(self.matches) and not (self.unknown_uses or self.unreadable or self.stale)


def _release_key(version: str) -> tuple[int, ...]:
    # The release numbers of a version ("0.33.0rc1+local" -> (0, 33, 0)).
    parts = []
    for part in version.split("+")[0].split("."):
        digits = len(part) - len(part.lstrip("0123456789"))
        if digits:
            parts.append(int(part[:digits]))
        if digits < len(part) or not digits:
            break
    return tuple(parts)


def _nearest(
    found: Mapping[str, str], verified: Mapping[str, Mapping[str, str]], version: str
) -> str:
    # The verified release sharing the most fingerprinted files with the
    # installed code; among those, the newest not newer than the installed
    # version, else the oldest.
    def shared(release: str) -> int:
        return sum(verified[release].get(f) == fp for f, fp in found.items())

    best = max(map(shared, verified))
    candidates = sorted((r for r in verified if shared(r) == best), key=_release_key)
    older = [r for r in candidates if _release_key(r) <= _release_key(version)]
    return older[-1] if older else candidates[0]


def check_vllm_code(
    version: str,
    verified: Mapping[str, Mapping[str, str]] | None = None,
    policy_names: Iterable[str] = (),
) -> CodeCheck:
    """Check the vLLM code this Python runs (see the module docstring).

    ``version`` is only reported; ``verified`` defaults to
    ``arc_cy._compat.VERIFIED_VLLM``; ``policy_names`` are arc_cy's policy's
    attributes (vLLM arc's come from arc.py).
    """
    if verified is None:
        from ._compat import VERIFIED_VLLM as verified
    trees: dict[str, ast.Module] = {}
    callers: list[tuple[str, CodeType]] = []
    unreadable, stale = [], []
    for module in (*FINGERPRINTED.values(), *CALLER_MODULES):
        try:
            spec = module_spec(module)
            if spec is None:
                if module in FINGERPRINTED.values():
                    unreadable.append(module)
            elif module in CALLER_MODULES:
                callers.append((str(spec.origin), spec.loader.get_code(module)))  # type: ignore[union-attr]
            else:
                trees[module], pyc = load_source(spec)
                if pyc:
                    stale.append((str(spec.origin), pyc))
        except (OSError, SyntaxError, ValueError, ImportError, EOFError, RecursionError):
            unreadable.append(module)
    if unreadable:
        return CodeCheck(version, (), unreadable=tuple(unreadable))
    paths = {n: str(module_spec(m).origin) for n, m in FINGERPRINTED.items()}  # type: ignore[union-attr]
    found = {n: fingerprint(trees[m]) for n, m in FINGERPRINTED.items()}
    matches = tuple(
        sorted(
            (r for r, fps in verified.items() if all(fps.get(n) == fp for n, fp in found.items())),
            key=_release_key,
        )
    )
    nearest = None if matches else _nearest(found, verified, version)
    differing = tuple(
        (n, paths[n]) for n in FINGERPRINTED if nearest and verified[nearest].get(n) != found[n]
    )
    beyond = beyond_base(trees[ARC_MODULE], trees[BASE_MODULE], policy_names)
    unknown = [
        (name, path, line) for path, code in callers for name, line in caller_uses(code, beyond)
    ]
    return CodeCheck(
        version,
        matches,
        differing,
        nearest,
        tuple(sorted(unknown, key=lambda u: (u[1], u[2], u[0]))),
        stale=tuple(stale),
    )


def _releases(releases: Iterable[str]) -> str:
    names = [f"vLLM {r}" for r in releases]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def matched_message(result: CodeCheck) -> str:
    """E.g. "its ARC and policy interface are those of verified vLLM 0.33.0"."""
    return f"its ARC and policy interface are those of verified {_releases(result.matches)}"


def _reasons(result: CodeCheck) -> str:
    reasons = []
    if result.unreadable:
        reasons.append("arc_cy cannot read the source of " + ", ".join(result.unreadable))
    reasons += [
        f"its {name} ({path}) differs from that of vLLM {result.nearest}, "
        "the nearest verified release"
        for name, path in result.differing
    ]
    reasons += [
        f"the code Python runs for {path} ({pyc}) is not compiled from that source"
        for path, pyc in result.stale
    ]
    reasons += [
        f"{path}:{line} uses {name!r}, "
        + (
            "which reaches attributes by a computed name"
            if name in DYNAMIC
            else "which an ARC policy has beyond base.py's CachePolicy"
        )
        for name, path, line in result.unknown_uses
    ]
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
