"""Pure-Python twin of the compiled ARC core, for debugging and type checkers.

It keeps vLLM's own layout (four OrderedDicts) so that a decision can be
followed line by line against vLLM's ``arc.py``.

Working storage, as in the core: what a call holds while user code may run
(the caller's keys, the victims it picks, the key objects it replaces or
forgets) is kept in tuples, which no other code can resize, and a list is
handed back only when made from one (``list(tuple)`` runs no Python code).
Whatever a call drops is released when it returns, after busy is cleared.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from itertools import repeat
from ctypes import sizeof
from collections.abc import Container, Iterable, Iterator, Sequence
from typing import Any

from ._common import (
    ARC_DOC,
    LIST_NAMES,
    MAX_ENTRIES,
    MSG_DUPLICATE,
    MSG_FULL,
    MSG_MUTATED,
    MSG_REENTRANT,
    CachePolicy,
    ChunkStatus,
    ListView,
    check_capacity,
    check_evict_n,
    check_max_entries,
    check_target,
    chunk_ref_offset,
    order_request_keys,
    read_ref_cnt,
)

__all__ = ["ARCCachePolicy"]

_INSERTED_ONLY = "inserted only"
_REUSED = "reused"
# What _chunk_type refers to before any chunk is seen (no chunk is a None).
_NO_TYPE: weakref.ref[type] = weakref.ref(type(None))


class ARCCachePolicy(CachePolicy):
    __doc__ = ARC_DOC

    def __init__(self, cache_capacity: int) -> None:
        # Called again, it starts over as vLLM's __init__ does: capacity and
        # target first, then the lists are emptied in turn; _max_entries
        # (arc_cy's own) is reset too.
        again = hasattr(self, "_lists")
        if again:
            self._enter("__init__")
        # Name of the mutating method now running, while it may call back
        # into user code (hashing, protected.__contains__, req_context).
        self._busy: str | None = "__init__"
        try:
            capacity = check_capacity(cache_capacity)
        finally:
            self._busy = None
        self._capacity = capacity
        self._max_entries = MAX_ENTRIES
        self._target: float = 0.0
        self._chunk_type: weakref.ref[type] = _NO_TYPE  # the last chunk type checked
        if not again:
            self._t1: OrderedDict[Any, ChunkStatus] = OrderedDict()
            self._t2: OrderedDict[Any, ChunkStatus] = OrderedDict()
            self._b1: OrderedDict[Any, None] = OrderedDict()
            self._b2: OrderedDict[Any, None] = OrderedDict()
            self._lists = (self._t1, self._t2, self._b1, self._b2)
            self._views = tuple(ListView(self, i) for i in range(4))
            return
        for od in self._lists:  # in turn, as clear()
            od.clear()

    def __getstate__(self) -> dict[str, Any]:
        # for copy and pickle: the chunk-type cache (a weak reference) is not
        # state
        state = self.__dict__.copy()
        del state["_chunk_type"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._chunk_type = _NO_TYPE

    # --- attributes -------------------------------------------------------

    @property
    def cache_capacity(self) -> int:
        return self._capacity

    @property
    def target_t1_size(self) -> float:
        return self._target

    @target_t1_size.setter
    def target_t1_size(self, value: float) -> None:
        self._enter("target_t1_size")
        self._busy = "target_t1_size"  # the check runs the value's code
        try:
            self._target = check_target(value)
        finally:
            self._busy = None

    @property
    def _max_entries(self) -> int:
        """The most entries (t1, t2, b1 and b2 together) the policy holds."""
        return self._limit

    @_max_entries.setter
    def _max_entries(self, value: int) -> None:
        # For tests: the compiled core's limit, reached without 2**29 entries.
        self._limit = check_max_entries(value)

    @property
    def t1(self) -> ListView[ChunkStatus]:
        return self._views[0]

    @property
    def t2(self) -> ListView[ChunkStatus]:
        return self._views[1]

    @property
    def b1(self) -> ListView[None]:
        return self._views[2]

    @property
    def b2(self) -> ListView[None]:
        return self._views[3]

    def _enter(self, name: str) -> None:
        if self._busy is not None:
            raise RuntimeError(MSG_REENTRANT.format(name, self._busy))

    # --- CachePolicy ------------------------------------------------------

    def _read(self, fn: Any, *args: Any) -> Any:
        # Reads may nest in a running method; they lock out mutators only.
        if self._busy is not None:
            return fn(*args)
        self._busy = "get"
        try:
            return fn(*args)
        finally:
            self._busy = None

    def get(self, key: Any) -> ChunkStatus | None:
        if self._busy is not None:
            return self._t1.get(key) or self._t2.get(key)
        self._busy = "get"
        try:
            return self._t1.get(key) or self._t2.get(key)
        finally:
            self._busy = None

    def insert(self, key: Any, chunk: ChunkStatus, req_context: Any = None) -> None:
        self._enter("insert")
        self._busy = "insert"
        t1, t2, b1, b2 = self._lists
        try:
            if type(chunk) is not self._chunk_type():  # as the core: check new types
                chunk_ref_offset(type(chunk))
                self._chunk_type = weakref.ref(type(chunk))
            if key in t1:
                raise ValueError(MSG_DUPLICATE.format(key, "t1"))
            if key in t2:
                raise ValueError(MSG_DUPLICATE.format(key, "t2"))
            # A forgotten ghost's key object is held until this call
            # returns, after busy is cleared (as the core does).
            if key in b1:
                released_on_return = _pop_entry(b1, key)  # noqa: F841
            elif key in b2:
                released_on_return = _pop_entry(b2, key)  # noqa: F841
            elif len(t1) + len(t2) + len(b1) + len(b2) >= self._limit:
                raise MemoryError(MSG_FULL.format(self._limit))
            t1[key] = chunk
        finally:
            self._busy = None

    def remove(self, key: Any) -> None:
        self._enter("remove")
        self._busy = "remove"
        try:
            # The popped key and chunk are released when this returns, after
            # busy is cleared: their __del__ may call back, as with the core.
            for od in (self._t1, self._t2):
                if key in od:
                    released_on_return = _pop_entry(od, key)  # noqa: F841
                    break
        finally:
            self._busy = None

    def _adapt_to_ghost_hit(self, key: Any) -> None:
        b1, b2 = self._b1, self._b2
        if key in b1:
            delta = max(1, len(b2) / len(b1))
            self._target = min(self._target + delta, self._capacity)
            b1.move_to_end(key)
        elif key in b2:
            delta = max(1, len(b1) / len(b2))
            self._target = max(self._target - delta, 0)
            b2.move_to_end(key)

    @staticmethod
    def _looked_up(keys: tuple[Any, ...], *lists: OrderedDict) -> tuple[Any, ...]:
        # Every lookup first, so a key that cannot be looked up fails
        # before anything changes. Returns the values found in lists[0].
        return tuple(_values_in_first(keys, lists))

    def on_store_miss(self, keys: Iterable[Any], req_context: Any) -> None:
        self._enter("on_store_miss")
        self._busy = "on_store_miss"
        try:
            keys = _held(keys)
            self._looked_up(keys, self._b1, self._b2)
            for key in reversed(keys):
                self._adapt_to_ghost_hit(key)
        finally:
            self._busy = None

    def touch(self, keys: Iterable[Any], req_context: Any) -> None:
        self._enter("touch")
        self._busy = "touch"
        try:
            t1, t2 = self._t1, self._t2
            keys = _held(keys)
            # A t1 chunk whose ref_cnt cannot be read fails before any change.
            for chunk in self._looked_up(keys, *self._lists):
                read_ref_cnt(chunk)
            # Replaced key objects, released after busy is cleared.
            replaced: tuple[Any, ...] = ()
            for key in reversed(keys):
                if key in t1:
                    old_key, chunk = _pop_entry(t1, key)
                    replaced = (old_key, replaced)
                    if read_ref_cnt(chunk) < 0:
                        # still being stored: not a second access
                        t1[key] = chunk
                    else:
                        t2[key] = chunk
                elif key in t2:
                    t2.move_to_end(key)
                else:
                    self._adapt_to_ghost_hit(key)
        finally:
            self._busy = None

    def on_request_access(self, keys: Iterable[Any], req_context: Any) -> None:
        return

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[Any]],
        insertion_only_keys: Container[Any],
        reused_keys: Container[Any],
        req_context: Any,
    ) -> None:
        self._enter("on_request_finished")
        self._busy = "on_request_finished"
        try:
            t1, t2 = self._t1, self._t2
            keys = _held(order_request_keys(key_groups, req_context))
            # Classify (tail first), then look up: a failure changes nothing.
            kinds = tuple(
                _INSERTED_ONLY
                if key in insertion_only_keys
                else _REUSED
                if key in reused_keys
                else None
                for key in reversed(keys)
            )
            self._looked_up(
                tuple(k for k, kind in zip(reversed(keys), kinds) if kind), t1, t2
            )
            # Replaced key objects, released after busy is cleared.
            replaced: tuple[Any, ...] = ()
            for key, kind in zip(reversed(keys), kinds):
                if kind is _INSERTED_ONLY:
                    # A store is not a frequency hit: refresh recency only.
                    if key in t1:
                        t1.move_to_end(key)
                    elif key in t2:
                        t2.move_to_end(key)
                elif kind is _REUSED:
                    if key in t1:
                        old_key, chunk = _pop_entry(t1, key)
                        replaced = (old_key, replaced)
                        t2[key] = chunk
                    elif key in t2:
                        t2.move_to_end(key)
        finally:
            self._busy = None

    def evict(
        self, n: int, protected: Container[Any]
    ) -> list[tuple[Any, ChunkStatus]] | None:
        self._enter("evict")
        n = check_evict_n(n)
        if n == 0:
            return []
        t1, t2 = self._t1, self._t2
        if n > len(t1) + len(t2):
            return None
        self._busy = "evict"
        try:
            # Select without changing anything, then apply; both compare keys
            # (user code), so both run busy. picked: (key, chunk) pairs, each
            # followed by whether it comes from t1.
            picked = tuple(_select(t1, t2, self._target, n, protected))
            if len(picked) < 2 * n:
                return None
            pairs: tuple[tuple[Any, ChunkStatus], ...] = picked[::2]
            b1, b2 = self._b1, self._b2
            for (key, _), from_t1 in zip(pairs, picked[1::2]):
                if from_t1:
                    del t1[key]
                    b1[key] = None
                else:
                    del t2[key]
                    b2[key] = None
            # Forgotten ghosts are released after busy is cleared.
            released_on_return = (  # noqa: F841
                tuple(map(b1.popitem, repeat(False, len(b1) - self._capacity))),
                tuple(map(b2.popitem, repeat(False, len(b2) - self._capacity))),
            )
            return list(pairs)
        finally:
            self._busy = None

    def clear(self) -> None:
        self._enter("clear")
        # t1, t2, b1 and b2 in turn, then the target, as vLLM: a key released
        # meanwhile sees its list and those before it empty, the others not.
        for od in self._lists:
            od.clear()
        self._target = 0.0

    def mark_evictable(self, key: Any) -> None:
        return

    def mark_non_evictable(self, key: Any) -> None:
        return

    # --- views and checks -------------------------------------------------

    def _list_len(self, which: int) -> int:
        return len(self._lists[which])

    def _list_contains(self, which: int, key: Any) -> bool:
        return self._read(self._lists[which].__contains__, key)

    def _list_getitem(self, which: int, key: Any) -> Any:
        return self._read(self._lists[which].__getitem__, key)

    def _list_iter(self, which: int) -> Iterator[tuple[Any, Any]]:
        try:
            yield from self._lists[which].items()
        except RuntimeError:
            raise RuntimeError(MSG_MUTATED) from None

    def _check_invariants(self) -> None:
        """Raise AssertionError if the lists are inconsistent."""
        assert self._busy is None, f"{self._busy}() did not finish"
        self._busy = "_check_invariants"
        try:
            self._check()
        finally:
            self._busy = None

    def _check(self) -> None:
        seen: dict[Any, str] = {}
        for name, od in zip(LIST_NAMES, self._lists):
            for key, value in od.items():
                assert key not in seen, f"{key!r} is in {seen[key]} and {name}"
                seen[key] = name
                if name in ("t1", "t2"):
                    chunk_ref_offset(type(value))
                else:
                    assert value is None, f"ghost {key!r} holds {value!r}"
        for name, od in zip(("b1", "b2"), (self._b1, self._b2)):
            assert len(od) <= self._capacity, (
                f"{name} holds {len(od)} > cache_capacity {self._capacity}"
            )


def _held(keys: Iterable[Any]) -> tuple[Any, ...]:
    """The keys as working storage: a tuple. Made through an iterator, as
    CPython 3.11's tuple(list) reads the list's items after allocating the
    tuple, which may run a collection (and hooks that empty the list)."""
    return keys if type(keys) is tuple else tuple(iter(keys))


def _select(
    t1: OrderedDict[Any, ChunkStatus],
    t2: OrderedDict[Any, ChunkStatus],
    target: float,
    n: int,
    protected: Container[Any],
) -> Iterator[Any]:
    """Up to n victims in vLLM's order (fewer when there are not n), each
    as its (key, chunk) pair, then whether it comes from t1. t1's size is
    tracked virtually, and both scans only move forward (vLLM PR 50992)."""
    t1_victims = _victims(t1, protected)
    t2_victims = _victims(t2, protected)
    virtual_t1_size = len(t1)
    threshold = int(target)
    for _ in range(n):
        if virtual_t1_size >= threshold:
            entry = next(t1_victims, None)
            if entry is not None:
                yield entry
                yield True
                virtual_t1_size -= 1
                continue
        entry = next(t2_victims, None)
        if entry is not None:
            yield entry
            yield False
            continue
        # t2 has no victim left: fall back to t1 (vLLM PR 55461).
        entry = next(t1_victims, None)
        if entry is None:
            return
        yield entry
        yield True
        virtual_t1_size -= 1


def _values_in_first(
    keys: tuple[Any, ...], lists: tuple[OrderedDict[Any, Any], ...]
) -> Iterator[Any]:
    first = lists[0]
    for key in keys:
        for od in lists:
            if key in od:
                if od is first:
                    yield first[key]
                break


def _pop_entry(od: OrderedDict, key: Any) -> tuple[Any, Any]:
    """Remove key's entry; return the stored key object and the value."""
    od.move_to_end(key)
    return od.popitem()


def _victims(
    od: OrderedDict[Any, ChunkStatus], protected: Container[Any]
) -> Iterator[tuple[Any, ChunkStatus]]:
    """The entries of od with ref_cnt == 0 that are not protected, LRU first:
    one forward walk, however often it is resumed."""
    # read_ref_cnt, with the offset looked up again only when the chunk
    # type changes (the walk is the twin's hot loop).
    tp: type | None = None
    need = 0
    for key, chunk in od.items():
        if type(chunk) is not tp:
            need = chunk_ref_offset(type(chunk)) + 4
            tp = type(chunk)
        if sizeof(chunk) < need:
            read_ref_cnt(chunk)  # raises the shared TypeError
        if chunk.ref_cnt == 0 and key not in protected:
            yield key, chunk
