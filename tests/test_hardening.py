"""Defects found by the second hardening review (ASan, UBSan, hostile input).

Each test failed on the core before its fix; they run on both
implementations. Crash reproductions run in a child process, so that a
segfault fails the test instead of killing pytest.
"""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import weakref

import pytest
from helpers import ReqContext, VllmARC, snapshot
from test_hostile import DEL_LOG, K, CallbackKey, ready

from arc_cy import _common

CTX = ReqContext(req_id="hardening")
TESTS = os.path.dirname(os.path.abspath(__file__))


def run_child(impl: str, body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, {tests!r})
        from conftest import load_policy_class
        cls = load_policy_class({impl!r})
        """
    ).format(tests=TESTS, impl=impl) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120
    )


# --- 1. a collection while touch() holds a list with NULL items --------------

GC_DURING_TOUCH = """
    import gc
    from fractions import Fraction

    def chunk(i):
        from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
        c = ChunkStatus(i)
        c.ref_cnt = 0
        return c

    K = lambda i: b"key-%d" % i
    p = cls(4)
    for i in range(4):
        p.insert(K(i), chunk(i), None)
    assert len(p.evict(2, ())) == 2          # b1 = [0, 1]
    p.insert(K(4), chunk(4), None)
    p.target_t1_size = Fraction(1, 3)        # _adapt runs Python arithmetic
    copies = []

    def copy_7_item_lists(phase, info):
        if phase == "start":
            for o in gc.get_objects():
                if type(o) is list and len(o) == 7:
                    copies.append(o[:])

    gc.callbacks.append(copy_7_item_lists)
    gc.set_threshold(1)
    # 7 keys, processed last to first: K(0) is the ghost hit.
    p.touch([K(0), K(2), K(3), K(4), K(5), K(6), K(7)], None)
    gc.set_threshold(700)
    gc.callbacks.clear()
    p._check_invariants()
    assert p.target_t1_size == Fraction(4, 3), p.target_t1_size
    assert copies
    print("survived")
