"""arc_cy in the installed vLLM release, driven the way that release drives it.

The supported releases differ in how the OffloadingConnector's scheduler
side drives ``CPUOffloadingManager``, and the manager its ``CachePolicy``:

- 0.30: the scheduler calls ``manager.touch(keys)`` with all of a request's
  keys after every lookup and after every store that allocated chunks; the
  manager hands touches to the policy. There is no ``on_store_miss``,
  ``on_request_finished`` or ``order_request_keys``.
- 0.31 and 0.32: the scheduler never touches; the manager calls the policy's
  ``on_store_miss`` before it inserts, and ``on_request_finished`` when the
  request ends; ``insert(key, chunk)``.
- 0.33: as 0.32, plus ``on_request_access``, and ``insert`` takes the
  request's context.

This module reads from the installed release's own code which of these it
does (whether its scheduler calls ``manager.touch``), and feeds vLLM's
``arc`` and arc_cy, through that release's ``CachePolicyFactory`` by both
routes (the plugin name and ``cache_policy_module_path``), the same
scheduler-shaped traffic: every lookup, load, store, eviction, event and the
final T1/T2/B1/B2 state must agree. It runs in the test suite against the
vLLM of the lock, and under ``tools/vllm_compat.sh`` against each older
release. ``ARC_CY_COMPAT_STAND_IN=lru`` puts vLLM's ``lru`` policy in
arc_cy's place, to show that the check can fail.
"""

from __future__ import annotations

import inspect
import os
import random
from itertools import chain

import pytest

pytest.importorskip("vllm")  # the imports below need it

import vllm.plugins
from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

import arc_cy
from helpers import PURE, manager_state

pytestmark = pytest.mark.compat

SCHEDULER_TOUCHES = "self.manager.touch(" in inspect.getsource(scheduler)
"""Whether this release's scheduler touches the manager (0.30 does)."""

HAS_KEY_POSITIONS = hasattr(ReqContext, "set_offload_key_position")

STAND_IN = os.environ.get("ARC_CY_COMPAT_STAND_IN") or None

# How each contender is configured: (cache_policy, cache_policy_module_path).
ROUTES = {
    "plugin name": ("arc_cy", None),
    "module path": ("ARCCachePolicy", "arc_cy"),
    "compiled core": ("ARCCachePolicy", "arc_cy._core.arc"),
    "pure twin": ("ARCCachePolicy", "arc_cy._twin.arc"),
}
if PURE:  # a pure build has no core to route to
    del ROUTES["compiled core"]
if STAND_IN is not None:
    ROUTES = {f"{STAND_IN} standing in": (STAND_IN, None)}


@pytest.fixture(scope="module", autouse=True)
def _plugins() -> None:
    vllm.plugins.load_general_plugins()


def make_manager(cache_policy: str, module_path: str | None, num_chunks: int):
    return CPUOffloadingManager(
        num_chunks=num_chunks,
        cache_policy=cache_policy,
        cache_policy_module_path=module_path,
        enable_events=True,
    )


def test_both_routes_give_arc_cy_a_vllm_cache_policy() -> None:
    for route, (name, module_path) in ROUTES.items():
        policy = make_manager(name, module_path, 4)._policy
        assert isinstance(policy, CachePolicy), route
        if route in ("plugin name", "module path"):
            assert type(policy) is arc_cy.ARCCachePolicy, route
    assert arc_cy.HAVE_VLLM
    assert issubclass(arc_cy.ARCCachePolicy, CachePolicy)


def block(i: int) -> bytes:
    return make_offload_key(f"rel{i}".encode(), 0)


class Traffic:
    """vLLM's ARC and every contender, fed the same scheduler-shaped calls."""

    def __init__(self, num_chunks: int) -> None:
        self.names = ["vLLM arc", *ROUTES]
        self.managers = [make_manager("arc", None, num_chunks)] + [
            make_manager(name, path, num_chunks) for name, path in ROUTES.values()
        ]
        self.reached = {
            "hits": 0,
            "pinned evictions": 0,
            "evicted": 0,
            "rejected": 0,
            "ghost hits": 0,
            "touches": 0,
            "requests finished": 0,
        }

    step = 0

    def each(self, what: str, call, contexts=None):
        """call(manager, context) on every manager; the results must agree."""
        contexts = contexts or [None] * len(self.managers)
        results = [call(m, c) for m, c in zip(self.managers, contexts)]
        for name, result in zip(self.names[1:], results[1:]):
            assert result == results[0], (
                f"step {self.step}, {what}: {name} gave {result!r}; vLLM arc {results[0]!r}"
            )
        return results[0]

    def contexts(self, req_id: str, blocks: list[bytes]) -> list[ReqContext]:
        contexts = [ReqContext(req_id=req_id) for _ in self.managers]
        for ctx in contexts:
            if HAS_KEY_POSITIONS:
                for pos, key in enumerate(blocks):
                    ctx.set_offload_key_position(key, pos)
            self.managers[contexts.index(ctx)].on_new_request(ctx)
        return contexts

    def touch(self, blocks: list[bytes], contexts: list[ReqContext]) -> None:
        if SCHEDULER_TOUCHES:
            self.each("touch", lambda m, c: m.touch(blocks, c), contexts)
            self.reached["touches"] += 1

    def check(self) -> None:
        self.each("events", lambda m, c: [(e.keys, e.removed) for e in m.take_events()])
        if STAND_IN is None:
            target = self.each("T1/T2/B1/B2 and target_t1_size", lambda m, c: manager_state(m))[-1]
            if target != getattr(self, "_target", 0.0):
                self.reached["ghost hits"] += 1
                self._target = target
            for manager in self.managers[1:]:
                manager._policy._check_invariants()


