"""A cache policy that runs vLLM's ARC and arc_cy in lockstep inside an engine (test code).

Named by module path in ``kv_connector_extra_config``::

    {"eviction_policy": "LockstepCompiled",
     "cache_policy_module_path": "arc_cy_harness.engine_lockstep"}

(``LockstepPure`` for the pure twin). The manager builds it as any policy;
it forwards each of the manager's calls to vLLM's ``ARCCachePolicy`` and to
arc_cy's, on the same arguments (the same key objects and ChunkStatus
objects, an iterator made into one list), returns arc_cy's result, and
compares after each call: the results (chunks by identity), then T1, T2, B1
and B2 in order and ``target_t1_size`` (every ``state_every`` calls, and on
the first call after an evict). It counts calls, evictions, hits and
mismatches in ``counts``; the first mismatches are kept in ``mismatches``.
The instances made in this process are in ``INSTANCES``.
"""

from __future__ import annotations

import collections.abc
import importlib
import time
from typing import Any

from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy as VllmARC
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

INSTANCES: list[_Lockstep] = []


def _items(lst: Any) -> list[tuple[Any, int]]:
    return [(k, id(v)) for k, v in lst.items()]


class _Lockstep(CachePolicy):
    MODULE = ""
    state_every = 1

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.oracle = VllmARC(cache_capacity)
        self.ours = importlib.import_module(self.MODULE).ARCCachePolicy(cache_capacity)
        self.counts: collections.Counter[str] = collections.Counter()
        self.mismatches: list[str] = []
        self.policy_ns = 0  # time spent in arc_cy's calls
        INSTANCES.append(self)

    def _mismatch(self, what: str) -> None:
        self.counts["mismatches"] += 1
        if len(self.mismatches) < 10:
            self.mismatches.append(f"call {self.counts['calls']}: {what}")

    def _state(self, p: Any) -> tuple:
        return (
            _items(p.t1),
            _items(p.t2),
            list(p.b1.keys()),
            list(p.b2.keys()),
            float(p.target_t1_size),
        )

    def _call(self, name: str, *args: Any, force_state: bool = False) -> Any:
        self.counts["calls"] += 1
        self.counts[name] += 1
        want = getattr(self.oracle, name)(*args)
        t = time.perf_counter_ns()
        got = getattr(self.ours, name)(*args)
        self.policy_ns += time.perf_counter_ns() - t
        if name == "evict":
            same = (want is None and got is None) or (
                want is not None
                and got is not None
                and [(k, id(c)) for k, c in want] == [(k, id(c)) for k, c in got]
            )
        elif name == "get":
            same = want is got
        else:
            same = want is None and got is None
        if not same:
            self._mismatch(f"{name} returned {got!r}, vLLM arc {want!r}")
        if force_state or self.counts["calls"] % self.state_every == 0:
            self.counts["state_checks"] += 1
            if self._state(self.oracle) != self._state(self.ours):
                self._mismatch(f"state after {name} differs")
        return got

    @staticmethod
    def _reiterable(keys: Any) -> Any:
        return keys if isinstance(keys, collections.abc.Collection) else list(keys)

    def _ghosts(self, keys: Any) -> None:
        self.counts["ghost_hits"] += sum(
            1 for k in keys if k in self.oracle.b1 or k in self.oracle.b2
        )

    def get(self, key):
        chunk = self._call("get", key)
        if chunk is not None:
            self.counts["get_hits"] += 1
        return chunk

    def insert(self, key, chunk):
        return self._call("insert", key, chunk)

    def remove(self, key):
        return self._call("remove", key)

    def touch(self, keys, req_context):
        keys = self._reiterable(keys)
        self._ghosts(keys)
        return self._call("touch", keys, req_context)

    def on_store_miss(self, keys, req_context):
        keys = self._reiterable(keys)
        self._ghosts(keys)
        return self._call("on_store_miss", keys, req_context)

    def on_request_finished(self, key_groups, insertion_only_keys, reused_keys, req_context):
        self.counts["reused_keys"] += len(reused_keys)
        return self._call(
            "on_request_finished", key_groups, insertion_only_keys, reused_keys, req_context
        )

    def evict(self, n, protected):
        got = self._call("evict", n, protected, force_state=True)
        if got is None:
            self.counts["evict_refused"] += 1
        else:
            self.counts["evicted"] += len(got)
        return got

    def clear(self):
        return self._call("clear", force_state=True)

    def mark_evictable(self, key):
        return self._call("mark_evictable", key)

    def mark_non_evictable(self, key):
        return self._call("mark_non_evictable", key)

    def report(self) -> dict[str, Any]:
        """The counts, after a last comparison of the whole state."""
        self.counts["state_checks"] += 1
        if self._state(self.oracle) != self._state(self.ours):
            self._mismatch("final state differs")
        return {
            "class": type(self).__name__,
            "arc_cy_class": f"{type(self.ours).__module__}.{type(self.ours).__qualname__}",
            "capacity": self.cache_capacity,
            "counts": dict(self.counts),
            "mismatches": list(self.mismatches),
            "arc_cy_policy_ms": self.policy_ns / 1e6,
        }


class LockstepCompiled(_Lockstep):
    MODULE = "arc_cy._core.arc"


class LockstepPure(_Lockstep):
    MODULE = "arc_cy._twin.arc"