"""


def test_gc_during_touch_sees_no_null_items(impl):
    proc = run_child(impl, GC_DURING_TOUCH)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.strip() == "survived"


# --- 2. ref_cnt is read through the chunk's current type and bounds ---------


class Big(ctypes.Structure):
    # 44 bytes: the buffer lives on the heap, not inside the object.
    _fields_ = [("pad", ctypes.c_char * 40), ("ref_cnt", ctypes.c_int32)]


class Small(ctypes.Structure):
    _fields_ = [("ref_cnt", ctypes.c_int32), ("pad", ctypes.c_char * 20)]


def _shrunk_chunk_evict(cls, resize):
    policy = cls(4)
    chunk = Big()
    chunk.ref_cnt = 0                  # offset 40: evictable for Big
    ctypes.memset(ctypes.addressof(chunk), 1, 4)  # offset 0, for Small: pinned
    policy.insert(K(1), chunk, CTX)
    chunk.__class__ = Small
    if resize:
        ctypes.resize(chunk, ctypes.sizeof(Small))
    assert ctypes.sizeof(chunk) == (24 if resize else 44)
    return policy.evict(1, ()), snapshot(policy)


@pytest.mark.parametrize("resize", [False, True], ids=["class", "class+resize"])
def test_ref_cnt_follows_the_chunks_current_type(policy_cls, resize):
    """vLLM reads chunk.ref_cnt through the chunk's type at that moment;
    the core read the offset it cached at insert(), past a shrunk buffer."""
    result, _ = _shrunk_chunk_evict(policy_cls, resize)
    assert result is None  # pinned, read at Small's offset
    oracle, _ = _shrunk_chunk_evict(VllmARC, resize)
    assert oracle is None


def test_ref_cnt_outside_the_buffer_is_refused(policy_cls):
    """A class whose ref_cnt lies past the instance's buffer (a smaller
    chunk given a larger class): a clear error, nothing changes."""
    policy = policy_cls(4)
    chunk = Small()
    policy.insert(K(1), chunk, CTX)
    policy.insert(K(2), ready(2), CTX)
    chunk.__class__ = Big
    before = snapshot(policy)
    for call in (lambda: policy.evict(1, ()), lambda: policy.touch([K(1)], CTX)):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == _common.MSG_CHUNK_SIZE.format("Big", 24, 40)
        assert snapshot(policy) == before
    policy._check_invariants()
    chunk.__class__ = Small
    chunk.ref_cnt = 0
    assert [k for k, _ in policy.evict(2, ())] == [K(1), K(2)]


# --- 3. a packed ref_cnt (misaligned; UBSan checks the load) -----------------


class Packed(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("flag", ctypes.c_char), ("ref_cnt", ctypes.c_int32)]


def test_packed_ref_cnt(policy_cls):
    policy = policy_cls(4)
    a, b = Packed(b"a", 1), Packed(b"b", 0)
    assert Packed.ref_cnt.offset == 1
    policy.insert(K(1), a, CTX)
    policy.insert(K(2), b, CTX)
    assert policy.evict(1, ()) == [(K(2), b)]
    assert policy.evict(1, ()) is None
    a.ref_cnt = 0
    assert policy.evict(1, ()) == [(K(1), a)]


# --- 4. keys whose __eq__ is not transitive ---------------------------------


class NT:
    """X and Y are unequal, Z equals both; all share one hash."""

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return 12345

    def __eq__(self, other):
        return self.name == other.name or "Z" in (self.name, other.name)

    def __repr__(self):
        return self.name


def test_non_transitive_insert_finds_t1_first(policy_cls):
    X, Y, Z = NT("X"), NT("Y"), NT("Z")
    policy = policy_cls(4)
    policy.insert(X, ready(1), CTX)
    assert [k for k, _ in policy.evict(1, ())] == [X]
    policy.insert(Y, ready(2), CTX)
    before = snapshot(policy)
    with pytest.raises(ValueError) as info:
        policy.insert(Z, ready(3), CTX)
    assert str(info.value) == _common.MSG_DUPLICATE.format(Z, "t1")
    assert snapshot(policy) == before
    policy._check_invariants()


def _x_in_t2_y_in_t1(cls):
    X, Y = NT("X"), NT("Y")
    policy = cls(4)
    cx, cy = ready(1), ready(2)
    policy.insert(X, cx, CTX)
    policy.touch([X], CTX)
    policy.insert(Y, cy, CTX)
    return policy, cx, cy


def test_non_transitive_get_and_remove_search_t1_first(policy_cls):
    Z = NT("Z")
    for cls in (VllmARC, policy_cls):
        policy, cx, cy = _x_in_t2_y_in_t1(cls)
        assert policy.get(Z) is cy, cls
        policy.remove(Z)
        assert (list(policy.t1), list(policy.t2)) == ([], [NT("X")]), cls
        assert policy.t2[NT("X")] is cx


# --- 5. a replaced key is released after the call, in both twins -------------

REPLACE_ACTS = {
    "insert": lambda p: p.insert(K(50), ready(50), CTX),
    "evict": lambda p: p.evict(1, ()),
    "touch": lambda p: p.touch([K(2)], CTX),
    "get": lambda p: p.get(K(2)),
}


def _replace_key(cls, how, act):
    DEL_LOG.clear()
    policy = cls(3)
    policy.insert(K(2), ready(2), CTX)
    key = CallbackKey("cb", policy, REPLACE_ACTS[act])
    policy.insert(key, ready(40), CTX)
    del key
    equal = CallbackKey("cb")
    if how == "insert-over-ghost":
        assert [k for k, _ in policy.evict(1, {K(2)})] == [equal]
        policy.insert(equal, ready(41), CTX)
    elif how == "touch":
        policy.touch([equal], CTX)
    elif how == "on_request_finished":
        policy.on_request_finished(((equal,),), set(), {equal}, CTX)
    policy._check_invariants()
    state = [[getattr(k, "name", k) for k in lst] for lst in snapshot(policy)[:4]]
    return state, list(DEL_LOG)


@pytest.mark.parametrize("act", REPLACE_ACTS)
@pytest.mark.parametrize("how", ["insert-over-ghost", "touch", "on_request_finished"])
def test_replaced_key_is_released_after_the_call(policy_cls, how, act):
    state, log = _replace_key(policy_cls, how, act)
    assert log == ["ok"], log  # the policy was no longer busy


# --- 6. chunk types are not kept alive ----------------------------------------


def test_chunk_types_are_freed(policy_cls):
    refs = []
    policy = policy_cls(8)
    for i in range(50):
        tp = type(f"Chunk{i}", (ctypes.Structure,), {"_fields_": [("ref_cnt", ctypes.c_int32)]})
        refs.append(weakref.ref(tp))
        chunk = tp()
        policy.insert(K(i), chunk, CTX)
        assert policy.evict(1, ())[0][1] is chunk
        del tp, chunk
    del policy
    gc.collect()
    assert [r for r in refs if r() is not None] == []


# --- 7. the largest number of entries, ghosts included -----------------------


def test_entry_limit(policy_cls):
    assert _common.MAX_ENTRIES == 2**29
    policy = policy_cls(10)
    assert policy._max_entries == _common.MAX_ENTRIES
    policy._max_entries = 4
    for i in range(4):
        policy.insert(K(i), ready(i), CTX)
    assert len(policy.evict(2, ())) == 2  # b1 = [0, 1]: ghosts count
    before = snapshot(policy)
    with pytest.raises(MemoryError) as info:
        policy.insert(K(9), ready(9), CTX)
    assert str(info.value) == _common.MSG_FULL.format(4)
    assert snapshot(policy) == before
    policy.insert(K(0), ready(10), CTX)  # a ghost's entry is reused
    policy.remove(K(2))
    policy.insert(K(9), ready(9), CTX)
    policy._check_invariants()
    with pytest.raises(ValueError):
        policy._max_entries = _common.MAX_ENTRIES + 1


class SameHash:
    """Distinct keys (equal by name) that all share one hash."""

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return 777

    def __eq__(self, other):
        return isinstance(other, SameHash) and other.name == self.name

    def __repr__(self):
        return f"SameHash({self.name!r})"


def test_keys_sharing_a_hash_are_found_in_every_list(policy_cls):
    """The core settles a look-up at the first node of a hash only when no
    other node has it; keys sharing a hash take the list-by-list path."""
    policy = policy_cls(4)
    chunks = {n: ready(i) for i, n in enumerate("abcde")}
    for n in "abcd":
        policy.insert(SameHash(n), chunks[n], CTX)
        policy._check_invariants()
    policy.touch([SameHash("b")], CTX)  # t1 = [a, c, d], t2 = [b]
    assert [k for k, _ in policy.evict(1, ())] == [SameHash("a")]  # b1 = [a]
    policy.remove(SameHash("c"))
    policy._check_invariants()
    assert policy.get(SameHash("b")) is chunks["b"]
    assert policy.get(SameHash("d")) is chunks["d"]
    assert policy.get(SameHash("a")) is None and SameHash("a") in policy.b1
    assert policy.get(SameHash("c")) is None and SameHash("c") not in policy.b1
    policy.insert(SameHash("a"), chunks["e"], CTX)  # the ghost comes back
    policy.insert(SameHash("c"), chunks["c"], CTX)
    assert (list(policy.t1), list(policy.t2), list(policy.b1)) == (
        [SameHash("d"), SameHash("a"), SameHash("c")],
        [SameHash("b")],
        [],
    )
    policy._check_invariants()
