"""The garbage collector: a collection may start at any allocation a call
makes, and user code (a gc.callbacks hook, the __del__ of a garbage cycle)
then runs in the middle of the call. No list or tuple with NULL items, no
half-made entry and no working storage is ever where such code can find it
(the core's tp_traverse included), and a hook that changes the policy or
empties the lists it finds leaves the core consistent and in agreement
with vLLM's ARC: the core's rules 3, 4, 9 and 13 (core_only), its memory
safety; the twin, vLLM's code, is exposed as vLLM's is. Reference cycles
through a policy are collected, in both.

Crash reproductions run a program of tests/progs/ in a child process
(tests/childproc.py). GC stress mode (ARC_CY_GC_STRESS=1, conftest) runs
the hostile-input modules with a collection at every allocation.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from arc_cy import _messages
from childproc import run_json, run_prog
from helpers import CTX, is_plus, ready
from hostile import Key

pytestmark = [pytest.mark.gc_stress, pytest.mark.both_policies]

# --- a collection while a call holds its working storage ------------------------


@pytest.mark.core_only
@pytest.mark.arc_only  # ARC's target arithmetic starts the collection: ARC+ has none
def test_gc_during_touch_sees_no_null_items(impl):
    """A collection while touch() holds a list of the caller's keys (a
    Fraction target's arithmetic allocates): a hook that copies every
    7-item list sees no NULL item (tests/progs/gc_during_touch.py)."""
    proc = run_prog("gc_during_touch.py", impl, "--no-vllm")
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.strip() == "survived"


# The cases of tests/progs/working_storage.py (its REACH_CALLS and EMPTIED).
REACH_CALLS = ["touch", "on_store_miss", "on_request_finished", "touch-after-ghost-hit"]


@pytest.mark.core_only
@pytest.mark.needs_vllm
@pytest.mark.parametrize("how", REACH_CALLS)
def test_key_callbacks_cannot_reach_the_working_storage(impl, how):
    """touch, on_store_miss and on_request_finished must keep no copy of
    the keys where key callbacks can find it: a callback that finds such a
    list with gc.get_referrers and clears it leaves the call ending in
    vLLM's state (its ARC, run first with nothing armed, is the oracle)."""
    proc = run_prog("working_storage.py", impl, "reach", how)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.startswith("as vLLM:"), proc.stdout


EMPTIED = ["evict", "touch"]


@pytest.mark.core_only
@pytest.mark.needs_vllm
@pytest.mark.parametrize("how", EMPTIED)
def test_gc_hook_cannot_empty_the_working_storage(impl, how):
    """A gc.callbacks hook that empties every list shaped like working
    storage (n Nones, (key, chunk) pairs, keys) while evict() or touch()
    runs: no crash, and vLLM's state and result."""
    proc = run_prog("working_storage.py", impl, "emptied", how)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.startswith("as vLLM:"), proc.stdout


# --- a collection that changes the policy or reads young objects ----------------


VIEW_CHANGES = ("remove", "clear", "__init__", "insert")


@pytest.mark.core_only
@pytest.mark.parametrize("source", ["hook", "cycle"])
@pytest.mark.parametrize("view", ["t1", "b1"])
def test_view_iterator_and_a_collection_that_changes_the_policy(impl, view, source):
    """The core's iterator took a node pointer, then made the pair,
    whose allocation may start a collection; a gc.callbacks hook or a
    garbage cycle's __del__ that called remove(), clear() or __init__ left
    it reading freed nodes. The items read so far, in the list's order,
    then MSG_MUTATED if the list changed."""
    got = run_json("view_iter_gc.py", impl, view, source, *VIEW_CHANGES, "--no-vllm")
    for how in VIEW_CHANGES:
        read = got[how]["got"]
        assert len(read) >= 3 and read == got[how]["before"][: len(read)], how
        changed = not (view == "b1" and how in ("remove", "insert"))
        assert got[how]["ending"] == (_messages.MSG_MUTATED if changed else "end"), how


