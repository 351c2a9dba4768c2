"""Pure-Python twin of the compiled ARC core, for debugging and type checkers.

It keeps vLLM's own layout (four OrderedDicts) so that a decision can be
followed line by line against vLLM's ``arc.py``.

Working storage (docs/hardening.md, "Rules"): what a call holds while user
code may run is complete when made and never changed after: the caller's
keys as a tuple made from a list (nothing runs while it fills), the victims
evict() picks and the key objects a call replaces or forgets as chains of
tuple cells, each made whole, and on_request_finished's classes in a
bytearray, which holds no objects. Whatever a call drops (a forgotten
ghost's key, a removed entry, a replaced key object) goes into the call's
`released` chain, so it is released when the call returns, after busy is
cleared.

Busy (the same rule as the core's): a call takes it with one atomic step
(dict.setdefault, on a dict of the policy's own in a __slots__ member,
never on its __dict__, which user code's keys share) inside the try whose
finally gives it back, and gives it
back only if it holds it, so an exception at any line (a trace hook, a
signal handler, a policy made by __new__) cannot leave it set, and a call
refused cannot clear another's. Giving it back is one `del` of the slot
the call holds, written out in the finally of every call with no call
before it (so neither a profile hook nor a signal handler can run
between its check and the `del`), and again in an outer finally: a trace
hook that raised at the first one's line is unset by the second (CPython
unsets a hook that raises). Reads take it only when it is free.
clear() and __init__ called again keep it while they release what they
drop, marked with their thread: that thread's calls (a __del__ that
calls back) nest, taking busy in the release's own slot, so that a
nested call's end never touches the release's; other threads' stay
refused.
"""

from __future__ import annotations

import numbers
from _thread import get_ident
from collections import OrderedDict
from collections.abc import Container, Iterable, Iterator, Sequence
from ctypes import sizeof
from typing import Any

from ._base import CachePolicy, ChunkStatus, order_request_keys
from ._checks import MAX_ENTRIES, check_capacity, check_evict_n, check_max_entries, check_target
from ._chunks import chunk_entry, chunk_ref_offset, read_ref_cnt
from ._doc import POLICY_DOC
from ._guard import vllm_guard
from ._messages import MSG_DUPLICATE, MSG_FULL, MSG_MUTATED, MSG_REENTRANT
from ._views import LIST_NAMES, ListView

__all__ = ["ARCCachePolicy"]

# on_request_finished's classes of keys
_INSERTED_ONLY = 1
_REUSED = 2
# The lists' names in a copy's or a pickle's state.
_LIST_ATTRS = ("_t1", "_t2", "_b1", "_b2")


# A running call's token, what busy holds: a list, a new object for every
# call (so only the call that took busy gives it back) and the cheapest one
# Python makes (get() makes one per key): [name, slot], slot being the dict
# whose "_busy" the call takes, the policy's own (its `_busy` slot) or,
# nested in a release, the release's own (get()'s fast path, which only
# takes the policy's, has no slot). While clear() or __init__ releases, two more
# items follow: its thread's ident and its own slot, for the calls that
# nest in it.
_Call = list[Any]


class _Busy(CachePolicy):
    """Where the twin's busy lives: the call now running while it may run
    user code (hashing, protected.__contains__, req_context, a collection),
    a _Call under "_busy" in a dict of the policy's own, absent when none
    runs. That dict is a __slots__ member (a descriptor on this class), not
    an instance-dict key: reading busy never hashes or compares a key that
    user code put in the instance's __dict__ (a key whose hash was
    "_busy"'s once ran its __eq__ in the give-back's check,
    docs/hardening.md rule 2). Every policy gets its dict when it is made."""

    __slots__ = ("_busy",)
    _busy: dict[str, _Call]

    def __new__(cls, *args: Any, **kwargs: Any) -> _Busy:
        self = super().__new__(cls)
        self._busy = {}
        return self


# The slot itself: read and written past any subclass's attribute access,
# and only on the twin's policies (TypeError for any other object).
_BUSY_SLOT: Any = _Busy.__dict__["_busy"]


