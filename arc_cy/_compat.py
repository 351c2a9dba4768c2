"""Which vLLM arc_cy is verified against: declared here, and only here; and
the guard that keeps arc_cy off vLLM code it has not verified.

arc_cy is checked decision for decision against vLLM's ``ARCCachePolicy``,
driven through its manager and scheduler, on each release in
``VERIFIED_VLLM``: 0.33 in CI, 0.30 to 0.32 by ``.ci/vllm_compat.sh
VERSION``. What arc_cy runs on is the installed vLLM's code, not its
version string (``arc_cy._fingerprint``). In a process where vLLM imports,
both implementations' constructors call :data:`vllm_guard`, whichever
route built them (the plugin's name, or ``cache_policy_module_path``): on
unverified code they raise, the plugin does not register and ``python -m
arc_cy`` fails, unless the operator overrides that.
"""

from __future__ import annotations

import logging
import os
import warnings

from ._env import env_flag

SUPPORTED_VLLM = ">=0.30.0,<0.34"
"""The vLLM versions the ``[vllm]`` extra installs, as a PEP 440 specifier:
from the oldest to the newest minor release in VERIFIED_VLLM
(tests/test_vllm_guard.py checks)."""

VERIFIED_VLLM: dict[str, dict[str, str]] = {
    # release: the fingerprints of its vllm/v1/kv_offload/cpu/policies/
    # arc.py and base.py, as .ci/fingerprint.py prints them (from each
    # release's wheel; .ci/vllm_compat.sh prints them for the release it
    # verified). Only releases that passed .ci/vllm_compat.sh belong here.
    "0.30.0": {
        "arc.py": "160e0884ba183338675e903682e0d552e98cbf1454d2a7367ec76f1e766bf2e2",
        "base.py": "ab21b7a1b0855b8f6d79c5a3bf48281b4deade57736bf11caca1c25d23fc9577",
    },
    "0.31.0": {
        "arc.py": "8aeef23ce0d76d3b0399289c056a7d16f4f477596459d1bc6fe68dd5aedbc838",
        "base.py": "b860fde2568156c1bc9a7c73487b533b86f0077a6b551ad0529bf9803c6d599b",
    },
    "0.32.0": {
        "arc.py": "8aeef23ce0d76d3b0399289c056a7d16f4f477596459d1bc6fe68dd5aedbc838",
        "base.py": "b860fde2568156c1bc9a7c73487b533b86f0077a6b551ad0529bf9803c6d599b",
    },
    "0.33.0": {
        "arc.py": "2f0597db023064e6952bd2f7bb43cd7fec75f8fda76797e89dc2e8ff55bfd2d2",
        "base.py": "ac75af28eeca3e4616b4bea0eb0945d699291b1b480dedb4e1c6e1c48192e2ad",
    },
}
"""The verified vLLM releases, with the fingerprints of their policy code."""

OVERRIDE_ENV = "ARC_CY_ALLOW_UNVERIFIED_VLLM"
"""Set to 1 to use arc_cy on vLLM code it has not verified, at your risk."""
DEPRECATED_OVERRIDE_ENV = "ARC_CY_IGNORE_VLLM_VERSION"
"""The override's old name: still honoured, with a FutureWarning."""

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


class VllmGuard:
    """The check of this process's vLLM code, run once. Both
    implementations' ``__init__`` start with ``if vllm_guard.pending:
    vllm_guard.check()``: after the first accepted check, one attribute
    read per construction."""

    def __init__(self) -> None:
        self.pending = True
        """False once arc_cy may run here: no vLLM, or its code accepted."""
        self._result: object = None
        self._warned = False

    def result(self):  # type: ignore[no-untyped-def]  # CodeCheck | None
        """What arc_cy._fingerprint found for this process's vLLM (None
        without vLLM), checked on the first call only."""
        from ._base import HAVE_VLLM

        if self._result is None and HAVE_VLLM:
            import vllm

            from . import _arc_py
            from ._fingerprint import check_vllm_code

            names = set(dir(_arc_py.ARCCachePolicy))
            try:
                from . import _arc_c

                names |= set(dir(_arc_c.ARCCachePolicy))
            except ImportError:
                pass
            self._result = check_vllm_code(
                str(getattr(vllm, "__version__", "unknown")), policy_names=names
            )
        return self._result

    def allowed(self) -> bool:
        """Whether arc_cy may run on this vLLM: verified code, or the
        override set (logged once)."""
        from ._fingerprint import overridden_message

        code = self.result()
        if code is None or code.ok:
            return True
        if not override_set():
            return False
        if not self._warned:
            self._warned = True
            logger.warning("%s", overridden_message(code, OVERRIDE_ENV))
        return True

    def check(self) -> None:
        """Raise RuntimeError, with the plugin's message, unless allowed()."""
        from ._fingerprint import refused_message

        if not self.allowed():
            raise RuntimeError(refused_message(self.result(), OVERRIDE_ENV))
        self.pending = False


vllm_guard = VllmGuard()
