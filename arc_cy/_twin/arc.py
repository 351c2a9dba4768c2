"""Pure-Python twin of the compiled ARC core: vLLM's ``arc.py``, to read,
to step through in a debugger, and for type checkers.

Its methods are vLLM's, in vLLM's order and with vLLM's steps
(``tests/test_twin_reads_like_arc.py``), ``touch`` (vLLM 0.30 to 0.33)
included, so they make the core's decisions on every legal input (vLLM's
calls: hashable keys, ``ChunkStatus`` chunks, sets). It is exposed as vLLM's
ARC is: ``t1``, ``t2``, ``b1``, ``b2`` are its ``OrderedDict``s,
``target_t1_size`` and ``cache_capacity`` plain attributes, and what vLLM's
ARC raises on an input it raises. It adds one rule to vLLM's: a mutating
call made while another runs (user code calling back: a key's ``__eq__``,
``protected.__contains__``, a ``__del__``) is refused with RuntimeError, as
the core refuses it. The core's other rules, which keep a compiled policy
memory safe on hostile input, are the core's alone (docs/hardening.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Iterator, Sequence
from typing import Any

from .._guard import vllm_guard
from .._messages import MSG_REENTRANT
from .._policy import POLICY_DOC
from .._record import Recorder, record_for
from .._vllm import CachePolicy, ChunkStatus, order_request_keys

__all__ = ["ARCCachePolicy", "mutating"]


class mutating:
    """``with mutating(self, "evict"):`` runs a twin's mutating call, and
    refuses it (RuntimeError, as the core does) while another mutating call
    of the policy runs. A class, as contextlib's ``suppress`` is: a
    generator-based context manager cost a twin's insert() four times
    vLLM's."""

    __slots__ = ("policy", "name")

    def __init__(self, policy: Any, name: str) -> None:
        self.policy, self.name = policy, name

    def __enter__(self) -> None:
        running = self.policy._running
        if running is not None:
            raise RuntimeError(MSG_REENTRANT.format(self.name, running))
        self.policy._running = self.name

    def __exit__(self, *exc_info: object) -> None:
        self.policy._running = None