class ARCCachePolicy(_Busy):
    __doc__ = POLICY_DOC  # one text, both implementations' (arc_cy._doc)

    # The lists t1, t2, b1 and b2, in one tuple: a list is replaced by one
    # assignment, so a call cut short by a hook cannot leave two t1s.
    _lists: tuple[OrderedDict[Any, Any], ...]

    def __init__(self, cache_capacity: int) -> None:
        if vllm_guard.pending:
            vllm_guard.check()
        # Called again, it starts over as vLLM's __init__ does: capacity and
        # target first, then each list is replaced in turn; _max_entries
        # (arc_cy's own) is reset too.
        call: _Call = ["__init__", _slot(self)]
        try:
            try:
                _begin(call)
                capacity = check_capacity(cache_capacity)
                call += (get_ident(), {})  # from here it only releases
                self._capacity = capacity
                self._limit = MAX_ENTRIES
                self._target: Any = 0.0
                if "_lists" not in self.__dict__:
                    # The views first: a policy that has lists has views.
                    self._views = (
                        ListView(self, 0),
                        ListView(self, 1),
                        ListView(self, 2),
                        ListView(self, 3),
                    )
                    self._lists = (OrderedDict(), OrderedDict(), OrderedDict(), OrderedDict())
                    return
                for which in range(4):
                    self._replace_list(which)
            finally:
                if "_busy" in call[1] and call[1]["_busy"] is call:
                    del call[1]["_busy"]
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]

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
        _slot(self)
        self._views = (ListView(self, 0), ListView(self, 1), ListView(self, 2), ListView(self, 3))
        if len(lists) == 4:  # a copy of a policy made by __new__ has none
            self._lists = (lists[0], lists[1], lists[2], lists[3])

    # --- attributes -------------------------------------------------------

    @property
    def cache_capacity(self) -> int:
        return self._capacity

    @property
    def target_t1_size(self) -> float | numbers.Real:
        return self._target  # type: ignore[no-any-return]

    @target_t1_size.setter
    def target_t1_size(self, value: float | numbers.Real) -> None:
        call = ["target_t1_size", self._busy]
        try:
            try:
                _begin(call)  # the check runs the value's code
                self._target = check_target(value)
            finally:
                if "_busy" in call[1] and call[1]["_busy"] is call:
                    del call[1]["_busy"]
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]

    @property
    def _max_entries(self) -> int:
        """The most entries (t1, t2, b1 and b2 together) the policy holds."""
        return self._limit

    @_max_entries.setter
    def _max_entries(self, value: int) -> None:
        # For tests: the compiled core's limit, reached without 2**29 entries.
        call = ["_max_entries", self._busy]
        try:
            try:
                _begin(call)
                self._limit = check_max_entries(value)  # runs value.__index__
            finally:
                if "_busy" in call[1] and call[1]["_busy"] is call:
                    del call[1]["_busy"]
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]

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

    # --- CachePolicy ------------------------------------------------------

    def _read(self, fn: Any, *args: Any) -> Any:
        # Reads nest in a running call and lock out mutators only; the
        # OrderedDicts re-check themselves after every __eq__.
        call: _Call = ["get", self._busy]
        try:
            try:
                _begin(call, read=True)
                return fn(*args)
            finally:
                if "_busy" in call[1] and call[1]["_busy"] is call:
                    del call[1]["_busy"]
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]

    def get(self, key: Any) -> ChunkStatus | None:
        # _read inlined where busy is free: vLLM calls get() for every key
        # of every lookup and store, and the twin must keep within 10% of
        # vLLM arc there. The truth test of `or` is user code: under busy.
        call = ["get"]
        state = self._busy
        try:
            try:
                if state.setdefault("_busy", call) is not call:
                    return self._read(self._get, key)  # type: ignore[no-any-return]
                lists = self._lists
                return lists[0].get(key) or lists[1].get(key)  # type: ignore[no-any-return]
            finally:
                if "_busy" in state and state["_busy"] is call:
                    del state["_busy"]
        finally:
            if "_busy" in state and state["_busy"] is call:
                del state["_busy"]

    def _get(self, key: Any) -> ChunkStatus | None:
        lists = self._lists
        return lists[0].get(key) or lists[1].get(key)  # type: ignore[no-any-return]

    def insert(self, key: Any, chunk: ChunkStatus, req_context: Any = None) -> None:
        call = ["insert", self._busy]
        released: _Chain = ()
        try:
            try:
                _begin(call)
                t1, t2, b1, b2 = self._lists
                chunk_ref_offset(type(chunk))  # as the core: the type as it is now
                # vLLM: `t1[key] = chunk` replaces a resident entry (or holds the
                # key in both lists); arc_cy refuses it, and a full policy.
                if key in t1:
                    raise ValueError(MSG_DUPLICATE.format(key, "t1"))
                if key in t2:
                    raise ValueError(MSG_DUPLICATE.format(key, "t2"))
                if key in b1:
                    released = (_pop_entry(b1, key), released)
                elif key in b2:
                    released = (_pop_entry(b2, key), released)
                elif len(t1) + len(t2) + len(b1) + len(b2) >= self._limit:
                    raise MemoryError(MSG_FULL.format(self._limit))
                t1[key] = chunk
                del t1, t2, b1, b2  # before what is released (rule 6)
            finally:
                if "_busy" in call[1] and call[1]["_busy"] is call:
                    del call[1]["_busy"]
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]

    def remove(self, key: Any) -> None:
        call = ["remove", self._busy]
        released: _Chain = ()
        try:
            try:
                _begin(call)
                t1, t2 = self._lists[:2]
                if key in t1:
                    released = (_pop_entry(t1, key), released)
                elif key in t2:
                    released = (_pop_entry(t2, key), released)
                del t1, t2  # before what is released (rule 6)
            finally:
                if "_busy" in call[1] and call[1]["_busy"] is call:
                    del call[1]["_busy"]
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]

    def _adapt_to_ghost_hit(self, key: Any) -> None:
        _, _, b1, b2 = self._lists
        if key in b1:
            delta = max(1, len(b2) / len(b1))
            self._target = min(self._target + delta, self._capacity)
            b1.move_to_end(key)
        elif key in b2:
            delta = max(1, len(b1) / len(b2))
            self._target = max(self._target - delta, 0)
            b2.move_to_end(key)

    def on_store_miss(self, keys: Iterable[Any], req_context: Any) -> None:
        call = ["on_store_miss", self._busy]
        try:
            try:
                _begin(call)
                keys = _held(keys)
                _, _, b1, b2 = self._lists
                for key in keys:  # every lookup first: a failure changes nothing
                    key in b1 or key in b2  # noqa: B018 -- for what it raises, not its value
                for key in reversed(keys):
                    self._adapt_to_ghost_hit(key)
            finally:
                if "_busy" in call[1] and call[1]["_busy"] is call:
                    del call[1]["_busy"]
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]

    def touch(self, keys: Iterable[Any], req_context: Any) -> None:
        call = ["touch", self._busy]
        try:
            try:
                _begin(call)
                t1, t2, b1, b2 = self._lists
                keys = _held(keys)
                # vLLM: looks each key up as it applies it, and asks is_ready.
                # Here every lookup first, and every t1 chunk's ref_cnt read
                # (kept, as the core keeps it): a failure changes nothing, and a
                # chunk whose class changes while the call runs is moved by what
                # was read.
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
                        if pending[j]:
                            # still being stored: not a second access
                            t1[key] = chunk
                        else:
                            t2[key] = chunk
                    elif key in t2:
                        t2.move_to_end(key)
                    else:
                        self._adapt_to_ghost_hit(key)
                del t1, t2, b1, b2  # before what is released (rule 6)
            finally:
                if "_busy" in call[1] and call[1]["_busy"] is call:
                    del call[1]["_busy"]
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]

    def on_request_access(self, keys: Iterable[Any], req_context: Any) -> None:
        return

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[Any]],
        insertion_only_keys: Container[Any],
        reused_keys: Container[Any],
        req_context: Any,
    ) -> None:
        call = ["on_request_finished", self._busy]
        try:
            try:
                _begin(call)
                t1, t2 = self._lists[:2]
                keys = _held(order_request_keys(key_groups, req_context))
                tail_first = range(len(keys) - 1, -1, -1)
                # vLLM: asks both containers about each key as it applies it.
                # Here every key is classified (tail first), then looked up,
                # before the first change: a failure changes nothing.
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
                    if not kinds[j]:
                        continue
                    keys[j] in t1 or keys[j] in t2
                released: _Chain = ()  # the replaced key objects
                od = None
                for j in tail_first:
                    key, kind = keys[j], kinds[j]
                    od = (t1 if key in t1 else t2 if key in t2 else None) if kind else None
                    if od is None:
                        continue
                    if kind == _REUSED and od is t1:
                        old_key, chunk = _pop_entry(t1, key)
                        released = (old_key, released)
                        t2[key] = chunk
                        continue
                    # A store is not a frequency hit: it refreshes recency
                    # only, as a reuse does in t2.
                    od.move_to_end(key)
                del t1, t2, od  # before what is released (rule 6)
            finally:
                if "_busy" in call[1] and call[1]["_busy"] is call:
                    del call[1]["_busy"]
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]

    def evict(self, n: int, protected: Container[Any]) -> list[tuple[Any, ChunkStatus]] | None:
        call = ["evict", self._busy]
        try:
            try:
                _begin(call)  # n.__index__ is user code too
                n = check_evict_n(n)
                if n == 0:
                    return []
                t1, t2, b1, b2 = self._lists
                # Select without changing anything (the scans compare keys: user
                # code). vLLM: candidates in a list; here picked, a chain (rule
                # 4) of cells (entry, from_t1, rest), flat for speed, the last
                # victim first; entry is the (key, chunk) pair the result holds.
                picked: _Chain = ()
                virtual_t1_size = len(t1)
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
                        return None
                    picked = (entry, True, picked)
                    virtual_t1_size -= 1
                victims = _reversed(picked)  # first victim first
                cell = victims
                for _ in range(n):  # the chain's n cells
                    (key, _), from_t1, cell = cell
                    resident, ghost = (t1, b1) if from_t1 else (t2, b2)
                    del resident[key]
                    ghost[key] = None
                released: _Chain = ()  # the forgotten ghosts
                for ghost in (b1, b2):
                    for _ in range(len(ghost) - self._capacity):
                        released = (ghost.popitem(last=False), released)
                del t1, t2, b1, b2, resident, ghost, t1_victims, t2_victims  # rule 6
                return _entries(victims)
            finally:
                if "_busy" in call[1] and call[1]["_busy"] is call:
                    del call[1]["_busy"]
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]

    def clear(self) -> None:
        call: _Call = ["clear", self._busy]
        try:
            try:
                _begin(call)
                call += (get_ident(), {})  # nothing but releasing runs from here
                # t1, t2, b1 and b2 in turn, then the target, as vLLM: a key
                # released meanwhile sees its list and those before it empty,
                # the others not. Each list is looked up when its turn comes,
                # so lists an __init__ nested in a __del__ replaced go there.
                for which in range(4):
                    self._replace_list(which, clear=True)
                self._target = 0.0
            finally:
                if "_busy" in call[1] and call[1]["_busy"] is call:
                    del call[1]["_busy"]
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]

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

    def _check_invariants(self) -> None:
        """Raise AssertionError if the lists are inconsistent."""
        running = self._busy.get("_busy")
        assert running is None, f"{running[0]}() did not finish"
        call = ["_check_invariants", self._busy]
        try:
            try:
                _begin(call)
                self._check()
            finally:
                if "_busy" in call[1] and call[1]["_busy"] is call:
                    del call[1]["_busy"]
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]

    def _check(self) -> None:
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


