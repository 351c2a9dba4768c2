"""Pure-Python twin of the compiled ARC core, for debugging and type checkers.

It keeps vLLM's own layout (four OrderedDicts) and its methods' names,
order and steps, so that a decision can be followed side by side with
vLLM's ``arc.py``: ``__init__``, ``get``, ``insert``, ``remove``,
``_adapt_to_ghost_hit``, ``on_store_miss``, ``touch`` (0.30 to 0.33),
``on_request_finished``, ``clear`` and ``evict``, then arc_cy's own
(``tests/test_twin_reads_like_arc.py`` holds it to that).

Busy and the argument checks (docs/hardening.md, rule 2) are stated once,
in arc_cy._busy: ``@protocol`` below names the methods that run under busy,
how, and each one's checks, and puts in each one's place a wrapper
generated from one template, which takes busy, checks the arguments, calls
the method written here and gives busy back.

What arc_cy adds to vLLM's steps (docs/hardening.md, "Rules"): a call that
raises has changed nothing, so every lookup comes before the first change
(rule 11); what a call holds while user code may run is complete when made
and never changed after (rule 4): the caller's keys as a tuple made from a
list (nothing runs while it fills), the victims evict() picks and the key
objects a call replaces or forgets as chains of tuple cells, each made
whole, and on_request_finished's classes in a bytearray, which holds no
objects. What a call drops (a forgotten ghost's key, a removed entry, a
replaced key object) it returns with its result, ``(result, released)``,
so that its wrapper releases it after busy is given back (rule 6).
"""

from __future__ import annotations

import numbers
from collections import OrderedDict
from collections.abc import Container, Iterable, Iterator, Sequence
from ctypes import sizeof
from typing import Any

from ._base import ChunkStatus, order_request_keys
from ._busy import Busy, Method, busy_slot, idle, protocol
from ._checks import MAX_ENTRIES, check_capacity, check_evict_n, check_max_entries, check_target
from ._chunks import chunk_entry, chunk_ref_offset, read_ref_cnt
from ._doc import POLICY_DOC
from ._guard import vllm_guard
from ._messages import MSG_DUPLICATE, MSG_FULL, MSG_MUTATED
from ._views import LIST_NAMES, ListView, list_views

__all__ = ["ARCCachePolicy"]

# on_request_finished's classes of keys
_INSERTED_ONLY = 1
_REUSED = 2
# The lists' names in a copy's or a pickle's state.
_LIST_ATTRS = ("_t1", "_t2", "_b1", "_b2")

# A chain: () or (item, rest), one tuple cell per item, each made whole in
# one step (rule 4), so nothing that runs meanwhile (a key's __eq__, a
# collection) can see it half made or change it: `chain = (item, chain)`
# pushes, `item, chain = chain` walks. evict()'s cells are flat, (entry,
# from_t1, rest); its walks are loops in a function, not generators: a
# generator over the cells cost evict() a quarter more.
_Chain = tuple[Any, ...]


# --- what runs before a method: its arguments' checks -----------------------


def _made(policy: Any) -> dict[str, Any]:
    """__init__'s first step, outside busy: the vLLM guard, then the
    policy's busy dict (made if it has none: a policy made by
    object.__new__)."""
    if vllm_guard.pending:
        vllm_guard.check()
    return busy_slot(policy)


def _chunk(chunk: Any) -> Any:
    """insert()'s chunk, checked as the core checks it: its type as it is
    now (rule 7)."""
    chunk_ref_offset(type(chunk))
    return chunk


def _held(keys: Iterable[Any]) -> tuple[Any, ...]:
    """The keys as working storage: a tuple, made from a list through its
    iterator, so nothing runs while the tuple fills (CPython 3.11's
    tuple(list) reads the list after an allocation that may run a
    collection; tuple(generator) would show a half-made tuple to it).
    Any other iterable becomes a list first, as vLLM's list(keys)."""
    if type(keys) is tuple:
        return keys
    if type(keys) is not list:
        keys = list(keys)
    return tuple(iter(keys))


