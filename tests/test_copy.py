"""Copying and pickling: the compiled core refuses (a clear TypeError,
MSG_NO_COPY), a documented divergence, from a callback too; vLLM's class
and the pure twin copy, the twin as vLLM's does.
"""

from __future__ import annotations

import copy

import pytest

from helpers import CTX, K, VllmARC, keysnap, load_policy_class, no_copy, ready
from hostile import hostile, populated, with_ghosts

pytestmark = [pytest.mark.gc_stress, pytest.mark.both_policies]


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
    if policy_cls.__module__.startswith("arc_cy._core."):
        with pytest.raises(TypeError) as info:
            do(policy)
        assert str(info.value) == no_copy(policy_cls)
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


@pytest.mark.needs_vllm
@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_the_twin_copies_as_vllms_class_does(how):
    """A shallow copy shares the lists, as vLLM's does; a deep one and a
    pickled one have their own."""
    import pickle

    do = {
        "copy": copy.copy,
        "deepcopy": copy.deepcopy,
        "pickle": lambda p: pickle.loads(pickle.dumps(p)),
    }[how]

    def run(cls):
        policy = populated(cls)
        made = do(policy)
        made.insert(K(60), ready(60), CTX)
        made.touch([K(2)], CTX)
        return keysnap(made), keysnap(policy)

    assert run(load_policy_class("python")) == run(VllmARC)


@pytest.mark.core_only
@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_a_copy_made_during_a_call_is_refused(policy_cls, how):
    """From a callback too (the twin once copied busy, so that a copy made
    there refused every mutator for ever, and shared the running call's
    lists)."""
    made = []

    def copy_once(*_):
        if not made:
            with pytest.raises(TypeError) as info:
                how(policy)
            made.append(str(info.value))

    policy = with_ghosts(policy_cls)
    assert len(policy.evict(1, hostile(set, __contains__=copy_once)())) == 1
    assert made == [no_copy(policy_cls)]
