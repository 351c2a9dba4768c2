"""Pure-Python twin of the compiled ARC+ policy (``arc_cy._core.arc``'s
``ARCPlusCachePolicy``): the same decisions, written as plainly as vLLM's
``arc.py``, for reading and debugging. It is exposed as the ARC twin
(``arc_cy._twin.arc``) is: its lists and counters are plain attributes,
and a mutating call made while another runs is refused (``mutating``). The
compiled class's other rules are the core's alone (docs/hardening.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Iterator, Sequence
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
    ticks: int  # stamps given so far
    b1_returned: int  # the ghosts' fates (arc_cy._policy.PLUS_DOC)
    b1_forgotten: int
    b2_returned: int
    b2_forgotten: int

    def __init__(self, cache_capacity: int) -> None:
        if vllm_guard.plus_pending:
            vllm_guard.check(plus=True)
        with mutating(self, "__init__"):
            super().__init__(cache_capacity)
            self.t1: OrderedDict[Any, ChunkStatus] = OrderedDict()
            self.t2: OrderedDict[Any, ChunkStatus] = OrderedDict()
            # key -> None (only care about presence)
            self.b1: OrderedDict[Any, None] = OrderedDict()
            self.b2: OrderedDict[Any, None] = OrderedDict()
            # A resident key -> when it was last put in t1 or t2, moved or
            # refreshed there: the recency order across both lists.
            self.stamps: dict[Any, int] = {}
            self.ticks = 0
            self.b1_returned = self.b1_forgotten = 0
            self.b2_returned = self.b2_forgotten = 0
        if self._recorder is None:
            self._recorder = record_for(self, cache_capacity)

    def get(self, key: Any) -> ChunkStatus | None:
        return self.t1.get(key) or self.t2.get(key)

    def _stamp(self, key: Any) -> None:
        self.ticks += 1
        self.stamps[key] = self.ticks

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
            self._stamp(key)

    def remove(self, key: Any) -> None:
        with mutating(self, "remove"):
            if self.t1.pop(key, None) is not None or self.t2.pop(key, None) is not None:
                del self.stamps[key]

    def _ghost_returned(self, key: Any) -> None:
        if key in self.b1:
            self.b1_returned += 1
            self.b1.move_to_end(key)
        elif key in self.b2:
            self.b2_returned += 1
            self.b2.move_to_end(key)

    def on_store_miss(self, keys: Iterable[Any], req_context: Any) -> None:
        with mutating(self, "on_store_miss"):
            for key in reversed(list(keys)):
                self._ghost_returned(key)
        if self._recorder is not None:
            self._recorder.missed(req_context)

    def touch(self, keys: Iterable[Any], req_context: Any) -> None:
        with mutating(self, "touch"):
            # vLLM 0.30 to 0.33's hook, as its ARC's: a ready t1 chunk moves to t2.
            for key in reversed(list(keys)):
                if key in self.t1:
                    chunk = self.t1.pop(key)
                    if chunk.ref_cnt < 0:  # still being stored: not a second access
                        self.t1[key] = chunk
                    else:
                        self.t2[key] = chunk
                    self._stamp(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
                    self._stamp(key)
                else:
                    self._ghost_returned(key)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[Any]],
        insertion_only_keys: Container[Any],
        reused_keys: Container[Any],
        req_context: Any,
    ) -> None:
        with mutating(self, "on_request_finished"):
            keys = order_request_keys(key_groups, req_context)
            for key in dict.fromkeys(reversed(keys)):  # tail first, each key once
                if key in insertion_only_keys and (key in self.t1 or key in self.t2):
                    # A store is not a frequency hit: recency only.
                    (self.t1 if key in self.t1 else self.t2).move_to_end(key)
                    self._stamp(key)
                elif key in reused_keys and key in self.t1:
                    self.t2[key] = self.t1.pop(key)
                    self._stamp(key)
                elif key in reused_keys and key in self.t2:
                    self.t2.move_to_end(key)
                    self._stamp(key)
                elif key in self.t1 or key in self.t2:
                    continue
                elif key in self.b1 or key in self.b2:
                    # Asked for again and not kept: its count is two or more.
                    self.b1.pop(key, None)
                    self.b2.pop(key, None)
                    self.b2[key] = None
                else:
                    # Asked for and not kept (refused, or its store failed):
                    # remembered, so that its next request finds a ghost.
                    self.b1[key] = None
            self._trim_ghosts()
        if self._recorder is not None:
            self._recorder.finished(keys, reused_keys, req_context)

    def _trim_ghosts(self) -> None:
        for _ in range(len(self.b1) - self.cache_capacity):
            self.b1.popitem(last=False)
            self.b1_forgotten += 1
        for _ in range(len(self.b2) - self.cache_capacity):
            self.b2.popitem(last=False)
            self.b2_forgotten += 1

    def clear(self) -> None:
        with mutating(self, "clear"):
            self.stamps.clear()
            self.t1.clear()
            self.t2.clear()
            self.b1.clear()
            self.b2.clear()
            self.b1_returned = self.b1_forgotten = 0
            self.b2_returned = self.b2_forgotten = 0
        if self._recorder is not None:
            self._recorder.cleared()

    def _ghost_rate(self, returned: int, forgotten: int) -> float:
        return returned / (returned + forgotten) if returned + forgotten else 0.0

    def evict(self, n: int, protected: set[Any]) -> list[tuple[Any, ChunkStatus]] | None:
        with mutating(self, "evict"):
            if n == 0:
                return []
            # vLLM's manager protects the offer's keys: those in no list are
            # being stored, and if none is a ghost, all are asked for the first time.
            offer = [key for key in protected if key not in self.t1 and key not in self.t2]
            first_seen = bool(offer) and not any(key in self.b1 or key in self.b2 for key in offer)
            # While blocks asked for once come back less than blocks asked for
            # twice, a first-seen offer may not take a t2 victim.
            guarded = first_seen and self._ghost_rate(
                self.b1_returned, self.b1_forgotten
            ) < self._ghost_rate(self.b2_returned, self.b2_forgotten)

            def victims(entries: Iterator[tuple[Any, ChunkStatus]]) -> Iterator[Any]:
                for key, chunk in entries:
                    if chunk.ref_cnt == 0 and key not in protected:
                        yield key

            t1_victims, t2_victims = victims(iter(self.t1.items())), victims(iter(self.t2.items()))
            v1, v2 = next(t1_victims, None), next(t2_victims, None)
            candidates: list[tuple[Any, bool]] = []  # (key, from_t1)
            for _ in range(n):
                # The least recently requested of t1's and t2's next victims.
                if v2 is not None and (v1 is None or self.stamps[v2] < self.stamps[v1]):
                    if guarded:
                        return None  # a first-seen offer does not displace t2
                    candidates.append((v2, False))
                    v2 = next(t2_victims, None)
                elif v1 is not None:
                    candidates.append((v1, True))
                    v1 = next(t1_victims, None)
                else:
                    return None

            result: list[tuple[Any, ChunkStatus]] = []
            for key, from_t1 in candidates:
                if from_t1:
                    chunk = self.t1.pop(key)
                    self.b1[key] = None
                else:
                    chunk = self.t2.pop(key)
                    self.b2[key] = None
                del self.stamps[key]
                result.append((key, chunk))
            self._trim_ghosts()
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
        """Raise AssertionError if a key is in two lists, a ghost list
        outgrew cache_capacity, or the stamps are not the resident keys'."""
        lists = (self.t1, self.t2, self.b1, self.b2)
        assert sum(len(x) for x in lists) == len(set().union(*lists)), "a key in two lists"
        assert len(self.b1) <= self.cache_capacity, "b1 outgrew cache_capacity"
        assert len(self.b2) <= self.cache_capacity, "b2 outgrew cache_capacity"
        assert self.stamps.keys() == self.t1.keys() | self.t2.keys(), "stamps not t1's and t2's"
        for resident in (self.t1, self.t2):
            order = [self.stamps[key] for key in resident]
            assert order == sorted(order), "a list out of its stamps' order"
