"""The vLLM code guard: the check (:data:`vllm_guard`, which the plugin, the
constructors and ``python -m arc_cy`` go through) and its messages.
docs/usage.md, "The guard", says what it judges and how, once."""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import warnings
from typing import NamedTuple

from .._flags import env_flag
from . import files, verified
from .files import ARC_MODULE, BASE_MODULE, FILES, Unjudged

OVERRIDE_ENV = "ARC_CY_ALLOW_UNVERIFIED_VLLM"  # 1: use unverified vLLM code, at your risk
DEPRECATED_OVERRIDE_ENV = "ARC_CY_IGNORE_VLLM_VERSION"  # its old name, with a FutureWarning
logger: logging.Logger = logging.getLogger("vllm.plugins.arc_cy")
_MODULE_PATH = '"ARCCachePolicy" with "cache_policy_module_path": "arc_cy"'


def override_set() -> bool:
    if OVERRIDE_ENV in os.environ or DEPRECATED_OVERRIDE_ENV not in os.environ:
        return env_flag(OVERRIDE_ENV)
    message = f"arc_cy: {DEPRECATED_OVERRIDE_ENV} is deprecated; set {OVERRIDE_ENV} instead"
    warnings.warn(message, FutureWarning, stacklevel=2)
    return env_flag(DEPRECATED_OVERRIDE_ENV)


def vllm_version() -> str:
    """The imported vLLM's ``__version__``, else its metadata's, else "unknown"."""
    from importlib import metadata  # email, zipfile and more: only without vllm.__version__

    version = getattr(sys.modules.get("vllm"), "__version__", None)
    try:
        return version if isinstance(version, str) and version else metadata.version("vllm")
    except Exception:
        return "unknown"


def release_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in version.split("+")[0].split("."))


def releases() -> list[str]:
    """The verified releases, newest first."""
    return sorted(verified.FILES, key=release_key, reverse=True)


def verified_code(release: str) -> dict[str, str]:
    """A verified release's ARC code: object -> fingerprint."""
    fps = [(name, fp.split()) for name, fps in verified.ARC.items() for fp in fps.split("; ")]
    return {name: fp for name, (fp, *rs) in fps if release in rs}


class CodeCheck(NamedTuple):
    """What the guard found for this process's vLLM."""

    version: str
    verified_as: str | None = None  # the verified release whose ARC code this is
    problems: tuple[str, ...] = ()  # each reason to refuse it, as the operator reads it
    by_hash: bool = False  # accepted by its files' hashes: no lockstep ran

    @property
    def ok(self) -> bool:
        return self.verified_as is not None and not self.problems


def check_vllm_code() -> CodeCheck | None:
    """Judge this process's vLLM afresh (None where vLLM does not import); never raises."""
    from .. import _vllm

    if not _vllm.VLLM_IMPORTED:
        return None
    version, enabled = vllm_version(), gc.isenabled()
    gc.disable()  # a collection in a process with torch costs more than the check
    try:
        if not _vllm.HAVE_VLLM:
            why = f"CachePolicy and ChunkStatus ({files.why(_vllm.VLLM_IMPORT_ERROR)})"
            raise Unjudged(f"its policy module does not give arc_cy {why}")
        return _judge(version)
    except (Exception, RecursionError, MemoryError) as exc:
        why = str(exc) if isinstance(exc, Unjudged) else files.why(exc)
        return CodeCheck(version, problems=(f"arc_cy cannot judge it: {why}",))
    finally:
        if enabled:
            gc.enable()


def _judge(version: str) -> CodeCheck:
    sources: dict[str, tuple[str, bytes]] = {}
    for module in FILES:
        if (path := files.source_path(module)) is not None:
            sources[module] = (path, files.read(path))
        elif module in (ARC_MODULE, BASE_MODULE):
            raise Unjudged(f"{module} cannot be found")
    digest = files.digest({m: source for m, (_, source) in sources.items()})
    try:  # Uncompared: a file changed since the process started
        if release := next((r for r in releases() if verified.FILES[r] == digest), None):
            return CodeCheck(version, release, tuple(files.stale(sources, files.started())), True)
    except files.Uncompared:
        pass
    return _release_day(version, sources)


def _arc_cy_names() -> set[str]:
    """The names arc_cy's policies (as the package selects them) have, less Python's."""
    package = sys.modules["arc_cy"]
    classes = package.ARCCachePolicy, package.ARCPlusCachePolicy
    return {n for cls in classes for n in dir(cls) if not n.startswith("__")}


_DOES = {"keyword": "passes the keyword", "string": "has the string"}  # else kind + "s"


