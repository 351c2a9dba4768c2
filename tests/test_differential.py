"""Differential tests: arc_cy against vLLM's ARCCachePolicy on random traffic.

Two levels: the policy API driven directly (arc_cy_harness.traffic's steps of
the manager, in a random mix; shared key and ChunkStatus objects, so chunk
identity is compared too), and three real CPUOffloadingManagers fed the same
manager-shaped traffic (and three tiering primary tiers, on releases that
have its deferred write release).
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("vllm")  # the imports below need it

from vllm.v1.kv_offload.base import make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from arc_cy_harness.traffic import Lockstep, PolicyTraffic
from helpers import (
    IMPLEMENTATIONS,
    KEY_POSITIONS,
    MODULES,
    ORACLE_HOOKS,
    ReqContext,
    VllmARC,
    assert_same_state,
    insert,
    load_policy_class,
    manager_state,
)

pytestmark = pytest.mark.sdist


def same(method, results):
    """Lockstep's check: every policy answered as vLLM's (the first) did;
    evicted chunks compared by identity."""
    if method == "evict":
        if results[0] is None:
            assert all(r is None for r in results)
            return
        results = [[(k, id(c)) for k, c in r] for r in results]
    first = results[0]
    for other in results[1:]:
        assert other == first


def run_policy_sequence(seed: int, steps: int, capacity: int, universe: int) -> tuple[int, int]:
    """Drive vLLM's ARC and both arc_cy classes with the same calls, the
    manager's steps of arc_cy_harness.traffic in a random mix."""
    rng = random.Random(seed)
    oracle = VllmARC(capacity)
    policies = [load_policy_class(name)(capacity) for name in IMPLEMENTATIONS]
    keys = [make_offload_key(f"k{i}".encode(), i % 2) for i in range(universe)]
    t = PolicyTraffic(
        Lockstep([oracle, *policies], check=same, insert=insert),
        capacity,
        hooks=ORACLE_HOOKS,
        positions=KEY_POSITIONS,
    )
    chunks = t.chunks  # resident key -> its chunk (the driver's model)

    for _ in range(steps):
        op = rng.random()
        ctx = ReqContext(req_id=f"r{rng.randrange(8)}")
        if op < 0.30:  # a store: misses observed, then eviction, then insert
            batch = rng.sample(keys, rng.randint(1, min(6, universe)))
            if t.store(batch, ctx) is None:
                continue
        elif op < 0.45:  # complete (or fail) pending stores
            pending = [k for k, c in chunks.items() if c.ref_cnt < 0]
            for k in rng.sample(pending, min(len(pending), rng.randint(0, 4))):
                if rng.random() < 0.85:
                    t.complete_store(k)
                else:
                    t.fail_store(k)
        elif op < 0.55:  # pin or unpin (loads in flight), told as the manager tells
            ready = [k for k, c in chunks.items() if c.ref_cnt >= 0]
            if ready:
                k = rng.choice(ready)
                if chunks[k].ref_cnt > 0 and rng.random() < 0.6:
                    t.unpin(k)
                else:
                    t.pin(k)
        elif op < 0.70:  # a lookup's first accesses, then a touch
            batch = [rng.choice(keys) for _ in range(rng.randint(0, 5))]
            if t.access(batch, ctx) is not None:
                assert_same_state(oracle, *policies)
            t.touch(batch, ctx)
        elif op < 0.85:  # a finished request with token positions
            group = rng.sample(keys, rng.randint(1, min(6, universe)))
            for _pos, k in enumerate(group):
                if rng.random() < 0.9:
                    position = rng.randrange(100)
                    if KEY_POSITIONS:
                        ctx.set_offload_key_position(k, position)
            inserted = {k for k in group if rng.random() < 0.3}
            reused = {k for k in group if k not in inserted and rng.random() < 0.6}
            t.finish((tuple(group),), inserted, reused, ctx)
        elif op < 0.93:  # eviction with protected entries, may fail
            n = rng.randint(0, capacity + 1)
            protected = set(rng.sample(keys, rng.randint(0, 3)))
            t.evict(n, protected)
        elif op < 0.96:
            t.remove(rng.choice(keys))
        elif op < 0.98:
            t.set_target(rng.choice([0, 1, 2.5, capacity, capacity / 3]))
        else:
            t.clear()
        for k in rng.sample(keys, 3):
            t.get(k)
        assert_same_state(oracle, *policies)
    return t.stats["evictions"], t.stats["evict_none"]


