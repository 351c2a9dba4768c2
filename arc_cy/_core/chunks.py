"""The compiled core's chunk check: where a chunk's type keeps ``ref_cnt``
(a c_int32 ctypes field that reads natively, and vLLM's readiness rule),
checked for each type as it is now (docs/hardening.md, rule 7). The twins
read ``chunk.ref_cnt`` as vLLM does, and check nothing.

A type can change after its check (a class attribute set or deleted, a
base's, its bases): CPython then gives it a new version tag, which it
keys its own attribute cache on. So is a check here: a type's offset is
trusted while its version tag is the one it had when it was checked, and
a type without a tag is checked again at every read. The core reads the
tag in C (layout.h) at every read; this module reads it through
ctypes when it checks a type, at the offset the core checks at import.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from functools import partial
from typing import Any

from .._messages import MSG_CHUNK, MSG_CHUNK_READY
from .._vllm import ChunkStatus

# The stand-in's ChunkStatus, vLLM or not (_IS_READY knows both classes).
from .._vllm_standins import ChunkStatus as _StandInChunkStatus

# Chunk types whose ref_cnt offset is known: key -> (weak reference to the
# type, its version tag when checked, offset, a view of its tag now). Weak,
# so that chunk types made at run time are not kept alive (the reference's
# callback forgets the entry). The key is the type's
# pointer hash, object.__hash__: unique among live objects, never a
# metaclass's __hash__, and cheap where id() is not (CPython 3.12+ raises an
# audit event on id(), which costs ~270 ns once any audit hook is installed,
# as filelock, imported with vLLM, does). A hit is confirmed by identity,
# then by the tag.
ChunkEntry = tuple["weakref.ref[type]", int, int, Any]
_ref_offsets: dict[int, ChunkEntry] = {}
_type_key = object.__hash__


# --- a type's version tag --------------------------------------------------------
#
# PyTypeObject's fields up to tp_version_tag, unchanged from CPython 3.8 to
# 3.13. CPython sets the tag to 0 whenever the type or a base is changed
# through the type's API (type.__setattr__, __delattr__, __bases__), and a
# later lookup gives it a new one, never one given before; 0 is no tag.
_P = ctypes.c_void_p
_SSIZE = ctypes.c_ssize_t
_SLOTS = (
    "dealloc vectorcall_offset getattr setattr as_async repr as_number "
    "as_sequence as_mapping hash call str getattro setattro as_buffer"
).split()
_SLOTS2 = (
    "doc traverse clear richcompare weaklistoffset iter iternext methods "
    "members getset base dict descr_get descr_set dictoffset init alloc new "
    "free is_gc bases mro cache subclasses weaklist del"
).split()
_SIZES = ("vectorcall_offset", "weaklistoffset", "dictoffset")


class _TypeHead(ctypes.Structure):
    _fields_ = [
        ("ob_refcnt", _SSIZE),
        ("ob_type", _P),
        ("ob_size", _SSIZE),
        ("tp_name", _P),
        ("tp_basicsize", _SSIZE),
        ("tp_itemsize", _SSIZE),
        *[("tp_" + n, _SSIZE if n in _SIZES else _P) for n in _SLOTS],
        ("tp_flags", ctypes.c_ulong),
        *[("tp_" + n, _SSIZE if n in _SIZES else _P) for n in _SLOTS2],
        ("tp_version_tag", ctypes.c_uint),
    ]


TAG_OFFSET: int = _TypeHead.tp_version_tag.offset
_type_getattribute = type.__dict__["__getattribute__"]
_NO_NAME = "_arc_cy_no_such_attribute"
_NO_TAG = -1  # what a type without a tag is cached with: no tag equals it


def _raw_view(tp: type) -> Any:
    if not issubclass(type(tp), type):  # only a type has a tag to read
        raise TypeError(MSG_CHUNK.format(type(tp).__qualname__))
    return ctypes.c_uint.from_address(id(tp) + TAG_OFFSET)


def _raw_version(tp: type) -> int:
    view = _raw_view(tp)
    if not view.value:
        # A lookup of a name no type defines gives tp a tag: type's own
        # lookup, past any metaclass, which runs no Python code.
        try:
            _type_getattribute(tp, _NO_NAME)
        except AttributeError:
            pass
    return view.value or _NO_TAG


def _tags_readable() -> bool:
    """Whether _TypeHead is this CPython's layout and tags act as above."""

    class Probe(ctypes.Structure):
        _fields_ = [("ref_cnt", ctypes.c_int32)]

    head = _TypeHead.from_address(id(Probe))
    if (
        head.tp_flags != Probe.__flags__
        or head.tp_basicsize != Probe.__basicsize__
        or head.tp_base != id(Probe.__base__)
        or head.tp_mro != id(Probe.__mro__)
        or head.tp_bases != id(Probe.__bases__)
        or head.tp_dictoffset != Probe.__dictoffset__
        or head.tp_weaklistoffset != Probe.__weakrefoffset__
    ):
        return False
    first = _raw_version(Probe)
    Probe.changed = True  # type: ignore[attr-defined]
    if _raw_view(Probe).value != 0:
        return False
    second = _raw_version(Probe)
    return _NO_TAG not in (first, second) and first != second


# Where tags cannot be read so, every read checks its type again: slow, and
# still right.
TAGS_READABLE = _tags_readable()
_NO_VIEW = ctypes.c_uint(0)


def _tag_view(tp: type) -> Any:
    """A view of tp's version tag now (read while tp is alive only)."""
    return _raw_view(tp) if TAGS_READABLE else _NO_VIEW


