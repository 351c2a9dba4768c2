"""Manager-shaped traffic: the one driver the benchmarks and the tests share.

Two levels.

``PolicyTraffic`` calls cache policies the way vLLM's ``CPUOffloadingManager``
calls its policy, with its own model of the manager's state: the resident
chunks (key -> ChunkStatus, one object shared by every policy driven) and
the transfers in flight. It drives a ``Lockstep``: one policy (bench/soak.py)
or several given the same calls with the same objects (the differential
tests), each call's results handed to a ``check`` the caller supplies (the
tests' assertions stay in the tests). Its step vocabulary:

    lookup(keys)                 get() of each key: (hits, misses)
    load(hits, ctx)              touch() the hits, pin each (a load in flight)
    pin(key) / unpin(key)        ref_cnt += 1 / -= 1, mark_non_evictable() on
                                 0 -> 1, mark_evictable() on 1 -> 0
    store(keys, ctx)             prepare_store: on_store_miss() of the keys not
                                 resident, evict() what does not fit (the
                                 request's keys protected), insert() each with
                                 ref_cnt -1 (a store in flight)
    complete_store(key)          ref_cnt -1 -> 0 and mark_evictable()
    fail_store(key)              remove() (a failed store)
    finish(groups, ins, reused, ctx)   on_request_finished()
    access(keys, ctx)            on_request_access()
    touch(keys, ctx), evict(n, protected), remove(key), set_target(value),
    clear(), get(key)            the policy calls themselves, the model kept
                                 in step

and ``request(req)`` / ``complete_due(req)``: one request as the manager
serves it (look up a run of keys, load the hits, store the misses, finish),
its transfers completing some requests later (a load unpins, a store
completes or, with probability ``store_fail``, fails).

``ManagerTraffic`` runs requests through one real ``CPUOffloadingManager``
the way the scheduler-side connector does (bench/hit_ratio.py,
bench/store_latency.py's chat trace).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from arc_cy._policy import HOOKS as _HOOKS

HOOKS = frozenset(_HOOKS)


class Lockstep:
    """Calls each method on every policy, in order; counts the calls (one
    per method call, whatever the number of policies) and hands each call's
    results to ``check(method, results)``."""

    def __init__(
        self,
        policies: Sequence[Any],
        check: Callable[[str, list[Any]], None] | None = None,
        insert: Callable[[Any, Any, Any, Any], None] | None = None,
    ) -> None:
        self.policies = list(policies)
        self.check = check
        # insert(policy, key, chunk, ctx): how the installed vLLM's manager
        # calls insert() (vLLM 0.32's takes no request context).
        self._insert = insert
        self.calls = 0

    def call(self, method: str, *args: Any) -> list[Any]:
        if method == "insert" and self._insert is not None:
            results = [self._insert(p, *args) for p in self.policies]
        else:
            results = [getattr(p, method)(*args) for p in self.policies]
        self.calls += 1
        if self.check is not None:
            self.check(method, results)
        return results


class PolicyTraffic:
    """The manager's side of the traffic, on a Lockstep of policies.

    ``key(i)`` makes key number ``i`` of a universe of ``universe`` keys
    (requests take runs of consecutive numbers, skewed toward low ones, so
    that there are hits and ghost hits); with ``fresh`` > 0 a key is passed,
    with that probability, as an equal copy (another object, as vLLM's
    hashes are). ``hooks``: the policy hooks to call (those of the installed
    vLLM's policies); ``positions``: whether the request context takes
    offload-key positions. Delays are in requests: an int, or (lo, hi)
    drawn uniformly."""

    def __init__(
        self,
        target: Lockstep,
        capacity: int,
        *,
        seed: int = 0,
        key: Callable[[int], bytes] | None = None,
        universe: int = 0,
        fresh: float = 0.0,
        request_keys: tuple[int, int] = (1, 8),
        load_delay: int | tuple[int, int] = (1, 3),
        store_delay: int | tuple[int, int] = (0, 3),
        store_fail: float = 0.07,
        position_p: float = 1.0,
        access_p: float = 0.0,
        hooks: Iterable[str] = HOOKS,
        positions: bool = True,
        count_ghosts: bool = False,
    ) -> None:
        from vllm.v1.kv_offload.base import ReqContext
        from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

        self.ReqContext = ReqContext
        self.ChunkStatus = ChunkStatus
        self.target = target
        self.call = target.call
        self.capacity = capacity
        self.rng = random.Random(seed)
        self.key = key or (lambda i: i.to_bytes(8, "little"))
        self.universe = universe or 4 * capacity
        self.fresh_p = fresh
        self.request_keys = request_keys
        self.load_delay = load_delay
        self.store_delay = store_delay
        self.store_fail = store_fail
        self.position_p = position_p
        self.access_p = access_p
        self.hooks = frozenset(hooks)
        self.positions = positions
        self.count_ghosts = count_ghosts
        self.chunks: dict[bytes, Any] = {}  # resident key -> its chunk
        self.pending: list[tuple[int, str, list[bytes]]] = []  # (due request, kind, keys)
        self.next_id = 0
        self.stats = dict.fromkeys(("requests", "evictions", "evict_none", "ghost_hits"), 0)

    # --- the policy calls, the model kept in step --------------------------------

    def get(self, key: bytes) -> Any:
        return self.call("get", key)[0]

    def touch(self, keys: list[bytes], ctx: Any) -> None:
        self.call("touch", keys, ctx)

    def access(self, keys: list[bytes], ctx: Any) -> list[Any] | None:
        if "on_request_access" in self.hooks:
            return self.call("on_request_access", keys, ctx)
        return None

    def finish(
        self,
        groups: tuple[tuple[bytes, ...], ...],
        inserted: set[bytes],
        reused: set[bytes],
        ctx: Any,
    ) -> None:
        if "on_request_finished" in self.hooks:
            self.call("on_request_finished", groups, inserted, reused, ctx)

    def evict(self, n: int, protected: Any) -> list[tuple[bytes, Any]] | None:
        """evict(n, protected); the victims leave the model. The first
        policy's result (the Lockstep's check compares the others)."""
        return self.evict_each(n, protected)[0]

    def evict_each(self, n: int, protected: Any) -> list[Any]:
        """evict(n, protected), every policy's result; the model follows
        the first policy's."""
        results = self.call("evict", n, protected)
        if results[0] is None:
            self.stats["evict_none"] += 1
            return results
        self.stats["evictions"] += 1
        for k, _ in results[0]:
            del self.chunks[k]
        return results

    def insert(self, key: bytes, ctx: Any, ref_cnt: int = -1) -> Any:
        """insert() of a new chunk (ref_cnt -1: its store is in flight)."""
        chunk = self.ChunkStatus(self.next_id)
        self.next_id += 1
        chunk.ref_cnt = ref_cnt
        self.chunks[key] = chunk
        self.call("insert", key, chunk, ctx)
        return chunk

    def remove(self, key: bytes) -> None:
        self.chunks.pop(key, None)
        self.call("remove", key)

    def set_target(self, value: Any) -> None:
        for p in self.target.policies:
            p.target_t1_size = value

    def clear(self) -> None:
        """clear(): vLLM's reset_cache(); transfers in flight are dropped."""
        self.call("clear")
        self.chunks.clear()
        self.pending.clear()

    # --- what the manager does -------------------------------------------------

    def pin(self, key: bytes, tell: bool = True) -> None:
        """A load starts: ref_cnt += 1 (mark_non_evictable() on 0 -> 1, unless
        not ``tell``: the policy must read ref_cnt live)."""
        chunk = self.chunks[key]
        if chunk.ref_cnt == 0 and tell:
            self.call("mark_non_evictable", key)
        chunk.ref_cnt += 1

    def unpin(self, key: bytes, tell: bool = True) -> None:
        """A load completes: ref_cnt -= 1 (mark_evictable() on 1 -> 0)."""
        chunk = self.chunks[key]
        chunk.ref_cnt -= 1
        if chunk.ref_cnt == 0 and tell:
            self.call("mark_evictable", key)

    def complete_store(self, key: bytes, tell: bool = True) -> None:
        """A store completes: ref_cnt -1 -> 0 (and mark_evictable())."""
        self.chunks[key].ref_cnt = 0
        if tell:
            self.call("mark_evictable", key)

    def fail_store(self, key: bytes, as_key: bytes | None = None) -> None:
        """A store fails: remove() (of ``as_key``, an equal key, if given)."""
        del self.chunks[key]
        self.call("remove", key if as_key is None else as_key)

    def lookup(self, keys: Iterable[bytes]) -> tuple[list[bytes], list[bytes]]:
        """get() of each key: the keys found and readable (ref_cnt >= 0),
        and the keys not resident (a store in flight is neither)."""
        hits, misses = [], []
        for key in keys:
            chunk = self.get(key)
            if chunk is None:
                misses.append(key)
            elif chunk.ref_cnt >= 0:
                hits.append(key)
        return hits, misses

    def load(self, hits: list[bytes], ctx: Any) -> None:
        """prepare_load of the hits: touch() them, then pin each."""
        self.touch(hits, ctx)
        for key in hits:
            self.pin(key)

    def store(self, keys: list[bytes], ctx: Any, protected: Any = None) -> list[bytes] | None:
        """prepare_store of ``keys``: the keys not resident are observed
        missing (on_store_miss), what does not fit is evicted (``protected``,
        default the keys, stays), and each is inserted with its store in
        flight. Returns the keys inserted, or None when evict() failed
        (then nothing is inserted)."""
        new = [k for k in keys if k not in self.chunks]
        if self.count_ghosts:
            first = self.target.policies[0]
            self.stats["ghost_hits"] += sum(k in first.b1 or k in first.b2 for k in new)
        if "on_store_miss" in self.hooks:
            self.call("on_store_miss", new, ctx)
        need = len(self.chunks) + len(new) - self.capacity
        if need > 0 and self.evict(need, set(keys) if protected is None else protected) is None:
            return None
        for key in new:
            self.insert(key, ctx)
        return new

    def _key(self, i: int) -> bytes:
        key = self.key(i)
        if self.fresh_p and self.rng.random() < self.fresh_p:
            return bytes(bytearray(key))
        return key

    def _delay(self, d: int | tuple[int, int]) -> int:
        return d if isinstance(d, int) else self.rng.randint(*d)

    def request(self, req: int) -> None:
        """Request number ``req``: a run of keys looked up; the hits loaded,
        the misses stored, the request finished; its transfers complete
        later (complete_due)."""
        rng = self.rng
        self.stats["requests"] += 1
        ctx = self.ReqContext(req_id=f"r{req}")
        start = int(self.universe * rng.random() ** 2)
        keys = [
            self._key((start + j) % self.universe) for j in range(rng.randint(*self.request_keys))
        ]
        keys = list(dict.fromkeys(keys))
        if self.positions:
            for pos, key in enumerate(keys):
                if self.position_p >= 1 or rng.random() < self.position_p:
                    ctx.set_offload_key_position(key, pos)
        hits, misses = self.lookup(keys)
        if hits:
            self.load(hits, ctx)
            self.pending.append((req + self._delay(self.load_delay), "load", hits))
        inserted: list[bytes] = []
        if misses and self.store(misses, ctx, protected=set(keys)) is not None:
            inserted = misses
            self.pending.append((req + self._delay(self.store_delay), "store", misses))
        reused = set(hits)
        self.finish((tuple(keys),), set(inserted) - reused, reused, ctx)
        if self.access_p and rng.random() < self.access_p:
            self.access(keys, ctx)

    def complete_due(self, req: int) -> None:
        """The transfers due by request ``req``: loads unpin; stores complete,
        or fail (remove(), of an equal copy of the key with ``fresh``)."""
        due = [p for p in self.pending if p[0] <= req]
        self.pending = [p for p in self.pending if p[0] > req]
        for _, kind, keys in due:
            for key in keys:
                chunk = self.chunks.get(key)
                if chunk is None:  # evicted, removed or cleared meanwhile
                    continue
                if kind == "load":
                    self.unpin(key)
                elif chunk.ref_cnt < 0:
                    if self.rng.random() < 1 - self.store_fail:
                        self.complete_store(key)
                    else:
                        as_key = key
                        if self.fresh_p and self.rng.random() < self.fresh_p:
                            as_key = bytes(bytearray(key))
                        self.fail_store(key, as_key)