@pytest.mark.compat
@pytest.mark.parametrize("seed", range(12))
def test_random_policy_sequences(seed):
    capacity = [1, 2, 3, 5, 8, 13][seed % 6]
    evictions, failures = run_policy_sequence(seed, 2500, capacity, universe=4 * capacity + 3)
    # the sequences must exercise both successful and failed evictions
    assert evictions > 50 and failures > 5


def each(managers, fn):
    """fn(manager) on every manager: the same answer from each (vLLM arc's,
    the first, returned)."""
    results = [fn(m) for m in managers]
    for r in results[1:]:
        assert r == results[0]
    return results[0]


def manager_key(i: int) -> bytes:
    return make_offload_key(f"blk{i}".encode(), 0)


@pytest.mark.compat
@pytest.mark.parametrize("seed", range(6))
def test_random_manager_traffic(seed):
    """Conversations sharing prefixes, loads in flight, failed stores
    (complete_store(..., success=False)), retried offers in one request,
    re-offers after a preemption (the same request context), resets; with
    store_threshold 1, 2 and 3."""
    rng = random.Random(1000 + seed)
    num_chunks = rng.choice([8, 16, 40])
    # store_threshold >= 2: a key is stored on its threshold-th offer (0.34
    # counts each request's offer of a key once: a retried offer does not
    # count again)
    threshold = (1, 2, 3)[seed % 3]
    managers = [
        CPUOffloadingManager(num_chunks=num_chunks, cache_policy="arc", store_threshold=threshold)
    ] + [
        CPUOffloadingManager(
            num_chunks=num_chunks,
            cache_policy="ARCCachePolicy",
            cache_policy_module_path=module,
            store_threshold=threshold,
        )
        for module in map(MODULES.get, IMPLEMENTATIONS)
    ]
    # Apart from the turns' keys (blk0, blk1, ...): a request never offers a
    # key twice (block hashes chain), which arc_cy's insert() would refuse.
    system_prompts = [[manager_key(-1000 * s - i - 1) for i in range(6)] for s in range(3)]
    conversations: list[list[bytes]] = []
    inflight_loads: list[tuple[ReqContext, list[bytes]]] = []
    inflight_stores: list[tuple[ReqContext, list[bytes], list[bytes]]] = []
    # Requests whose stores completed but which have not finished: a
    # preemption makes such a request offer its blocks again, in the same
    # context (0.34 counts a key once per request).
    preempted: list[tuple[ReqContext, list[bytes]]] = []
    # A request finishes once none of its jobs is in flight and it is not
    # waiting to be rescheduled (a finished request offers nothing new).
    open_jobs: dict[int, int] = {}
    next_block = 0
    stats = dict.fromkeys(
        ("evicted", "rejected", "hits", "target_moves", "retries", "failed_stores", "reoffers"), 0
    )
    target = 0.0

    def job_done(ctx):
        open_jobs[id(ctx)] -= 1
        if open_jobs[id(ctx)] == 0 and all(c is not ctx for c, _ in preempted):
            del open_jobs[id(ctx)]
            if "on_request_finished" in ORACLE_HOOKS:
                for m, c in zip(managers, ctx):
                    m.on_request_finished(c)

    def offer(blocks, ctx):
        outs = [m.prepare_store(blocks, c) for m, c in zip(managers, ctx)]
        if outs[0] is None:
            stats["rejected"] += 1
            assert all(o is None for o in outs)
        else:
            summary = [(o.keys_to_store, o.evicted_keys) for o in outs]
            assert all(s == summary[0] for s in summary)
            stats["evicted"] += len(outs[0].evicted_keys)
            inflight_stores.append((ctx, blocks, outs[0].keys_to_store))
            open_jobs[id(ctx)] = open_jobs.get(id(ctx), 0) + 1

    for step in range(1500):
        op = rng.random()
        if op < 0.45:  # a request: look up its prefix, load hits, store the rest
            if conversations and rng.random() < 0.6:
                prefix = rng.choice(conversations)
            else:
                prefix = list(rng.choice(system_prompts))
            turn = [manager_key(next_block + i) for i in range(rng.randint(1, 5))]
            next_block += len(turn)
            blocks = prefix + turn
            assert len(set(blocks)) == len(blocks)
            conversations.append(blocks)
            ctx = [ReqContext(req_id=f"q{step}") for _ in managers]
            for c in ctx:
                for pos, k in enumerate(blocks):
                    if KEY_POSITIONS:
                        c.set_offload_key_position(k, pos)
            hits = 0
            for k in blocks:
                res = each(
                    managers, lambda m, k=k, ctx=ctx: m.lookup(k, ctx[managers.index(m)]).name
                )
                if res != "HIT":
                    break
                hits += 1
            stats["hits"] += hits
            if hits:
                for m, c in zip(managers, ctx):
                    m.prepare_load(blocks[:hits], c)
                inflight_loads.append((ctx, blocks[:hits]))
                open_jobs[id(ctx)] = open_jobs.get(id(ctx), 0) + 1
            offer(blocks, ctx)
            if rng.random() < 0.2:  # the same request offers them again
                offer(blocks, ctx)
                stats["retries"] += 1
        elif op < 0.70 and inflight_stores:
            ctx, blocks, stored = inflight_stores.pop(rng.randrange(len(inflight_stores)))
            ok = rng.random() < 0.9
            for m, c in zip(managers, ctx):
                m.complete_store(stored, c, success=ok)
            stats["failed_stores"] += not ok and bool(stored)
            if rng.random() < 0.25 and all(c is not ctx for c, _ in preempted):
                preempted.append((ctx, blocks))
            job_done(ctx)
        elif op < 0.78 and preempted:  # rescheduled: its stores restart from chunk 0
            ctx, blocks = preempted.pop(rng.randrange(len(preempted)))
            open_jobs[id(ctx)] = open_jobs.get(id(ctx), 0) + 1  # this step's
            offer(blocks, ctx)
            stats["reoffers"] += 1
            if rng.random() < 0.5:
                preempted.append((ctx, blocks))
            job_done(ctx)
        elif op < 0.92 and inflight_loads:
            ctx, loaded = inflight_loads.pop(rng.randrange(len(inflight_loads)))
            for m, c in zip(managers, ctx):
                m.complete_load(loaded, c)
            job_done(ctx)
        elif op < 0.97:
            batch = rng.choice(conversations) if conversations else []
            if hasattr(managers[0], "touch"):  # 0.30 to 0.33: a request's hits, by touch
                ctx = ReqContext(req_id="t")
                for m in managers:
                    m.touch(batch, ctx)
            else:  # 0.34: a re-offer (store misses of ghosts, counted once)
                offer(batch, [ReqContext(req_id=f"r{step}") for _ in managers])
        elif op < 0.975:
            for m in managers:
                m.reset_cache()
            inflight_loads.clear()
            inflight_stores.clear()
            preempted.clear()
            open_jobs.clear()
        each(managers, manager_state)
        for m in managers[1:]:
            m._policy._check_invariants()
        if managers[0]._policy.target_t1_size != target:  # a ghost hit (or a reset)
            target = managers[0]._policy.target_t1_size
            stats["target_moves"] += 1
    assert stats["evicted"] > 100 and stats["hits"] > 20 and stats["target_moves"] > 5, stats
    assert stats["retries"] > 20 and stats["failed_stores"] > 5 and stats["reoffers"] > 20, stats