TUPLE_READER_CALLS = ("evict", "touch", "on_store_miss", "on_request_finished")


@pytest.mark.needs_vllm
def test_gc_hook_reading_young_tuples():
    """The twin built its working storage with tuple(<generator>):
    a tracked tuple with NULL items while user code ran; a gc hook that
    read it crashed. Both implementations, and vLLM, survive alike."""
    got = run_json("tuple_reader_gc.py", *TUPLE_READER_CALLS)
    for call in TUPLE_READER_CALLS:
        assert got[call] == dict.fromkeys(got[call], got[call]["vllm"]), call


# --- reference cycles -----------------------------------------------------------


def test_reference_cycle_through_a_key_is_collected(policy_cls):
    """A key (or chunk) that refers back to its policy forms a cycle that
    the garbage collector must be able to break."""
    policy = policy_cls(4)
    key = Key("cycle")
    key.policy = policy
    policy.insert(key, ready(1), CTX)
    del key
    ref = weakref.ref(policy)
    del policy
    gc.collect()
    assert ref() is None


# --- what a callback finds through gc.get_referrers ----------------------------


@pytest.mark.core_only
def test_nothing_found_through_get_referrers_can_be_re_stated(impl):
    """During evict()'s scan, protected.__contains__ re-states every object
    of arc_cy's types that refers to the policy (the scan's cursors were
    such objects, with Cython's __setstate__: a raw node index). None is
    internal state, none takes a state, and the scan ends as it would."""
    out = run_json("surface.py", "referrers", impl, "--no-vllm")
    assert set(out["found"]) <= {"ListView"}, out
    assert "ok" not in out["tried"], out
    clean = run_json("surface.py", "referrers", impl.replace("cython", "python"), "--no-vllm")
    assert out["evicted"] == clean["evicted"] and len(out["evicted"]) == 30


@pytest.mark.core_only
def test_methods_refuse_an_object_of_another_type(impl):
    """Every method and property of every type the module defines, and of
    the views and iterators it hands out, called through its class on an
    object(), a list and the twin's policy, crashes nothing, and both
    policies are intact after. Cython's binding methods did not check their
    object and read it as a core (a segfault): the core's methods refuse
    every one with TypeError."""
    out = run_json("wrong_self.py", impl, "--no-vllm")
    # ARCCore, ARCCachePolicy, _ListIter, ListView and the items generator
    assert out["types"] >= 5, out
    assert out["own TypeError"] >= 250 and set(out) == {
        "types",
        "own TypeError",
        "shared TypeError",
        "shared AttributeError",
        "shared returned",
    }, out


# --- objects the collector cleared -----------------------------------------------


@pytest.mark.core_only
def test_objects_the_collector_cleared_refuse_or_were_not_cleared(impl):
    """Rule 13: a finalizer that runs late in a collection
    (tests/progs/cleared_by_gc.py) uses a policy and a view iterator that
    the collector has cleared. The core's objects cannot be cleared to
    None (Cython's generated tp_clear would leave next() reading None as a
    core, and insert() reading None as the chunk-type cache): the iterator
    keeps its core, the core its scalars, and the core's clear drops only
    its entries (the iterator then refuses: the lists changed)."""
    got = run_json("cleared_by_gc.py", impl, "--no-vllm")
    assert got.pop("seen") == [True, True], got
    assert got == {
        "iter refers to its policy": True,
        "next": ["raised", "RuntimeError", _messages.MSG_MUTATED],
        "cache_capacity": ["returned", "8"],
        "target_t1_size": (
            ["raised", "AttributeError", _messages.MSG_PLUS_NO_TARGET]
            if is_plus(impl)
            else ["returned", "0.0"]
        ),
        "get": ["returned", "None"],
        "insert": ["returned", "None"],
        "evict": ["returned", "1"],
        "t1": ["returned", "[]"],
        "check": ["returned", "None"],
    }, got
