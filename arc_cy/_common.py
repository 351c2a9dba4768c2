"""Pieces shared by the compiled core and the pure-Python twin.

Everything both implementations must agree on lives here once: vLLM's base
classes (or stand-ins when vLLM is not installed), argument validation and
the exact text of every error, so the twins cannot drift apart.
"""

from __future__ import annotations

import ctypes
import math
import numbers
import operator
import sys
import weakref
from collections.abc import ItemsView, Iterator, Mapping
from ctypes import sizeof
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

# The stand-in's ChunkStatus, vLLM or not (_IS_READY knows both classes).
from ._standins import ChunkStatus as _StandInChunkStatus

VLLM_IMPORT_ERROR: BaseException | None = None
"""Why vLLM failed to import when it is installed but broken (else None)."""

if TYPE_CHECKING:
    # Type checkers see the stand-ins, vLLM or not: same layout, same calls.
    from ._standins import CachePolicy, ChunkStatus, order_request_keys

    HAVE_VLLM: bool
else:
    try:
        from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus

        HAVE_VLLM = True
    except Exception as exc:  # any: a broken vLLM must not break arc_cy
        HAVE_VLLM = False
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == "vllm"):
            VLLM_IMPORT_ERROR = exc  # installed, but failed to import
        # `X as X`: a re-export (arc_cy and the twins import it from here).
        from ._standins import CachePolicy as CachePolicy
        from ._standins import ChunkStatus
    try:
        if not HAVE_VLLM:
            raise ImportError
        from vllm.v1.kv_offload.cpu.policies.base import order_request_keys
    except ImportError:
        # vLLM 0.30 has no order_request_keys (0.31 added it, with
        # on_request_finished); arc_cy still subclasses its CachePolicy.
        from ._standins import order_request_keys as order_request_keys


# The text of every error either implementation raises.
MSG_NEGATIVE_N = "evict() needs n >= 0, got {!r}"
MSG_NEGATIVE_CAPACITY = "cache_capacity must be >= 0, got {!r}"
MSG_CAPACITY_MAX = (
    "cache_capacity must be at most {} (2**29 entries: t1 + t2, b1 and b2 "
    "each hold up to cache_capacity), got {!r}"
)
MSG_TARGET_TYPE = "target_t1_size must be a real number, got {!r}"
MSG_TARGET_FINITE = "target_t1_size must be finite, got {!r}"
MSG_DUPLICATE = "key {!r} is already cached (in {}); remove() it before insert()"
MSG_CHUNK = (
    "chunk must be a ctypes structure with a c_int32 'ref_cnt' field, "
    "like vLLM's ChunkStatus; got {}"
)
MSG_CHUNK_READY = (
    "chunk type {} overrides is_ready; arc_cy decides readiness as vLLM's "
    "ChunkStatus does (ref_cnt >= 0)"
)
MSG_CHUNK_SIZE = (
    "chunk of type {} has a {}-byte buffer, too small for its ref_cnt field at offset {}"
)
MSG_FULL = "ARC policy is full: it holds its limit of {} entries (t1, t2, b1 and b2)"
MSG_MAX_ENTRIES = "_max_entries must be between 0 and {}, got {!r}"
MSG_REENTRANT = "{}() called on the ARC policy while {}() is still running"
MSG_MUTATED = "ARC list changed during iteration"
# Python's own texts, which the compiled core's interface gives too.
MSG_NO_ACCESSOR = "property {!r} of {!r} object has no {}"
MSG_MISSING = "ARCCachePolicy.{}() missing {} required positional argument{}: {}"
MSG_NO_COPY = (
    "{} (arc_cy's compiled core) cannot be copied or pickled; arc_cy._arc_py.ARCCachePolicy can"
)

# Names of the four lists, in the order the compiled core numbers them.
LIST_NAMES = ("t1", "t2", "b1", "b2")

# The most entries (resident and ghost, all four lists) one policy holds:
# the compiled core's node array is indexed by int32 and grows by doubling.
MAX_ENTRIES = 2**29
# The largest cache_capacity: t1 + t2 and each ghost list hold up to it.
MAX_CAPACITY = MAX_ENTRIES // 3

# The default of the compiled core's required arguments: a call without
# one raises Python's own TypeError (missing_arguments), as the twin's does.
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()

# Chunk types whose ref_cnt offset is known: key -> (weak reference to the
# type, offset). Weak, so that chunk types made at run time are not kept
# alive (the reference's callback forgets the entry). The key is the type's
# pointer hash, object.__hash__: unique among live objects, never a
# metaclass's __hash__, and cheap where id() is not (CPython 3.12+ raises an
# audit event on id(), which costs ~270 ns once any audit hook is installed,
# as filelock, imported with vLLM, does). A hit is confirmed by identity.
_ref_offsets: dict[int, tuple[weakref.ref[type], int]] = {}
_type_key = object.__hash__


def dead_ref() -> weakref.ref[Any]:
    """A weak reference whose object is gone: it refers to nothing (None in
    Python, Py_None in C), so no chunk's type can equal it. The marker for
    "no chunk type seen yet"; a live type as marker would let its instances
    (type(None) let None) skip the chunk check."""
    return weakref.ref(set())


