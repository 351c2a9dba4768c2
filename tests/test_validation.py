"""Validation of arguments and failing user code. The compiled core checks
its arguments (n, chunk, key, target, capacity: its rules 11 and 12,
core_only): a bad one makes the call raise arc_cy's exception and change
nothing; so do its limits (the largest number of entries and capacity,
__init__ again with a bad capacity, the read-only capacity). The twin
checks nothing vLLM's ARC does not: on the same bad arguments it raises
what vLLM's raises, or goes on as vLLM's does. In both, a protected
container that raises changes nothing, and n beyond what is held is None.
"""

from __future__ import annotations

import ctypes
import inspect
import math

import pytest

from arc_cy import _messages
from arc_cy._core import arguments
from helpers import (
    CTX,
    ChunkStatus,
    K,
    VllmARC,
    filled,
    keysnap,
    load_policy_class,
    ready,
    snapshot,
)
from hostile import HostileError, after, hostile, populated, set_target, unchanged

pytestmark = [pytest.mark.gc_stress, pytest.mark.both_policies]

# --- bad arguments: same exception, same message, nothing changed ---------------


class Bitfield(ctypes.Structure):
    _fields_ = [("ref_cnt", ctypes.c_int32, 8)]


class Wide(ctypes.Structure):
    _fields_ = [("ref_cnt", ctypes.c_int64)]


class BigEndian(ctypes.BigEndianStructure):
    _fields_ = [("ref_cnt", ctypes.c_int32), ("chunk_id", ctypes.c_int64)]


BAD_CALLS = {
    "evict(-1)": (lambda p: p.evict(-1, ()), ValueError),
    "evict(1.5)": (lambda p: p.evict(1.5, ()), TypeError),
    "evict('2')": (lambda p: p.evict("2", ()), TypeError),
    "evict(None)": (lambda p: p.evict(None, set()), TypeError),
    "evict(protected=None)": (lambda p: p.evict(1, None), TypeError),
    "insert(object chunk)": (lambda p: p.insert(K(9), object(), CTX), TypeError),
    "insert(None chunk)": (lambda p: p.insert(K(9), None, CTX), TypeError),
    "insert(ChunkStatus type)": (lambda p: p.insert(K(9), ChunkStatus, CTX), TypeError),
    "insert(bitfield ref_cnt)": (lambda p: p.insert(K(9), Bitfield(), CTX), TypeError),
    "insert(int64 ref_cnt)": (lambda p: p.insert(K(9), Wide(), CTX), TypeError),
    "insert(big-endian)": (lambda p: p.insert(K(9), BigEndian(), CTX), TypeError),
    "insert(unhashable)": (lambda p: p.insert([K(9)], ready(9), CTX), TypeError),
    "insert(duplicate t1)": (lambda p: p.insert(K(4), ready(9), CTX), ValueError),
    "insert(duplicate t2)": (
        lambda p: p.insert(bytes(bytearray(K(3))), ready(9), CTX),
        ValueError,
    ),
    "get(unhashable)": (lambda p: p.get({}), TypeError),
    "remove(unhashable)": (lambda p: p.remove([1]), TypeError),
    "touch(unhashable)": (lambda p: p.touch([K(4), [1]], CTX), TypeError),
    "touch(None)": (lambda p: p.touch(None, CTX), TypeError),
    "on_store_miss(unhashable)": (lambda p: p.on_store_miss([K(0), {}], CTX), TypeError),
    "on_request_finished(unhashable)": (
        lambda p: p.on_request_finished(((K(4), [1]),), set(), {K(4)}, CTX),
        TypeError,
    ),
    "t1[unhashable]": (lambda p: p.t1[[1]], TypeError),
    "t1[missing]": (lambda p: p.t1[K(0)], KeyError),
    "target 'x'": (set_target("x"), TypeError),
    "target None": (set_target(None), TypeError),
    "target True": (set_target(True), TypeError),
    "target 1j": (set_target(1j), TypeError),
    "target nan": (set_target(math.nan), ValueError),
    "target inf": (set_target(math.inf), ValueError),
    "target -inf": (set_target(-math.inf), ValueError),
    "capacity -1": (lambda p: type(p)(-1), ValueError),
    "capacity 1.5": (lambda p: type(p)(1.5), TypeError),
    "capacity '3'": (lambda p: type(p)("3"), TypeError),
    "capacity None": (lambda p: type(p)(None), TypeError),
}


@pytest.mark.core_only
@pytest.mark.parametrize("case", BAD_CALLS)
def test_bad_arguments_raise_and_change_nothing(policy_cls, case):
    call, exc_type = BAD_CALLS[case]
    if case.startswith("target") and not hasattr(policy_cls(1), "target_t1_size"):
        exc_type = AttributeError  # ARC+ has none to set
    unchanged(populated(policy_cls), call, exc_type)