@pytest.mark.stand_in
@pytest.mark.parametrize("seed", range(6))
def test_scheduler_shaped_traffic(seed: int) -> None:
    """Conversations sharing prefixes, loads held across steps, failed
    stores, resets; calls in the order the installed release makes them."""
    rng = random.Random(3000 + seed)
    traffic = Traffic(num_chunks=rng.choice([32, 48, 64]))
    prompts = [[make_offload_key(f"sys{s}-{i}".encode(), 0) for i in range(8)] for s in range(3)]
    conversations: list[list[bytes]] = []
    # Requests with work in flight: contexts, the blocks they hold pinned
    # (loads) or pending (stores).
    loads: list[tuple[list[ReqContext], list[bytes]]] = []
    stores: list[tuple[list[ReqContext], list[bytes]]] = []
    next_block = 0

    for step in range(1200):
        traffic.step = step
        op = rng.random()
        if op < 0.45:
            prefix = list(
                rng.choice(conversations if conversations and rng.random() < 0.6 else prompts)
            )
            turn = [block(next_block + i) for i in range(rng.randint(1, 6))]
            next_block += len(turn)
            blocks = prefix + turn
            conversations.append(blocks)
            contexts = traffic.contexts(f"q{step}", blocks)
            hits = 0
            for key in blocks:
                found = traffic.each("lookup", lambda m, c, key=key: m.lookup(key, c), contexts)
                if found != LookupResult.HIT:
                    break
                hits += 1
            traffic.reached["hits"] += hits
            traffic.touch(blocks, contexts)
            if hits:
                traffic.each(
                    "prepare_load's chunk ids",
                    lambda m, c: m.prepare_load(blocks[:hits], c).block_ids.tolist(),  # noqa: B023 -- each() calls it at once
                    contexts,
                )
                loads.append((contexts, blocks[:hits]))
            oracle = traffic.managers[0]._policy
            pinned = any(c.ref_cnt > 0 for c in chain(oracle.t1.values(), oracle.t2.values()))
            out = traffic.each(
                "prepare_store (keys stored, keys evicted, chunk ids)",
                lambda m, c: _store_summary(m.prepare_store(blocks[hits:], c)),  # noqa: B023 -- each() calls it at once
                contexts,
            )
            if out is None:
                traffic.reached["rejected"] += 1
            else:
                stored, evicted, _ = out
                traffic.reached["evicted"] += len(evicted)
                if evicted and pinned:
                    traffic.reached["pinned evictions"] += 1
                if stored:
                    traffic.touch(blocks, contexts)
                    stores.append((contexts, stored))
        elif op < 0.70 and stores:
            contexts, stored = stores.pop(rng.randrange(len(stores)))
            ok = rng.random() < 0.9
            traffic.each(
                "complete_store",
                lambda m, c: m.complete_store(stored, c, success=ok),  # noqa: B023 -- each() calls it at once
                contexts,
            )
            _finish(traffic, contexts, loads)
        elif op < 0.92 and loads:
            contexts, loaded = loads.pop(rng.randrange(len(loads)))
            traffic.each("complete_load", lambda m, c: m.complete_load(loaded, c), contexts)  # noqa: B023 -- each() calls it at once
            _finish(traffic, contexts, stores)
        elif op < 0.925:
            traffic.each("reset_cache", lambda m, c: m.reset_cache())
            loads.clear()
            stores.clear()
        traffic.check()

    reached = traffic.reached
    assert reached["evicted"] > 300 and reached["hits"] > 500, reached
    assert reached["rejected"] > 20 and reached["requests finished"] > 100, reached
    assert reached["pinned evictions"] > 50, reached
    if STAND_IN is None:
        assert reached["ghost hits"] > 5, reached
    assert (reached["touches"] > 100) == SCHEDULER_TOUCHES, reached


def _store_summary(out) -> tuple[list[bytes], list[bytes], list[int]] | None:
    if out is None:
        return None
    return list(out.keys_to_store), list(out.evicted_keys), out.store_spec.block_ids.tolist()


def _finish(traffic: Traffic, contexts: list[ReqContext], other) -> None:
    """The request ends once it has no other work in flight."""
    if not any(c is contexts for c, _ in other):
        traffic.each("on_request_finished", lambda m, c: m.on_request_finished(c), contexts)
        traffic.reached["requests finished"] += 1


def test_the_oracles_touch_is_vllms_own():
    """Where vLLM's ARC has no touch() (0.34 removed it), the oracle gets
    0.33.0's (tests/helpers.py). That is faithful only while 0.33.0's
    arc.py, less touch, is the installed arc.py: so it is checked here."""
    import ast

    import vllm.v1.kv_offload.cpu.policies.arc as arc

    from helpers import ORACLE_TOUCHES, REPO, VllmARC

    if ORACLE_TOUCHES:
        assert VllmARC is arc.ARCCachePolicy
        return
    assert VllmARC.__mro__[1] is arc.ARCCachePolicy
    assert {name for name in vars(VllmARC) if not name.startswith("_")} == {"touch"}
    old = ast.parse(
        (REPO / "tests/data/vllm/0.33.0/vllm/v1/kv_offload/cpu/policies/arc.py").read_text()
    )
    (cls,) = [n for n in old.body if isinstance(n, ast.ClassDef)]
    cls.body = [n for n in cls.body if getattr(n, "name", None) != "touch"]
    new = ast.parse(inspect.getsource(arc))
    assert ast.dump(old) == ast.dump(new)
