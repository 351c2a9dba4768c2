"""Behaviour of one policy object on ordinary input, on both
implementations of ARC and ARC+: get, insert, remove, touch, evict (pinned
and protected chunks, atomic failure), the ghost lists, clear(); ARC's own
decisions (arc_only): the t1/t2 choice and the adaptive target.
"""

from __future__ import annotations

import pytest

from helpers import CTX, ChunkStatus, adapts, filled, ready

pytestmark = [pytest.mark.sdist, pytest.mark.both_policies]


def test_get_insert_remove(policy_cls):
    policy = policy_cls(4)
    chunk = ChunkStatus(0)
    assert policy.get(b"k") is None
    policy.insert(b"k", chunk, CTX)
    assert policy.get(b"k") is chunk
    policy.remove(b"k")
    policy.remove(b"k")  # absent: nothing happens
    assert policy.get(b"k") is None and len(policy.t1) == 0


def test_touch_pending_chunk_stays_in_t1(policy_cls):
    policy = policy_cls(4)
    policy.insert(b"a", ChunkStatus(0), CTX)  # ref_cnt -1: being stored
    policy.insert(b"b", ChunkStatus(1), CTX)
    policy.touch([b"a"], CTX)
    assert list(policy.t1) == [b"b", b"a"] and len(policy.t2) == 0
    policy.t1[b"a"].ref_cnt = 0
    policy.touch([b"a"], CTX)
    assert list(policy.t2) == [b"a"]


@pytest.mark.arc_only
def test_ghost_hits_adapt_the_target(policy_cls):
    policy, _ = filled(policy_cls, 3, t1=[b"a", b"b"], t2=[b"c"])
    policy.evict(2, set())  # target 0: t1 first
    assert list(policy.b1) == [b"a", b"b"]
    policy.on_store_miss([b"a"], CTX)
    assert policy.target_t1_size == 1 and list(policy.b1) == [b"b", b"a"]
    policy.target_t1_size = 3
    policy.on_store_miss([b"b"], CTX)
    assert policy.target_t1_size == 3 and type(policy.target_t1_size) is int


@pytest.mark.arc_only
def test_batch_crosses_t1_t2_and_back(policy_cls):
    policy, _ = filled(policy_cls, 8, t1=[b"1", b"2", b"3", b"4"], t2=[b"x", b"y"])
    policy.target_t1_size = 3
    got = [k for k, _ in policy.evict(5, set())]
    # t1 (4 >= 3), t1 (3 >= 3), then t2 twice (2 < 3), then t2 is empty: t1
    assert got == [b"1", b"2", b"x", b"y", b"3"]
    assert list(policy.b1) == [b"1", b"2", b"3"] and list(policy.b2) == [b"x", b"y"]


def test_pinned_and_protected_at_the_lru_ends(policy_cls):
    policy, chunks = filled(
        policy_cls, 8, t1=[b"p", b"q", b"r"], t2=[b"s", b"t"], pinned=[b"p", b"s"]
    )
    got = [k for k, _ in policy.evict(2, {b"q"})]
    assert got == [b"r", b"t"]  # p pinned, q protected; then t1 is spent
    assert list(policy.t1) == [b"p", b"q"] and list(policy.t2) == [b"s"]


def test_exhausted_scan_fails_atomically(policy_cls):
    policy, chunks = filled(policy_cls, 8, t1=[b"a", b"b"], t2=[b"c"], pinned=[b"c"])
    before = (list(policy.t1.items()), list(policy.t2), list(policy.b1))
    assert policy.evict(3, set()) is None
    assert policy.evict(2, {b"a"}) is None
    assert (list(policy.t1.items()), list(policy.t2), list(policy.b1)) == before
    assert policy.evict(0, set()) == []
    assert policy.evict(99, set()) is None


class CountingContainer:
    def __init__(self, keys=()):
        self.keys = set(keys)
        self.asked: list = []

    def __contains__(self, key):
        self.asked.append(key)
        return key in self.keys

    def __iter__(self):  # ARC+'s evict() reads the keys first
        return iter(self.keys)