# The entry of the type looked up last: most calls ask for it again.
_last_offset: tuple[weakref.ref[type], int] = (dead_ref(), 0)


def _forget_type(key: int, ref: weakref.ref[type]) -> None:
    if _ref_offsets.get(key, (None, 0))[0] is ref:
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


def chunk_ref_offset(tp: type) -> int:
    """Byte offset of the c_int32 ``ref_cnt`` field in instances of ``tp``.

    Raises TypeError for types whose instances cannot be read that way.
    """
    global _last_offset
    entry = _last_offset
    if entry[0]() is tp:
        return entry[1]
    key = _type_key(tp)
    found = _ref_offsets.get(key)
    if found is None or found[0]() is not tp:
        offset = _ref_cnt_offset(tp)
        if offset is None:
            raise TypeError(MSG_CHUNK.format(tp.__qualname__))
        if not _ready_as_vllm(tp):
            raise TypeError(MSG_CHUNK_READY.format(tp.__qualname__))
        found = (weakref.ref(tp, partial(_forget_type, key)), offset)
        _ref_offsets[key] = found
    _last_offset = found
    return found[1]


def read_ref_cnt(chunk: Any) -> int:
    """chunk.ref_cnt, refused (TypeError) if the chunk's current type has no
    c_int32 ref_cnt or its buffer has shrunk below it. The compiled core
    makes the same checks on its raw reads."""
    offset = chunk_ref_offset(type(chunk))
    if offset > sizeof(chunk) - 4:
        raise TypeError(MSG_CHUNK_SIZE.format(type(chunk).__qualname__, sizeof(chunk), offset))
    return chunk.ref_cnt  # type: ignore[no-any-return]


def check_max_entries(n: Any) -> int:
    n = operator.index(n)
    if not 0 <= n <= MAX_ENTRIES:
        raise ValueError(MSG_MAX_ENTRIES.format(MAX_ENTRIES, n))
    return n


def check_evict_n(n: Any) -> int:
    n = operator.index(n)
    if n < 0:
        raise ValueError(MSG_NEGATIVE_N.format(n))
    return n


def check_capacity(capacity: Any) -> int:
    if capacity is MISSING:
        raise missing_arguments("__init__", cache_capacity=capacity)
    capacity = operator.index(capacity)
    if capacity < 0:
        raise ValueError(MSG_NEGATIVE_CAPACITY.format(capacity))
    if capacity > MAX_CAPACITY:
        raise ValueError(MSG_CAPACITY_MAX.format(MAX_CAPACITY, capacity))
    return capacity


def missing_arguments(method: str, **args: Any) -> TypeError:
    """The TypeError Python raises for a call of ARCCachePolicy.<method>
    without the arguments args gives as MISSING."""
    names = [repr(name) for name, value in args.items() if value is MISSING]
    if len(names) > 2:
        listed = ", ".join(names[:-1]) + ", and " + names[-1]
    else:
        listed = " and ".join(names)
    return TypeError(MSG_MISSING.format(method, len(names), "s" * (len(names) > 1), listed))


def check_target(value: Any) -> Any:
    # Stored as given (int or float), as vLLM does, so arithmetic on it
    # produces the same types and values in both implementations.
    # int() of it is taken where vLLM takes it, in evict().
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(MSG_TARGET_TYPE.format(value))
    try:
        finite = math.isfinite(value)
    except OverflowError:  # beyond a float's range (10**400): finite
        finite = True
    if not finite:
        raise ValueError(MSG_TARGET_FINITE.format(value))
    return value


class _ListSource(Protocol):
    def _list_len(self, which: int) -> int: ...
    def _list_contains(self, which: int, key: Any) -> bool: ...
    def _list_getitem(self, which: int, key: Any) -> Any: ...
    def _list_iter(self, which: int) -> Iterator[tuple[Any, Any]]: ...


_V = TypeVar("_V")


class ListView(Mapping[Any, _V], Generic[_V]):
    """Read-only, ordered view of one ARC list (LRU first).

    Values are the ChunkStatus objects for t1/t2 and None for b1/b2.
    """

    __slots__ = ("_policy", "_which")

    def __init__(self, policy: _ListSource, which: int) -> None:
        self._policy = policy
        self._which = which

    def __len__(self) -> int:
        return self._policy._list_len(self._which)

    def __contains__(self, key: object) -> bool:
        return self._policy._list_contains(self._which, key)

    def __getitem__(self, key: Any) -> _V:
        return self._policy._list_getitem(self._which, key)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[Any]:
        for key, _ in self._policy._list_iter(self._which):
            yield key

    def items(self) -> ItemsView[Any, _V]:
        return _Items(self)

    def __repr__(self) -> str:
        return f"{LIST_NAMES[self._which]}({list(self.keys())!r})"


class _Items(ItemsView[Any, _V]):
    __slots__ = ()

    def __iter__(self) -> Iterator[tuple[Any, _V]]:
        view: ListView[_V] = self._mapping  # type: ignore[assignment]
        return view._policy._list_iter(view._which)
