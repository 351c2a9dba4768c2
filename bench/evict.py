"""Cost of one policy.evict(n) and of the other policy calls, driving the
policy objects directly: vLLM 0.33.0's ARCCachePolicy and LRUCachePolicy,
arc_cy compiled (arc_cy._arc_c) and arc_cy pure (arc_cy._arc_py).

Each contender has its own policy and its own ChunkStatus objects (the keys,
32 hash bytes + 4-byte group index, are shared). Every repetition measures
the same situation, and only the call is timed:

  evict       steady state: a full cache whose ghost list B1 is also full,
              so every evict(n) moves n chunks to B1 and trims n ghosts.
              After each timed call the n chunks come back under n fresh
              keys (untimed insert), restoring T1's size; B1 stays full.
  pinned      as evict, with the k oldest T1 chunks pinned (ref_cnt 1, as a
              load does; mark_non_evictable called) at the LRU end
  protected   as evict, with the k oldest T1 keys in ``protected``
  fallback    T2 entirely pinned and T1 below target_t1_size (reached by a
              reuse touch, ghost evictions and repeated B1 ghost touches), so
              every evict(n) scans all of T2 and falls back to T1; checked
              before each repetition
  ops         get / insert / touch / on_store_miss / on_request_finished at a
              realistic batch (256 keys), state restored after each call

Run: $PY -P bench/evict.py [--full] [--json out.json]
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib as bl  # noqa: E402

TAG = "evict"


def _ctx(name: str = "bench") -> Any:
    from vllm.v1.kv_offload.base import ReqContext

    return ReqContext(name)


def _pin(p: Any, keys: list[bytes]) -> None:
    for k in keys:
        c = p.get(k)
        assert c is not None and c.ref_cnt == 0
        c.ref_cnt = 1            # what prepare_load does
        p.mark_non_evictable(k)


def build_steady(name: str, capacity: int, keys_a: list[bytes], keys_b: list[bytes]) -> Any:
    """Full cache (all in T1 for ARC) and, for ARC, B1 full of ghosts."""
    p = bl.policy_class(name)(capacity)
    ctx = _ctx()
    for k, c in zip(keys_a, bl.ready_chunks(capacity)):
        p.insert(k, c, ctx)
    ev = p.evict(capacity, set())
    assert ev is not None and len(ev) == capacity
    for k, (_, c) in zip(keys_b, ev):
        p.insert(k, c, ctx)
    del ev
    return p


# The compiled core's list node (arc_cy/_arc_c.pyx, ``Node``): key and chunk
# pointers, the key's hash, prev/next links, ref_cnt offset, list tag.
class _Node(ctypes.Structure):
    _fields_ = [("key", ctypes.c_void_p), ("chunk", ctypes.c_void_p),
                ("hash", ctypes.c_ssize_t), ("prev", ctypes.c_int32),
                ("next", ctypes.c_int32), ("ref_off", ctypes.c_uint16),
                ("where", ctypes.c_uint8)]


NODE_BYTES = ctypes.sizeof(_Node)


def scan_bytes_per_entry() -> int:
    """Bytes the compiled scan reads per entry it skips: its node and the
    ChunkStatus object whose ref_cnt it reads live."""
    return NODE_BYTES + sys.getsizeof(bl.ready_chunks(1)[0])


def run_evict(
    policies: dict[str, Any],
    *,
    n: int,
    reps: int,
    warmup: int,
    fresh: list[bytes],
    protected_extra: set[bytes] | None = None,
    check: Any = None,
    label: str,
    floor_entries: int = 0,
) -> dict[str, Any]:
    """Time ``evict(n)`` on each policy, round-robin. With ``floor_entries``,
    each repetition also times one sequential read (numpy sum) of an array
    of ``floor_entries`` x scan_bytes_per_entry() bytes: the memory floor
    for a scan that reads that many entries."""
    names = list(policies)
    samples: dict[str, list[int]] = {k: [] for k in names}
    floor_samples: list[int] = []
    if floor_entries:
        import numpy as np

        floor_arr = np.ones(floor_entries * scan_bytes_per_entry() // 8, dtype=np.uint64)
    mismatches = 0
    ctx = _ctx()
    pc = time.perf_counter_ns
    with bl.timed_phase():
        for r in range(warmup + reps):
            batch = fresh[r * n : (r + 1) * n]
            # what the manager passes: the keys of the store being prepared
            protected = set(batch)
            if protected_extra:
                protected |= protected_extra
            got: dict[str, list[bytes]] = {}
            for j in range(len(names)):
                name = names[(r + j) % len(names)]
                p = policies[name]
                if check is not None:
                    check(name, p)
                t0 = pc()
                ev = p.evict(n, protected)
                t1 = pc()
                assert ev is not None and len(ev) == n, (name, label)
                if r >= warmup:
                    samples[name].append(t1 - t0)
                got[name] = [k for k, _ in ev]
                for k, (_, c) in zip(batch, ev):   # restore T1's size
                    p.insert(k, c, ctx)
                del ev
            arc = [got[k] for k in bl.ARC_LIKE if k in got]
            if any(a != arc[0] for a in arc):
                mismatches += 1
            if floor_entries:
                t0 = pc()
                floor_arr.sum()
                t1 = pc()
                if r >= warmup:
                    floor_samples.append(t1 - t0)
    res: dict[str, Any] = {"n": n, "reps": reps, "warmup": warmup,
                           "arc_decisions_mismatched_reps": mismatches, "contenders": {}}
    if floor_entries:
        res["floor"] = {"entries": floor_entries, "bytes_per_entry": scan_bytes_per_entry(),
                        "node_bytes": NODE_BYTES, "bytes": int(floor_arr.nbytes),
                        "sequential_read": bl.stats(floor_samples)}
    for name in names:
        res["contenders"][name] = {"evict": bl.stats(samples[name]),
                                   "evict_per_key": bl.stats(samples[name], per=n)}
        if name == "arc_cy":
            res["contenders"][name]["scan_visits_total"] = policies[name]._scan_visits
    bl.add_ratios(res["contenders"], "evict")
    c = res["contenders"]
    bl.progress(TAG, f"{label}: evict({n}) p50 " + ", ".join(
        f"{k} {c[k]['evict']['p50']:.1f}us" for k in c))
    return res


def capacity_case(capacity: int, ns: list[int], reps: int, seed: int,
                  pinned: list[int] = (), protected: list[int] = ()) -> list[dict[str, Any]]:
    t = time.perf_counter()
    stream = bl.KeyStream(seed)
    keys_a = stream.take(capacity)
    keys_b = stream.take(capacity)
    policies = {}
    for name in bl.NAMES:
        policies[name] = build_steady(name, capacity, keys_a, keys_b)
    del keys_a
    bl.progress(TAG, f"capacity {capacity}: 4 steady-state policies built in "
                f"{time.perf_counter() - t:.1f}s")
    out = []
    for n in ns:
        fresh = stream.take((reps + 10) * n)
        res = run_evict(policies, n=n, reps=reps, warmup=10, fresh=fresh,
                        label=f"cap {capacity} nothing pinned")
        res.update(scenario="evict", capacity=capacity, pinned=0, protected=0)
        out.append(res)
    n = max(ns)
    for k in protected:
        # The k oldest T1 keys (T1 order is insertion order here).
        lru_end = [key for key, _ in zip(policies["vllm_arc"].t1, range(k))]
        fresh = stream.take((reps + 10) * n)
        res = run_evict(policies, n=n, reps=reps, warmup=10, fresh=fresh,
                        protected_extra=set(lru_end), label=f"cap {capacity} {k} protected")
        res.update(scenario="protected", capacity=capacity, pinned=0, protected=k)
        out.append(res)
    for k in sorted(pinned):
        lru_end = [key for key, _ in zip(policies["vllm_arc"].t1, range(k))]
        for name, p in policies.items():
            if name in bl.ARC_LIKE:
                assert [key for key, _ in zip(p.t1, range(k))] == lru_end, name
            already = [key for key in lru_end if p.get(key).ref_cnt == 0]
            _pin(p, already)
        fresh = stream.take((reps + 10) * n)
        res = run_evict(policies, n=n, reps=reps, warmup=10, fresh=fresh,
                        label=f"cap {capacity} {k} pinned at LRU end", floor_entries=k)
        res.update(scenario="pinned", capacity=capacity, pinned=k, protected=0,
                   pinned_fraction_of_t1=round(k / capacity, 3))
        out.append(res)
    return out


def growth_case(caps: tuple[int, ...], n: int, reps: int, seed: int) -> dict[str, Any]:
    """evict(n) of the same policy at several capacities, interleaved in one
    loop, so that drifting machine load cannot bias the cross-capacity ratio."""
    t = time.perf_counter()
    stream = bl.KeyStream(seed)
    policies = {}
    for cap in caps:
        keys_a = stream.take(cap)
        keys_b = stream.take(cap)
        for name in ("vllm_arc", "arc_cy"):
            policies[f"{name}@{cap}"] = build_steady(name, cap, keys_a, keys_b)
    bl.progress(TAG, f"growth: {len(policies)} policies built in {time.perf_counter() - t:.1f}s")
    fresh = stream.take((reps + 10) * n)
    res = run_evict(policies, n=n, reps=reps, warmup=10, fresh=fresh,
                    label="growth (capacities interleaved)")
    res.update(scenario="growth", capacities=list(caps))
    c = res["contenders"]
    res["growth_p50"] = {
        name: round(c[f"{name}@{caps[-1]}"]["evict"]["p50"] / c[f"{name}@{caps[0]}"]["evict"]["p50"], 3)
        for name in ("vllm_arc", "arc_cy")}
    bl.progress(TAG, f"growth {caps[0]} -> {caps[-1]} (p50 ratio): {res['growth_p50']}")
    return res


def fallback_case(capacity: int, n: int, reps: int, seed: int) -> dict[str, Any]:
    t = time.perf_counter()
    stream = bl.KeyStream(seed)
    half = capacity // 2
    a_keys = stream.take(half)
    b_keys = stream.take(capacity - half)
    g_keys = stream.take(n)
    n_touch = (capacity - half + 4 * n) // n + 1
    policies = {}
    for name in bl.NAMES:
        p = bl.policy_class(name)(capacity)
        ctx = _ctx()
        chunks = bl.ready_chunks(capacity)
        for k, c in zip(a_keys, chunks):
            p.insert(k, c, ctx)
        p.touch(a_keys, ctx)                 # reused: A moves to T2
        for k, c in zip(b_keys, chunks[half:]):
            p.insert(k, c, ctx)              # B in T1
        ev = p.evict(n, set())               # T1's oldest become B1 ghosts
        ghosts = [k for k, _ in ev]
        for k, (_, c) in zip(g_keys, ev):
            p.insert(k, c, ctx)
        for _ in range(n_touch):             # B1 hits raise target_t1_size
            p.touch(ghosts, ctx)
        _pin(p, [k for k in a_keys if p.get(k) is not None])  # all of T2 pinned
        policies[name] = p
    for name in bl.ARC_LIKE:
        p = policies[name]
        assert len(p.t2) == half and all(c.ref_cnt > 0 for c in p.t2.values()), name
        assert len(p.t1) < int(p.target_t1_size), name
    state = (len(policies["vllm_arc"].t1), policies["vllm_arc"].target_t1_size)
    bl.progress(TAG, f"fallback {capacity}: built in {time.perf_counter() - t:.1f}s, "
                f"(len(t1), target) = {state}, t2 = {half} all pinned")
    checked = [0]

    def check(name: str, p: Any) -> None:
        if name in bl.ARC_LIKE:
            assert len(p.t1) < int(p.target_t1_size) and len(p.t2) == half, name
            checked[0] += 1

    fresh = stream.take((reps + 10) * n)
    res = run_evict(policies, n=n, reps=reps, warmup=10, fresh=fresh, check=check,
                    label=f"fallback cap {capacity}", floor_entries=half)
    for name in bl.ARC_LIKE:
        assert len(policies[name].t2) == half and len(policies[name].b2) == 0, name
    res.update(scenario="fallback", capacity=capacity, pinned=half, protected=0,
               state_t1_target=state, fallback_checked_reps=checked[0])
    return res


def ops_case(capacity: int, batch: int, reps: int, seed: int) -> dict[str, Any]:
    """Per-call cost of get/insert/touch/on_store_miss/on_request_finished."""
    from vllm.v1.kv_offload.base import ReqContext

    t = time.perf_counter()
    stream = bl.KeyStream(seed)
    keys = stream.take(capacity)
    n_ghost = capacity // 5
    refill = stream.take(n_ghost)
    ins_keys = stream.take(batch)
    half = capacity // 2
    policies = {}
    ghosts = None
    for name in bl.NAMES:
        p = bl.policy_class(name)(capacity)
        ctx = _ctx()
        for k, c in zip(keys, bl.ready_chunks(capacity)):
            p.insert(k, c, ctx)
        p.touch(keys[:half], ctx)            # first half reused: T2
        ev = p.evict(n_ghost, set())         # oldest of T1 -> B1
        if name == "vllm_arc":
            ghosts = [k for k, _ in ev]
        for k, (_, c) in zip(refill, ev):
            p.insert(k, c, ctx)
        policies[name] = p
    assert ghosts is not None
    t1_keys = keys[half + n_ghost :]  # still in T1
    t2_keys = keys[:half]
    for name in bl.ARC_LIKE:
        p = policies[name]
        assert all(k in p.t2 for k in t2_keys[:batch]) and all(k in p.t1 for k in t1_keys[:batch])
        assert all(k in p.b1 for k in ghosts[:batch])
    bl.progress(TAG, f"ops: {capacity} entries built in {time.perf_counter() - t:.1f}s")
    chunks_ins = {name: bl.ready_chunks(batch) for name in bl.NAMES}
    names = list(policies)
    pc = time.perf_counter_ns
    samples: dict[str, dict[str, list[int]]] = {n: {} for n in names}

    def record(op: str, name: str, dt: int) -> None:
        samples[name].setdefault(op, []).append(dt)

    resident = t2_keys + t1_keys
    get_keys = [resident[(i * 7919) % len(resident)] for i in range(batch)]
    half_b = batch // 2
    n_slices = max(1, min(8, len(ghosts) // batch, len(t2_keys) // batch))
    fin_t1 = t1_keys[:half_b]
    fin_t2 = t2_keys[:half_b]
    with bl.timed_phase():
        for r in range(reps + 10):
            rec = r >= 10
            for j in range(len(names)):
                name = names[(r + j) % len(names)]
                p = policies[name]
                ctx = ReqContext(f"ops{r}")
                # get: `batch` lookups of resident keys, timed as one loop
                g = p.get
                t0 = pc()
                for k in get_keys:
                    g(k)
                t1 = pc()
                if rec:
                    record("get", name, t1 - t0)
                # insert: `batch` fresh keys, one loop; removed afterwards
                ins = p.insert
                cs = chunks_ins[name]
                t0 = pc()
                for k, c in zip(ins_keys, cs):
                    ins(k, c, ctx)
                t1 = pc()
                if rec:
                    record("insert", name, t1 - t0)
                for k in ins_keys:
                    p.remove(k)
                # touch: `batch` T2 keys (move to T2's MRU end)
                sl = r % n_slices
                tk = t2_keys[sl * batch : (sl + 1) * batch]
                t0 = pc()
                p.touch(tk, ctx)
                t1 = pc()
                if rec:
                    record("touch", name, t1 - t0)
                # on_store_miss: `batch` B1 ghosts (target_t1_size restored)
                if hasattr(p, "target_t1_size"):
                    saved = p.target_t1_size
                gk = ghosts[sl * batch : (sl + 1) * batch]
                t0 = pc()
                p.on_store_miss(gk, ctx)
                t1 = pc()
                if rec:
                    record("on_store_miss", name, t1 - t0)
                if hasattr(p, "target_t1_size"):
                    p.target_t1_size = saved
                # on_request_finished: half inserted-only (T1), half reused (T2)
                fk = fin_t2 + fin_t1
                for pos, k in enumerate(fk):
                    ctx.set_offload_key_position(k, (pos + 1) * 16)
                groups = (tuple(fk),)
                ins_only = set(fin_t1)
                reused = set(fin_t2)
                t0 = pc()
                p.on_request_finished(groups, ins_only, reused, ctx)
                t1 = pc()
                if rec:
                    record("on_request_finished", name, t1 - t0)
    res: dict[str, Any] = {"scenario": "ops", "capacity": capacity, "batch": batch,
                           "reps": reps, "contenders": {}}
    for name in names:
        d = {}
        for op, s in samples[name].items():
            d[op] = bl.stats(s)
            d[op + "_per_key"] = bl.stats(s, per=batch)
        res["contenders"][name] = d
    for op in ("get", "insert", "touch", "on_store_miss", "on_request_finished"):
        bl.add_ratios(res["contenders"], op)
    c = res["contenders"]
    bl.progress(TAG, "ops per key p50 (ns): " + "; ".join(
        f"{op}: " + ", ".join(f"{n} {1000 * c[n][op + '_per_key']['p50']:.0f}" for n in c)
        for op in ("get", "insert", "touch", "on_store_miss", "on_request_finished")))
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = bl.arg_parser(__doc__).parse_args(argv)
    t0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    if args.full:
        for cap in (10_000, 30_000, 100_000, 300_000, 1_000_000):
            extra = dict(pinned=[1_000, 10_000, 50_000], protected=[1_000, 10_000, 50_000]) \
                if cap == 100_000 else {}
            if cap == 1_000_000:
                extra = dict(pinned=[500_000])
            results += capacity_case(cap, [16, 256, 1024], 300 if cap < 1_000_000 else 150,
                                     seed=cap, **extra)
        results.append(fallback_case(100_000, 1024, 300, seed=5))
        results.append(fallback_case(1_000_000, 1024, 60, seed=6))
        results.append(ops_case(100_000, 256, 500, seed=9))
        results.append(ops_case(1_000_000, 256, 300, seed=10))
        results.append(growth_case((10_000, 100_000, 1_000_000), 1024, 300, seed=77))
    else:
        results += capacity_case(10_000, [1024], 300, seed=10_000)
        results += capacity_case(100_000, [1024], 300, seed=100_000, pinned=[50_000])
        results += capacity_case(1_000_000, [1024], 150, seed=1_000_000)
        results.append(fallback_case(100_000, 1024, 200, seed=5))
        results.append(ops_case(100_000, 256, 300, seed=9))
        results.append(growth_case((10_000, 1_000_000), 1024, 200, seed=77))
    return bl.finish(TAG, args, t0, results)


if __name__ == "__main__":
    main()