class _Region:
    """The primary tier's shared memory, which no decision reads: a stand-in
    for SharedOffloadRegion with the two methods the tier calls."""

    def create_kv_memoryview(self) -> memoryview:
        return memoryview(bytearray())

    def cleanup(self) -> None:
        pass


@pytest.mark.compat
@pytest.mark.needs_vllm  # vLLM's tiering manager: in the 3.11 test command (.ci/run)
@pytest.mark.parametrize("seed", range(4))
def test_random_primary_tier_traffic(seed):
    """The tiering primary tier (vLLM's CPUPrimaryTierOffloadingManager, its
    policy vLLM's arc or arc_cy's): writes from a secondary tier that
    complete, fail, or fail with a deferred release (defer_write_release,
    then release_deferred_write: the p2p tier's failed writes); reads for
    a secondary tier (which do not count as accesses), loads and re-offers."""
    tiering = pytest.importorskip("vllm.v1.kv_offload.tiering.manager")
    primary_cls = tiering.CPUPrimaryTierOffloadingManager
    if not hasattr(primary_cls, "defer_write_release"):
        pytest.skip("this vLLM's primary tier has no deferred write release (0.34+)")
    rng = random.Random(2000 + seed)
    num_chunks = rng.choice([8, 16])
    managers = [primary_cls(num_chunks, _Region(), cache_policy="arc")] + [
        primary_cls(
            num_chunks, _Region(), cache_policy="ARCCachePolicy", cache_policy_module_path=module
        )
        for module in map(MODULES.get, IMPLEMENTATIONS)
    ]
    writes: list[tuple[list[ReqContext], list[bytes]]] = []
    reads: list[tuple[list[ReqContext], list[bytes]]] = []
    deferred: list[list[int]] = []
    stats = dict.fromkeys(("evicted", "deferred", "released", "failed", "reads", "moves"), 0)
    target = 0.0

    def state(m):
        return manager_state(m), m.num_deferred_release_chunks, sorted(m._free_list)

    universe = [manager_key(i) for i in range(3 * num_chunks)]
    for step in range(1500):
        op = rng.random()
        # one context per manager: a manager keeps its request state on it
        ctx = [ReqContext(req_id=f"q{step}") for _ in managers]
        if op < 0.40:  # a secondary tier writes keys into the primary
            keys = rng.sample(universe, rng.randint(1, 4))
            outs = [m.prepare_write(keys, c) for m, c in zip(managers, ctx)]
            if outs[0] is not None:
                assert all(
                    (o.keys_to_store, o.evicted_keys)
                    == (outs[0].keys_to_store, outs[0].evicted_keys)
                    for o in outs
                )
                stats["evicted"] += len(outs[0].evicted_keys)
                if outs[0].keys_to_store:
                    writes.append((ctx, outs[0].keys_to_store))
            else:
                assert all(o is None for o in outs)
        elif op < 0.65 and writes:
            wctx, keys = writes.pop(rng.randrange(len(writes)))
            how = rng.random()
            if how < 0.5:
                for m, c in zip(managers, wctx):
                    m.complete_write(keys, c, True)
            elif how < 0.7:
                for m, c in zip(managers, wctx):
                    m.complete_write(keys, c, False)
                stats["failed"] += 1
            else:  # failed keys, a subset; the rest completes
                failed = rng.sample(keys, rng.randint(1, len(keys)))
                ok = [k for k in keys if k not in failed]
                if ok:
                    for m, c in zip(managers, wctx):
                        m.complete_write(ok, c, True)
                deferred.append(each(managers, lambda m, f=failed: m.defer_write_release(f)))
                stats["deferred"] += len(failed)
        elif op < 0.75 and deferred:
            chunk_ids = deferred.pop(rng.randrange(len(deferred)))
            for m in managers:
                m.release_deferred_write(chunk_ids)
            stats["released"] += len(chunk_ids)
        elif op < 0.95:  # hits: a GPU load (an access) or a secondary's read (not one)
            keys = rng.sample(universe, rng.randint(1, 4))
            hits = [
                k
                for k in keys
                if each(managers, lambda m, k=k, ctx=ctx: m.lookup(k, ctx[managers.index(m)]).name)
                == "HIT"
            ]
            if hits and rng.random() < 0.5:
                for m, c in zip(managers, ctx):
                    m.prepare_load(hits, c)
                    m.complete_load(hits, c)
            elif hits:
                for m, c in zip(managers, ctx):
                    m.prepare_read(hits, c)
                reads.append((ctx, hits))
                stats["reads"] += 1
            for m, c in zip(managers, ctx):
                m.on_request_finished(c)
        elif reads:
            rctx, keys = reads.pop(rng.randrange(len(reads)))
            for m, c in zip(managers, rctx):
                m.complete_read(keys, c)
        each(managers, state)
        for m in managers[1:]:
            m._policy._check_invariants()
        if managers[0]._policy.target_t1_size != target:
            target = managers[0]._policy.target_t1_size
            stats["moves"] += 1
    assert stats["evicted"] > 20 and stats["deferred"] > 15 and stats["released"] > 10, stats
    assert stats["failed"] > 8 and stats["reads"] > 30 and stats["moves"] > 20, stats