def _outcome(cls, call):
    """What call does to a populated policy of cls: its exception (type and
    message) or "ok", and the lists and target after."""
    policy = populated(cls)
    try:
        call(policy)
    except Exception as exc:
        return (type(exc).__name__, str(exc)), keysnap(policy)
    return "ok", keysnap(policy)


@pytest.mark.needs_vllm
@pytest.mark.parametrize("case", BAD_CALLS)
def test_the_twin_takes_bad_arguments_as_vllms_arc_does(case):
    """vLLM's exposure: what vLLM's ARC raises, the twin raises, with the
    same message, and what vLLM's accepts (a negative n, a duplicate key, a
    chunk of any type, any target or capacity), the twin accepts, to the
    same state."""
    call, _ = BAD_CALLS[case]
    assert _outcome(load_policy_class("python"), call) == _outcome(VllmARC, call)


class BigEndianChunk(ctypes.BigEndianStructure):
    _fields_ = [("ref_cnt", ctypes.c_int32)]


@pytest.mark.parametrize(
    "call,exc",
    [
        (lambda p: p.evict(-1, set()), ValueError),
        (lambda p: p.evict(1.0, set()), TypeError),
        (lambda p: p.evict("1", set()), TypeError),
        (lambda p: p.insert(b"b", ready(5), CTX), ValueError),
        (lambda p: p.insert(b"c", ready(5), CTX), ValueError),
        (lambda p: p.insert(b"z", object(), CTX), TypeError),
        (lambda p: p.insert(b"z", BigEndianChunk(0), CTX), TypeError),
        (lambda p: p.insert(b"z", ctypes.c_int32(0), CTX), TypeError),
        (lambda p: p.insert([1], ready(5), CTX), TypeError),
        (lambda p: p.get([1]), TypeError),
        (lambda p: p.touch([b"a", [1]], CTX), TypeError),
        (lambda p: p.on_store_miss([b"b1", {}], CTX), TypeError),
        (lambda p: p.remove({}), TypeError),
        # ARC's target: ARC+ has none (test_bad_arguments_raise_and_change_nothing)
        *[
            pytest.param(call, exc, marks=pytest.mark.arc_only)
            for call, exc in [
                (lambda p: setattr(p, "target_t1_size", "1"), TypeError),
                (lambda p: setattr(p, "target_t1_size", float("nan")), ValueError),
                (lambda p: setattr(p, "target_t1_size", float("inf")), ValueError),
                (lambda p: setattr(p, "target_t1_size", True), TypeError),
            ]
        ],
    ],
)
@pytest.mark.core_only
def test_bad_input_raises_and_changes_nothing(policy_cls, call, exc):
    policy, _ = filled(policy_cls, 4, t1=[b"a", b"b"], t2=[b"c"])
    policy.evict(1, set())
    unchanged(policy, call, exc)


@pytest.mark.core_only
@pytest.mark.parametrize("capacity,exc", [(-1, ValueError), (2.0, TypeError), ("3", TypeError)])
def test_bad_capacity(policy_cls, capacity, exc):
    with pytest.raises(exc):
        policy_cls(capacity)


@pytest.mark.core_only  # the twin's cache_capacity is vLLM's attribute
def test_capacity_is_read_only(policy_cls):
    policy = policy_cls(3)
    assert policy.cache_capacity == 3
    with pytest.raises(AttributeError):
        policy.cache_capacity = 5


@pytest.mark.core_only
def test_init_again_with_bad_capacity_changes_nothing(policy_cls):
    policy = populated(policy_cls)
    policy._max_entries = 50
    for bad, exc in ((-1, ValueError), ("3", TypeError), (None, TypeError)):
        unchanged(policy, lambda p, bad=bad: p.__init__(bad), exc)
        assert (policy._max_entries, policy.cache_capacity) == (50, 3)


# --- protected containers that raise --------------------------------------------


@pytest.mark.parametrize("calls", [0, 1, 2, 3])
def test_protected_raising(policy_cls, calls):
    raising = hostile(set, __contains__=after(calls, HostileError))()
    unchanged(populated(policy_cls), lambda p: p.evict(4, raising), HostileError)


# --- limits ---------------------------------------------------------------------


@pytest.mark.core_only  # the core's node array: int32 indices
def test_entry_limit(policy_cls):
    assert arguments.MAX_ENTRIES == 2**29
    policy = policy_cls(10)
    assert policy._max_entries == arguments.MAX_ENTRIES
    policy._max_entries = 4
    for i in range(4):
        policy.insert(K(i), ready(i), CTX)
    assert len(policy.evict(2, ())) == 2  # b1 = [0, 1]: ghosts count
    before = snapshot(policy)
    with pytest.raises(MemoryError) as info:
        policy.insert(K(9), ready(9), CTX)
    assert str(info.value) == _messages.MSG_FULL.format(4)
    assert snapshot(policy) == before
    policy.insert(K(0), ready(10), CTX)  # a ghost's entry is reused
    policy.remove(K(2))
    policy.insert(K(9), ready(9), CTX)
    policy._check_invariants()
    with pytest.raises(ValueError):
        policy._max_entries = arguments.MAX_ENTRIES + 1


