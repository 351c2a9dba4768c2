"""arc_cy's boolean environment flags, parsed in one place (standard library
only: setup.py and the test programs load it too)."""

from __future__ import annotations

import os
from collections.abc import Mapping

FALSE = ("", "0", "false", "no", "off")
TRUE = ("1", "true", "yes", "on")
RUNTIME_FLAGS = (
    "ARC_CY_NO_EXTENSIONS",
    "ARC_CY_ALLOW_UNVERIFIED_VLLM",
    "ARC_CY_IGNORE_VLLM_VERSION",
)
"""Every flag that arc_cy reads once installed (setup.py's build flags
aside): the plugin must survive each one mistyped (tests/test_plugin.py)."""
RECORDING = ("ARC_CY_RECORD_TRACE", "ARC_CY_RECORD_MAX_MB")
"""The recording's settings (arc_cy._record): a path and a size, not flags;
a value it cannot use is one WARNING, and no recording."""


def env_flag(name: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether flag ``name`` is set: unset or one of FALSE (any case, spaces
    around ignored) is False, one of TRUE is True, anything else a ValueError
    that names the flag and the values it takes."""
    value = environ.get(name, "").strip().lower()
    if value in FALSE:
        return False
    if value in TRUE:
        return True
    raise ValueError(
        f"{name}={environ[name]!r} is not a boolean: set it to one of "
        f"{', '.join(TRUE)} (true) or {', '.join(FALSE[1:])} or nothing (false)"
    )
