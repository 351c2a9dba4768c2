"""Release: when and in which order the policy lets go of keys and chunks.
clear() and __init__ called again release each list in vLLM's order
(values in insertion order, then keys; __init__ resets the capacity and
target first), in both implementations. In the core, a released key's
__del__ that acts on the policy (a mutating call) sees what it would see
in vLLM, and what a call drops is released once it has returned (its rule
6, core_only); the twin, vLLM's code, releases as vLLM does, and refuses a
mutating call from such a __del__ while its own call runs.
"""

from __future__ import annotations

import gc

import pytest

from arc_cy._core import arguments
from helpers import CTX, ChunkStatus, VllmARC, keysnap, ready
from hostile import populated

pytestmark = pytest.mark.gc_stress

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


@pytest.mark.needs_vllm
@pytest.mark.parametrize(
    "acting", [False, pytest.param(True, marks=pytest.mark.core_only)], ids=["logged", "acting"]
)
@pytest.mark.parametrize("how", ["__init__", "clear"])
def test_release_order_is_vllms(policy_cls, how, acting):
    """__init__ again releases each list's entries in insertion order, as
    vLLM replacing each OrderedDict does; clear() releases the values in
    insertion order, then the keys in list order. A __del__ that acts sees
    what vLLM's sees."""
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


@pytest.mark.needs_vllm
def test_clear_releases_lists_in_turn_then_resets_the_target(policy_cls):
    """clear() releases the lists in turn, then resets target_t1_size, as
    vLLM: a released key's __del__ that sets the target is overwritten
    (0.0), and each key sees the lists before its own empty."""
    got = _release_scenario(policy_cls, lambda p: p.clear())
    assert got == _release_scenario(VllmARC, lambda p: p.clear())
    assert got[1] == (0.0, float)
    assert [entry[0] for entry in got[2]] == ["t1-b", "t1-c", "t2", "t1-a", "b1"]


@pytest.mark.needs_vllm
def test_init_again_resets_like_vllms_init(policy_cls):
    """__init__ again sets the capacity and target first, then
    empties the lists (vLLM replaces them in turn)."""
    got = _release_scenario(policy_cls, lambda p: p.__init__(6))
    assert got == _release_scenario(VllmARC, lambda p: p.__init__(6))
    assert got[1] == (3, int)  # set by a __del__ after the target was reset


@pytest.mark.core_only
def test_init_again_resets_the_entry_limit(policy_cls):
    """The core's _max_entries, which vLLM's class does not have."""
    policy = populated(policy_cls)
    policy._max_entries = 10
    policy.__init__(7)
    assert (policy._max_entries, policy.cache_capacity) == (arguments.MAX_ENTRIES, 7)
    policy._check_invariants()


class Acting:
    """A key or chunk whose __del__ logs what it sees of the policy (the
    sizes of t1, t2, b1 and b2), then runs act(policy) once."""

    def __init__(self, name, policy, act=None):
        self.name, self.policy, self.act = name, policy, act

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return isinstance(other, Acting) and other.name == self.name

    def __del__(self):
        p = self.policy
        if p is None:
            return
        RELEASE_LOG.append((self.name, len(p.t1), len(p.t2), len(p.b1), len(p.b2)))
        act, self.act = self.act, None
        if act is not None:
            act(p)


class ActingChunk(ChunkStatus):
    """A ready chunk whose __del__ runs act(policy) once."""

    act = None

    def __del__(self):
        act, self.act = self.act, None
        if act is not None:
            act()