class ARCCachePolicy(CachePolicy):
    __doc__ = POLICY_DOC  # one text, both implementations' (arc_cy._policy)

    _running: str | None = None  # the mutating call under way (mutating())
    _recorder: Recorder | None = None  # ARC_CY_RECORD_TRACE's (arc_cy._record)
    target_t1_size: Any  # a float, or any Real as set (a Fraction stays exact), as in vLLM

    def __init__(self, cache_capacity: int) -> None:
        if vllm_guard.pending:
            vllm_guard.check()
        with mutating(self, "__init__"):
            super().__init__(cache_capacity)
            self.target_t1_size = 0.0
            self.t1: OrderedDict[Any, ChunkStatus] = OrderedDict()
            self.t2: OrderedDict[Any, ChunkStatus] = OrderedDict()
            # key -> None (only care about presence)
            self.b1: OrderedDict[Any, None] = OrderedDict()
            self.b2: OrderedDict[Any, None] = OrderedDict()
        if self._recorder is None:
            self._recorder = record_for(self, cache_capacity)

    def get(self, key: Any) -> ChunkStatus | None:
        return self.t1.get(key) or self.t2.get(key)

    def insert(self, key: Any, chunk: ChunkStatus, req_context: Any = None) -> None:
        with mutating(self, "insert"):
            self.t1[key] = chunk
            self.b1.pop(key, None)
            self.b2.pop(key, None)

    def remove(self, key: Any) -> None:
        with mutating(self, "remove"):
            if self.t1.pop(key, None) is None:
                self.t2.pop(key, None)

    def _adapt_to_ghost_hit(self, key: Any) -> bool:
        if key in self.b1:
            delta = max(1, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
            self.b1.move_to_end(key)
            return True
        if key in self.b2:
            delta = max(1, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            self.b2.move_to_end(key)
            return True
        return False

    def on_store_miss(self, keys: Iterable[Any], req_context: Any) -> None:
        with mutating(self, "on_store_miss"):
            for key in reversed(list(keys)):
                self._adapt_to_ghost_hit(key)
        if self._recorder is not None:
            self._recorder.missed(req_context)

    def touch(self, keys: Iterable[Any], req_context: Any) -> None:
        with mutating(self, "touch"):
            for key in reversed(list(keys)):
                if key in self.t1:
                    chunk = self.t1.pop(key)
                    # vLLM asks `not chunk.is_ready`, which its ChunkStatus
                    # answers so; the core reads ref_cnt, and so does this.
                    if chunk.ref_cnt < 0:
                        # chunk was just prepared to be stored, not really
                        # touched twice: keep it in T1 as most recently used
                        self.t1[key] = chunk
                    else:
                        self.t2[key] = chunk
                elif key in self.t2:
                    self.t2.move_to_end(key)
                else:
                    self._adapt_to_ghost_hit(key)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[Any]],
        insertion_only_keys: Container[Any],
        reused_keys: Container[Any],
        req_context: Any,
    ) -> None:
        with mutating(self, "on_request_finished"):
            keys = order_request_keys(key_groups, req_context)
            for key in reversed(keys):
                if key in insertion_only_keys:
                    # A store is not a frequency hit. Preserve T1 membership
                    # while still restoring tail-to-head recency.
                    if key in self.t1:
                        self.t1.move_to_end(key)
                    elif key in self.t2:
                        self.t2.move_to_end(key)
                    continue

                # Ready chunks reused by this request count as one access.
                if key in reused_keys and key in self.t1:
                    chunk = self.t1.pop(key)
                    self.t2[key] = chunk
                elif key in reused_keys and key in self.t2:
                    self.t2.move_to_end(key)
        if self._recorder is not None:
            self._recorder.finished(keys, reused_keys, req_context)

    def clear(self) -> None:
        with mutating(self, "clear"):
            self.t1.clear()
            self.t2.clear()
            self.b1.clear()
            self.b2.clear()
            self.target_t1_size = 0.0
        if self._recorder is not None:
            self._recorder.cleared()

    def evict(self, n: int, protected: Container[Any]) -> list[tuple[Any, ChunkStatus]] | None:
        with mutating(self, "evict"):
            if n == 0:
                return []

            # Collect candidates atomically: simulate T1 size changes as we
            # select, but do not modify actual data structures until all n
            # are found.
            candidates: list[tuple[Any, ChunkStatus, bool]] = []  # (key, chunk, from_t1)
            virtual_t1_size = len(self.t1)
            # Keep the scans monotonic: restarting from the LRU end after
            # every selection makes a batch eviction quadratic in the number
            # of chunks.
            t1_iter = iter(self.t1.items())
            t2_iter = iter(self.t2.items())

            def next_candidate(
                entries: Iterator[tuple[Any, ChunkStatus]],
            ) -> tuple[Any, ChunkStatus] | None:
                for key, chunk in entries:
                    if chunk.ref_cnt == 0 and key not in protected:
                        return key, chunk
                return None

            for _ in range(n):
                candidate: tuple[Any, ChunkStatus, bool] | None = None

                if virtual_t1_size >= int(self.target_t1_size):
                    entry = next_candidate(t1_iter)
                    if entry is not None:
                        candidate = (*entry, True)
                        virtual_t1_size -= 1

                if candidate is None:
                    entry = next_candidate(t2_iter)
                    if entry is not None:
                        candidate = (*entry, False)

                if candidate is None:
                    entry = next_candidate(t1_iter)
                    if entry is None:
                        return None
                    candidate = (*entry, True)
                    virtual_t1_size -= 1

                candidates.append(candidate)

            # Apply all evictions now that we know n candidates exist.
            result: list[tuple[Any, ChunkStatus]] = []
            for key, chunk, from_t1 in candidates:
                if from_t1:
                    del self.t1[key]
                    self.b1[key] = None
                else:
                    del self.t2[key]
                    self.b2[key] = None
                result.append((key, chunk))

            # Trim ghost lists to cache_capacity.
            for ghost in (self.b1, self.b2):
                for _ in range(len(ghost) - self.cache_capacity):
                    ghost.popitem(last=False)

            return result

    # --- arc_cy's own ----------------------------------------------------------

    def on_request_access(self, keys: Iterable[Any], req_context: Any) -> None:
        if self._recorder is not None:
            self._recorder.arrive(keys, req_context)

    def mark_evictable(self, key: Any) -> None:
        return

    def mark_non_evictable(self, key: Any) -> None:
        if self._recorder is not None:
            self._recorder.pinned(key)

    def _check_invariants(self) -> None:
        """Raise AssertionError if a key is in two lists or a ghost list
        outgrew cache_capacity."""
        lists = (self.t1, self.t2, self.b1, self.b2)
        assert sum(len(x) for x in lists) == len(set().union(*lists)), "a key in two lists"
        assert len(self.b1) <= self.cache_capacity, "b1 outgrew cache_capacity"
        assert len(self.b2) <= self.cache_capacity, "b2 outgrew cache_capacity"
