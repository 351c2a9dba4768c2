"""ARC+ (arc_cy_plus): its steps on both implementations, hand-worked
hit ratios through vLLM's own manager, both routes into that manager, and
the compiled class against its twin on random legal steps (the CachePolicy
contract and ARC+'s rules asserted at every step, and what the steps
reached)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from helpers import CTX, ChunkStatus, K, ReqContext, load_plus_class, plus_snap, ready

# Under ASan/UBSan too (.ci/sanitize.sh): the compiled ARC+'s own C paths.
pytestmark = pytest.mark.sanitize


@pytest.fixture
def plus_cls(impl: str) -> type:
    return load_plus_class(impl)


def pending(chunk_id: int) -> ChunkStatus:
    """A chunk whose store is in flight (ref_cnt -1), as vLLM's manager makes it."""
    chunk = ready(chunk_id)
    chunk.ref_cnt = -1
    return chunk


def stored(policy: Any, *keys: bytes) -> dict[bytes, ChunkStatus]:
    """keys inserted and their stores complete (ref_cnt 0), in order."""
    chunks = {}
    for key in keys:
        chunks[key] = ready(len(chunks))
        policy.insert(key, chunks[key], CTX)
    return chunks


def finished(policy: Any, keys: list[bytes], inserted=(), reused=()) -> None:
    policy.on_request_finished(
        (tuple(keys),), set(inserted) - set(reused), set(reused), ReqContext(req_id="r")
    )


def fates(policy: Any) -> tuple[int, int, int, int]:
    return plus_snap(policy)[4]


def evicted(policy: Any, n: int, protected: set) -> list[bytes] | None:
    out = policy.evict(n, protected)
    return None if out is None else [k for k, _ in out]


# --- the steps, one by one ---------------------------------------------------


@pytest.mark.gc_stress
def test_a_ghost_is_inserted_in_t2_any_other_key_in_t1(plus_cls: type) -> None:
    policy = plus_cls(4)
    stored(policy, K(1), K(2), K(3))
    assert evicted(policy, 2, set()) == [K(1), K(2)]  # to b1
    finished(policy, [K(2)])  # a ghost asked for again: to b2
    assert list(policy.b1) == [K(1)] and list(policy.b2) == [K(2)]
    policy.insert(K(1), pending(7), CTX)
    policy.insert(K(2), pending(8), CTX)
    policy.insert(K(5), pending(9), CTX)
    assert list(policy.t1) == [K(3), K(5)] and list(policy.t2) == [K(1), K(2)]
    assert list(policy.b1) == [] and list(policy.b2) == []
    policy._check_invariants()


@pytest.mark.gc_stress
def test_request_finished_tail_first_each_key_once(plus_cls: type) -> None:
    policy = plus_cls(3)
    stored(policy, K(1), K(2), K(3))
    assert evicted(policy, 1, set()) == [K(1)]  # b1: K(1)
    # K(3) was stored by the request (recency only), K(2) reused (to t2),
    # K(1) a ghost asked for and not kept (to b2), K(4) and K(5) in no list
    # (remembered in b1, tail first), K(4) repeated (once).
    finished(policy, [K(4), K(2), K(1), K(3), K(5), K(4)], inserted=[K(3)], reused=[K(2)])
    assert list(policy.t1) == [K(3)] and list(policy.t2) == [K(2)]
    assert list(policy.b1) == [K(4), K(5)] and list(policy.b2) == [K(1)]
    assert fates(policy) == (0, 0, 0, 0)  # nothing returned or forgotten yet
    # b1 holds cache_capacity ghosts at most: the oldest are forgotten.
    finished(policy, [K(6), K(7)])
    assert list(policy.b1) == [K(5), K(7), K(6)]
    assert fates(policy) == (0, 1, 0, 0)
    policy._check_invariants()