def _release_day(version: str, sources: dict[str, tuple[str, bytes]]) -> CodeCheck:
    from . import fingerprint  # its analysis (ast, symtable) is loaded on release day only

    (arc_path, arc), (base_path, base) = sources[ARC_MODULE], sources[BASE_MODULE]
    for module, found in files.find_callers().items():
        sources.setdefault(module, found)
    try:
        code, names = fingerprint.arc_code(arc, base)
        watched = names | _arc_cy_names() | fingerprint.DYNAMIC
        callers = {
            path: fingerprint.caller_uses(source, watched)
            for module, (path, source) in sources.items()
            if module not in (ARC_MODULE, BASE_MODULE)
        }
    except (SyntaxError, ValueError) as exc:
        raise Unjudged(files.why(exc)) from None
    matching = [r for r in releases() if verified_code(r) == code]
    nearest, problems = (matching[0], []) if matching else _changes(code, arc_path, base_path)
    made = set(matching or [nearest])
    allowed = {use for use, rs in verified.USES.items() if made & set(rs.split())}
    for path, uses in callers.items():
        problems += [
            f"{path}:{line} {_DOES.get(kind, kind + 's')} {name!r}, which no caller of "
            f"verified vLLM {nearest}'s ARC code does"
            for use, line in sorted(uses.items(), key=lambda u: u[1])
            if use not in allowed
            for kind, _, name in [use.partition(":")]
        ]
    problems += files.stale(sources)
    if not problems and (differs := lockstep_difference()):
        problems.append(differs)
    return CodeCheck(version, nearest if matching else None, tuple(problems))


def _changes(code: dict[str, str], arc: str, base: str) -> tuple[str, list[str]]:
    """The verified release nearest code, and each object that differs from its ARC code."""
    ours = {r: verified_code(r) for r in releases()}
    score = {r: (sum(code.get(k) == v for k, v in ours[r].items()), release_key(r)) for r in ours}
    near = max(ours, key=score.__getitem__)
    theirs, out = ours[near], []
    for name in sorted(k for k in code.keys() | theirs.keys() if code.get(k) != theirs.get(k)):
        file, _, obj = name.partition(":")
        what = f"{file}'s module code" if obj == "<module code>" else f"`{obj}`"
        how = "is not in {}'s" if name not in theirs else "differs from {}'s"
        how = "is missing, which {}'s has" if name not in code else how
        path = arc if file == "arc.py" else base
        out.append(f"{what} ({path}) {how.format(f'verified vLLM {near}')}")
    return near, out


def lockstep_difference() -> str | None:
    """How vLLM's managers first decide otherwise with arc_cy than with their ARC; None if never."""
    from . import lockstep  # random, dataclasses, enum: on release day only

    differs = lockstep.first_difference()
    return differs and f"arc_cy decides otherwise than this vLLM's ARC {differs}"


def plus_refusal() -> str | None:
    """Why ARC+ is not built on this vLLM (0.30's manager never calls on_request_finished)."""
    policy = getattr(sys.modules.get(BASE_MODULE), "CachePolicy", None)
    if policy is None or hasattr(policy, "on_request_finished"):
        return None
    return (
        'ARC+ ("arc_cy_plus", ARCPlusCachePolicy) learns in on_request_finished, which vLLM '
        f"{vllm_version()}'s manager never calls: it would stop admitting blocks once the pool "
        f'is full. Use "arc_cy" instead, or {_MODULE_PATH}'
    )


class VllmGuard:
    """Runs once per process: constructors call check() while ``pending`` (ARC+: plus_pending)."""

    pending = True  # False once arc_cy may run here: no vLLM, or its code accepted
    plus_pending = True  # False once ARC+ may too (plus_refusal)
    _result: CodeCheck | None = None
    _checked = _warned = False
    _running: int | None = None  # the thread whose check's lockstep builds policies

    def result(self) -> CodeCheck | None:
        """What the check found (None without vLLM), run on the first call."""
        if not self._checked:
            self._running = threading.get_ident()
            try:
                self._result = check_vllm_code()
            finally:
                self._running = None
            self._checked = True
        return self._result

    def allowed(self) -> bool:
        """Whether arc_cy may run: verified code, or the override (logged once)."""
        code = None if self._running == threading.get_ident() else self.result()
        if code is None or code.ok:  # no vLLM, verified code, or the check's own lockstep
            return True
        if not override_set():
            return False
        if not self._warned:
            self._warned = True
            logger.warning("%s", overridden_message(code))
        return True

    def check(self, plus: bool = False) -> None:
        """Raise RuntimeError, with the plugin's message, unless allowed() (ARC+: plus_refusal)."""
        if not self.allowed():
            raise RuntimeError(refused_message(self.result()))  # type: ignore[arg-type]
        if plus and (why := plus_refusal()):
            raise RuntimeError(f"arc_cy: {why}.")
        if self._running is None:
            self.pending = False
            self.plus_pending = self.plus_pending and not plus


vllm_guard = VllmGuard()


def verified_message(code: CodeCheck) -> str:
    return f"its ARC code is verified vLLM {code.verified_as}'s"


def refused_message(code: CodeCheck) -> str:
    """Why the installed vLLM's code is refused, and what to do about it."""
    how = "not code arc_cy verified:"
    if code.verified_as is not None:
        how = f"verified vLLM {code.verified_as}'s, but"
    return (
        f"arc_cy: vLLM {code.version}'s ARC code is {how} {'; '.join(code.problems)}. arc_cy "
        "reproduces vLLM arc decision for decision on the ARC code of the releases it verified "
        f"({', '.join(releases()[::-1])}). Install one of them, or verify this vLLM from an "
        "arc_cy checkout with `tools/vllm_compat.sh VERSION` (docs/usage.md#the-guard), or set "
        f"{OVERRIDE_ENV}=1 to use arc_cy anyway, unverified."
    )


def overridden_message(code: CodeCheck) -> str:
    return (
        f"arc_cy: using arc_cy on vLLM {code.version}'s unverified code because "
        f"{OVERRIDE_ENV} is set ({'; '.join(code.problems)})"
    )