def _full(cls, act_on="t1-a", act=None):
    """t1 = [t1-a, t1-b], t2 = [t2-a, t2-b], b1 = [b1-a], b2 = [b2-a]; the
    key act_on carries act."""
    RELEASE_LOG.clear()
    policy = cls(4)

    def key(name):
        return Acting(name, policy, act if name == act_on else None)

    for name in ("b2-a", "b1-a", "t2-a", "t2-b", "t1-a", "t1-b"):
        policy.insert(key(name), ready(0), CTX)
    for name in ("b2-a", "t2-a", "t2-b"):
        policy.touch([key(name)], CTX)
    assert [k.name for k, _ in policy.evict(1, ())] == ["b1-a"]
    policy.target_t1_size = 4
    assert [k.name for k, _ in policy.evict(1, ())] == ["b2-a"]
    assert [[k.name for k in v] for v in (policy.t1, policy.t2, policy.b1, policy.b2)] == [
        ["t1-a", "t1-b"],
        ["t2-a", "t2-b"],
        ["b1-a"],
        ["b2-a"],
    ]
    gc.collect()
    RELEASE_LOG.clear()
    return policy


def _init_in_clear(cls):
    policy = _full(cls, act=lambda p: p.__init__(4))
    policy.clear()
    return list(RELEASE_LOG), keysnap(policy)


@pytest.mark.core_only
@pytest.mark.needs_vllm
def test_init_from_a_del_in_clear_releases_in_vllms_order(policy_cls):
    """clear() looks each list up when its turn comes: an __init__ that a
    t1 key's __del__ runs releases t2, b1 and b2 itself, as vLLM's does, so
    each __del__ sees what it would see in vLLM."""
    got = _init_in_clear(policy_cls)
    assert got == _init_in_clear(VllmARC)
    names = [entry[0] for entry in got[0]]
    # t2's, b1's and b2's keys go inside the nested __init__, before t1-b
    assert names == ["t1-a", "t2-a", "t2-b", "b1-a", "b2-a", "t1-b"]


def _insert_from_a_chunk_del(cls, which):
    """Clear a policy whose first chunk in list `which` (t1 or t2) inserts
    "new" from its __del__, while clear() releases that list's values."""
    policy = cls(4)
    new = ready(7)

    def act():
        policy.insert("new", new, CTX)

    for i, name in enumerate(("a", "b")):
        chunk = ActingChunk(i)
        chunk.ref_cnt = 0
        if name == "a":
            chunk.act = act
        policy.insert(name, chunk, CTX)
    del chunk
    if which == "t2":
        policy.touch(["a", "b"], CTX)
    policy.clear()
    return policy, new


@pytest.mark.core_only
@pytest.mark.parametrize("which", ["t1", "t2"])
def test_a_write_while_clear_releases_a_list_lands_in_the_new_list(policy_cls, which):
    """Each list is taken out whole before its entries are released, so a
    chunk's __del__ that inserts during clear() leaves a proper t1 entry:
    listed, counted and evictable (docs/hardening.md, "Where arc_cy
    differs": vLLM's half-cleared OrderedDict keeps it in its dict but in
    no order)."""
    policy, new = _insert_from_a_chunk_del(policy_cls, which)
    assert (list(policy.t1), len(policy.t1), policy.get("new")) == (["new"], 1, new)
    assert (list(policy.t2), list(policy.b1), list(policy.b2)) == ([], [], [])
    if hasattr(policy, "_check_invariants"):
        policy._check_invariants()
    assert [k for k, _ in policy.evict(1, ())] == ["new"]
    assert list(policy.b1) == ["new"]


@pytest.mark.needs_vllm
def test_vllms_list_written_while_it_is_cleared_loses_the_entry():
    """What arc_cy does not copy: vLLM's t1 written while it is cleared
    counts the entry and finds it, but lists it nowhere, and evict() cannot
    reach it."""
    policy, new = _insert_from_a_chunk_del(VllmARC, "t1")
    assert (list(policy.t1), len(policy.t1), policy.get("new")) == ([], 1, new)
    assert policy.evict(1, ()) is None
    # written while t2 is cleared, t1 is whole again: the same as arc_cy
    policy, new = _insert_from_a_chunk_del(VllmARC, "t2")
    assert (list(policy.t1), len(policy.t1)) == (["new"], 1)