def _version(tp: type) -> int:
    """tp's version tag, given it now if it has none, or _NO_TAG where
    CPython gives it none (it ran out of tags, or TAGS_READABLE is false)."""
    return _raw_version(tp) if TAGS_READABLE else _NO_TAG


def dead_ref() -> weakref.ref[Any]:
    """A weak reference whose object is gone: it refers to nothing (None in
    Python, Py_None in C), so no chunk's type can equal it. The marker for
    "no chunk type seen yet"; a live type as marker would let its instances
    (type(None) let None) skip the chunk check."""
    return weakref.ref(set())


# The entry of the type looked up last: most calls ask for it again.
_last_offset: ChunkEntry = (dead_ref(), _NO_TAG, 0, _NO_VIEW)


def _forget_type(key: int, ref: weakref.ref[type]) -> None:
    entry = _ref_offsets.get(key)
    if entry is not None and entry[0] is ref:
        del _ref_offsets[key]


# What instance attribute access uses, read past any metaclass override.
_type_mro = type.__dict__["__mro__"].__get__
_type_namespace = type.__dict__["__dict__"].__get__
_CField: Any = type(ChunkStatus.ref_cnt)  # ctypes' field descriptor
_OBJECT_GETATTRIBUTE = object.__dict__["__getattribute__"]


def _lookup(mro: tuple[type, ...], name: str) -> tuple[type | None, Any]:
    """The class of mro that defines name first, and its definition."""
    for klass in mro:
        namespace = _type_namespace(klass)
        if name in namespace:
            return klass, namespace[name]
    return None, None


def _ref_cnt_offset(tp: type) -> int | None:
    """Offset of the field that ``chunk.ref_cnt`` reads for instances of tp,
    if reading it there is reading a native c_int32 (what the compiled core
    does), else None. Decided by the field descriptor itself: its class's
    ``_fields_`` is a plain list that can change after ctypes fixed the
    layout."""
    if not issubclass(tp, (ctypes.Structure, ctypes.Union)):
        return None
    mro = _type_mro(tp)
    if _lookup(mro, "__getattribute__")[1] is not _OBJECT_GETATTRIBUTE:
        return None
    # The most derived definition wins, as for attribute access.
    field = _lookup(mro, "ref_cnt")[1]
    if type(field) is not _CField:
        return None
    offset: int = field.offset
    if not 0 <= offset <= ctypes.sizeof(tp) - 4:
        return None
    # Read through the descriptor what the core reads with memcpy: a field
    # of another type, byte order or width, or a bitfield, reads otherwise.
    new = _FROM_BUFFER_COPY[issubclass(tp, ctypes.Union)]
    for probe in _PROBES:
        buf = bytearray(b"\xff" * ctypes.sizeof(tp))
        buf[offset : offset + 4] = probe
        try:
            value = field.__get__(new(tp, buf), tp)
        except (TypeError, ValueError):  # e.g. an abstract structure
            return None
        if type(value) is not int or value != int.from_bytes(probe, sys.byteorder, signed=True):
            return None
    return offset


# Patterns for the ref_cnt probe: signs, bytes that differ, every bit used.
_PROBES = (b"\x01\x02\x03\x84", b"\xfe\x7f\x00\x40", b"\x00\x00\x00\x00")
# ctypes' own from_buffer_copy (not a metaclass override): no user code runs.
_FROM_BUFFER_COPY = (
    type(ctypes.Structure).__dict__["from_buffer_copy"],
    type(ctypes.Union).__dict__["from_buffer_copy"],
)
# is_ready as vLLM's ChunkStatus (and the stand-in) define it: ref_cnt >= 0.
_IS_READY = frozenset(
    id(klass.__dict__["is_ready"])
    for klass in (ChunkStatus, _StandInChunkStatus)
    if "is_ready" in klass.__dict__
)


def _ready_as_vllm(tp: type) -> bool:
    """Whether tp's is_ready is vLLM's (or absent): arc_cy reads ref_cnt < 0
    where vLLM's touch asks chunk.is_ready."""
    definition = _lookup(_type_mro(tp), "is_ready")[1]
    return definition is None or id(definition) in _IS_READY


def chunk_entry(tp: type) -> ChunkEntry:
    """The checked entry of ``tp``: (weak reference to it, its version tag
    when checked, the byte offset of its c_int32 ``ref_cnt``, a view of its
    tag now). Valid while ``view.value == tag``: the tag is read before
    the check, so a change made while the check runs is seen at the next
    read. Raises TypeError for types whose instances cannot be read so."""
    global _last_offset
    entry = _last_offset
    if entry[0]() is tp and entry[3].value == entry[1]:
        return entry
    key = _type_key(tp)
    found = _ref_offsets.get(key)
    if found is None or found[0]() is not tp or found[3].value != found[1]:
        tag = _version(tp)
        offset = _ref_cnt_offset(tp)
        if offset is None:
            raise TypeError(MSG_CHUNK.format(tp.__qualname__))
        if not _ready_as_vllm(tp):
            raise TypeError(MSG_CHUNK_READY.format(tp.__qualname__))
        ref = found[0] if found is not None and found[0]() is tp else None
        if ref is None:
            ref = weakref.ref(tp, partial(_forget_type, key))
        found = (ref, tag, offset, _tag_view(tp))
        _ref_offsets[key] = found
    _last_offset = found
    return found


def chunk_ref_offset(tp: type) -> int:
    """Byte offset of the c_int32 ``ref_cnt`` field in instances of ``tp``,
    as ``tp`` is now.

    Raises TypeError for types whose instances cannot be read that way.
    """
    return chunk_entry(tp)[2]
