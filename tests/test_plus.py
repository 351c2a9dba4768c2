"""ARC+ (arc_cy_plus): its three rules on both implementations, hand-worked
hit ratios through vLLM's own manager, both routes into that manager, and
the compiled class against its twin on random legal steps (the CachePolicy
contract asserted at every step, and what the steps reached)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from helpers import CTX, ChunkStatus, K, ReqContext, keysnap, load_plus_class, ready

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


# --- the rules, one by one ---------------------------------------------------


@pytest.mark.gc_stress
def test_first_seen_offer_refused_while_target_is_zero(plus_cls: type) -> None:
    policy = plus_cls(2)
    chunks = stored(policy, K(1), K(2))
    before = keysnap(policy)
    assert policy.evict(1, {K(3)}) is None  # a victim exists, but K(3) is first seen
    assert keysnap(policy) == before
    # Its request finishes: K(3), in no list, is remembered in b1.
    finished(policy, [K(3)])
    assert list(policy.b1) == [K(3)]
    # Its next request: a ghost hit raises the target, the offer is admitted
    # (t1's LRU entry goes), and K(3) goes to t2 (the paper's rule).
    policy.on_store_miss([K(3)], CTX)
    assert policy.target_t1_size == 1
    assert policy.evict(1, {K(3)}) == [(K(1), chunks[K(1)])]
    policy.insert(K(3), pending(9), CTX)
    assert list(policy.t1) == [K(2)] and list(policy.t2) == [K(3)]
    assert list(policy.b1) == [K(1)]
    policy._check_invariants()


@pytest.mark.gc_stress
def test_an_offer_without_a_key_to_store_is_not_judged(plus_cls: type) -> None:
    policy = plus_cls(2)
    chunks = stored(policy, K(1), K(2))
    # protected holds resident keys only, or nothing: there is no offer of
    # first-seen keys to refuse, and target_t1_size 0 prefers t1.
    assert policy.evict(1, {K(2)}) == [(K(1), chunks[K(1)])]
    assert policy.evict(1, set()) == [(K(2), chunks[K(2)])]
    assert list(policy.b1) == [K(1), K(2)]


@pytest.mark.gc_stress
def test_first_seen_offer_refused_when_t1_has_no_victim(plus_cls: type) -> None:
    policy = plus_cls(3)
    chunks = stored(policy, K(1), K(2))
    finished(policy, [K(2)], reused=[K(2)])  # K(2) to t2
    chunks[K(1)].ref_cnt = 1  # t1's only entry is being read
    policy.target_t1_size = 1.0
    before = keysnap(policy)
    # t1 is at its target, so its victim is due, and it has none: t2's
    # frequent K(2) is not given up for a first-seen key.
    assert policy.evict(1, {K(4)}) is None
    assert keysnap(policy) == before
    # An offer that holds a ghost takes t2's victim, as ARC does.
    finished(policy, [K(5)])
    assert list(policy.b1) == [K(5)]
    assert policy.evict(1, {K(4), K(5)}) == [(K(2), chunks[K(2)])]
    assert list(policy.b2) == [K(2)]


@pytest.mark.gc_stress
def test_ghost_insert_goes_to_t2_from_b1_and_b2(plus_cls: type) -> None:
    policy = plus_cls(4)
    stored(policy, K(1), K(2))
    finished(policy, [K(2)], reused=[K(2)])
    policy.target_t1_size = 4
    assert [k for k, _ in policy.evict(1, {K(9)})] == [K(2)]  # t1 below target: t2's
    policy.target_t1_size = 0.5
    finished(policy, [K(3)])  # an offer with a ghost in it is admitted
    assert [k for k, _ in policy.evict(1, {K(3)})] == [K(1)]
    assert list(policy.b1) == [K(3), K(1)] and list(policy.b2) == [K(2)]
    policy.insert(K(1), pending(7), CTX)
    policy.insert(K(2), pending(8), CTX)
    policy.insert(K(3), pending(9), CTX)
    assert list(policy.t1) == [] and list(policy.t2) == [K(1), K(2), K(3)]
    assert list(policy.b1) == [] and list(policy.b2) == []


@pytest.mark.gc_stress
def test_remembered_keys_tail_first_once_and_b1_trimmed(plus_cls: type) -> None:
    policy = plus_cls(3)
    stored(policy, K(1))
    # Resident keys and ghosts stay where they are; the rest go to b1 tail
    # first (the head ends at the MRU end), a repeated key once.
    finished(policy, [K(2), K(1), K(3), K(4), K(3)])
    assert list(policy.t1) == [K(1)]
    assert list(policy.b1) == [K(3), K(4), K(2)]
    finished(policy, [K(5), K(3)])  # b1 holds cache_capacity ghosts at most
    assert list(policy.b1) == [K(4), K(2), K(5)]
    policy._check_invariants()


@pytest.mark.gc_stress
def test_clear_and_n_zero(plus_cls: type) -> None:
    policy = plus_cls(2)
    stored(policy, K(1))
    finished(policy, [K(2)])
    policy.on_store_miss([K(2)], CTX)
    assert policy.evict(0, {K(7)}) == []
    policy.clear()
    assert keysnap(policy) == ([], [], [], [], 0.0, float)


# --- hit ratios through vLLM's manager, worked by hand -----------------------

# Pool 2, one request in flight, one block a request (512 tokens).
SCAN = ["H", "X1", "X2", "H", "X3", "X4", "H", "X5", "X6", "H"]
# A hot block H between pairs of blocks asked once. vLLM lru and arc: every
# X evicts the oldest entry, and two Xs come between Hs, so H is gone when
# asked again: 0 hits. ARC+: H and X1 fill the pool; X2 is offered with
# target_t1_size 0 and no ghost: refused (remembered in b1); H hits (moves
# to t2); every X after is refused the same way (b1 keeps the last two):
# H hits in requests 3, 6 and 9, 3 of 10.
# Then a block asked three times in a row: A, B fill the pool; C is
# refused once by ARC+ (first seen, target 0), then found in b1: the
# target rises to 1, t1's A goes, C is stored (in t2) and hits once: 1
# of 5. vLLM lru and arc store C at once and hit it twice.
AGAIN = ["A", "B", "C", "C", "C"]
HAND = {
    "scan": (SCAN, {"lru": 0, "arc": 0, "plus": 3}),
    "again": (AGAIN, {"lru": 2, "arc": 2, "plus": 1}),
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

    names, hits = HAND[trace]
    ids = {name: i for i, name in enumerate(dict.fromkeys(names))}
    requests = trace_of((t, 512, 1, (ids[name],)) for t, name in enumerate(names))
    keys = rp.trace_keys(requests)
    events = rp.schedule(requests, inflight=1)
    for policy, want in (("lru", hits["lru"]), ("arc", hits["arc"]), (impl, hits["plus"])):
        run = rp.Replayer(_manager(policy, 2), keys, store_batch=1).run(events)
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
    # The manager drives it: a store, a load, a refused first-seen store.
    mine = CPUOffloadingManager(
        num_chunks=1, cache_policy="ARCPlusCachePolicy", cache_policy_module_path=_module(impl)
    )
    ctx = ReqContext(req_id="a")
    out = mine.prepare_store([K(1)], ctx)
    assert out is not None and list(out.keys_to_store) == [K(1)]
    mine.complete_store([K(1)], ctx)
    mine.on_request_finished(ctx)
    ctx = ReqContext(req_id="b")
    assert mine.prepare_store([K(2)], ctx) is None
    mine.on_request_finished(ctx)
    assert list(mine._policy.b1) == [K(2)]


def _module(impl: str) -> str:
    from helpers import PLUS_MODULES

    return PLUS_MODULES[impl]


# --- the compiled class against its twin, on random legal steps --------------


class Lockstep:
    """The compiled ARC+ and its twin driven as vLLM's manager drives a
    policy (stores in flight pinned, loads pinned, failed stores removed,
    requests finished in any order), on the same chunk objects; every
    result and state compared, the contract checked at every step."""

    def __init__(self, rng: random.Random, capacity: int) -> None:
        self.rng = rng
        self.capacity = capacity
        self.both = (load_plus_class("cython")(capacity), load_plus_class("python")(capacity))
        self.chunks: dict[bytes, ChunkStatus] = {}  # resident
        self.inflight: list[tuple[list[bytes], list[bytes], list[bytes], list[bytes]]] = []
        self.reached: Counter[str] = Counter()
        self.ids = 0

    def call(self, name: str, *args: Any) -> Any:
        core, twin = (getattr(p, name)(*args) for p in self.both)
        if name == "evict" and core is not None:
            core = [(k, id(c)) for k, c in core]
            twin = [(k, id(c)) for k, c in twin]
        assert core == twin, name
        assert keysnap(self.both[0]) == keysnap(self.both[1]), name
        for p in self.both:
            p._check_invariants()
        return core

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
            free = [k for k, c in self.chunks.items() if c.ref_cnt == 0 and k not in keys]
            ok = True
            if need > 0:
                ghosts = any(k in self.both[1].b1 or k in self.both[1].b2 for k in keys)
                self.reached["evict_full"] += 1
                if any(c.ref_cnt != 0 for c in self.chunks.values()):
                    self.reached["evict_with_pins"] += 1
                # vLLM's manager asks only if enough chunks have ref_cnt 0.
                out = self.call("evict", need, set(keys)) if need <= evictable else None
                if out is None:
                    ok = False
                    if need <= len(free):
                        # Victims existed: refused, a first-seen offer (rule 3).
                        assert not ghosts
                        self.reached["refused"] += 1
                else:
                    for key, _ in out:
                        chunk = self.chunks.pop(key)
                        assert chunk.ref_cnt == 0 and key not in keys  # pinned, protected: never
                    self.reached["evicted"] += len(out)
            if ok:
                for key in new:
                    ghost = key in self.both[1].b1 or key in self.both[1].b2
                    self.ids += 1
                    self.chunks[key] = pending(self.ids)
                    self.call("insert", key, self.chunks[key], CTX)
                    self.reached["ghost_to_t2"] += ghost
                    assert (key in self.both[1].t2) == ghost
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
        b1 = len(self.both[1].b1)
        self.call(
            "on_request_finished",
            (tuple(keys),),
            set(inserted) - set(reused),
            set(reused),
            ReqContext(req_id="r"),
        )
        self.reached["remembered"] += max(0, len(self.both[1].b1) - b1)
        self.reached["b1_full"] += len(self.both[1].b1) == self.capacity

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.01:
            self.call("clear")
            self.chunks.clear()
            self.inflight.clear()  # vLLM's reset_cache: the requests are dropped
        elif r < 0.04:
            value = self.rng.choice([0.0, 0.5, 1, self.capacity / 2, float(self.capacity)])
            for p in self.both:
                p.target_t1_size = value
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
    # What the steps reached (about a quarter of what 24 seeds reach here).
    minimum = {
        "evict_full": 1000,
        "evict_with_pins": 750,
        "evicted": 1600,
        "refused": 150,
        "ghost_to_t2": 700,
        "remembered": 400,
        "b1_full": 800,
    }
    low = {k: (reached[k], v) for k, v in minimum.items() if reached[k] < v}
    assert not low, f"reached less than the minimum (reached, minimum): {low}; all: {reached}"
