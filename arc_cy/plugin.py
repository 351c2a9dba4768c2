"""vLLM plugin: makes ``"eviction_policy": "arc_cy"`` name arc_cy's policy.

Declared as a ``vllm.general_plugins`` entry point, so vLLM runs
``register()`` in every process it starts, possibly more than once.
"""

from __future__ import annotations

from arc_cy._compat import logger

POLICY_NAME: str = "arc_cy"
__all__ = ["POLICY_NAME", "logger", "register"]


def register() -> None:
    """Register ``arc_cy`` with vLLM's CachePolicyFactory (idempotent).

    Only when the installed vLLM's policy code is that of a release arc_cy
    has verified (``arc_cy._fingerprint``; its version string does not
    count): else it logs an error and registers nothing, unless
    ``ARC_CY_ALLOW_UNVERIFIED_VLLM=1``. The check is the one both
    constructors run (``arc_cy._compat.vllm_guard``), once per process.
    """
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    import arc_cy
    from arc_cy._compat import OVERRIDE_ENV, vllm_guard
    from arc_cy._fingerprint import matched_message, refused_message

    code = vllm_guard.result()
    if not vllm_guard.allowed():
        logger.error(
            "%s The 'arc_cy' cache policy is NOT registered.", refused_message(code, OVERRIDE_ENV)
        )
        return
    try:
        CachePolicyFactory.register_cache_policy(POLICY_NAME, "arc_cy", "ARCCachePolicy")
    except ValueError:
        # Registered already: by an earlier call in this process, or by
        # someone else under our name, which we refuse to shadow silently.
        existing = CachePolicyFactory.get_cache_policy_cls(POLICY_NAME)
        if existing is not arc_cy.ARCCachePolicy:
            raise RuntimeError(
                f"cache policy {POLICY_NAME!r} is already registered as "
                f"{existing.__module__}.{existing.__qualname__}"
            ) from None
        return
    logger.info(
        "arc_cy: registered CPU offloading cache policy %r (%s implementation) on vLLM %s: %s",
        POLICY_NAME,
        arc_cy.IMPLEMENTATION,
        code.version,
        matched_message(code) if code.ok else "UNVERIFIED code",
    )