def _begin(call: _Call, read: bool = False) -> None:
    """Take busy for call in its slot (call[1]), inside the try whose
    finally gives it back; while another call runs, in any thread, a
    mutator is refused and a read nests without it, unless that call is a
    clear() or __init__ releasing in this thread (a __del__ calls back):
    then call takes busy in the release's own slot, which it names in
    call[1] first. Every call does this before any user code runs. Each
    step is one store, and the finally gives back only what call holds, so
    a hook that raises between two steps leaves nothing taken. A function,
    not a method: a method called through the class on another object must
    not dispatch its release to that object (which may lack it, and leave
    busy taken)."""
    running = call[1].setdefault("_busy", call)  # one atomic step
    while running is not call:
        if len(running) > 2 and running[2] == get_ident():
            call[1] = running[3]
            running = call[1].setdefault("_busy", call)
        elif read:
            return
        else:
            raise RuntimeError(MSG_REENTRANT.format(call[0], _innermost(running)[0]))


def _slot(policy: ARCCachePolicy) -> dict[str, _Call]:
    """The policy's busy dict, made if it has none (a policy made by
    object.__new__, or cleared by the collector): for __init__ and
    __setstate__. Another object is refused (TypeError), and left as it
    was."""
    try:
        return _BUSY_SLOT.__get__(policy)  # type: ignore[no-any-return]
    except AttributeError:
        slot: dict[str, _Call] = {}
        _BUSY_SLOT.__set__(policy, slot)
        return slot


def _innermost(running: _Call) -> _Call:
    """The call running in running's release, if one nests there, and so
    on: the call whose name a refusal gives, as the core's busy does."""
    while len(running) > 2 and "_busy" in running[3]:
        running = running[3]["_busy"]
    return running


def _copies(lists: tuple[OrderedDict[Any, Any], ...]) -> list[OrderedDict[Any, Any]]:
    """A copy of each list, for __getstate__."""
    return [OrderedDict(od) for od in lists]


# A chain: () or (item, rest), one tuple cell per item, each made whole in
# one step (rule 4), so nothing that runs meanwhile (a key's __eq__, a
# collection) can see it half made or change it. A call pushes with
# `chain = (item, chain)` and walks it with `item, chain = chain`: the
# victims evict() picks (its cells flat, (entry, from_t1, rest)), and
# `released`, what a call drops (a forgotten ghost's key, a removed entry, a
# replaced key object), released when the call returns, after busy is
# given back. evict()'s walks are loops in a function, not generators: a
# generator over the cells cost evict() a quarter more.
_Chain = tuple[Any, ...]


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
