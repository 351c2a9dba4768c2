"""Chunk types: what the policy accepts as a chunk and how it reads
ref_cnt. A chunk is a ctypes structure with a c_int32 ref_cnt field, like
vLLM's ChunkStatus; ref_cnt is read at the offset that attribute access
resolves for the chunk's type at that moment (a subclass's field, a
packed or far offset, a class changed after insert), within the chunk's
buffer. Anything else the compiled core refuses with arc_cy's message
(its rules 1 and 7, memory safety: core_only); the twin reads
chunk.ref_cnt as vLLM does, and agrees with vLLM's ARC where the core does.
Chunk types are held weakly: a type made at run time is freed with its
last chunk, and a new type made at a freed type's address is checked
again.
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
    ChunkStatus,
    K,
    VllmARC,
    insert,
    keysnap,
    oracle,
    ready,
    snapshot,
)
from hostile import core_only_params, hostile, populated, unchanged

pytestmark = [pytest.mark.gc_stress, pytest.mark.both_policies]

# --- what is a chunk ------------------------------------------------------------


@pytest.mark.core_only
def test_any_object_as_a_chunk_is_refused(impl):
    """Every non-chunk is refused with arc_cy's message, whether or not a
    real chunk came before (a None chunk once passed the check when it was
    the first chunk, the 'no type yet' marker being type(None), and crashed
    the core's evict)."""
    got = run_json("any_chunk.py", impl, "--no-vllm")
    for name, messages in got.items():
        assert len(set(messages)) == 1, (name, messages)
        assert messages[0].startswith(
            ("chunk must be a ctypes structure", "chunk type Ready overrides is_ready")
        ), (name, messages)
    assert got["None"][0] == _messages.MSG_CHUNK.format("NoneType")
    assert got["is_ready overridden"][0] == _messages.MSG_CHUNK_READY.format("Ready")


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


@pytest.mark.core_only
@pytest.mark.parametrize(
    "tp", [BitfieldInSubclass, PropertyInSubclass, CustomGetattribute], ids=lambda t: t.__name__
)
def test_ref_cnt_shadowed_in_a_subclass_is_refused(policy_cls, tp):
    """Validation skipped the subclass's bitfield and accepted the
    base's plain field, but recorded the bitfield's offset; the core then
    read 4 raw bytes where vLLM reads the bitfield's value."""
    chunk = tp.__new__(tp)
    policy = populated(policy_cls)
    error = unchanged(policy, lambda p: p.insert(K(9), chunk, CTX), TypeError)
    assert str(error) == _messages.MSG_CHUNK.format(tp.__qualname__)


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
    assert scenario(policy_cls) == scenario(oracle(policy_cls))


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


@pytest.mark.core_only
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


@pytest.mark.core_only  # the core reads every chunk before its first change (rule 11)
@pytest.mark.arc_only  # ARC's target arithmetic
def test_a_chunk_whose_class_changes_during_touch(policy_cls):
    """touch([t1 key, ghost key]) applies the ghost hit first; the target's
    arithmetic there reassigns the t1 chunk's __class__ to one without
    ref_cnt. Its readiness was read before the first change: the call
    completes by what it read (the core once raised after moving the
    target and the ghost)."""

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
    assert state[:4] == ([K(2), K(5)], [K(3), K(4)], [K(1), K(0)], [])
    assert target == Fraction(3, 2)


# --- a chunk type changed after its check (rule 7) ------------------------------
#
# Every way a chunk's type can change after the policy checked it, through
# what Python allows: a class attribute set or deleted (ref_cnt as a
# property, another ctypes field, a plain value; __getattribute__;
# is_ready), on the type, on a base, or through a metaclass's __setattr__;
# the type's __bases__; a chunk's __class__; _fields_ (final once set; its
# list changed in place). Each change is made between two calls, or inside
# an evict() (protected.__contains__, between two reads), and each call
# reads the chunks after it. Both implementations then either make vLLM's
# ARC's decisions (they read ref_cnt as attribute access now resolves it)
# or, in the core, refuse the call with arc_cy's TypeError, changing nothing
# (the twin reads ref_cnt as vLLM does: the refusals are core_only).

FIELD_AT_16 = type(
    "FieldAt16",
    (ctypes.Structure,),
    {"_fields_": [("pad", ctypes.c_char * 16), ("x", ctypes.c_int32)]},
).x
INT64_FIELD = ChunkStatus.chunk_id  # type: ignore[attr-defined]
BIG_ENDIAN_FIELD = type(
    "BigEndian", (ctypes.BigEndianStructure,), {"_fields_": [("x", ctypes.c_int32)]}
).x


def _prop(value):
    return property(lambda self: value)


def _kinds():
    """A chunk type, Leaf, under a base, Mid, of vLLM's ChunkStatus, with a
    metaclass whose __setattr__ is Python code; Leaf's spare (a c_int32 at
    offset 16) holds what a change may make ref_cnt read."""

    class Meta(type(ChunkStatus)):
        def __setattr__(cls, name, value):
            super().__setattr__(name, value)

    class Mid(ChunkStatus, metaclass=Meta):
        pass

    class Leaf(Mid):
        _fields_ = [("spare", ctypes.c_int32)]

    class Plain(ChunkStatus):  # a base without Meta, for __bases__
        pass

    class Shadow(ChunkStatus):  # a base that shadows ref_cnt
        ref_cnt = _prop(0)

    class Spared(ChunkStatus):  # a class for a chunk, reading spare's offset
        _fields_ = [("spare", ctypes.c_int32)]

    Spared.ref_cnt = Spared.spare
    return Meta, Mid, Leaf, Plain, Shadow, Spared


_STRUCT_TYPE = type(ChunkStatus)  # ctypes' metaclass, which has its own __setattr__


def _set(cls, name, value):
    _STRUCT_TYPE.__setattr__(cls, name, value)  # past Meta's __setattr__


def _del_back(kinds, chunks):
    _set(kinds[2], "ref_cnt", _prop(0))
    _STRUCT_TYPE.__delattr__(kinds[2], "ref_cnt")


def _final_fields(kinds, chunks):
    with pytest.raises(AttributeError):
        kinds[2]._fields_ = [("ref_cnt", ctypes.c_int64)]


def _bases(kinds, base_index):
    def change(kinds, chunks):
        kinds[2].__bases__ = (kinds[base_index],)

    return change


def _chunk_class(kind_index):
    def change(kinds, chunks):
        for chunk in chunks:
            chunk.__class__ = kinds[kind_index]

    return change


# name: (change(kinds, chunks), what follows: "agree" or "refuse")
CHANGES = {
    "ref_cnt a property": (lambda k, c: _set(k[2], "ref_cnt", _prop(0)), "refuse"),
    "ref_cnt a property, through the metaclass": (
        lambda k, c: setattr(k[2], "ref_cnt", _prop(0)),
        "refuse",
    ),
    "ref_cnt a plain attribute": (lambda k, c: _set(k[2], "ref_cnt", 0), "refuse"),
    "ref_cnt another c_int32 field": (lambda k, c: _set(k[2], "ref_cnt", k[2].spare), "agree"),
    "ref_cnt another class's c_int32 field": (
        lambda k, c: _set(k[2], "ref_cnt", FIELD_AT_16),
        "agree",
    ),
    "ref_cnt a c_int64 field": (lambda k, c: _set(k[2], "ref_cnt", INT64_FIELD), "refuse"),
    "ref_cnt a big-endian field": (lambda k, c: _set(k[2], "ref_cnt", BIG_ENDIAN_FIELD), "refuse"),
    "ref_cnt a property, then deleted": (_del_back, "agree"),
    "a base's ref_cnt a property": (lambda k, c: _set(k[1], "ref_cnt", _prop(0)), "refuse"),
    "a base's ref_cnt another field": (lambda k, c: _set(k[1], "ref_cnt", FIELD_AT_16), "agree"),
    "__getattribute__ set": (
        lambda k, c: _set(k[2], "__getattribute__", lambda s, n: object.__getattribute__(s, n)),
        "refuse",
    ),
    "__getattribute__ set to object's": (
        lambda k, c: _set(k[2], "__getattribute__", object.__getattribute__),
        "agree",
    ),
    "is_ready replaced": (lambda k, c: _set(k[2], "is_ready", _prop(True)), "refuse"),
    "an unrelated attribute set": (lambda k, c: _set(k[2], "note", 1), "agree"),
    "the metaclass's own ref_cnt": (lambda k, c: setattr(k[0], "ref_cnt", _prop(0)), "agree"),
    "__bases__ to a plain base": (_bases(None, 3), "agree"),
    "__bases__ to a base that shadows ref_cnt": (_bases(None, 4), "refuse"),
    "a chunk's __class__ to one that reads another field": (_chunk_class(5), "agree"),
    "a chunk's __class__ to one whose ref_cnt is a property": (_chunk_class(4), "refuse"),
    "_fields_ set again (final)": (_final_fields, "agree"),
    "_fields_ changed in place": (
        lambda k, c: k[2]._fields_.__setitem__(0, ("ref_cnt", ctypes.c_int64)),
        "agree",
    ),
}
CHANGE_OPS = ("evict", "touch", "insert", "evict, changed while it reads")
CHANGE_PARAMS = core_only_params(CHANGES, {n for n, (_, how) in CHANGES.items() if how == "refuse"})


def _changed_run(policy, change, op):
    """The policy after insert() checked Leaf (and evict() read it once),
    the change, then op: ("ok", result, state) or ("refused", error,
    state before == state after)."""
    kinds = _kinds()
    leaf = kinds[2]
    chunks = []
    # ref_cnt 1, 0, 0, 0; spare 0, 0, -1, 1: reading either gives other
    # victims and another readiness
    for i, (ref_cnt, spare) in enumerate([(1, 0), (0, 0), (0, -1), (0, 1)]):
        chunk = leaf(i)
        chunk.ref_cnt, chunk.spare = ref_cnt, spare
        chunks.append(chunk)
        insert(policy, K(i), chunk, CTX)
    assert [k for k, _ in policy.evict(1, set())] == [K(1)]  # read as checked
    fresh = leaf(9)
    fresh.ref_cnt = fresh.spare = 0
    before = keysnap(policy)
    changes = [change]
    if op.startswith("evict, changed"):

        def change_once(*_):
            while changes:
                changes.pop()(kinds, [*chunks, fresh])

        def call(p):
            return p.evict(2, hostile(set, __contains__=change_once)())

    else:
        changes.pop()(kinds, [*chunks, fresh])
        call = {
            "evict": lambda p: p.evict(2, set()),
            "touch": lambda p: p.touch([K(0), K(2), K(3)], CTX),
            "insert": lambda p: insert(p, K(9), fresh, CTX),
        }[op]
    try:
        result = call(policy)
    except TypeError as err:
        assert keysnap(policy) == before, "a refused call changed the policy"
        return "refused", str(err), keysnap(policy)
    if result is not None:
        result = [(k, chunks.index(c) if c in chunks else c) for k, c in result]
    return "ok", result, keysnap(policy)


@pytest.mark.needs_vllm
@pytest.mark.parametrize("op", CHANGE_OPS)
@pytest.mark.parametrize("name", CHANGE_PARAMS)
def test_a_chunk_type_changed_after_its_check_is_read_as_it_is_or_refused(policy_cls, name, op):
    """The policy reads ref_cnt as the chunk's type is now: each change
    either keeps vLLM's decisions, call for call, or the core refuses it (the
    core once kept reading the offset it checked first, evicting a chunk
    whose ref_cnt had become a property vLLM and the twin read)."""
    change, expected = CHANGES[name]
    got = _changed_run(policy_cls(8), change, op)
    if expected == "refuse":
        assert got[0] == "refused", got
        assert got[1].startswith(("chunk must be a ctypes structure", "chunk type ")), got
    else:
        assert got == _changed_run(oracle(policy_cls)(8), change, op)
