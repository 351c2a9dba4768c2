"""The vLLM code guard: arc_cy runs only on vLLM code whose decisions it
verified.

What it judges, when it runs, what a refusal and the override do and what
it costs are stated once, in docs/usage.md ("The guard"). This module is
the check (:data:`vllm_guard`, which the plugin, both constructors and
``python -m arc_cy`` go through) and the messages an operator reads; the
analysis is ``arc_cy._fingerprint`` (standard library only), the table
``arc_cy._verified``. It imports neither implementation:
:data:`POLICY_NAMES` is what they define.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings

from . import _fingerprint
from ._env import env_flag
from ._fingerprint import CodeCheck, release_key
from ._verified import VERIFIED

OVERRIDE_ENV = "ARC_CY_ALLOW_UNVERIFIED_VLLM"
"""Set to 1 to use arc_cy on vLLM code it has not verified, at your risk."""
DEPRECATED_OVERRIDE_ENV = "ARC_CY_IGNORE_VLLM_VERSION"
"""The override's old name: still honoured, with a FutureWarning."""

POLICY_NAMES = frozenset(
    {
        "_adapt_to_ghost_hit",
        "_busy",
        "_check_invariants",
        "_list_contains",
        "_list_getitem",
        "_list_iter",
        "_list_len",
        "_max_entries",
        "_read",
        "_replace_list",
        "_scan_visits",
        "b1",
        "b2",
        "cache_capacity",
        "clear",
        "evict",
        "get",
        "insert",
        "mark_evictable",
        "mark_non_evictable",
        "on_request_access",
        "on_request_finished",
        "on_store_miss",
        "remove",
        "t1",
        "t2",
        "target_t1_size",
        "touch",
    }
)
"""Every name, dunders aside, that arc_cy's policies (the core and the
twin) define above vLLM's ``CachePolicy`` (tests/test_vllm_guard.py checks
both classes)."""

logger: logging.Logger = logging.getLogger("vllm.plugins.arc_cy")


def override_set() -> bool:
    if OVERRIDE_ENV not in os.environ and DEPRECATED_OVERRIDE_ENV in os.environ:
        warnings.warn(
            f"arc_cy: {DEPRECATED_OVERRIDE_ENV} is deprecated; set {OVERRIDE_ENV} instead",
            FutureWarning,
            stacklevel=2,
        )
        return env_flag(DEPRECATED_OVERRIDE_ENV)
    return env_flag(OVERRIDE_ENV)


def vllm_version() -> str:
    """The imported vLLM's version: its ``__version__``, else its installed
    metadata, else "unknown" (a source tree, an overlay)."""
    import sys

    version = getattr(sys.modules.get("vllm"), "__version__", None)
    if isinstance(version, str) and version:
        return version
    try:
        from importlib import metadata

        return metadata.version("vllm")
    except Exception:
        return "unknown"


def check_vllm_code() -> CodeCheck | None:
    """Judge this process's vLLM (None where vLLM does not import).
    Never raises; reads the files afresh on every call."""
    from . import _base

    if not _base.VLLM_IMPORTED:
        return None
    version = vllm_version()
    if not _base.HAVE_VLLM:
        err = _base.VLLM_IMPORT_ERROR
        return CodeCheck(
            version,
            unjudged=(
                "its policy module does not give arc_cy CachePolicy and ChunkStatus "
                f"({type(err).__name__}: {err})",
            ),
        )
    code = _fingerprint.check_vllm_code(version, VERIFIED, POLICY_NAMES)
    held = _held_by_arc_cy()
    if held:
        code = dataclasses.replace(code, not_source=code.not_source + held)
    return code


HOLDERS = ("arc_cy._base", "arc_cy._arc_py", "arc_cy._plus_py", "arc_cy._arc_c")
"""arc_cy's modules that bind vLLM's ``order_request_keys`` (and run it)."""


def _held_by_arc_cy() -> tuple[tuple[str, str], ...]:
    """What arc_cy itself runs of base.py is what base.py binds: arc_cy
    bound ``order_request_keys`` when it imported, so a replacement made
    before then (and undone since) would run in arc_cy alone. (path, what)
    for each arc_cy module that holds another; none where base.py has no
    such function (0.30: arc_cy's own stand-in)."""
    import sys

    base = sys.modules.get(_fingerprint.BASE_MODULE)
    theirs = getattr(base, "__dict__", {}).get("order_request_keys")
    if theirs is None:
        return ()
    wrong = [
        name
        for name in HOLDERS
        if (held := getattr(sys.modules.get(name), "__dict__", {}).get("order_request_keys"))
        is not None
        and held is not theirs
    ]
    if not wrong:
        return ()
    path = str(getattr(base, "__file__", _fingerprint.FILES[_fingerprint.BASE_MODULE]))
    return (
        (
            path,
            "arc_cy runs another order_request_keys than it binds "
            f"({', '.join(wrong)}): it was replaced before arc_cy imported it",
        ),
    )


