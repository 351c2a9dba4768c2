"""Stateful differential fuzzing: vLLM's ARC vs both arc_cy implementations
(the twin alone on a pure build).

A hypothesis RuleBasedStateMachine applies every operation to vLLM
0.33.0's ARCCachePolicy (the oracle) and to ``arc_cy._core.arc`` and
``arc_cy._twin.arc`` ARCCachePolicy, with the same key objects and the same
ChunkStatus objects (ref_cnt is read live, so all three see one value),
and after every step checks that the three agree (t1/t2 order and chunk
identity, b1/b2 order, target_t1_size value and type, get() of every key)
and that each arc_cy policy passes ``_check_invariants()``.

Capacities are tiny (0-12) and so is the key universe. Rules shaped like
the manager's traffic (store: ghost hits, evict to make room, insert; fill;
re-insert of a ghost; touch of resident keys) and evict() sizes drawn
against the resident and evictable counts keep the caches full, so full
evictions, pinned runs, ghost re-insertions, victims from both t1 and t2
and ghost trimming happen in every run: test_StateMachine counts them
(hypothesis events, COVERAGE) and fails below COVERAGE_MIN.

Profiles (hypothesis settings profiles, applied to this module's test only):

    arc_cy-fuzz-ci    the default; 600 examples x up to 60 steps (~30k
                      steps, ~30 s on a 2-core machine).
    arc_cy-fuzz-long  ARC_CY_FUZZ_PROFILE=long: 16_000 examples x up to
                      100 steps (over a million steps; ~25 minutes).
                      It prints the steps run and the coverage counts:

    ARC_CY_FUZZ_PROFILE=long "$ARC_CY_PY" -P -m pytest -s \
        tests/test_fuzz_stateful.py -k StateMachine

A second, plain (non-hypothesis) test replays long seeded random sequences
(200_000 policy calls each) of CPUOffloadingManager-shaped traffic
(arc_cy_harness.traffic's PolicyTraffic, the driver bench/soak.py uses too) on
the same three policies, to cover long histories that shrinking-friendly
hypothesis examples do not reach.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm")  # the imports below need it

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from vllm.v1.kv_offload.base import make_offload_key

from arc_cy._flags import env_flag
from arc_cy_harness.traffic import Lockstep, PolicyTraffic
from helpers import (
    IMPLEMENTATIONS,
    MODULES,
    ChunkStatus,
    ReqContext,
    VllmARC,
    assert_same_state,
    load_policy_class,
    snapshot,
)

ARC_CY = [load_policy_class(name) for name in IMPLEMENTATIONS]

pytestmark = pytest.mark.sanitize

settings.register_profile(
    "arc_cy-fuzz-ci",
    max_examples=600,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "arc_cy-fuzz-long",
    max_examples=16_000,
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
PROFILE = {"ci": "arc_cy-fuzz-ci", "long": "arc_cy-fuzz-long"}[
    os.environ.get("ARC_CY_FUZZ_PROFILE", "ci")
]

STEPS = {"steps": 0, "examples": 0, "evict_calls": 0, "resident_at_evict": 0}

# What the state machine reached, counted over one run (see COVERAGE_MIN).
COVERAGE = dict.fromkeys(
    [
        "evict_ok",  # evict() found all n victims, n > 0
        "evict_none",  # evict() found fewer than n
        "evict_full",  # a successful evict() on a full cache
        "evict_pinned_run",  # ... that skipped 2+ pinned chunks at an LRU end
        "evict_t1_and_t2",  # ... whose victims came from both t1 and t2
        "ghost_hit",  # touch()/on_store_miss() of a b1/b2 key
        "ghost_reinsert",  # insert() of a b1/b2 key
        "ghost_trim",  # an evict() that pushed ghosts out of b1/b2
    ],
    0,
)

key_index = st.integers(0, 31)
key_indexes = st.lists(key_index, max_size=6)
target_values = st.one_of(
    st.integers(-3, 15),
    st.floats(-3, 15, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.5, 1.5, 2.999999, 10**20, -(10**20), 1e300]),
)


class ARCMachine(RuleBasedStateMachine):
    """The three policies, driven in lockstep."""

    @initialize(capacity=st.integers(0, 12), extra=st.integers(1, 12))
    def setup(self, capacity: int, extra: int) -> None:
        STEPS["examples"] += 1
        self.capacity = capacity
        universe = min(32, capacity + extra + 1)
        self.keys = [make_offload_key(f"k{i}".encode(), i % 2) for i in range(universe)]
        self.oracle = VllmARC(capacity)
        self.arc_cy = [cls(capacity) for cls in ARC_CY]
        # The manager's steps and its model of the resident chunks
        # (arc_cy_harness.traffic); the rules choose the steps.
        self.t = PolicyTraffic(Lockstep(self.all), capacity)

    # --- helpers -----------------------------------------------------------

    @property
    def all(self):
        return (self.oracle, *self.arc_cy)

    def key(self, i: int, fresh: bool = False):
        key = self.keys[i % len(self.keys)]
        # An equal key that is a different object, as vLLM's hashes are.
        return bytes(bytearray(key)) if fresh else key

    def resident_items(self):
        return [*self.oracle.t1.items(), *self.oracle.t2.items()]

    def resident(self, pred=lambda chunk: True):
        return [k for k, chunk in self.resident_items() if pred(chunk)]

    def ctx(self):
        return ReqContext(req_id="r")

    def count(self, what: str) -> None:
        COVERAGE[what] += 1
        event(what)

    def count_ghost_hits(self, keys) -> None:
        ghosts = (self.oracle.b1, self.oracle.b2)
        if any(k in g for k in keys for g in ghosts):
            self.count("ghost_hit")

    def core_refuses(self, call, exc_type):
        """call(policy) must make the compiled core raise exc_type and change
        nothing (the twin, as vLLM's ARC, takes the call: it is not made)."""
        for p in self.arc_cy:
            if type(p).__module__ == MODULES["cython"]:
                before = snapshot(p)
                with pytest.raises(exc_type):
                    call(p)
                assert snapshot(p) == before

    # --- rules -------------------------------------------------------------

    @rule(i=key_index, fresh=st.booleans(), ready=st.booleans())
    def insert(self, i, fresh, ready):
        key = self.key(i, fresh)
        if key in self.oracle.t1 or key in self.oracle.t2:
            # vLLM, and the twin, would silently keep two entries; the core
            # refuses.
            chunk = ChunkStatus(-1)
            self.core_refuses(lambda p: p.insert(key, chunk, None), ValueError)
            return
        self.insert_new(key, ready)

    def insert_new(self, key, ready: bool) -> None:
        if key in self.oracle.b1 or key in self.oracle.b2:
            self.count("ghost_reinsert")
        self.t.insert(key, self.ctx(), ref_cnt=0 if ready else -1)

    @precondition(lambda self: len(self.oracle.b1) + len(self.oracle.b2) > 0)
    @rule(i=key_index, fresh=st.booleans(), ready=st.booleans())
    def reinsert_ghost(self, i, fresh, ready):
        ghosts = [*self.oracle.b1, *self.oracle.b2]
        key = ghosts[i % len(ghosts)]
        self.insert_new(bytes(bytearray(key)) if fresh else key, ready)

    @rule(
        idx=st.lists(key_index, min_size=1, max_size=8),
        ready=st.sampled_from([True, True, True, False]),
        fresh=st.booleans(),
    )
    def store(self, idx, ready, fresh):
        """What the manager's prepare_store does: ghost hits for the keys
        that are not resident, evict to make room (the request's keys are
        protected), insert them."""
        keys = list(dict.fromkeys(self.key(i, fresh) for i in idx))
        missing = [k for k in keys if k not in self.oracle.t1 and k not in self.oracle.t2]
        if not missing or len(missing) > self.capacity:
            return
        self.count_ghost_hits(missing)
        self.t.call("on_store_miss", missing, self.ctx())
        need = len(self.oracle.t1) + len(self.oracle.t2) + len(missing) - self.capacity
        if need > 0 and self.evict_n(need, set(keys)) is None:
            return
        for key in missing:
            self.insert_new(key, ready)

    @rule(start=key_index, ready=st.sampled_from([True, True, True, False]))
    def fill(self, start, ready):
        """Insert absent keys (ghosts among them) until the cache is full."""
        n = len(self.keys)
        for j in range(n):
            if len(self.oracle.t1) + len(self.oracle.t2) >= self.capacity:
                break
            key = self.keys[(start + j) % n]
            if key not in self.oracle.t1 and key not in self.oracle.t2:
                self.insert_new(key, ready)

    @rule(i=key_index, mark=st.booleans())
    def complete_store(self, i, mark):
        pending = self.resident(lambda c: c.ref_cnt < 0)
        if pending:
            self.t.complete_store(pending[i % len(pending)], tell=mark)

    @rule(i=key_index, fresh=st.booleans())
    def fail_store(self, i, fresh):
        pending = self.resident(lambda c: c.ref_cnt < 0)
        if pending:
            key = pending[i % len(pending)]
            self.t.fail_store(key, bytes(bytearray(key)) if fresh else key)

    @rule(i=key_index, mark=st.booleans())
    def pin(self, i, mark):
        ready = self.resident(lambda c: c.ref_cnt >= 0)
        if ready:
            self.t.pin(ready[i % len(ready)], tell=mark)

    @rule(i=key_index, mark=st.booleans())
    def unpin(self, i, mark):
        pinned = self.resident(lambda c: c.ref_cnt > 0)
        if pinned:
            self.t.unpin(pinned[i % len(pinned)], tell=mark)

    @rule(idx=key_indexes, fresh=st.booleans())
    def touch(self, idx, fresh):
        keys = [self.key(i, fresh) for i in idx]
        self.count_ghost_hits(keys)
        self.t.touch(keys, self.ctx())

    @rule(idx=key_indexes)
    def touch_resident(self, idx):
        """A request's hits: touch resident keys (t1 -> t2 when ready)."""
        resident = self.resident()
        if resident:
            self.t.touch([resident[i % len(resident)] for i in idx], self.ctx())

    @rule(idx=key_indexes, as_tuple=st.booleans())
    def on_store_miss(self, idx, as_tuple):
        keys = [self.key(i) for i in idx]
        self.count_ghost_hits(keys)
        ctx = self.ctx()
        for p in self.all:
            p.on_store_miss(tuple(keys) if as_tuple else iter(keys), ctx)

    @rule(idx=key_indexes)
    def on_request_access(self, idx):
        keys = [self.key(i) for i in idx]
        for result in self.t.access(keys, self.ctx()):
            assert result is None

    @rule(
        groups=st.lists(key_indexes, min_size=1, max_size=3),
        ins=st.frozensets(key_index, max_size=8),
        reused=st.frozensets(key_index, max_size=8),
        positions=st.sampled_from(["all", "partial", "none"]),
        order=st.randoms(use_true_random=False),
    )
    def on_request_finished(self, groups, ins, reused, positions, order):
        key_groups = tuple(tuple(self.key(i) for i in g) for g in groups)
        flat = [k for g in key_groups for k in g]
        ctx = self.ctx()
        if positions != "none":
            ranks = list(range(len(flat)))
            order.shuffle(ranks)
            for j, (key, rank) in enumerate(zip(flat, ranks)):
                if positions == "all" or j % 2:
                    ctx.set_offload_key_position(key, rank)
        insertion_only = {self.key(i) for i in ins}
        reused_keys = {self.key(i) for i in reused}
        self.t.finish(key_groups, insertion_only, reused_keys, ctx)

    @rule(
        size=st.sampled_from(["one", "some", "some", "evictable", "all", "zero", "more"]),
        j=st.integers(0, 16),
        prot=st.frozensets(key_index, max_size=6),
        kind=st.sampled_from(["set", "frozenset", "list", "dict", "empty-tuple"]),
    )
    def evict(self, size, j, prot, kind):
        # n is drawn against what is resident: "more" asks for more chunks
        # than are resident (always None), "all" for every one, the others
        # for at most as many as could be evicted.
        keys = {self.key(i) for i in prot}
        resident = len(self.oracle.t1) + len(self.oracle.t2)
        evictable = len(self.resident(lambda c: c.ref_cnt == 0)) - sum(
            1 for k in keys if (c := self.oracle.get(k)) is not None and c.ref_cnt == 0
        )
        n = {
            "zero": 0,
            "one": min(1, resident),
            "some": 1 + j % evictable if evictable > 0 else min(1, resident),
            "evictable": evictable if evictable > 0 else min(1, resident),
            "all": resident,
            "more": resident + 1 + j % 3,
        }[size]
        self.evict_n(
            n,
            {
                "set": lambda: set(keys),
                "frozenset": lambda: frozenset(keys),
                "list": lambda: list(keys),
                "dict": lambda: dict.fromkeys(keys),
                "empty-tuple": lambda: (),
            }[kind](),
        )

    def evict_n(self, n, protected):
        """evict(n, protected) on all three; returns vLLM's result."""
        resident = len(self.oracle.t1) + len(self.oracle.t2)
        STEPS["evict_calls"] += 1
        STEPS["resident_at_evict"] += resident
        before = snapshot(self.oracle)
        t1_before = list(self.oracle.t1)
        full = self.capacity > 0 and resident >= self.capacity
        pinned_run = any(
            len(lst) >= 2 and all(c.ref_cnt != 0 for c in list(lst.values())[:2])
            for lst in (self.oracle.t1, self.oracle.t2)
        )
        ghosts = len(self.oracle.b1) + len(self.oracle.b2)
        results = self.t.evict_each(n, protected)
        if results[0] is None:
            if n:
                self.count("evict_none")
            for p, r in zip(self.all, results):
                assert r is None
                assert snapshot(p) == before
            return
        if n:
            self.count("evict_ok")
            from_t1 = sum(k in t1_before for k, _ in results[0])
            if 0 < from_t1 < n:
                self.count("evict_t1_and_t2")
            if full:
                self.count("evict_full")
            if pinned_run:
                self.count("evict_pinned_run")
            if len(self.oracle.b1) + len(self.oracle.b2) < ghosts + n:
                self.count("ghost_trim")
        expected = [(k, id(c)) for k, c in results[0]]
        assert len(expected) == n
        for r in results[1:]:
            assert isinstance(r, list)
            assert [(k, id(c)) for k, c in r] == expected
        for key, chunk in results[0]:
            assert chunk.ref_cnt == 0 and key not in protected
        return results[0]

    @rule(i=key_index, fresh=st.booleans())
    def remove(self, i, fresh):
        self.t.remove(self.key(i, fresh))

    @precondition(lambda self: len(self.oracle.b1) + len(self.oracle.b2) > 0)
    @rule(go=st.integers(0, 7))
    def clear(self, go):
        if go:  # rarely: a clear() undoes the long histories that fill b1/b2
            return
        self.t.clear()

    @rule(value=target_values)
    def set_target(self, value):
        self.t.set_target(value)

    # --- checks ------------------------------------------------------------

    @invariant()
    def agree(self):
        STEPS["steps"] += 1
        assert_same_state(self.oracle, *self.arc_cy)
        for key in self.keys:
            chunk = self.oracle.get(key)
            for p in self.arc_cy:
                assert p.get(key) is chunk
        for p in self.arc_cy:
            assert p.cache_capacity == self.capacity
        # The driver's model of the resident chunks is vLLM's.
        assert self.t.chunks == dict(self.resident_items())


# Each run must reach every counted state at least this often: about half
# the lowest of ten CI-profile runs (2026-12, hypothesis 6.x, unseeded, so
# each run draws anew), lowest-highest: evict_ok 701-1068, evict_none
# 770-1006, evict_full 461-782, evict_pinned_run 86-234, evict_t1_and_t2
# 61-164, ghost_hit 220-811 (the widest spread), ghost_reinsert 692-1245,
# ghost_trim 41-91 (the rarest: b1 or b2 must outgrow the capacity). A floor
# of 250 ghost hits failed one run in ten.
COVERAGE_MIN = {
    "evict_ok": 350,
    "evict_none": 380,
    "evict_full": 230,
    "evict_pinned_run": 40,
    "evict_t1_and_t2": 30,
    "ghost_hit": 100,
    "ghost_reinsert": 340,
    "ghost_trim": 10,
}


def test_StateMachine():
    STEPS.update(dict.fromkeys(STEPS, 0))
    COVERAGE.update(dict.fromkeys(COVERAGE, 0))
    run_state_machine_as_test(ARCMachine, settings=settings.get_profile(PROFILE))
    if PROFILE != "arc_cy-fuzz-ci" or env_flag("ARC_CY_FUZZ_REPORT"):
        print(
            f"\n[{PROFILE}] {STEPS['examples']} examples, "
            f"{STEPS['steps']} checked steps, {STEPS['evict_calls']} evict calls "
            f"(mean resident {STEPS['resident_at_evict'] / max(1, STEPS['evict_calls']):.1f}), "
            f"coverage {COVERAGE}"
        )
    low = {k: v for k, v in COVERAGE.items() if v < COVERAGE_MIN[k]}
    assert not low, (low, COVERAGE)


# --- long plain random sequences ---------------------------------------------


def agree(method, results):
    """Lockstep's check: every policy answered as vLLM's (the first) did."""
    if method == "get":
        assert all(r is results[0] for r in results)
    elif method == "evict":
        if results[0] is None:
            assert all(r is None for r in results)
        else:
            expected = [(k, id(c)) for k, c in results[0]]
            for r in results[1:]:
                assert [(k, id(c)) for k, c in r] == expected


class Traffic(PolicyTraffic):
    """Manager-shaped random calls (arc_cy_harness.traffic) applied to vLLM's ARC
    and both arc_cy classes in lockstep, with the same objects."""

    def __init__(self, seed: int, capacity: int, universe: int) -> None:
        self.policies = [VllmARC(capacity), *(cls(capacity) for cls in ARC_CY)]
        self.keys = [make_offload_key(f"s{seed}-{i}".encode(), i % 3) for i in range(universe)]
        super().__init__(
            Lockstep(self.policies, check=agree),
            capacity,
            seed=seed,
            key=self.keys.__getitem__,
            universe=universe,
            fresh=0.5,
            request_keys=(1, 8),
            load_delay=(1, 3),
            store_delay=(0, 3),
            store_fail=0.07,
            position_p=0.95,
            access_p=0.3,
            count_ghosts=True,
        )

    def fresh(self, key: bytes) -> bytes:
        return bytes(bytearray(key)) if self.rng.random() < 0.5 else key

    def run(self, calls: int, check_every: int) -> None:
        rng = self.rng
        req = 0
        next_check = 0
        while self.target.calls < calls:
            req += 1
            self.request(req)
            self.complete_due(req)
            r = rng.random()
            if r < 0.002:
                self.clear()
            elif r < 0.01:
                self.set_target(rng.choice([rng.randint(0, self.capacity), rng.random() * 9]))
            elif r < 0.03:
                self.remove(self.fresh(rng.choice(self.keys)))
            elif r < 0.08:
                self.touch(rng.sample(self.keys, 3), ReqContext(req_id="t"))
            if self.target.calls >= next_check:
                assert_same_state(*self.policies)
                next_check += check_every
        assert_same_state(*self.policies)


@pytest.mark.parametrize(
    ("seed", "capacity", "universe", "check_every"),
    [(1, 5, 16, 1), (2, 12, 40, 1), (3, 64, 200, 25), (4, 300, 1000, 200)],
)
def test_long_random_sequences(seed, capacity, universe, check_every):
    traffic = Traffic(seed, capacity, universe)
    traffic.run(200_000, check_every)
    stats = traffic.stats
    # The traffic must actually reach the interesting paths.
    assert stats["evictions"] > 50 and stats["ghost_hits"] > 50, stats
    assert stats["evict_none"] > 0 or capacity > 12, stats