class ManagerTraffic:
    """Runs requests through one real CPUOffloadingManager the way the
    scheduler-side connector does: lookup the prefix, prepare_load the hits,
    prepare_store the misses in batches (chunked prefill), and complete the
    transfers and finish the request ``inflight`` requests later, so loads
    and stores of different requests interleave.

    Records hits, evictions and, if ``timed``, per-call latencies.
    """

    def __init__(
        self, manager: Any, *, inflight: int = 4, store_batch: int = 256, timed: bool = False
    ) -> None:
        from vllm.v1.kv_offload.base import LookupResult

        self.m = manager
        self.HIT = LookupResult.HIT
        self.inflight = inflight
        self.store_batch = store_batch
        self.timed = timed
        self.queue: list[tuple[Any, list[bytes], list[list[bytes]], list[int]]] = []
        self.requests = 0
        self.keys = 0
        self.hits = 0
        self.store_failures = 0
        self.stored = 0
        self.evicted = 0
        self.per_request: list[tuple[int, tuple[bytes, ...]]] = []  # (hits, evicted)
        self.t_store: list[int] = []  # prepare_store ns, per call
        self.t_store_keys: list[int] = []  # keys offered per call
        self.t_cycle: list[int] = []  # prepare_store + complete_store + finish, per request
        self.cycle_keys: list[int] = []

    def step(self, keys: list[bytes], req_id: str) -> None:
        from vllm.v1.kv_offload.base import ReqContext

        m = self.m
        ctx = ReqContext(req_id)
        for j, k in enumerate(keys):
            ctx.set_offload_key_position(k, (j + 1) * 16)
        m.on_new_request(ctx)
        hits = 0
        for k in keys:
            if m.lookup(k, ctx) is not self.HIT:
                break
            hits += 1
        hit_keys = keys[:hits]
        if hit_keys:
            m.prepare_load(hit_keys, ctx)
        evicted: list[bytes] = []
        stores: list[list[bytes]] = []
        spent = [0, 0]  # ns in prepare_store, keys offered
        pc = time.perf_counter_ns
        for b in range(hits, len(keys), self.store_batch):
            batch = keys[b : b + self.store_batch]
            t0 = pc()
            out = m.prepare_store(batch, ctx)
            t1 = pc()
            if self.timed:
                self.t_store.append(t1 - t0)
                self.t_store_keys.append(len(batch))
            spent[0] += t1 - t0
            spent[1] += len(batch)
            if out is None:
                self.store_failures += 1
                continue
            evicted.extend(out.evicted_keys)
            if out.keys_to_store:
                stores.append(out.keys_to_store)
                self.stored += len(out.keys_to_store)
        self.requests += 1
        self.keys += len(keys)
        self.hits += hits
        self.evicted += len(evicted)
        self.per_request.append((hits, tuple(evicted)))
        self.queue.append((ctx, hit_keys, stores, spent))
        if len(self.queue) > self.inflight:
            self._complete(self.queue.pop(0))

    def _complete(self, item: tuple[Any, list[bytes], list[list[bytes]], list[int]]) -> None:
        ctx, hit_keys, stores, spent = item
        m = self.m
        if hit_keys:
            m.complete_load(hit_keys, ctx)
        pc = time.perf_counter_ns
        t0 = pc()
        for keys in stores:
            m.complete_store(keys, ctx)
        m.on_request_finished(ctx)
        t1 = pc()
        if self.timed and spent[1]:
            self.t_cycle.append(spent[0] + t1 - t0)
            self.cycle_keys.append(spent[1])

    def drain(self) -> None:
        while self.queue:
            self._complete(self.queue.pop(0))

    def hit_ratio(self) -> float:
        return self.hits / self.keys if self.keys else 0.0
