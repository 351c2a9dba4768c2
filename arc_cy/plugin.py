"""vLLM plugin: makes ``"eviction_policy": "arc_cy"`` name arc_cy's policy.

Declared as a ``vllm.general_plugins`` entry point, so vLLM runs
``register()`` in every process it starts, possibly more than once.
"""

from __future__ import annotations

import logging

POLICY_NAME = "arc_cy"

logger = logging.getLogger("vllm.plugins.arc_cy")


def register() -> None:
    """Register ``arc_cy`` with vLLM's CachePolicyFactory (idempotent)."""
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    import arc_cy

    try:
        CachePolicyFactory.register_cache_policy(
            POLICY_NAME, "arc_cy", "ARCCachePolicy"
        )
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
        "arc_cy: registered CPU offloading cache policy %r (%s implementation)",
        POLICY_NAME,
        arc_cy.IMPLEMENTATION,
    )
