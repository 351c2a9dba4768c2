"""The lists t1, t2, b1 and b2: ordered mappings, LRU first, whose
iterators go on while their list does not change and raise RuntimeError
once it has; a move that changes nothing (OrderedDict.move_to_end to the
end an entry already sits at) is not a change, as in vLLM. The core's are
read-only views whose iterators say MSG_MUTATED ("ARC list changed during
iteration"), also once __init__ replaced the list, and cannot be built or
re-stated from Python (its rules 3 and 9: core_only); the twin's are its
OrderedDicts, as vLLM's.
"""

from __future__ import annotations

import pytest

from childproc import run_json
from helpers import CTX, ChunkStatus, K, filled, keysnap, oracle, ready
from hostile import MUTATIONS, core_only_params, populated

pytestmark = [pytest.mark.gc_stress, pytest.mark.both_policies]


def test_lists_are_ordered_mappings(policy_cls):
    policy, chunks = filled(policy_cls, 10, t1=[b"a", b"b"], t2=[b"c"])
    t1 = policy.t1
    assert len(t1) == 2 and b"a" in t1 and b"c" not in t1
    assert list(t1.keys()) == [b"a", b"b"]
    assert list(t1.items()) == [(b"a", chunks[b"a"]), (b"b", chunks[b"b"])]
    assert t1[b"a"] is chunks[b"a"]
    assert t1.get(b"zz") is None
    with pytest.raises(KeyError):
        t1[b"c"]
    assert policy.evict(1, set()) == [(b"a", chunks[b"a"])]
    assert list(policy.b1.items()) == [(b"a", None)]
    assert policy.b1[b"a"] is None and b"a" not in policy.t1


@pytest.mark.core_only
def test_the_cores_views_are_read_only(policy_cls):
    policy, chunks = filled(policy_cls, 10, t1=[b"a", b"b"], t2=[b"c"])
    with pytest.raises(TypeError):
        policy.t1[b"x"] = chunks[b"a"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        policy.t1 = {}
    assert list(policy.t1) == [b"a", b"b"]


# __init__ replaces the lists: the twin's old OrderedDict iterates on, as
# vLLM's; the core's view refuses.
@pytest.mark.parametrize("mutation", core_only_params(MUTATIONS, {"__init__"}))
@pytest.mark.parametrize("view", ["t1", "b1"])
def test_iterating_a_view_while_the_policy_changes(policy_cls, view, mutation):
    policy = populated(policy_cls)
    it = iter(getattr(policy, view).items())
    first = next(it)
    before = keysnap(policy)
    MUTATIONS[mutation](policy)
    if (
        getattr(policy, view)
        and keysnap(policy)[view == "b1" and 2 or 0] == before[view == "b1" and 2 or 0]
    ):
        # this list did not change: the iterator goes on
        rest = list(it)
        assert [first, *rest] == list(getattr(policy, view).items())
    else:
        with pytest.raises(RuntimeError, match="during iteration"):
            next(it)
    policy._check_invariants()


def test_iterating_a_view_after_clear(policy_cls):
    policy = populated(policy_cls)
    its = [iter(policy.t1), iter(policy.t1.values()), iter(policy.b1.items())]
    for it in its:
        next(it)
    policy.clear()
    for it in its:
        with pytest.raises(RuntimeError, match="during iteration"):
            next(it)
    assert (len(policy.t1), list(policy.b1)) == (0, [])


def _iterator_after(cls, view, act):
    policy = cls(6)
    for i in range(6):
        policy.insert(K(i), ready(i), CTX)
    assert len(policy.evict(2, ())) == 2  # b1 = [0, 1], t1 = [2, 3, 4, 5]
    policy.touch([K(3), K(4)], CTX)  # t1 = [2, 5], t2 = [4, 3]
    policy.insert(K(6), ChunkStatus(6), CTX)  # pending: t1 = [2, 5, 6]
    it = iter(getattr(policy, view))
    first = next(it)
    act(policy)
    try:
        return "continues", [first, *it]
    except RuntimeError:
        return "raised", None


NO_OP_MOVES = {
    "touch t2's MRU": ("t2", lambda p: p.touch([K(3)], CTX)),
    "reused t2's MRU": ("t2", lambda p: p.on_request_finished(((K(3),),), set(), {K(3)}, CTX)),
    "inserted-only t1's MRU": (
        "t1",
        lambda p: p.on_request_finished(((K(6),),), {K(6)}, set(), CTX),
    ),
    "ghost hit at b1's MRU": ("b1", lambda p: p.on_store_miss([K(1)], CTX)),
    # vLLM pops the pending chunk and stores it again: a change
    "touch a pending t1 MRU": ("t1", lambda p: p.touch([K(6)], CTX)),
    "touch t2's LRU": ("t2", lambda p: p.touch([K(4)], CTX)),
}


@pytest.mark.needs_vllm
@pytest.mark.parametrize("case", NO_OP_MOVES)
def test_iterator_survives_moves_that_change_nothing(policy_cls, case):
    """The core counted moving an entry to the end it already sits
    at as a change; OrderedDict's move_to_end does not."""
    view, act = NO_OP_MOVES[case]
    got = _iterator_after(policy_cls, view, act)
    assert got == _iterator_after(oracle(policy_cls), view, act)
    raises = case.startswith(("touch a pending", "touch t2's LRU"))
    assert got[0] == ("raised" if raises else "continues")


# --- iterators cannot be built or re-stated from Python --------------------------


@pytest.mark.core_only
def test_a_views_iterator_cannot_be_built_or_re_stated(impl):
    """type(iter(view)).__new__ made an iterator with no core, and
    __setstate__ (Cython's auto-pickling) set any node index or list number:
    both crashed. Now __new__ is refused or builds a working iterator,
    there is no __setstate__, pickling is refused, and the live iterator
    goes on (tests/progs/surface.py, in a child process)."""
    out = run_json("surface.py", "iterators", impl, "--no-vllm")
    assert out["new"] == "TypeError" or out.get("new_next") in ("ok", "StopIteration"), out
    assert out["setstate"] == "absent", out
    assert out["pickle"] == out["reduce_ex"] == "TypeError", out
    assert out["rest"] == [K(i).decode() for i in range(1, 6)]
