"""Release: when and in which order the policy lets go of keys and chunks.
clear() and __init__ called again release each list in vLLM's order
(values in insertion order, then keys; __init__ resets the capacity and
target first), and a released key's __del__ that acts on the policy sees
what it would see in vLLM.
"""

from __future__ import annotations

import gc

import pytest

from arc_cy import _checks
from helpers import CTX, ChunkStatus, VllmARC, keysnap, ready
from hostile import populated

pytestmark = pytest.mark.hostile

DELS: list[str] = []


class LoggedKey:
    act = None

    def __init__(self, n):
        self.n = n

    def __hash__(self):
        return hash(self.n)

    def __eq__(self, other):
        return isinstance(other, LoggedKey) and other.n == self.n

    def __del__(self):
        DELS.append(f"k{self.n}")
        if LoggedKey.act is not None:
            LoggedKey.act(self.n)


class LoggedChunk(ChunkStatus):
    def __del__(self):
        DELS.append(f"c{self.chunk_id}")


def _released(cls, how, acting):
    policy = cls(10)
    for i in range(6):
        chunk = LoggedChunk(i)
        chunk.ref_cnt = 0
        policy.insert(LoggedKey(i), chunk, CTX)
    del chunk
    policy.touch([LoggedKey(0)], CTX)  # t1 -> t2: a new entry of t2
    policy.touch([LoggedKey(3)], CTX)
    policy.on_request_finished(((LoggedKey(1),),), {LoggedKey(1)}, set(), CTX)  # move_to_end
    policy.evict(2, set())  # b1 = [2, 4]
    gc.collect()
    DELS.clear()
    if acting:
        # a released key inserts a new one: where it lands shows the order
        LoggedKey.act = lambda n: policy.insert(f"new{n}", ready(100 + n), CTX) if n < 6 else None
    try:
        policy.__init__(10) if how == "__init__" else policy.clear()
    finally:
        LoggedKey.act = None
    state = [
        [getattr(k, "n", k) for k in view] for view in (policy.t1, policy.t2, policy.b1, policy.b2)
    ]
    return list(DELS), state


@pytest.mark.parametrize("acting", [False, True], ids=["logged", "acting"])
@pytest.mark.parametrize("how", ["__init__", "clear"])
def test_release_order_is_vllms(policy_cls, how, acting):
    """__init__ again released each list in list order (LRU first)
    where vLLM, replacing each OrderedDict, releases its entries in
    insertion order; clear() releases the values in insertion order, then
    the keys in list order. A __del__ that acts sees what vLLM's sees."""
    pytest.importorskip("vllm")
    assert _released(policy_cls, how, acting) == _released(VllmARC, how, acting)


RELEASE_LOG: list = []


class ReleasingKey:
    """Equal by name; when freed, records the list sizes it sees and sets
    target_t1_size to 3."""

    def __init__(self, name, policy=None):
        self.name = name
        self.policy = policy

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return isinstance(other, ReleasingKey) and other.name == self.name

    def __del__(self):
        p = self.policy
        if p is not None:
            RELEASE_LOG.append(
                (self.name, len(p.t1), len(p.t2), len(p.b1), len(p.b2), p.target_t1_size)
            )
            p.target_t1_size = 3


def _release_scenario(cls, reset):
    RELEASE_LOG.clear()
    policy = cls(4)
    for name in ("t1-a", "b1", "t2", "t1-b", "t1-c"):
        policy.insert(ReleasingKey(name, policy), ready(len(RELEASE_LOG)), CTX)
    policy.touch([ReleasingKey("t2", policy)], CTX)  # stored under this key object
    assert [k.name for k, _ in policy.evict(1, ())] == ["t1-a"]
    assert [k.name for k, _ in policy.evict(1, {ReleasingKey("t1-b")})] == ["b1"]
    policy.target_t1_size = 1.5
    RELEASE_LOG.clear()
    reset(policy)
    state = keysnap(policy)
    names = [[k.name for k in lst] for lst in state[:4]]
    return names, state[4:], list(RELEASE_LOG)


def test_clear_releases_lists_in_turn_then_resets_the_target(policy_cls):
    """The core reset target_t1_size before releasing the keys (and
    released them all at once), so a released key's __del__ that set the
    target left 3 where vLLM and the twin end with 0.0."""
    pytest.importorskip("vllm")
    got = _release_scenario(policy_cls, lambda p: p.clear())
    assert got == _release_scenario(VllmARC, lambda p: p.clear())
    assert got[1] == (0.0, float)
    assert [entry[0] for entry in got[2]] == ["t1-b", "t1-c", "t2", "t1-a", "b1"]


def test_init_again_resets_like_vllms_init(policy_cls):
    """__init__ again sets the capacity and target first, then
    empties the lists (vLLM replaces them in turn); both twins now also
    reset _max_entries, which vLLM's class does not have."""
    pytest.importorskip("vllm")
    got = _release_scenario(policy_cls, lambda p: p.__init__(6))
    assert got == _release_scenario(VllmARC, lambda p: p.__init__(6))
    assert got[1] == (3, int)  # set by a __del__ after the target was reset
    policy = populated(policy_cls)
    policy._max_entries = 10
    policy.__init__(7)
    assert (policy._max_entries, policy.cache_capacity) == (_checks.MAX_ENTRIES, 7)
    policy._check_invariants()