@pytest.mark.gc_stress
@pytest.mark.parametrize("capacity", [4, 40, 100])
def test_a_request_of_ghosts_alone_fills_b2_and_trims_it(plus_cls: type, capacity: int) -> None:
    """Every key of a request is a b1 ghost, not kept, while b2 is full: all
    move to b2 under the request's key objects, and b2 forgets as many
    (the most keys a call replaces and forgets at once: the core holds
    each in its working storage, reserved before the first change)."""
    policy = plus_cls(capacity)
    frequent = [K(i) for i in range(capacity)]
    stored(policy, *frequent)
    finished(policy, frequent, reused=frequent)  # to t2
    assert len(policy.evict(capacity, set())) == capacity  # b2 full
    once = [K(1000 + i) for i in range(capacity)]
    stored(policy, *once)
    assert len(policy.evict(capacity, set())) == capacity  # b1 full
    asked = [bytes(bytearray(k)) for k in once]  # equal keys, other objects
    finished(policy, asked)
    assert list(policy.b1) == [] and list(policy.b2) == once[::-1]  # tail first
    assert all(k is a for k, a in zip(policy.b2, asked[::-1]))
    assert fates(policy) == (0, 0, 0, capacity)
    policy._check_invariants()


@pytest.mark.gc_stress
def test_store_misses_count_the_ghosts_that_return(plus_cls: type) -> None:
    policy = plus_cls(4)
    stored(policy, K(1), K(2), K(3))
    finished(policy, [K(3)], reused=[K(3)])  # K(3) to t2
    assert evicted(policy, 3, set()) == [K(1), K(2), K(3)]
    assert list(policy.b1) == [K(1), K(2)] and list(policy.b2) == [K(3)]
    policy.on_store_miss([K(2), K(9), K(1), K(3)], CTX)  # K(9): in no list
    assert fates(policy) == (2, 0, 1, 0)
    assert list(policy.b1) == [K(1), K(2)]  # to the MRU end, tail first
    policy.touch([K(1)], CTX)  # touch counts a ghost as on_store_miss does
    assert fates(policy) == (3, 0, 1, 0)


@pytest.mark.gc_stress
def test_touch_moves_resident_keys_as_arcs(plus_cls: type) -> None:
    policy = plus_cls(4)
    chunks = stored(policy, K(1), K(2))
    policy.insert(K(3), pending(5), CTX)
    policy.touch([K(1), K(3)], CTX)  # ready: to t2; still being stored: t1's MRU end
    assert list(policy.t1) == [K(2), K(3)] and list(policy.t2) == [K(1)]
    chunks[K(1)].ref_cnt = 0
    # K(2) is now the least recent of all: touched keys were refreshed.
    assert evicted(policy, 1, set()) == [K(2)]


@pytest.mark.gc_stress
def test_victims_are_the_least_recently_requested_of_t1_and_t2(plus_cls: type) -> None:
    policy = plus_cls(4)
    chunks = stored(policy, K(1), K(2), K(3))
    finished(policy, [K(1)], reused=[K(1)])  # K(1) to t2, the most recent
    finished(policy, [K(3)], inserted=[K(3)])  # K(3) refreshed in t1
    # Least recent first: K(2) (t1), K(1) (t2), K(3) (t1); pinned and
    # protected entries are passed over.
    assert evicted(policy, 2, set()) == [K(2), K(1)]
    chunks[K(3)].ref_cnt = 1
    assert evicted(policy, 1, set()) is None
    assert list(policy.b1) == [K(2)] and list(policy.b2) == [K(1)]


def with_fates(policy: Any, b1: tuple[int, int], b2: tuple[int, int]) -> None:
    """An empty policy whose ghosts' fates are b1 and b2 (returned,
    forgotten; forgotten at most cache_capacity - returned), made through
    its own calls: a list of ghosts filled, some returned by a store
    miss, the rest pushed out by newer ghosts, then the lists emptied."""
    assert not (policy.t1 or policy.t2 or policy.b1 or policy.b2)
    cap = policy.cache_capacity
    for which, (back, gone) in ((1, b1), (2, b2)):
        assert back + gone <= cap
        keys = [K(1000 * which + i) for i in range(cap)]
        more = [K(1000 * which + 500 + i) for i in range(gone)]
        if which == 1:
            stored(policy, *keys)
            assert len(policy.evict(cap, set())) == cap  # to b1
            policy.on_store_miss(keys[:back], CTX)  # returned: to b1's MRU end
            finished(policy, more)  # remembered: the oldest ghosts forgotten
        else:
            for batch in (keys, more):
                stored(policy, *batch)
                finished(policy, batch, reused=batch)  # to t2
                assert len(policy.evict(len(batch), set())) == len(batch)  # to b2
                if batch is keys:
                    policy.on_store_miss(keys[:back], CTX)
        for key in [*policy.b1, *policy.b2]:  # out of the lists, no fate
            policy.insert(key, ready(0), CTX)
            policy.remove(key)
    assert fates(policy) == (*b1, *b2)


