"""Which vLLM arc_cy is verified against: declared here, and only here.

arc_cy is checked decision for decision against vLLM's ``ARCCachePolicy``,
driven through its manager and scheduler, on each release in
``VERIFIED_VLLM``: 0.33 in CI, 0.30 to 0.32 by ``.ci/vllm_compat.sh
VERSION``. What the vLLM plugin registers on is the installed vLLM's code,
not its version string (``arc_cy/_fingerprint.py``): its ``arc.py`` and
``base.py`` must be those of a verified release, and the policy's callers
must use nothing ``base.py`` does not define. Otherwise the plugin refuses
to register and ``python -m arc_cy`` fails, unless the operator overrides
that.
"""

from __future__ import annotations

import os

SUPPORTED_VLLM = ">=0.30.0,<0.34"
"""The vLLM versions the ``[vllm]`` extra installs, as a PEP 440 specifier:
from the oldest to the newest minor release in VERIFIED_VLLM
(tests/test_version_guard.py checks)."""

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

OVERRIDE_ENV = "ARC_CY_IGNORE_VLLM_VERSION"
"""Set to 1 to use arc_cy on vLLM code it has not verified, at your risk."""


def override_set() -> bool:
    return os.environ.get(OVERRIDE_ENV, "") not in ("", "0")
