"""Which vLLM releases arc_cy supports: declared here, and only here.

arc_cy is checked decision for decision against the ``ARCCachePolicy`` of
the vLLM releases in ``SUPPORTED_VLLM``: 0.33 in CI, 0.30 to 0.32 by
``.ci/vllm_compat.sh VERSION``. They ship the same ARC, but the interface
around it changes (0.30's scheduler touches, 0.31 adds ``on_store_miss`` and
``on_request_finished``, 0.33 ``on_request_access`` and ``insert``'s
``req_context``), so on any other release the vLLM plugin refuses to
register and ``python -m arc_cy`` fails, unless the operator overrides that.
"""

from __future__ import annotations

import os

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

SUPPORTED_VLLM = ">=0.30.0,<0.34"
"""The vLLM versions arc_cy supports, as a PEP 440 specifier."""

OVERRIDE_ENV = "ARC_CY_IGNORE_VLLM_VERSION"
"""Set to 1 to use arc_cy with a vLLM outside SUPPORTED_VLLM, at your risk."""


def override_set() -> bool:
    return os.environ.get(OVERRIDE_ENV, "") not in ("", "0")


def vllm_supported(version: str) -> bool:
    """Whether vLLM ``version`` is in SUPPORTED_VLLM (a pre-release, dev or
    local build of a supported release counts as that release)."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return False
    return SpecifierSet(SUPPORTED_VLLM).contains(parsed.base_version)


def unsupported_message(version: str) -> str:
    """What an operator reads when vLLM ``version`` is not supported."""
    return (
        f"arc_cy: vLLM {version} is not supported: this arc_cy supports "
        f"vllm{SUPPORTED_VLLM}, whose ARC it reproduces decision for decision. "
        "Install a supported vLLM (pip install 'vllm" + SUPPORTED_VLLM + "') "
        f"or set {OVERRIDE_ENV}=1 to use arc_cy anyway, unverified."
    )