@pytest.mark.gc_stress
def test_first_seen_offer_refused_when_it_needs_t2_while_b1_comes_back_less(
    plus_cls: type,
) -> None:
    policy = plus_cls(4)
    with_fates(policy, b1=(1, 3), b2=(2, 2))  # b1's rate 1/4 < b2's 2/4
    stored(policy, K(1), K(2))
    finished(policy, [K(1), K(2)], reused=[K(1), K(2)])  # both to t2
    before = plus_snap(policy)
    # An offer of first-seen keys (in no list, no ghost) that needs a t2
    # victim: refused, nothing changed.
    assert policy.evict(1, {K(8), K(9)}) is None
    assert plus_snap(policy) == before
    # Its request finishes: the keys are remembered in b1; their next
    # request is no longer first-seen, and takes t2's victim.
    finished(policy, [K(8), K(9)])
    policy.on_store_miss([K(8), K(9)], CTX)
    # (K(1) finished after K(2): the request takes its keys tail first.)
    assert evicted(policy, 1, {K(8), K(9)}) == [K(2)]
    policy.insert(K(8), pending(9), CTX)
    assert list(policy.t2) == [K(1), K(8)] and list(policy.b2) == [K(2)]
    policy._check_invariants()


@pytest.mark.gc_stress
def test_the_refusal_needs_a_t2_victim_and_the_ghosts_evidence(plus_cls: type) -> None:
    # b1's ghosts come back less than b2's: an offer of first-seen keys may
    # take t1's victims, not t2's.
    policy = plus_cls(4)
    with_fates(policy, b1=(1, 3), b2=(2, 2))
    stored(policy, K(1), K(2), K(3))
    finished(policy, [K(2)], reused=[K(2)])  # order: K(1), K(3) (t1), K(2) (t2)
    assert evicted(policy, 1, {K(9)}) == [K(1)]  # from t1: admitted
    assert evicted(policy, 2, {K(9)}) is None  # K(3), then t2's K(2): refused
    assert evicted(policy, 1, {K(9), K(1)}) == [K(3)]  # not first-seen (K(1) a ghost)
    assert evicted(policy, 1, {K(9), K(1)}) == [K(2)]  # ... and may take t2's
    # b1's rate against b2's: refused only where it is lower.
    for b1, b2, refused in (
        ((2, 2), (2, 2), False),
        ((3, 1), (2, 2), False),
        ((0, 4), (1, 3), True),
    ):
        policy = plus_cls(4)
        with_fates(policy, b1=b1, b2=b2)
        stored(policy, K(1))
        finished(policy, [K(1)], reused=[K(1)])
        assert (evicted(policy, 1, {K(9)}) is None) == refused, (b1, b2)
    # No fate yet (both rates 0): admitted.
    policy = plus_cls(4)
    stored(policy, K(1))
    finished(policy, [K(1)], reused=[K(1)])
    assert evicted(policy, 1, {K(9)}) == [K(1)]


@pytest.mark.gc_stress
def test_an_offer_without_a_key_to_store_is_not_judged(plus_cls: type) -> None:
    policy = plus_cls(2)
    with_fates(policy, b1=(0, 2), b2=(1, 1))
    stored(policy, K(1), K(2))
    finished(policy, [K(1), K(2)], reused=[K(1), K(2)])
    # protected holds resident keys only, or nothing: no first-seen offer.
    assert evicted(policy, 1, {K(2)}) == [K(1)]
    assert evicted(policy, 1, set()) == [K(2)]


@pytest.mark.gc_stress
def test_clear_and_n_zero(plus_cls: type) -> None:
    policy = plus_cls(2)
    stored(policy, K(1))
    finished(policy, [K(2)])
    policy.on_store_miss([K(2)], CTX)
    assert fates(policy) == (1, 0, 0, 0)
    assert policy.evict(0, {K(7)}) == []
    policy.clear()
    assert plus_snap(policy) == ([], [], [], [], (0, 0, 0, 0))


