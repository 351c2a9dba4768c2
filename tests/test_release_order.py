"""Release: when the policy lets go of keys and chunks. What a call drops
is released once it has returned (the core's rule 6, core_only): clear()
and __init__ called again take every entry out, and reset what they reset,
before they let go of any, all at once, so a released key's or chunk's
__del__ finds an empty, consistent policy that runs no call, and may call
it; a call that a __del__ makes after any other call finds the old lists
released. The twin, vLLM's code, releases as vLLM does, and refuses a
mutating call from such a __del__ while its own call runs.
"""

from __future__ import annotations

import gc

import pytest

from arc_cy._core import arguments
from helpers import CTX, ChunkStatus, VllmARC, keysnap, ready
from hostile import populated

pytestmark = pytest.mark.gc_stress

RELEASE_LOG: list = []


@pytest.mark.core_only
def test_init_again_resets_the_entry_limit(policy_cls):
    """The core's _max_entries, which vLLM's class does not have."""
    policy = populated(policy_cls)
    policy._max_entries = 10
    policy.__init__(7)
    assert (policy._max_entries, policy.cache_capacity) == (arguments.MAX_ENTRIES, 7)
    policy._check_invariants()


class Acting:
    """A key whose __del__ logs what it sees of the policy (the sizes of t1,
    t2, b1 and b2, the target, whether _check_invariants() passes), then
    runs act(policy) once."""

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
        sizes = (len(p.t1), len(p.t2), len(p.b1), len(p.b2))
        RELEASE_LOG.append((self.name, sizes, p.target_t1_size, _checked(p)))
        act, self.act = self.act, None
        if act is not None:
            act(p)


def _checked(policy):
    """Whether policy runs no call and is consistent: "ok", else why not."""
    try:
        policy._check_invariants()
    except AssertionError as exc:
        return str(exc)
    return "ok"


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


RELEASE_ACTS = {
    "insert": lambda p: p.insert(Acting("new", None), ready(9), CTX),
    "evict": lambda p: p.evict(1, ()),
    "clear": lambda p: p.clear(),
    "__init__": lambda p: p.__init__(4),
    "target": lambda p: setattr(p, "target_t1_size", 3),
}
ALL = ["t1-a", "t1-b", "t2-a", "t2-b", "b1-a", "b2-a"]


@pytest.mark.core_only
@pytest.mark.parametrize("act", [None, *RELEASE_ACTS])
@pytest.mark.parametrize("how", ["clear", "__init__"])
def test_a_release_finds_the_policy_empty_and_free(policy_cls, how, act):
    """clear() and __init__ again take every entry out and reset the target
    before they let go of any (rule 6): each released key's __del__ finds an
    empty, consistent policy that runs no call, and the mutator one of them
    calls (t1-a's) is accepted; what it did stays (its target too, where
    vLLM's clear() resets the target after the lists)."""
    policy = _full(policy_cls, act=RELEASE_ACTS.get(act))
    policy.clear() if how == "clear" else policy.__init__(4)
    seen = list(RELEASE_LOG)
    assert sorted(entry[0] for entry in seen) == sorted(ALL)
    assert all(entry[3] == "ok" for entry in seen), seen
    acted = [entry[0] for entry in seen].index("t1-a")
    assert all(entry[1:3] == ((0, 0, 0, 0), 0.0) for entry in seen[: acted + 1]), seen
    t1 = [k.name for k in policy.t1]
    assert (t1, len(policy.t2), len(policy.b1), len(policy.b2)) == (
        (["new"] if act == "insert" else [], 0, 0, 0)
    )
    assert policy.target_t1_size == (3 if act == "target" else 0.0)
    policy._check_invariants()


def _insert_from_a_chunk_del(cls, which):
    """Clear a policy whose first chunk in list `which` (t1 or t2) inserts
    "new" from its __del__, while clear() releases it."""
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
    """Every list is taken out whole before anything is released, so a
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
    clear() releases, then b's runs __init__ again."""
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
def test_init_after_a_write_in_clear_releases_the_write(policy_cls):
    """The write, "new", went to the emptied t1, and the __init__ that a
    later key's __del__ runs releases it with the rest: the policy ends
    empty (as vLLM's, whose "new" sits in the t1 being cleared until
    clear() lets go of it)."""
    names, state = _init_after_a_write_in_clear(policy_cls)
    assert sorted(names) == ["a", "b", "c", "new"]
    assert state == keysnap(policy_cls(4))


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
