"""The claim, run through vLLM's own managers (docs/usage.md, "The guard"). Standard library."""

from __future__ import annotations

import dataclasses
import enum
import random
import reprlib
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from .files import CPU_MANAGER, KV_OFFLOAD, TIERING_MANAGER

REQUESTS = 150  # per manager: about 2,000 calls


class _Differs(Exception):
    pass


def first_difference(module: str = "arc_cy") -> str | None:
    """The first call after which vLLM's managers with arc_cy (its ARCCachePolicy from module)
    differ from them with vLLM's ARC: ``through vLLM's Manager, call N, method(args): ...``."""
    factory = import_module(f"{KV_OFFLOAD}.cpu.policies.factory").CachePolicyFactory
    tier = import_module(TIERING_MANAGER).CPUPrimaryTierOffloadingManager
    region = SimpleNamespace(create_kv_memoryview=lambda: memoryview(b""), cleanup=lambda: None)
    kinds = {
        "CPUOffloadingManager": import_module(CPU_MANAGER).CPUOffloadingManager,
        "tiering CPUPrimaryTierOffloadingManager": lambda **kw: tier(mmap_region=region, **kw),
    }
    routes: list[tuple[str, str | None]] = [("arc", None), ("arc_cy", None)]
    routes.append(("ARCCachePolicy", module))
    old = factory._registry.pop("arc_cy", None)  # "arc_cy" as the plugin registers it, meanwhile
    factory.register_cache_policy("arc_cy", module, "ARCCachePolicy")
    try:
        options = {"num_chunks": 16, "enable_events": True}
        for kind, make in kinds.items():
            managers = {
                f'"{p}"' + (f" from {m!r}" if m else ""): make(
                    cache_policy=p, cache_policy_module_path=m, **options
                )
                for p, m in routes
            }
            try:
                _drive(managers)
            except _Differs as exc:
                return f"through vLLM's {kind}, {exc}"
        return None
    finally:
        factory._registry.pop("arc_cy", None)
        factory._registry.update({"arc_cy": old} if old else {})


def _plain(x: Any) -> Any:
    """An answer as data: containers and dataclasses by their items, other objects by arrays."""
    if x is None or isinstance(x, (str, bytes, int, float, enum.Enum)):
        return x
    if dataclasses.is_dataclass(x):
        return [_plain(getattr(x, f.name)) for f in dataclasses.fields(x) if f.compare]
    if isinstance(x, (set, frozenset, dict)):
        return sorted(map(_plain, x.items() if isinstance(x, dict) else x), key=repr)
    if hasattr(x, "__iter__"):
        return [_plain(v) for v in x]
    return type(x).__name__, [v.tolist() for v in vars(x).values() if hasattr(v, "tolist")]


def _drive(managers: dict[str, Any]) -> None:
    """Requests sharing prefixes: lookups, loads of hits, stores of the rest (0.30: touches), each
    completed (a store failed in 10) or not yet, finished requests, resets; the first one leads."""
    base, rng = import_module(f"{KV_OFFLOAD}.base"), random.Random(0)
    made, cls = 0, type(next(iter(managers.values())))
    finishes = hasattr(cls, "on_request_finished")
    touches = hasattr(cls, "touch") and not finishes  # 0.30's scheduler touches instead
    shown = reprlib.Repr()
    shown.maxlist = shown.maxtuple = 4

    def call(method: str, *args: Any) -> Any:
        """method on each manager (a dict argument: each its own context)."""
        nonlocal made
        made, seen = made + 1, []
        for route, manager in managers.items():
            try:
                raw = getattr(manager, method)(*(a[route] if type(a) is dict else a for a in args))
                answer = _plain(raw)
            except Exception as exc:
                raw, answer = None, f"raises {type(exc).__name__}"
            p = manager._policy
            t1, t2 = ([(k, c.chunk_id, c.ref_cnt) for k, c in x.items()] for x in (p.t1, p.t2))
            seen.append((route, raw, answer, (t1, t2, list(p.b1), list(p.b2), p.target_t1_size)))
        for ours in seen[1:]:
            for what, i in (("answered", 2), ("left t1, t2, b1, b2, target_t1_size", 3)):
                if ours[i] != seen[0][i]:
                    said = ", ".join("ctx" if type(a) is dict else shown.repr(a) for a in args)
                    raise _Differs(
                        f"call {made}, {method}({said}): {seen[0][0]} {what} "
                        f"{shown.repr(seen[0][i])}, {ours[0]} {shown.repr(ours[i])}"
                    )
        return seen[0][1]

    def key(i: int) -> bytes:
        return base.make_offload_key(i.to_bytes(8, "big"), 0)  # type: ignore[no-any-return]

    convs = [[key(100 * p + i) for i in range(4)] for p in range(3)]  # shared prompts
    jobs: list[tuple[str, list[bytes], dict[str, Any]]] = []
    live: list[dict[str, Any]] = []
    for r in range(REQUESTS):
        turn = [key(1000 + 4 * r + i) for i in range(rng.randint(1, 3))]
        blocks = [*rng.choice(convs[-12:] if rng.random() < 0.7 else convs[:3]), *turn]
        convs.append(blocks)
        ctx = {route: base.ReqContext(req_id=f"r{r}") for route in managers}
        for c in ctx.values():
            for position, k in enumerate(blocks):
                getattr(c, "set_offload_key_position", lambda *a: None)(k, position)
        call("on_new_request", ctx)
        hits = 0
        while hits < len(blocks) and call("lookup", blocks[hits], ctx) == base.LookupResult.HIT:
            hits += 1
        if touches:
            call("touch", blocks, ctx)
        if hits:
            call("prepare_load", blocks[:hits], ctx)
            jobs.append(("load", blocks[:hits], ctx))
        out = call("prepare_store", blocks[hits:], ctx) if hits < len(blocks) else None
        if out is not None and out.keys_to_store:
            jobs.append(("store", list(out.keys_to_store), ctx))
        live.append(ctx)
        for job in [j for j in jobs if rng.random() < 0.5]:
            jobs.remove(job)
            if job[0] == "load":
                call("complete_load", job[1], job[2])
            else:
                call("complete_store", job[1], job[2], rng.random() < 0.9)
        for c in [c for c in live if rng.random() < 0.5 and all(j[2] is not c for j in jobs)]:
            live.remove(c)
            if finishes:
                call("on_request_finished", c)
        if rng.random() < 0.01:
            call("reset_cache")  # jobs in flight are never completed after it
            jobs.clear()
        call("take_events")