def test_no_target(plus_cls: type) -> None:
    """ARC+ adapts no target: it has no target_t1_size to read."""
    policy = plus_cls(2)
    assert not hasattr(policy, "target_t1_size")


# --- hit ratios through vLLM's manager, worked by hand -----------------------

# Pool 2, one request in flight, one block a request (512 tokens).
SCAN = ["H", "X1", "X2", "H", "X3", "X4", "H", "X5", "X6", "H", "X7", "X8", "H"]
# A hot block H between pairs of blocks asked once. vLLM lru and arc: every
# X evicts the oldest entry, and two Xs come between Hs, so H is gone when
# asked again: 0 hits. ARC+ (its ghosts' fates as b1 returned/forgotten,
# b2 returned/forgotten): H and X1 fill the pool; X2, first-seen, is
# admitted (no fate yet: both rates 0) and the least recent, H, goes to b1;
# H returns (1/0, 0/0), X1 goes, H is stored in t2; X3 takes X2 (b1's rate
# 1 is not below b2's 0) and X4 takes H (to b2); H returns from b2 (b2
# 1/0), X3 goes and b1 forgets X1 (b1 1/1); X5 takes X4, t1's (b1 forgets
# X2: 1/2); X6's only victim is t2's H while b1's rate (1/3 once it
# forgets X3) is below b2's (1): refused, X6 remembered; H hits; X7 takes
# X5, t1's; X8 would take H: refused; H hits: 2 of 13.
# Then a block asked three times in a row: A, B fill the pool; C takes
# A's place (no fate yet); C hits twice: 2 of 5, as vLLM's.
AGAIN = ["A", "B", "C", "C", "C"]
HAND = {
    "scan": (SCAN, 2, {"lru": 0, "arc": 0, "plus": 2}),
    "again": (AGAIN, 2, {"lru": 2, "arc": 2, "plus": 2}),
}


def _manager(policy: str, pool: int) -> Any:
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from helpers import PLUS_MODULES

    if policy in PLUS_MODULES:
        return CPUOffloadingManager(
            num_chunks=pool,
            cache_policy="ARCPlusCachePolicy",
            cache_policy_module_path=PLUS_MODULES[policy],
        )
    return CPUOffloadingManager(num_chunks=pool, cache_policy=policy)


@pytest.mark.needs_vllm
@pytest.mark.parametrize("trace", sorted(HAND))
def test_hand_worked_hit_ratios(trace: str, impl: str) -> None:
    from arc_cy import _replay as rp
    from arc_cy._trace import trace_of

    names, pool, hits = HAND[trace]
    ids = {name: i for i, name in enumerate(dict.fromkeys(names))}
    requests = trace_of((t, 512, 1, (ids[name],)) for t, name in enumerate(names))
    keys = rp.trace_keys(requests)
    events = rp.schedule(requests, inflight=1)
    for policy, want in (("lru", hits["lru"]), ("arc", hits["arc"]), (impl, hits["plus"])):
        run = rp.Replayer(_manager(policy, pool), keys, store_batch=1).run(events)
        assert (run.hits, run.asked) == (want, len(names)), policy


# --- vLLM's own manager, by both routes --------------------------------------


@pytest.mark.needs_vllm
def test_both_routes_into_vllms_manager(impl: str) -> None:
    from vllm.plugins import load_general_plugins
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    import arc_cy
    from helpers import CHOSEN

    load_general_plugins()
    by_name = CPUOffloadingManager(num_chunks=4, cache_policy="arc_cy_plus")
    by_path = CPUOffloadingManager(
        num_chunks=4, cache_policy="ARCPlusCachePolicy", cache_policy_module_path="arc_cy"
    )
    expected = load_plus_class(CHOSEN)
    assert type(by_name._policy) is expected and type(by_path._policy) is expected
    assert arc_cy.ARCPlusCachePolicy is expected
    twin = CPUOffloadingManager(
        num_chunks=4,
        cache_policy="ARCPlusCachePolicy",
        cache_policy_module_path="arc_cy._twin.plus",
    )
    assert type(twin._policy) is load_plus_class("python")
    # The manager drives it: a store, a load, a store that evicts, and a
    # request's key that was not kept is remembered.
    mine = CPUOffloadingManager(
        num_chunks=1, cache_policy="ARCPlusCachePolicy", cache_policy_module_path=_module(impl)
    )
    ctx = ReqContext(req_id="a")
    out = mine.prepare_store([K(1)], ctx)
    assert out is not None and list(out.keys_to_store) == [K(1)]
    mine.complete_store([K(1)], ctx)
    mine.on_request_finished(ctx)
    ctx = ReqContext(req_id="b")
    out = mine.prepare_store([K(2)], ctx)
    assert out is not None and list(out.evicted_keys) == [K(1)]
    out = mine.prepare_store([K(3)], ctx)  # K(2) is pending: no victim
    assert out is None
    mine.on_request_finished(ctx)
    # K(1) went to b1 as K(2)'s victim; K(3), not kept, is remembered, and
    # b1, of cache_capacity 1, forgets K(1).
    assert list(mine._policy.b1) == [K(3)]
    assert (mine._policy.b1_returned, mine._policy.b1_forgotten) == (0, 1)


