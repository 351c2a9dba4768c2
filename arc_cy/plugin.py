"""vLLM plugin: makes ``"eviction_policy": "arc_cy"`` name arc_cy's policy,
and ``"arc_cy_plus"`` its ARC+ where vLLM's manager calls the hook ARC+
learns in (``arc_cy._guard.plus_refusal``: 0.31 and later).

Declared as a ``vllm.general_plugins`` entry point, so vLLM runs
``register()`` in every process it starts, possibly more than once, and
without a ``try``: an exception out of it stops every vLLM process on the
machine, whatever policy it uses.
"""

from __future__ import annotations

from arc_cy._guard import logger

POLICY_NAME: str = "arc_cy"
PLUS_NAME: str = "arc_cy_plus"
__all__ = ["PLUS_NAME", "POLICY_NAME", "logger", "register"]


class _NameTaken(Exception):
    """Another policy holds a name of arc_cy's: the one error register()
    lets out, since shadowing it silently would run the wrong policy."""


def register() -> None:
    """Register ``arc_cy`` and ``arc_cy_plus`` with vLLM's
    CachePolicyFactory (idempotent).

    Only when the guard accepts this vLLM's code (``arc_cy._guard``, the
    check both constructors run, once per process): else it logs why and
    registers nothing, unless ``ARC_CY_ALLOW_UNVERIFIED_VLLM=1``. Never
    raises (docs/usage.md, "The guard"): any error, a mistyped flag's
    included, is logged at ERROR and registers nothing; the one exception is
    a name of arc_cy's taken by another policy (RuntimeError).
    """
    try:
        _register()
    except _NameTaken as exc:
        raise RuntimeError(str(exc)) from None
    except Exception as exc:
        logger.error(
            "arc_cy: %s: %s. The 'arc_cy' cache policy is NOT registered.",
            type(exc).__name__,
            exc,
        )


def _register() -> None:
    import arc_cy
    from arc_cy._guard import plus_refusal, refused_message, verified_message, vllm_guard

    # Everything that can fail runs before the registration, so that a
    # failure leaves the name unregistered: the implementation (its flag,
    # ARC_CY_NO_EXTENSIONS), vLLM's factory, the guard (its override flag).
    policies: dict[str, type] = {POLICY_NAME: arc_cy.ARCCachePolicy}
    implementation = arc_cy.IMPLEMENTATION
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    if (refusal := plus_refusal()) is None:
        policies[PLUS_NAME] = arc_cy.ARCPlusCachePolicy

    allowed = vllm_guard.allowed()
    code = vllm_guard.result()
    if code is None:
        logger.error("arc_cy: vLLM does not import. The 'arc_cy' cache policy is NOT registered.")
        return
    if not allowed:
        logger.error("%s The 'arc_cy' cache policy is NOT registered.", refused_message(code))
        return
    accepted = verified_message(code) if code.ok else "UNVERIFIED code"
    accepted += f"; not {PLUS_NAME!r}: {refusal}." if refusal else ""
    registered = []
    for name, policy_cls in policies.items():
        try:
            CachePolicyFactory.register_cache_policy(name, "arc_cy", policy_cls.__name__)
        except ValueError:
            # Registered already: by an earlier call in this process, or by
            # someone else under our name, which we refuse to shadow silently.
            existing = CachePolicyFactory.get_cache_policy_cls(name)
            if existing is not policy_cls:
                raise _NameTaken(
                    f"cache policy {name!r} is already registered as "
                    f"{existing.__module__}.{existing.__qualname__}"
                ) from None
            continue
        registered.append(repr(name))
    if registered:
        logger.info(
            "arc_cy: registered CPU offloading cache %s (%s implementation) on vLLM %s: %s",
            f"policy {registered[0]}"
            if len(registered) == 1
            else f"policies {', '.join(registered[:-1])} and {registered[-1]}",
            implementation,
            code.version,
            accepted,
        )
