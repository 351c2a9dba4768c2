"""Chunk types: what the policy accepts as a chunk and how it reads
ref_cnt. A chunk is a ctypes structure with a c_int32 ref_cnt field, like
vLLM's ChunkStatus; ref_cnt is read at the offset that attribute access
resolves for the chunk's type at that moment (a subclass's field, a
packed or far offset, a class changed after insert), within the chunk's
buffer. Anything else is refused with arc_cy's message, alike in both
implementations. Chunk types are held weakly: a type made at run time is
freed with its last chunk, and a new type made at a freed type's address
is checked again.
"""

from __future__ import annotations

import ctypes
import gc
import os
import weakref
from fractions import Fraction

import pytest

from arc_cy import _messages
from childproc import run_json
from helpers import (
    CTX,
    IMPLEMENTATIONS,
    ChunkStatus,
    K,
    VllmARC,
    keysnap,
    load_policy_class,
    ready,
    snapshot,
)
from hostile import populated, unchanged

pytestmark = pytest.mark.gc_stress

# --- what is a chunk ------------------------------------------------------------


def test_any_object_as_a_chunk_is_refused_alike():
    """Every non-chunk is refused with arc_cy's message, the same in both,
    whether or not a real chunk came before (a None chunk once passed the
    check when it was the first chunk, the 'no type yet' marker being
    type(None), and crashed the core's evict)."""
    got = run_json("any_chunk.py", "--no-vllm")
    assert got == dict.fromkeys(IMPLEMENTATIONS, got["python"])
    for name, messages in got["python"].items():
        assert len(set(messages)) == 1, (name, messages)
        assert messages[0].startswith(
            ("chunk must be a ctypes structure", "chunk type Ready overrides is_ready")
        ), (name, messages)
    assert got["python"]["None"][0] == _messages.MSG_CHUNK.format("NoneType")
    assert got["python"]["is_ready overridden"][0] == _messages.MSG_CHUNK_READY.format("Ready")


class BitfieldInSubclass(ChunkStatus):
    _fields_ = [("ref_cnt", ctypes.c_int32, 4)]


class PropertyInSubclass(ChunkStatus):
    @property
    def ref_cnt(self):
        return 0


class CustomGetattribute(ChunkStatus):
    def __getattribute__(self, name):
        return object.__getattribute__(self, name)


class RedeclaredInSubclass(ChunkStatus):
    # a plain c_int32 again, after the base's fields: this one is read
    _fields_ = [("ref_cnt", ctypes.c_int32)]


@pytest.mark.parametrize(
    "tp", [BitfieldInSubclass, PropertyInSubclass, CustomGetattribute], ids=lambda t: t.__name__
)
def test_ref_cnt_shadowed_in_a_subclass_is_refused(tp):
    """Validation skipped the subclass's bitfield and accepted the
    base's plain field, but recorded the bitfield's offset; the core then
    read 4 raw bytes where vLLM reads the bitfield's value."""
    chunk = tp.__new__(tp)
    errors = []
    for name in IMPLEMENTATIONS:
        policy = populated(load_policy_class(name))
        error = unchanged(policy, lambda p: p.insert(K(9), chunk, CTX), TypeError)
        errors.append(str(error))
    assert errors == [_messages.MSG_CHUNK.format(tp.__qualname__)] * len(IMPLEMENTATIONS)


@pytest.mark.needs_vllm
def test_ref_cnt_redeclared_in_a_subclass_is_read_there(policy_cls):

    def scenario(cls):
        policy = cls(4)
        chunks = [RedeclaredInSubclass(i) for i in range(3)]
        for i, chunk in enumerate(chunks):
            chunk.ref_cnt = 0 if i != 1 else -1
            ChunkStatus.ref_cnt.__set__(chunk, 7)  # the base's field: not read
            policy.insert(K(i), chunk, CTX)
        policy.touch([K(0), K(1)], CTX)
        return keysnap(policy), [k for k, _ in policy.evict(2, ())]

    assert RedeclaredInSubclass.ref_cnt.offset != ChunkStatus.ref_cnt.offset
    assert scenario(policy_cls) == scenario(VllmARC)


# --- where ref_cnt is read ------------------------------------------------------


class OffsetChunk(ctypes.Structure):
    _fields_ = [("pad", ctypes.c_int64), ("ref_cnt", ctypes.c_int32)]


class FarChunk(ctypes.Structure):
    # ref_cnt past 64 KiB: any offset within the buffer is read, as vLLM does
    _fields_ = [("pad", ctypes.c_char * 70000), ("ref_cnt", ctypes.c_int32)]


@pytest.mark.parametrize("chunk_type", [OffsetChunk, FarChunk])
def test_chunk_with_ref_cnt_at_an_offset(policy_cls, chunk_type):
    policy = policy_cls(4)
    a, b = chunk_type(ref_cnt=0), chunk_type(ref_cnt=1)
    policy.insert(b"a", a, CTX)
    policy.insert(b"b", b, CTX)
    assert policy.evict(1, set()) == [(b"a", a)]
    assert policy.evict(1, set()) is None  # b is pinned: read at its offset
    b.ref_cnt = 0
    assert policy.evict(1, set()) == [(b"b", b)]


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


class Big(ctypes.Structure):
    # 44 bytes: the buffer lives on the heap, not inside the object.
    _fields_ = [("pad", ctypes.c_char * 40), ("ref_cnt", ctypes.c_int32)]


class Small(ctypes.Structure):
    _fields_ = [("ref_cnt", ctypes.c_int32), ("pad", ctypes.c_char * 20)]


