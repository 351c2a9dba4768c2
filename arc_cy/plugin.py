"""vLLM plugin: makes ``"eviction_policy": "arc_cy"`` name arc_cy's policy.

Declared as a ``vllm.general_plugins`` entry point, so vLLM runs
``register()`` in every process it starts, possibly more than once.
"""

from __future__ import annotations

from arc_cy._guard import logger

POLICY_NAME: str = "arc_cy"
__all__ = ["POLICY_NAME", "logger", "register"]


def register() -> None:
    """Register ``arc_cy`` with vLLM's CachePolicyFactory (idempotent).

    Only when the guard accepts this vLLM's code (``arc_cy._guard``, the
    check both constructors run, once per process): else it logs why and
    registers nothing, unless ``ARC_CY_ALLOW_UNVERIFIED_VLLM=1``. vLLM calls
    general plugins without a ``try``, so nothing here raises but a name
    taken by another policy, which must not be shadowed silently.
    """
    import arc_cy
    from arc_cy._guard import refused_message, verified_message, vllm_guard

    try:
        from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

        allowed = vllm_guard.allowed()
    except Exception as exc:  # a broken vLLM, or a bad override value
        logger.error(
            "arc_cy: %s: %s. The 'arc_cy' cache policy is NOT registered.",
            type(exc).__name__,
            exc,
        )
        return
    code = vllm_guard.result()
    if code is None:
        logger.error("arc_cy: vLLM does not import. The 'arc_cy' cache policy is NOT registered.")
        return
    if not allowed:
        logger.error("%s The 'arc_cy' cache policy is NOT registered.", refused_message(code))
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
        verified_message(code) if code.ok else "UNVERIFIED code",
    )