@protocol(
    __init__=Method(before=_made, releases=True, cache_capacity=check_capacity),
    get=Method(read=True),
    insert=Method(drops=True, chunk=_chunk),
    remove=Method(drops=True),
    on_store_miss=Method(keys=_held),
    on_request_finished=Method(drops=True),
    clear=Method(releases=True),
    evict=Method(drops=True, n=check_evict_n),
    touch=Method(drops=True, keys=_held),
    target_t1_size=Method(value=check_target),
    _max_entries=Method(value=check_max_entries),
    _read=Method(read=True),
    _check_invariants=Method(before=idle),
)
class ARCCachePolicy(Busy):
    __doc__ = POLICY_DOC  # one text, both implementations' (arc_cy._doc)

    # The lists t1, t2, b1 and b2, in one tuple: a list is replaced by one
    # assignment, so a call cut short by a hook cannot leave two t1s.
    _lists: tuple[OrderedDict[Any, Any], ...]

    def __init__(self, cache_capacity: int) -> None:
        # Called again, it starts over as vLLM's does: capacity and target
        # first, then each list is replaced in turn; _max_entries (arc_cy's
        # own) is reset too.
        self._capacity = cache_capacity
        self._limit = MAX_ENTRIES
        self._target: Any = 0.0
        if "_lists" not in self.__dict__:
            # The views first: a policy that has lists has views.
            self._views = list_views(self)
            self._lists = (OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict())
            return
        for which in range(4):
            self._replace_list(which)

    def get(self, key: Any) -> ChunkStatus | None:
        # vLLM calls get() for every key of every lookup and store: the
        # lists, not the views. The truth test of `or` is the call's.
        lists = self._lists
        return lists[0].get(key) or lists[1].get(key)  # type: ignore[no-any-return]

    def insert(self, key: Any, chunk: ChunkStatus, req_context: Any = None) -> None:
        t1, t2, b1, b2 = self._lists
        # vLLM: `t1[key] = chunk` replaces a resident entry (or holds the
        # key in both lists); arc_cy refuses it, and a full policy.
        if key in t1:
            raise ValueError(MSG_DUPLICATE.format(key, "t1"))
        if key in t2:
            raise ValueError(MSG_DUPLICATE.format(key, "t2"))
        released: _Chain = ()  # the forgotten ghost's entry
        if key in b1:
            released = _pop_entry(b1, key)
        elif key in b2:
            released = _pop_entry(b2, key)
        elif len(t1) + len(t2) + len(b1) + len(b2) >= self._limit:
            raise MemoryError(MSG_FULL.format(self._limit))
        t1[key] = chunk
        return None, released

    def remove(self, key: Any) -> None:
        t1, t2 = self._lists[:2]
        if key in t1:
            return None, _pop_entry(t1, key)
        if key in t2:
            return None, _pop_entry(t2, key)
        return None, ()

    def _adapt_to_ghost_hit(self, key: Any) -> bool:
        _, _, b1, b2 = self._lists
        if key in b1:
            delta = max(1, len(b2) / len(b1))
            self._target = min(self._target + delta, self._capacity)
            b1.move_to_end(key)
            return True
        if key in b2:
            delta = max(1, len(b1) / len(b2))
            self._target = max(self._target - delta, 0)
            b2.move_to_end(key)
            return True
        return False

    def on_store_miss(self, keys: Iterable[Any], req_context: Any) -> None:
        _, _, b1, b2 = self._lists
        for key in keys:  # every lookup first: a failure changes nothing
            key in b1 or key in b2  # noqa: B018 -- for what it raises, not its value
        for key in reversed(keys):
            self._adapt_to_ghost_hit(key)

    def touch(self, keys: Iterable[Any], req_context: Any) -> None:
        t1, t2, b1, b2 = self._lists
        # vLLM: looks each key up as it applies it, and asks is_ready. Here
        # every lookup first, and every t1 chunk's ref_cnt read (kept, as
        # the core keeps it): a failure changes nothing, and a chunk whose
        # class changes while the call runs is moved by what was read.
        pending = bytearray(len(keys))  # 1: a t1 chunk still being stored
        for j, key in enumerate(keys):
            if key in t1:
                pending[j] = read_ref_cnt(t1[key]) < 0
            else:
                key in t2 or key in b1 or key in b2  # noqa: B018 -- as in on_store_miss
        released: _Chain = ()  # the replaced key objects
        for j in range(len(keys) - 1, -1, -1):
            key = keys[j]
            if key in t1:
                old_key, chunk = _pop_entry(t1, key)
                released = (old_key, released)
                if pending[j]:  # still being stored: not a second access
                    t1[key] = chunk
                else:
                    t2[key] = chunk
            elif key in t2:
                t2.move_to_end(key)
            else:
                self._adapt_to_ghost_hit(key)
        return None, released

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[Any]],
        insertion_only_keys: Container[Any],
        reused_keys: Container[Any],
        req_context: Any,
    ) -> None:
        t1, t2 = self._lists[:2]
        keys = _held(order_request_keys(key_groups, req_context))
        tail_first = range(len(keys) - 1, -1, -1)
        # vLLM asks both containers about each key as it applies it. Here
        # every key is classified (tail first), then looked up, before the
        # first change: a failure changes nothing.
        kinds = bytearray(len(keys))
        for j in tail_first:
            kinds[j] = (
                _INSERTED_ONLY
                if keys[j] in insertion_only_keys
                else _REUSED
                if keys[j] in reused_keys
                else 0
            )
        for j in tail_first:
            if kinds[j]:
                keys[j] in t1 or keys[j] in t2  # as in on_store_miss
        released: _Chain = ()  # the replaced key objects
        for j in tail_first:
            key = keys[j]
            if kinds[j] == _INSERTED_ONLY:
                # A store is not a frequency hit. Preserve T1 membership
                # while still restoring tail-to-head recency.
                if key in t1:
                    t1.move_to_end(key)
                elif key in t2:
                    t2.move_to_end(key)
            elif kinds[j] == _REUSED:
                # Ready chunks reused by this request count as one access.
                if key in t1:
                    old_key, chunk = _pop_entry(t1, key)
                    released = (old_key, released)
                    t2[key] = chunk
                elif key in t2:
                    t2.move_to_end(key)
        return None, released

    def clear(self) -> None:
        # t1, t2, b1 and b2 in turn, then the target, as vLLM: a key
        # released meanwhile sees its list and those before it empty, the
        # others not. Each list is looked up when its turn comes, so lists
        # an __init__ nested in a __del__ replaced go there.
        for which in range(4):
            self._replace_list(which, clear=True)
        self._target = 0.0

    def evict(self, n: int, protected: Container[Any]) -> list[tuple[Any, ChunkStatus]] | None:
        if n == 0:
            return [], ()
        t1, t2, b1, b2 = self._lists
        # Select without changing anything (the scans compare keys: user
        # code). vLLM: candidates in a list; here picked, a chain of cells
        # (entry, from_t1, rest), the last victim first; entry is the
        # (key, chunk) pair the result holds.
        picked: _Chain = ()
        virtual_t1_size = len(t1)
        # Keep the scans monotonic, as vLLM's iterators do.
        t1_victims = _victims(t1, protected)
        t2_victims = _victims(t2, protected)
        for _ in range(n):
            if virtual_t1_size >= int(self._target):
                entry = next(t1_victims, None)
                if entry is not None:
                    picked = (entry, True, picked)
                    virtual_t1_size -= 1
                    continue
            entry = next(t2_victims, None)
            if entry is not None:
                picked = (entry, False, picked)
                continue
            # t2 has no victim left: fall back to t1 (vLLM PR 55461).
            entry = next(t1_victims, None)
            if entry is None:
                return None, ()
            picked = (entry, True, picked)
            virtual_t1_size -= 1
        # Apply all evictions now that we know n candidates exist.
        victims = cell = _reversed(picked)  # first victim first
        for _ in range(n):
            (key, _), from_t1, cell = cell
            resident, ghost = (t1, b1) if from_t1 else (t2, b2)
            del resident[key]
            ghost[key] = None
        # Trim ghost lists to cache_capacity.
        released: _Chain = ()  # the forgotten ghosts
        for ghost in (b1, b2):
            for _ in range(len(ghost) - self._capacity):
                released = (ghost.popitem(last=False), released)
        return _entries(victims), released

    # --- arc_cy's own ----------------------------------------------------------

    def on_request_access(self, keys: Iterable[Any], req_context: Any) -> None:
        return

    def mark_evictable(self, key: Any) -> None:
        return

    def mark_non_evictable(self, key: Any) -> None:
        return

    @property
    def cache_capacity(self) -> int:
        return self._capacity

    @property
    def target_t1_size(self) -> float | numbers.Real:
        return self._target  # type: ignore[no-any-return]

    @target_t1_size.setter
    def target_t1_size(self, value: float | numbers.Real) -> None:
        self._target = value

    @property
    def _max_entries(self) -> int:
        """The most entries (t1, t2, b1 and b2 together) the policy holds."""
        return self._limit

    @_max_entries.setter
    def _max_entries(self, value: int) -> None:
        # For tests: the compiled core's limit, reached without 2**29 entries.
        self._limit = value

    # --- views ----------------------------------------------------------------

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

    def _read(self, fn: Any, *args: Any) -> Any:
        # Reads nest in a running call and lock out mutators only; the
        # OrderedDicts re-check themselves after every __eq__.
        return fn(*args)

    def _list_len(self, which: int) -> int:
        return len(self._lists[which])

    def _list_contains(self, which: int, key: Any) -> bool:
        return self._read(self._lists[which].__contains__, key)  # type: ignore[no-any-return]

    def _list_getitem(self, which: int, key: Any) -> Any:
        return self._read(self._lists[which].__getitem__, key)

    def _list_iter(self, which: int) -> Iterator[tuple[Any, Any]]:
        od = self._lists[which]
        items = iter(od.items())
        try:
            while True:
                # As the core: a change since the last step (here: __init__
                # replaced the list) fails this one, unless the list is done.
                replaced = self._lists[which] is not od
                item = next(items, None)
                if item is None:
                    return
                if replaced:
                    raise RuntimeError(MSG_MUTATED)
                yield item
        except RuntimeError:
            raise RuntimeError(MSG_MUTATED) from None

    # --- state ----------------------------------------------------------------

    def _replace_list(self, which: int, clear: bool = False) -> None:
        # As vLLM's `self.t1 = OrderedDict()` (or, with clear, its
        # `self.t1.clear()`): the old list is released now, before the next
        # list is replaced. It is taken out whole first, so what a __del__
        # writes meanwhile lands in the new list.
        lists = self._lists
        if type(which) is not int or not 0 <= which < 4:
            raise IndexError(which)  # a list number, as the core: four lists stay four
        old = lists[which]
        self._lists = lists[:which] + (OrderedDict(),) + lists[which + 1 :]
        del lists
        if clear:
            old.clear()  # the values in insertion order, then the keys in list order

    def __getstate__(self) -> dict[str, Any]:
        # For copy and pickle: the lists, copied (a shallow copy of a
        # running policy must not share them), and the scalars. Busy (a
        # copy made from a callback is not running anything) is not state;
        # the views are rebuilt.
        state = self.__dict__.copy()
        for attr in ("_lists", "_views"):
            state.pop(attr, None)
        if "_lists" in self.__dict__:
            # Copying a list hashes its keys: user code, run as a read.
            state.update(zip(_LIST_ATTRS, self._read(_copies, self._lists)))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        lists = [state.pop(attr) for attr in _LIST_ATTRS if attr in state]
        self.__dict__.update(state)
        busy_slot(self)
        self._views = list_views(self)
        if len(lists) == 4:  # a copy of a policy made by __new__ has none
            self._lists = (lists[0], lists[1], lists[2], lists[3])

    def _check_invariants(self) -> None:
        """Raise AssertionError if the lists are inconsistent."""
        # By identity: keys that break the hash/eq contract must pass too.
        seen: dict[int, str] = {}
        lists = self._lists
        assert type(lists) is tuple and len(lists) == 4, f"_lists is {lists!r}"
        for name, od in zip(LIST_NAMES, lists):
            for key, value in od.items():
                assert id(key) not in seen, f"{key!r} is in {seen[id(key)]} and {name}"
                seen[id(key)] = name
                if name in ("t1", "t2"):
                    chunk_ref_offset(type(value))
                else:
                    assert value is None, f"ghost {key!r} holds {value!r}"
        for name, od in zip(("b1", "b2"), lists[2:]):
            assert len(od) <= self._capacity, (
                f"{name} holds {len(od)} > cache_capacity {self._capacity}"
            )


