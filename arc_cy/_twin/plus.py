"""Pure-Python twin of the compiled ARC+ policy (``arc_cy._core.arc``'s
``ARCPlusCachePolicy``): the same decisions, written as plainly as vLLM's
``arc.py``, for reading and debugging. It is exposed as the ARC twin
(``arc_cy._twin.arc``) is: vLLM's lists and attributes, vLLM's errors, and
a mutating call made while another runs refused (``mutating``). The
compiled class's other rules are the core's alone (docs/hardening.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .._guard import vllm_guard
from .._policy import PLUS_DOC
from .._record import Recorder, record_for
from .._vllm import CachePolicy, ChunkStatus, order_request_keys
from .arc import mutating

__all__ = ["ARCPlusCachePolicy"]


class ARCPlusCachePolicy(CachePolicy):
    __doc__ = PLUS_DOC  # one text, both implementations' (arc_cy._policy)

    _running: str | None = None  # the mutating call under way (mutating())
    _recorder: Recorder | None = None  # ARC_CY_RECORD_TRACE's (arc_cy._record)
    target_t1_size: Any  # a float, or any Real as set (a Fraction stays exact), as in vLLM

    def __init__(self, cache_capacity: int) -> None:
        if vllm_guard.plus_pending:
            vllm_guard.check(plus=True)
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
            # A ghost is a key an earlier request asked for: its second request
            # makes it frequent (the ARC paper's rule; vLLM's ARC puts it in t1).
            if key in self.b1 or key in self.b2:
                self.b1.pop(key, None)
                self.b2.pop(key, None)
                self.t2[key] = chunk
            else:
                self.t1[key] = chunk

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
            # vLLM 0.30's hook, as its ARC's: a ready t1 chunk moves to t2.
            for key in reversed(list(keys)):
                if key in self.t1:
                    chunk = self.t1.pop(key)
                    if chunk.ref_cnt < 0:  # still being stored: not a second access
                        self.t1[key] = chunk
                    else:
                        self.t2[key] = chunk
                elif key in self.t2:
                    self.t2.move_to_end(key)
                else:
                    self._adapt_to_ghost_hit(key)

    def on_request_access(self, keys: Iterable[Any], req_context: Any) -> None:
        if self._recorder is not None:
            self._recorder.arrive(req_context)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[Any]],
        insertion_only_keys: set[Any],
        reused_keys: set[Any],
        req_context: Any,
    ) -> None:
        with mutating(self, "on_request_finished"):
            keys = order_request_keys(key_groups, req_context)
            for key in reversed(keys):
                if key in insertion_only_keys:
                    # A store is not a frequency hit: recency only.
                    if key in self.t1:
                        self.t1.move_to_end(key)
                    elif key in self.t2:
                        self.t2.move_to_end(key)
                elif key in reused_keys and key in self.t1:
                    self.t2[key] = self.t1.pop(key)
                elif key in reused_keys and key in self.t2:
                    self.t2.move_to_end(key)
                if not (key in self.t1 or key in self.t2 or key in self.b1 or key in self.b2):
                    # Asked for and not kept (refused, or its store failed):
                    # remembered, so that its next request finds a ghost.
                    self.b1[key] = None
            for _ in range(len(self.b1) - self.cache_capacity):
                self.b1.popitem(last=False)
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

    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, ChunkStatus]] | None:
        with mutating(self, "evict"):
            if n == 0:
                return []
            # vLLM's manager protects the offer's keys: those in no list are
            # being stored, and if none is a ghost, all are asked for the first time.
            offer = [key for key in protected if key not in self.t1 and key not in self.t2]
            first_seen = bool(offer) and not any(key in self.b1 or key in self.b2 for key in offer)
            if first_seen and int(self.target_t1_size) == 0:
                return None  # t1 has shown no value: not admitted

            candidates: list[tuple[Any, ChunkStatus, bool]] = []  # (key, chunk, from_t1)
            virtual_t1_size = len(self.t1)
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
                    elif first_seen:
                        return None  # t1's victims are pinned: t2's are not for these

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

            result: list[tuple[Any, ChunkStatus]] = []
            for key, chunk, from_t1 in candidates:
                if from_t1:
                    del self.t1[key]
                    self.b1[key] = None
                else:
                    del self.t2[key]
                    self.b2[key] = None
                result.append((key, chunk))

            for ghost in (self.b1, self.b2):
                for _ in range(len(ghost) - self.cache_capacity):
                    ghost.popitem(last=False)

            return result

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