class VllmGuard:
    """The check of this process's vLLM code, run once. Both
    implementations' ``__init__`` start with ``if vllm_guard.pending:
    vllm_guard.check()``: after the first accepted check, one attribute
    read per construction."""

    def __init__(self) -> None:
        self.pending = True
        """False once arc_cy may run here: no vLLM, or its code accepted."""
        self._result: CodeCheck | None = None
        self._checked = False
        self._warned = False

    def result(self) -> CodeCheck | None:
        """What the check found for this process's vLLM (None without
        vLLM), checked on the first call only."""
        if not self._checked:
            self._result = check_vllm_code()
            self._checked = True
        return self._result

    def allowed(self) -> bool:
        """Whether arc_cy may run on this vLLM: verified code, or the
        override set (logged once)."""
        code = self.result()
        if code is None or code.ok:
            return True
        if not override_set():
            return False
        if not self._warned:
            self._warned = True
            logger.warning("%s", overridden_message(code))
        return True

    def check(self) -> None:
        """Raise RuntimeError, with the plugin's message, unless allowed()."""
        if not self.allowed():
            raise RuntimeError(refused_message(self.result()))  # type: ignore[arg-type]
        self.pending = False


vllm_guard = VllmGuard()


# --- what the operator reads ----------------------------------------------------


def verified_message(code: CodeCheck) -> str:
    """E.g. "its ARC code is verified vLLM 0.34.0's"."""
    return f"its ARC code is verified vLLM {code.verified_as}'s"


def _object(name: str) -> str:
    file, _, obj = name.partition(":")
    return f"{file}'s module code" if obj == "<module code>" else f"`{obj}`"


def reasons(code: CodeCheck) -> str:
    """Each thing the guard refuses, by object, caller line or file."""
    out = [f"arc_cy cannot judge it: {why}" for why in code.unjudged]
    how = {
        "differs": "differs from verified vLLM {}'s",
        "new": "is not in verified vLLM {}'s",
        "missing": "is missing, which verified vLLM {}'s has",
    }
    out += [f"{_object(c.name)} ({c.path}) {how[c.how].format(code.nearest)}" for c in code.changes]
    out += [
        f"the code that runs for {path} is not its source's: {what}"
        for path, what in code.not_source
    ]
    why = {
        "dynamic": "which reaches attributes by a computed name, or an object's state whole",
        "beyond": "which an ARC policy has beyond base.py's CachePolicy",
        "gone": "a method of verified vLLM {}'s ARC that this vLLM's ARC lacks",
        "class": "vLLM's ARC class, which arc_cy's policy is not",
        "write": "which it assigns or deletes on an object not its own, and which a policy "
        "has (arc_cy's policies take no such write)",
    }
    out += [
        f"{u.path}{f':{u.line}' if u.line else ''} uses {u.name!r}, {why[u.why].format(u.release)}"
        for u in code.uses
    ]
    return "; ".join(out)


def _verified_releases() -> str:
    releases = sorted((r for e in VERIFIED for r in e["releases"]), key=release_key)
    return ", ".join(releases)


def refused_message(code: CodeCheck) -> str:
    """Why the installed vLLM's code is refused, and what to do about it."""
    if code.verified_as is not None:
        head = f"vLLM {code.version}'s ARC code is verified vLLM {code.verified_as}'s, but "
    else:
        head = f"vLLM {code.version}'s ARC code is not code arc_cy verified: "
    return (
        f"arc_cy: {head}{reasons(code)}. arc_cy reproduces vLLM arc decision for "
        f"decision on the ARC code of the releases it verified ({_verified_releases()}). "
        "Install one of them, or verify this vLLM from an arc_cy checkout with "
        "`tools/vllm_compat.sh VERSION` (docs/usage.md#the-guard), or set "
        f"{OVERRIDE_ENV}=1 to use arc_cy anyway, unverified."
    )


def overridden_message(code: CodeCheck) -> str:
    """What the operator reads when the override lets unverified code in."""
    return (
        f"arc_cy: using arc_cy on vLLM {code.version}'s unverified code because "
        f"{OVERRIDE_ENV} is set ({reasons(code)})"
    )