def _module(impl: str) -> str:
    from helpers import PLUS_MODULES

    return PLUS_MODULES[impl]


# --- the compiled class against its twin, on random legal steps --------------


class Lockstep:
    """The compiled ARC+ and its twin driven as vLLM's manager drives a
    policy (stores in flight pinned, loads pinned, failed stores removed,
    requests finished in any order), on the same chunk objects; every
    result and state compared, the contract and ARC+'s eviction rule
    checked at every step (the twin's stamps give the recency order)."""

    def __init__(self, rng: random.Random, capacity: int) -> None:
        self.rng = rng
        self.capacity = capacity
        self.both = (load_plus_class("cython")(capacity), load_plus_class("python")(capacity))
        self.chunks: dict[bytes, ChunkStatus] = {}  # resident
        self.inflight: list[tuple[list[bytes], list[bytes], list[bytes], list[bytes]]] = []
        self.reached: Counter[str] = Counter()
        self.ids = 0

    @property
    def twin(self) -> Any:
        return self.both[1]

    def call(self, name: str, *args: Any) -> Any:
        core, twin = (getattr(p, name)(*args) for p in self.both)
        if name == "evict" and core is not None:
            core = [(k, id(c)) for k, c in core]
            twin = [(k, id(c)) for k, c in twin]
        assert core == twin, name
        assert plus_snap(self.both[0]) == plus_snap(self.both[1]), name
        for p in self.both:
            p._check_invariants()
        return core

    def expected_victims(self, n: int, keys: list[bytes]) -> list[tuple[bytes, bool]]:
        """The n least recently requested evictable keys of t1 and t2 (the
        twin's stamps), each with whether it is t2's; fewer if short."""
        twin = self.twin
        ready_keys = [
            (twin.stamps[k], k, k in twin.t2)
            for k, c in (*twin.t1.items(), *twin.t2.items())
            if c.ref_cnt == 0 and k not in keys
        ]
        return [(k, in_t2) for _, k, in_t2 in sorted(ready_keys)[:n]]

    def guarded(self) -> bool:
        twin = self.twin

        def rate(back: int, gone: int) -> float:
            return back / (back + gone) if back + gone else 0.0

        return rate(twin.b1_returned, twin.b1_forgotten) < rate(twin.b2_returned, twin.b2_forgotten)

    def request(self) -> None:
        rng = self.rng
        session = rng.randrange(12)
        length = rng.randint(1, 8)
        keys = [K(1000 * session + j) for j in range(length)]
        if rng.random() < 0.3:  # a key of its own, asked once
            keys.append(K(10**6 + rng.randrange(10**6)))
        loaded = []
        for key in keys:
            chunk = self.chunks.get(key)
            if chunk is None or chunk.ref_cnt < 0:
                break
            loaded.append(key)
        for key in loaded:
            assert self.call("get", key) is not None
            self.chunks[key].ref_cnt += 1
        rest = keys[len(loaded) :]
        new = [k for k in rest if k not in self.chunks]
        reused = loaded + [k for k in rest if k in self.chunks and self.chunks[k].ref_cnt >= 0]
        inserted: list[bytes] = []
        if new:
            self.call("on_store_miss", new, CTX)
            need = len(new) - (self.capacity - len(self.chunks))
            evictable = sum(c.ref_cnt == 0 for c in self.chunks.values())
            ok = True
            if need > 0:
                twin = self.twin
                ghosts = any(k in twin.b1 or k in twin.b2 for k in keys)
                first_seen = not ghosts and any(k not in twin.t1 and k not in twin.t2 for k in keys)
                guarded = first_seen and self.guarded()
                want = self.expected_victims(need, keys)
                needs_t2 = any(in_t2 for _, in_t2 in want)
                self.reached["evict_full"] += 1
                self.reached["guarded"] += guarded
                if any(c.ref_cnt != 0 for c in self.chunks.values()):
                    self.reached["evict_with_pins"] += 1
                # vLLM's manager asks only if enough chunks have ref_cnt 0.
                out = self.call("evict", need, set(keys)) if need <= evictable else None
                if out is None:
                    ok = False
                    if len(want) == need:
                        # Victims existed: refused, a first-seen offer that
                        # needed t2 while b1's ghosts come back less.
                        assert guarded and needs_t2
                        self.reached["refused"] += 1
                else:
                    # The n least recent, t1's and t2's together (vLLM lru's order).
                    assert [k for k, _ in out] == [k for k, _ in want]
                    self.reached["evicted_t2"] += needs_t2
                    self.reached["guarded_admitted"] += guarded
                    for key, _ in out:
                        chunk = self.chunks.pop(key)
                        assert chunk.ref_cnt == 0 and key not in keys  # pinned, protected: never
                    self.reached["evicted"] += len(out)
            if ok:
                for key in new:
                    ghost = key in self.twin.b1 or key in self.twin.b2
                    self.ids += 1
                    self.chunks[key] = pending(self.ids)
                    self.call("insert", key, self.chunks[key], CTX)
                    self.reached["ghost_to_t2"] += ghost
                    assert (key in self.twin.t2) == ghost
                inserted = new
        self.inflight.append((keys, loaded, inserted, reused))

    def finish(self) -> None:
        keys, loaded, inserted, reused = self.inflight.pop(self.rng.randrange(len(self.inflight)))
        for key in loaded:
            if key in self.chunks:
                self.chunks[key].ref_cnt -= 1
        for key in inserted:
            if key not in self.chunks:
                continue
            if self.rng.random() < 0.1:  # a failed store
                self.call("remove", key)
                del self.chunks[key]
            else:
                self.chunks[key].ref_cnt = 0
        twin = self.twin
        asked_ghosts = sum(k in twin.b1 or k in twin.b2 for k in set(keys))
        b1 = len(twin.b1)
        self.call(
            "on_request_finished",
            (tuple(keys),),
            set(inserted) - set(reused),
            set(reused),
            ReqContext(req_id="r"),
        )
        self.reached["ghost_to_b2"] += asked_ghosts
        self.reached["remembered"] += max(0, len(twin.b1) - b1)
        self.reached["b1_full"] += len(twin.b1) == self.capacity

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.01:
            self.call("clear")
            self.chunks.clear()
            self.inflight.clear()  # vLLM's reset_cache: the requests are dropped
        elif r < 0.5 and self.inflight:
            self.finish()
        else:
            self.request()
        if len(self.inflight) > 4:
            self.finish()


@pytest.mark.compiled
def test_compiled_decides_as_its_twin_on_random_legal_steps() -> None:
    reached: Counter[str] = Counter()
    for seed in range(24):
        run = Lockstep(random.Random(seed), capacity=random.Random(seed).choice([4, 8, 16, 32]))
        for _ in range(400):
            run.step()
        reached.update(run.reached)
        fates = plus_snap(run.twin)[4]
        reached["returned"] += fates[0] + fates[2]
        reached["forgotten"] += fates[1] + fates[3]
    # What the steps reached (about a quarter of what 24 seeds reach here).
    minimum = {
        "evict_full": 1000,
        "evict_with_pins": 750,
        "evicted": 1600,
        "evicted_t2": 250,
        "guarded": 400,
        "guarded_admitted": 45,
        "refused": 200,
        "ghost_to_t2": 700,
        "ghost_to_b2": 350,
        "remembered": 400,
        "b1_full": 800,
        "returned": 200,  # the fates where each run ended (clear() zeroes them)
        "forgotten": 600,
    }
    low = {k: (reached[k], v) for k, v in minimum.items() if reached[k] < v}
    assert not low, f"reached less than the minimum (reached, minimum): {low}; all: {reached}"
