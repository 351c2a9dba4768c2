"""Copying and pickling: the compiled core refuses (a clear TypeError,
MSG_NO_COPY), a documented divergence; vLLM's class and the pure twin
copy, and a copy made while a call runs is not busy.
"""

from __future__ import annotations

import copy

import pytest

from arc_cy import _messages
from helpers import CTX, K, VllmARC, keysnap, ready
from hostile import populated, with_ghosts

pytestmark = pytest.mark.gc_stress


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_copy_and_pickle(policy_cls, how):
    """Documented: the compiled core refuses to be copied or
    pickled (a clear TypeError); vLLM's class and the twin copy."""
    import pickle

    do = {
        "copy": copy.copy,
        "deepcopy": copy.deepcopy,
        "pickle": lambda p: pickle.loads(pickle.dumps(p)),
    }[how]
    policy = populated(policy_cls)
    if policy_cls.__module__.endswith("_arc_c"):
        with pytest.raises(TypeError) as info:
            do(policy)
        assert str(info.value) == _messages.MSG_NO_COPY.format("ARCCachePolicy")
    else:
        twin = do(policy)
        assert keysnap(twin)[:4] == keysnap(policy)[:4]


@pytest.mark.needs_vllm
@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_vllms_policy_copies(how):
    import pickle

    do = {
        "copy": copy.copy,
        "deepcopy": copy.deepcopy,
        "pickle": lambda p: pickle.loads(pickle.dumps(p)),
    }[how]
    do(populated(VllmARC))  # vLLM's copies


def test_a_copy_made_during_a_call_is_not_busy(policy_cls):
    """The twin's __getstate__ copied busy, so a copy made from a
    callback refused every mutator for ever. The core refuses copies."""
    copies = []

    class Copying(set):
        def __contains__(self, key):
            if not copies:
                try:
                    copies.append(copy.deepcopy(policy))
                except TypeError as exc:
                    copies.append(exc)
            return False

    policy = with_ghosts(policy_cls)
    assert len(policy.evict(1, Copying())) == 1
    (made,) = copies
    if policy_cls.__module__.endswith("_arc_c"):
        assert str(made) == _messages.MSG_NO_COPY.format("ARCCachePolicy")
        return
    made.insert(K(60), ready(60), CTX)
    assert made.evict(1, set()) is not None
    made._check_invariants()
    assert K(60) not in policy.t1


def test_a_shallow_copy_of_a_running_policy_is_independent(policy_cls):
    """copy.copy() from inside evict() shared the twin's OrderedDicts:
    mutating through the copy left a victim in b1 that the running evict()
    never returned. A copy of a running policy, shallow or deep, is now
    independent of it (the core refuses copies)."""

    def run(cls, copying):
        made = []

        class Copying(set):
            def __contains__(self, key):
                if copying and not made:
                    try:
                        made.append(copying(policy))
                    except TypeError as exc:
                        made.append(exc)
                        return False
                    other = made[0]
                    other.insert(K(60), ready(60), CTX)
                    other.remove(K(5))
                    assert [k for k, _ in other.evict(1, set())] == [K(4)]
                    other._check_invariants()
                return False

        policy = with_ghosts(cls)
        result = policy.evict(2, Copying())
        policy._check_invariants()
        return [k for k, _ in result], keysnap(policy)[:4], made

    clean = run(policy_cls, None)[:2]
    for how in (copy.copy, copy.deepcopy):
        *got, made = run(policy_cls, how)
        assert got == list(clean)
        if policy_cls.__module__.endswith("_arc_c"):
            assert str(made[0]) == _messages.MSG_NO_COPY.format("ARCCachePolicy")
        else:
            assert list(made[0].t1) == [K(60)] and K(60) not in got[1][0]