def test_each_entry_is_examined_at_most_once_per_call(policy_cls):
    n = 200
    t1 = [b"a%d" % i for i in range(n)]
    t2 = [b"b%d" % i for i in range(n)]
    policy, _ = filled(policy_cls, 1000, t1=t1, t2=t2)
    if not hasattr(policy, "b1_returned"):  # ARC: alternate t1/t2 preference
        policy.target_t1_size = n
    protected = CountingContainer(t1[::3] + t2[::2])
    before = getattr(policy, "_scan_visits", None)
    got = policy.evict(150, protected)
    assert got is not None and len(got) == 150
    assert len(protected.asked) == len(set(protected.asked))
    if before is not None:  # the compiled core counts every entry it visits
        visits = policy._scan_visits - before
        assert visits <= 2 * n and visits == len(protected.asked)


@pytest.mark.parametrize(
    "make",
    [list, tuple, frozenset, dict.fromkeys, CountingContainer],
    ids=["list", "tuple", "frozenset", "dict", "custom"],
)
def test_any_container_works_as_protected(policy_cls, make):
    policy, _ = filled(policy_cls, 8, t1=[b"a", b"b", b"c"])
    assert [k for k, _ in policy.evict(2, make([b"a"]))] == [b"b", b"c"]


def test_set_subclass_contains_is_honoured(policy_cls):
    class Everything(set):
        def __contains__(self, key):
            return True

    policy, _ = filled(policy_cls, 8, t1=[b"a"])
    assert policy.evict(1, Everything()) is None


@pytest.mark.arc_only  # ARC+ remembers a finished request's keys in b1
def test_ghost_lists_are_trimmed_to_capacity(policy_cls):
    policy = policy_cls(2)
    for i in range(6):
        policy.insert(b"%d" % i, ready(i), CTX)
    assert [k for k, _ in policy.evict(4, set())] == [b"0", b"1", b"2", b"3"]
    assert list(policy.b1) == [b"2", b"3"]
    policy.insert(b"2", ready(9), CTX)  # a ghost comes back into t1
    assert list(policy.b1) == [b"3"] and list(policy.t1) == [b"4", b"5", b"2"]


def test_clear_resets_everything(policy_cls):
    policy, _ = filled(policy_cls, 4, t1=[b"a", b"b"], t2=[b"c"])
    policy.evict(1, set())
    policy.on_store_miss([b"a"], CTX)  # a ghost hit: ARC's target, ARC+'s fates
    if not hasattr(policy, "b1_returned"):
        policy.target_t1_size = 2  # an int: clear() makes it the float 0.0
    assert adapts(policy) != adapts(policy_cls(4))
    policy.clear()
    assert [len(v) for v in (policy.t1, policy.t2, policy.b1, policy.b2)] == [0] * 4
    assert adapts(policy) == adapts(policy_cls(4))  # ARC: target 0.0, a float
    policy.insert(b"a", ready(0), CTX)
    policy._check_invariants()


@pytest.mark.arc_only
def test_ghost_hit_deltas_use_the_ratio_of_ghost_sizes(policy_cls):
    # b1 = [a, b], b2 = [c, d, e]: a b1 hit adds 3/2, a b2 hit takes 2/3 -> 1
    policy, _ = filled(policy_cls, 5, t1=[b"a", b"b"], t2=[b"c", b"d", b"e"])
    policy.target_t1_size = 2
    # t1 while its virtual size >= 2, then t2, then the fallback to t1
    assert [k for k, _ in policy.evict(5, set())] == [b"a", b"c", b"d", b"e", b"b"]
    assert list(policy.b1) == [b"a", b"b"] and list(policy.b2) == [b"c", b"d", b"e"]
    policy.on_store_miss([b"a"], CTX)
    assert policy.target_t1_size == 3.5
    policy.touch([b"c"], CTX)
    assert policy.target_t1_size == 2.5
    policy.touch([b"d", b"a"], CTX)  # tail first: a (+1.5), then d (-1)
    assert policy.target_t1_size == 3.0
