"""The trace replay (arc_cy_harness.replay, bench/replay.py) through vLLM's
real CPUOffloadingManager: hand-worked hit ratios, the optimum as a ceiling,
and arc_cy deciding as vLLM arc does, call by call, compiled and pure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from arc_cy_harness import replay as rp
from helpers import MODULES

pytestmark = pytest.mark.needs_vllm

SHIPPED = (
    Path(__file__).resolve().parent.parent / "bench" / "data" / "mooncake_synthetic_trace.jsonl"
)


def manager(policy: str, pool: int, threshold: int = 1) -> Any:
    """vLLM's "lru" or "arc", or an arc_cy implementation ("cython", "python")."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    if policy in MODULES:
        return CPUOffloadingManager(
            num_chunks=pool,
            cache_policy="ARCCachePolicy",
            cache_policy_module_path=MODULES[policy],
            store_threshold=threshold,
        )
    return CPUOffloadingManager(num_chunks=pool, cache_policy=policy, store_threshold=threshold)


def replay(
    policy: str, requests: list[rp.TraceRequest], pool: int, threshold: int = 1, **model: Any
) -> rp.Replayer:
    return rp.Replayer(
        manager(policy, pool, threshold), rp.block_keys(requests), store_batch=2
    ).run(rp.schedule(requests, **model))


HAND = [
    rp.TraceRequest(0, 1536, 1, (1, 2, 3)),
    rp.TraceRequest(1, 1536, 1, (1, 2, 4)),
    rp.TraceRequest(2, 1024, 1, (5, 1)),
    rp.TraceRequest(3, 2048, 1, (1, 2, 4, 6)),
]
# (in flight, store_threshold, hits), of the 12 blocks asked, worked by hand
# with a pool that holds every block:
#   one in flight, threshold 1: 0 + 2 (1, 2) + 0 (5 misses first: 1 is not
#     a prefix hit) + 3 (1, 2, 4) = 5;
#   one in flight, threshold 2: request 0 stores nothing (each block seen
#     once); request 1 misses 1 and stores 1 and 2 (seen twice), not 4;
#     request 2 misses 5, 1 is resident; request 3 hits 1 and 2, misses 4
#     (then stores it) = 2;
#   two in flight, threshold 1: request 1 starts while request 0's store of
#     1 and 2 is in flight (not a hit); request 3 starts after requests 0
#     and 1 finished: 1, 2, 4 = 3.
HAND_CASES = [(1, 1, 5), (1, 2, 2), (2, 1, 3)]


@pytest.mark.parametrize(("inflight", "threshold", "hits"), HAND_CASES)
def test_the_hit_ratio_of_a_hand_worked_trace(
    impl: str, inflight: int, threshold: int, hits: int
) -> None:
    for policy in ("lru", "arc", impl):
        r = replay(policy, HAND, pool=16, threshold=threshold, inflight=inflight)
        assert (r.hits, r.asked) == (hits, 12), policy
        assert r.hit_ratio() == hits / 12
        assert not r.live  # every request finished: its loads and stores completed


@pytest.fixture(scope="module")
def trace_slice() -> list[rp.TraceRequest]:
    """400 requests of the shipped trace: 16,143 blocks asked, 9,597 distinct."""
    return rp.read_trace(str(SHIPPED))[3000:3400]


POOLS = (1500, 3000)  # where the policies' hit ratios differ


@pytest.mark.parametrize("threshold", [1, 2])
def test_the_optimum_is_a_ceiling_for_every_policy(
    trace_slice: list[rp.TraceRequest], impl: str, threshold: int
) -> None:
    sequence = rp.accesses(trace_slice)
    for pool in POOLS:
        best = rp.optimum_hits(sequence, pool)
        got = {p: replay(p, trace_slice, pool, threshold).hits for p in ("lru", "arc", impl)}
        assert all(0 < hits <= best for hits in got.values()), (pool, best, got)
        assert best <= len(sequence) - len(set(sequence))
    # The smaller pool is too small even for the optimum to hit every repeat.
    assert rp.optimum_hits(sequence, POOLS[0]) < len(sequence) - len(set(sequence))


@pytest.mark.parametrize("threshold", [1, 2])
def test_arc_cy_decides_as_vllm_arc_call_by_call(
    trace_slice: list[rp.TraceRequest], impl: str, threshold: int
) -> None:
    keys = rp.block_keys(trace_slice)
    events = rp.schedule(trace_slice)
    for pool in POOLS:
        ref = rp.Replayer(manager("arc", pool, threshold), keys, log_evictions=True).run(events)
        got = rp.Replayer(manager(impl, pool, threshold), keys).run(events)
        assert rp.first_difference(ref.decisions, got.decisions) is None
        assert rp.mismatches(ref.decisions, got.decisions) == 0
        # What the replay reached: hits, evictions in a tenth of the stores
        # or more, ARC's target moved by ghost hits, stores left out by
        # admission at threshold 2, requests overlapping (below).
        assert ref.hits > 0 and ref.evicted > 0
        assert sum(1 for e in ref.evictions if e) > ref.store_calls // 10
        assert ref.m._policy.target_t1_size > 0
        if threshold > 1:
            assert ref.stored + ref.hits < ref.asked - 1000
        # The manager with a policy that costs nothing makes the same calls.
        free = manager("lru", pool, threshold)
        free._policy = rp.FreePolicy(ref.evictions)
        again = rp.Replayer(free, keys).run(events)
        assert again.decisions == ref.decisions
    live = max_in_flight(events)
    assert live > 5


def max_in_flight(events: list[tuple[int, int]]) -> int:
    live = most = 0
    for kind, _ in events:
        live += 1 if kind == 0 else -1
        most = max(most, live)
    return most


def test_a_changed_decision_is_found_at_its_call() -> None:
    a = [("load", 0, 1), ("store", 0, (b"k1",)), ("load", 1, 0)]
    assert rp.first_difference(a, a) is None
    assert rp.first_difference(a, [*a[:1], ("store", 0, (b"k2",)), a[2]]) == 1
    assert rp.first_difference(a, a[:2]) == 2
    assert rp.mismatches(a, [("load", 0, 2), a[1]]) == 2