def _shrunk_chunk_evict(cls, resize):
    policy = cls(4)
    chunk = Big()
    chunk.ref_cnt = 0  # offset 40: evictable for Big
    ctypes.memset(ctypes.addressof(chunk), 1, 4)  # offset 0, for Small: pinned
    policy.insert(K(1), chunk, CTX)
    chunk.__class__ = Small
    if resize:
        ctypes.resize(chunk, ctypes.sizeof(Small))
    assert ctypes.sizeof(chunk) == (24 if resize else 44)
    return policy.evict(1, ()), snapshot(policy)


@pytest.mark.parametrize("resize", [False, True], ids=["class", "class+resize"])
def test_ref_cnt_follows_the_chunks_current_type(policy_cls, resize):
    """ref_cnt is read through the chunk's type at that moment, as vLLM
    reads chunk.ref_cnt, not at an offset cached at insert() (past a
    shrunk buffer)."""
    result, _ = _shrunk_chunk_evict(policy_cls, resize)
    assert result is None  # pinned, read at Small's offset


@pytest.mark.needs_vllm
@pytest.mark.parametrize("resize", [False, True], ids=["class", "class+resize"])
def test_vllm_reads_ref_cnt_through_the_chunks_current_type(resize):
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
        assert str(info.value) == _messages.MSG_CHUNK_SIZE.format("Big", 24, 40)
        assert snapshot(policy) == before
    policy._check_invariants()
    chunk.__class__ = Small
    chunk.ref_cnt = 0
    assert [k for k, _ in policy.evict(2, ())] == [K(1), K(2)]


# --- chunk types are held weakly ------------------------------------------------


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


@pytest.mark.parametrize("how", ["remove", "evict", "clear"])
def test_last_chunk_type_is_not_kept_alive(policy_cls, how):
    """Both implementations kept a strong reference to the last
    chunk type they saw; a type made at run time (here with a 10 MB class
    attribute) lived as long as the policy."""
    policy = policy_cls(4)
    policy.insert(K(1), ready(1), CTX)
    tp = type(
        "Runtime",
        (ctypes.Structure,),
        {
            "_fields_": [("ref_cnt", ctypes.c_int32)],
            "payload": bytes(10 * 2**20),
        },
    )
    ref = weakref.ref(tp)
    policy.insert(K(2), tp(), CTX)
    policy.touch([K(2)], CTX)
    del tp
    if how == "remove":
        policy.remove(K(2))
    elif how == "evict":
        assert [k for k, _ in policy.evict(2, ())] == [K(1), K(2)]
    else:
        policy.clear()
    gc.collect()
    assert ref() is None
    # and the policy still reads chunks of other types
    policy.insert(K(3), ready(3), CTX)
    everything = policy.evict(len(policy.t1) + len(policy.t2), ())
    assert K(3) in [k for k, _ in everything]
    policy._check_invariants()


def _chunk_type(name, fields):
    return type(name, (ctypes.Structure,), {"_fields_": fields})


# AddressSanitizer keeps freed memory in quarantine: no address comes back.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def test_a_chunk_type_made_at_a_freed_types_address_is_checked_again(policy_cls):
    """With the type held weakly, a new type may be made where the cached
    one was, and a resident chunk given that type: its ref_cnt offset must
    be looked up, not taken from the cache."""
    for _attempt in range(200):
        policy = policy_cls(4)
        old = _chunk_type("Old", [("ref_cnt", ctypes.c_int32), ("pad", ctypes.c_char * 12)])
        old_id = id(old)
        chunk = old()
        policy.insert(K(1), chunk, CTX)  # the cache: Old, ref_cnt at 0
        chunk.__class__ = Small  # no read: the cache still says Old
        del old
        gc.collect()
        # CPython 3.13 may hand the freed block out only after other blocks
        # of its size: keep making types (all alive) until one lands there.
        made = []
        for _ in range(64):
            new = _chunk_type("New", [("pad", ctypes.c_char * 8), ("ref_cnt", ctypes.c_int32)])
            made.append(new)
            if id(new) == old_id:
                break
        if id(new) == old_id:
            break
    else:
        # the same check, at another address
        assert UNDER_ASAN, "no type was made at a freed type's address in 200 attempts"
    chunk.__class__ = new
    ctypes.memset(ctypes.addressof(chunk), 0, 16)
    ctypes.memset(ctypes.addressof(chunk), 1, 4)  # at Old's offset: pinned
    assert chunk.ref_cnt == 0  # at New's offset: evictable
    assert policy.evict(1, ()) == [(K(1), chunk)]


class NoRefCnt(ctypes.Structure):
    _fields_ = [("other", ctypes.c_int32), ("chunk_id", ctypes.c_int64)]


def test_a_chunk_whose_class_changes_during_touch(policy_cls):
    """touch([t1 key, ghost key]) applies the ghost hit first; the target's
    arithmetic there reassigns the t1 chunk's __class__ to one without
    ref_cnt. Its readiness was read before the first change: the call
    completes by what it read, in both twins alike (the core raised after
    moving the target and the ghost; the twin dropped the chunk)."""

    def run(cls):
        policy = populated(cls)  # t1 = [2, 4, 5], t2 = [3], b1 = [0, 1]
        chunk = policy.t1[K(4)]
        changed = []

        class Target(Fraction):
            def __add__(self, other):
                if not changed:
                    changed.append(True)
                    chunk.__class__ = NoRefCnt
                return Fraction(Fraction.__add__(self, other))

        policy.target_t1_size = Target(1, 2)
        policy.touch([K(4), K(0)], CTX)
        assert changed
        chunk.__class__ = ChunkStatus  # readable again, for the checks
        policy._check_invariants()
        return keysnap(policy), policy.target_t1_size

    state, target = run(policy_cls)
    assert (state, target) == run(load_policy_class("python"))
    assert state[:4] == ([K(2), K(5)], [K(3), K(4)], [K(1), K(0)], [])
    assert target == Fraction(3, 2)