# --- helpers ----------------------------------------------------------------


def _copies(lists: tuple[OrderedDict[Any, Any], ...]) -> list[OrderedDict[Any, Any]]:
    """A copy of each list, for __getstate__."""
    return [OrderedDict(od) for od in lists]


def _reversed(cells: _Chain) -> _Chain:
    """evict()'s cells (entry, from_t1, rest), in the other order."""
    out: _Chain = ()
    while cells:
        entry, from_t1, cells = cells
        out = (entry, from_t1, out)
    return out


def _entries(cells: _Chain) -> list[Any]:
    """The entries of evict()'s cells, in order: a list, which never holds
    a NULL item, unlike a tuple being filled."""
    out = []
    while cells:
        entry, _, cells = cells
        out.append(entry)
    return out


def _pop_entry(od: OrderedDict, key: Any) -> tuple[Any, Any]:
    """Remove key's entry; return the stored key object and the value."""
    od.move_to_end(key)
    return od.popitem()


def _victims(
    od: OrderedDict[Any, ChunkStatus], protected: Container[Any]
) -> Iterator[tuple[Any, ChunkStatus]]:
    """The entries of od with ref_cnt == 0 that are not protected, LRU first:
    one forward walk, however often it is resumed."""
    # read_ref_cnt, with the type checked again only when the chunk's type
    # is another or its version tag moved (the walk is the twin's hot loop).
    tp: type | None = None
    need = tag = 0
    view: Any = None
    for key, chunk in od.items():
        if type(chunk) is not tp or view.value != tag:
            tp = type(chunk)
            _, tag, need, view = chunk_entry(tp)
            need += 4
        if sizeof(chunk) < need:
            read_ref_cnt(chunk)  # raises the shared TypeError
        if chunk.ref_cnt == 0 and key not in protected:
            yield key, chunk