@pytest.mark.parametrize("n", [10**30, 2**40, 5])
def test_evict_more_than_held_returns_none(policy_cls, n):
    """n above the resident count is None at once, with no scratch sized
    by n (a mutant without the core's early exit once survived)."""
    policy = populated(policy_cls)  # 4 resident
    assert unchanged_result(policy, lambda p: p.evict(n, set())) is None


@pytest.mark.needs_vllm
@pytest.mark.parametrize("n", [10**30, 2**40, 5])
def test_vllms_evict_more_than_held_returns_none(n):
    assert populated(VllmARC).evict(n, set()) is None


def unchanged_result(policy, call):
    before = snapshot(policy)
    result = call(policy)
    assert snapshot(policy) == before
    policy._check_invariants()
    return result


# --- the interface's own errors: Python's (the core's rule 12) -------------------


def _interface(cls):
    """Every public method that takes arguments (by the twin's signatures:
    the core's methods have none) and every property of the core's class,
    __init__ included, enumerated: (name, whether the property can be set,
    or None for a method)."""
    twin = load_policy_class("python")
    for name in sorted(dir(cls)):
        if name.startswith("_") and name != "__init__":
            continue
        attr = inspect.getattr_static(cls, name)
        if inspect.isdatadescriptor(attr) and not inspect.isroutine(attr):
            policy = cls(3)
            if not hasattr(policy, name):
                continue  # the other policy's (ARC+'s fates on ARC, ARC's target on ARC+)
            try:
                setattr(policy, name, getattr(policy, name))
            except AttributeError:
                yield name, False
            else:
                yield name, True
        elif callable(attr):
            params = list(inspect.signature(getattr(twin, name)).parameters.values())[1:]
            if any(p.default is p.empty for p in params):
                yield name, None


def _interface_errors(policy, interface):
    out = {}
    for name, settable in interface:
        calls = {}
        if settable is not None:
            calls["set"] = lambda name=name: setattr(policy, name, getattr(policy, name))
            calls["del"] = lambda name=name: delattr(policy, name)
        else:
            calls["no arguments"] = getattr(policy, name)
        for how, call in calls.items():
            try:
                call()
            except Exception as exc:
                out[name, how] = (type(exc).__name__, str(exc))
            else:
                out[name, how] = "ok"
    return out


@pytest.mark.compiled
def test_the_interfaces_own_errors_are_pythons():
    """Missing arguments and read-only (or undeletable) attributes: the core
    said "attribute ... of 'arc_cy._core.arc.ARCCore' objects is not writable"
    and, for del, NotImplementedError: __del__; Cython's argument errors
    read otherwise than Python's. Every method called with no arguments
    raises what the twin's method (Python's) raises, and every property set
    and deleted what a Python property of the same name and accessors
    raises, nothing changed."""
    core = load_policy_class("cython")
    interface = list(_interface(core))
    names = dict(interface)
    assert {"insert", "evict", "target_t1_size", "cache_capacity", "t1"} <= set(names)
    assert names["target_t1_size"] and not names["cache_capacity"]
    policy = populated(core)
    before = snapshot(policy)
    ours = _interface_errors(policy, interface)
    assert snapshot(policy) == before
    # Python's: the twin's methods, and properties of a Python class
    twin = populated(load_policy_class("python"))
    props = {
        name: property(lambda self: 0, (lambda self, v: None) if settable else None)
        for name, settable in interface
        if settable is not None
    }
    python = type(core.__name__, (), props)()
    pythons = _interface_errors(twin, [(n, s) for n, s in interface if s is None])
    pythons.update(_interface_errors(python, [(n, s) for n, s in interface if s is not None]))
    assert ours == pythons
    assert ours["target_t1_size", "del"][0] == "AttributeError"
    assert ours["insert", "no arguments"][0] == "TypeError"
    assert "ARCCore" not in repr(ours)


@pytest.mark.core_only
def test_a_capacity_above_the_maximum_is_refused(policy_cls):
    """The most entries one policy holds, 2**29, make the largest capacity
    2**29 // 3 (the two ghost lists and t1 + t2 each up to capacity). A
    larger one was accepted and failed at the 2**29th entry."""
    assert arguments.MAX_CAPACITY == 178_956_970 == arguments.MAX_ENTRIES // 3
    assert policy_cls(arguments.MAX_CAPACITY).cache_capacity == arguments.MAX_CAPACITY
    for bad in (arguments.MAX_CAPACITY + 1, 2**63, 10**30):
        with pytest.raises(ValueError) as info:
            policy_cls(bad)
        assert str(info.value) == _messages.MSG_CAPACITY_MAX.format(arguments.MAX_CAPACITY, bad)
        assert "178956970" in str(info.value)
    policy = populated(policy_cls)
    unchanged(policy, lambda p: p.__init__(arguments.MAX_CAPACITY + 1), ValueError)
