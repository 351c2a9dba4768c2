"""The compiled core's chunk check: where a chunk's type keeps ``ref_cnt``
(a c_int32 ctypes field that reads natively, and vLLM's readiness rule),
checked for each type as it is now (docs/hardening.md, rule 7). The twins
read ``chunk.ref_cnt`` as vLLM does, and check nothing.

A type can change after its check (a class attribute set or deleted, a
base's, its bases): CPython then gives it a new version tag, which it
keys its own attribute cache on. So is a check here: a type's offset is
trusted while its version tag is the one it had when it was checked, and
a type without a tag is checked again at every read. The tag is read in
C alone (layout.h), by the core, which hands it to chunk_entry.
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
# type, its version tag when checked, offset). Weak, so that chunk types
# made at run time are not kept alive (the reference's callback forgets the
# entry). The key is the type's pointer hash, object.__hash__: unique among
# live objects, never a metaclass's __hash__, and cheap where id() is not
# (CPython 3.12+ raises an audit event on id(), which costs ~270 ns once any
# audit hook is installed, as filelock, imported with vLLM, does). A hit is
# confirmed by identity, then by the tag.
_ref_offsets: dict[int, tuple[weakref.ref[type], int, int]] = {}
_type_key = object.__hash__


def dead_ref() -> weakref.ref[Any]:
    """A weak reference whose object is gone: it refers to nothing (None in
    Python, Py_None in C), so no chunk's type can equal it. The marker for
    "no chunk type seen yet"; a live type as marker would let its instances
    (type(None) let None) skip the chunk check."""
    return weakref.ref(set())


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


def chunk_entry(tp: type, tag: int) -> tuple[weakref.ref[type], int]:
    """(a weak reference to ``tp``, the byte offset of its c_int32
    ``ref_cnt``), checked for ``tp`` as it is now, or as it was when its
    version tag was ``tag`` (read in C by the caller before this call, so
    that a change made while the check runs is seen at the next read; 0: no
    tag, checked now). Raises TypeError for types whose instances cannot be
    read so."""
    key = _type_key(tp)
    found = _ref_offsets.get(key)
    if found is not None and found[0]() is tp and found[1] == tag and tag:
        return found[0], found[2]
    offset = _ref_cnt_offset(tp)
    if offset is None:
        raise TypeError(MSG_CHUNK.format(tp.__qualname__))
    if not _ready_as_vllm(tp):
        raise TypeError(MSG_CHUNK_READY.format(tp.__qualname__))
    ref = found[0] if found is not None and found[0]() is tp else None
    if ref is None:
        ref = weakref.ref(tp, partial(_forget_type, key))
    if tag:
        _ref_offsets[key] = (ref, tag, offset)
    return ref, offset


def chunk_ref_offset(tp: type) -> int:
    """Byte offset of the c_int32 ``ref_cnt`` field in instances of ``tp``,
    as ``tp`` is now.

    Raises TypeError for types whose instances cannot be read that way.
    """
    return chunk_entry(tp, 0)[1]