def _init_after_a_write_in_clear(cls):
    """t1 = [a, b], t2 = [c]: a's __del__ inserts "new" into t1 while
    clear() releases t1's keys, then b's runs __init__ again."""
    RELEASE_LOG.clear()
    policy = cls(4)
    acts = {"a": lambda p: p.insert(Acting("new", p), ready(9), CTX), "b": lambda p: p.__init__(4)}
    for i, name in enumerate("abc"):
        policy.insert(Acting(name, policy, acts.get(name)), ready(i), CTX)
    policy.touch([Acting("c", policy)], CTX)
    gc.collect()
    RELEASE_LOG.clear()
    policy.clear()
    return [entry[0] for entry in RELEASE_LOG], keysnap(policy)


@pytest.mark.core_only
@pytest.mark.needs_vllm
def test_init_after_a_write_in_clear_releases_the_write_at_once(policy_cls):
    """The other half of that difference: "new" went to a new t1, which the
    nested __init__ replaces and releases at once; vLLM's "new" sits in the
    t1 being cleared, released once clear() lets go of it, after t2."""
    got = _init_after_a_write_in_clear(policy_cls)
    assert got[0] == ["a", "b", "new", "c"]
    assert got[1] == _init_after_a_write_in_clear(VllmARC)[1]
    assert _init_after_a_write_in_clear(VllmARC)[0] == ["a", "b", "c", "new"]


def _init_after(cls, call):
    """A key that `call` lets go of runs __init__ again from its __del__,
    after the call returned; "returned" marks where that __init__ returns."""

    def init(p):
        p.__init__(4)
        RELEASE_LOG.append(("returned",))

    if call == "evict":
        # capacity 1: evicting y trims x from b1; the caller holds y
        RELEASE_LOG.clear()
        policy = cls(1)
        policy.insert(Acting("x", policy, init), ready(0), CTX)
        assert [k.name for k, _ in policy.evict(1, ())] == ["x"]
        for name in ("y", "w"):
            policy.insert(Acting(name, policy), ready(0), CTX)
        gc.collect()
        RELEASE_LOG.clear()
        victims = policy.evict(1, ())
        assert [k.name for k, _ in victims] == ["y"]
        del victims
    else:
        policy = _full(cls, "b1-a" if call == "insert" else "t1-a", init)
        key = Acting("b1-a" if call == "insert" else "t1-a", None)
        if call == "insert":
            policy.insert(key, ready(1), CTX)
        elif call == "remove":
            policy.remove(key)
        elif call == "touch":
            policy.touch([key], CTX)
        else:
            policy.on_request_finished(((key,),), set(), {key}, CTX)
        del key
    gc.collect()
    return [entry[0] for entry in RELEASE_LOG], keysnap(policy)


_INIT_AFTER = {
    # the key the call let go of, then t1, t2, b1 and b2's in turn
    "insert": ["b1-a", "t1-a", "t1-b", "t2-a", "t2-b", "b2-a", "returned"],
    "remove": ["t1-a", "t1-b", "t2-a", "t2-b", "b1-a", "b2-a", "returned"],
    "touch": ["t1-a", "t1-b", "t2-a", "t2-b", "b1-a", "b2-a", "returned"],
    "on_request_finished": ["t1-a", "t1-b", "t2-a", "t2-b", "b1-a", "b2-a", "returned"],
    # the trimmed ghost, t1's w, then y, which the caller held
    "evict": ["x", "w", "returned", "y"],
}


@pytest.mark.core_only
@pytest.mark.parametrize("call", list(_INIT_AFTER))
def test_init_from_a_del_after_a_call_releases_the_old_lists_itself(policy_cls, call):
    """A key that a call let go of runs __init__ again from its __del__,
    after the call returned: that __init__ releases what only the old lists
    held before it returns, as when it is called from the top (rule 6)."""
    names, state = _init_after(policy_cls, call)
    assert names == _INIT_AFTER[call]
    assert state == keysnap(policy_cls(4))
