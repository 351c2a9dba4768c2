"""Cost of one policy.evict(n) and of the other policy calls, driving the
policy objects directly: the installed vLLM's ARCCachePolicy and LRUCachePolicy,
arc_cy compiled (arc_cy._core.arc) and arc_cy pure (arc_cy._twin.arc).

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
              reuse, ghost evictions and repeated B1 ghost hits), so
              every evict(n) scans all of T2 and falls back to T1; checked
              before each repetition
  ops         get / insert / touch / on_store_miss / on_request_finished at a
              realistic batch (256 keys), state restored after each call
              (touch only where the policy has it: vLLM 0.34.0's do not)

Run: bench/run.sh --only evict, or alone with bench/ and harness/ on
PYTHONPATH (as bench/run.sh sets it): $PY -P bench/evict.py [--full] [--json out.json]
"""

from __future__ import annotations

import sys
import time
from typing import Any

import benchlib as bl

NAME = TAG = "evict"
PLOTS = (("evict.png", "policy.evict(1024): latency vs capacity and vs pinned entries"),)


def _ctx(name: str = "bench") -> Any:
    from vllm.v1.kv_offload.base import ReqContext

    return ReqContext(name)


def _pin(p: Any, keys: list[bytes]) -> None:
    for k in keys:
        c = p.get(k)
        assert c is not None and c.ref_cnt == 0
        c.ref_cnt = 1  # what prepare_load does
        p.mark_non_evictable(k)


def build_steady(
    names: list[str], capacity: int, keys_a: list[bytes], keys_b: list[bytes]
) -> dict[str, Any]:
    """One policy per name, each a full cache (all in T1 for ARC) and, for
    ARC, B1 full of ghosts. Built in step, a slice of keys for each policy
    in turn (bl.interleaved): the policies' memory is laid out alike, so no
    contender gains from being built first."""
    policies = {name: bl.policy_class(name)(capacity) for name in names}
    chunks: dict[str, list[Any]] = {name: [] for name in names}
    ctx = _ctx()
    for name, part in bl.interleaved(names, range(capacity)):
        p, mine = policies[name], chunks[name]
        mine += bl.ready_chunks(len(part), start=part[0])
        for i in part:
            p.insert(keys_a[i], mine[i], ctx)
    for name in bl.interleaved(names):
        ev = policies[name].evict(capacity, set())
        assert ev is not None and len(ev) == capacity
        chunks[name] = [c for _, c in ev]
    for name, part in bl.interleaved(names, range(capacity)):
        p, mine = policies[name], chunks[name]
        for i in part:
            p.insert(keys_b[i], mine[i], ctx)
    return policies


def node_bytes() -> int:
    """The compiled core's bytes per entry node, as the core reports them."""
    from arc_cy._core import arc as core

    return int(core._NODE_SIZE)


def scan_bytes_per_entry() -> int:
    """Bytes the compiled scan reads per entry it skips: its node and the
    ChunkStatus object whose ref_cnt it reads live."""
    return node_bytes() + sys.getsizeof(bl.ready_chunks(1)[0])


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
                for k, (_, c) in zip(batch, ev):  # restore T1's size
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
    res: dict[str, Any] = {
        "n": n,
        "reps": reps,
        "warmup": warmup,
        "arc_decisions_mismatched_reps": mismatches,
        "contenders": {},
    }
    if floor_entries:
        res["floor"] = {
            "entries": floor_entries,
            "bytes_per_entry": scan_bytes_per_entry(),
            "node_bytes": node_bytes(),
            "bytes": int(floor_arr.nbytes),
            "sequential_read": bl.stats(floor_samples),
        }
    for name in names:
        res["contenders"][name] = {
            "evict": bl.stats(samples[name]),
            "evict_per_key": bl.stats(samples[name], per=n),
        }
        if name == "arc_cy":
            res["contenders"][name]["scan_visits_total"] = policies[name]._scan_visits
    bl.add_ratios(res["contenders"], "evict")
    c = res["contenders"]
    bl.progress(
        TAG, f"{label}: evict({n}) p50 " + ", ".join(f"{k} {c[k]['evict']['p50']:.1f}us" for k in c)
    )
    return res


def capacity_case(
    capacity: int,
    ns: list[int],
    reps: int,
    seed: int,
    pinned: list[int] = (),
    protected: list[int] = (),
) -> list[dict[str, Any]]:
    t = time.perf_counter()
    stream = bl.KeyStream(seed)
    keys_a = stream.take(capacity)
    keys_b = stream.take(capacity)
    policies = build_steady(list(bl.NAMES), capacity, keys_a, keys_b)
    del keys_a
    bl.progress(
        TAG, f"capacity {capacity}: 4 steady-state policies built in {time.perf_counter() - t:.1f}s"
    )
    out = []
    for n in ns:
        fresh = stream.take((reps + 10) * n)
        res = run_evict(
            policies, n=n, reps=reps, warmup=10, fresh=fresh, label=f"cap {capacity} nothing pinned"
        )
        res.update(scenario="evict", capacity=capacity, pinned=0, protected=0)
        out.append(res)
    n = max(ns)
    for k in protected:
        # The k oldest T1 keys (T1 order is insertion order here).
        lru_end = [key for key, _ in zip(policies["vllm_arc"].t1, range(k))]
        fresh = stream.take((reps + 10) * n)
        res = run_evict(
            policies,
            n=n,
            reps=reps,
            warmup=10,
            fresh=fresh,
            protected_extra=set(lru_end),
            label=f"cap {capacity} {k} protected",
        )
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
        res = run_evict(
            policies,
            n=n,
            reps=reps,
            warmup=10,
            fresh=fresh,
            label=f"cap {capacity} {k} pinned at LRU end",
            floor_entries=k,
        )
        res.update(
            scenario="pinned",
            capacity=capacity,
            pinned=k,
            protected=0,
            pinned_fraction_of_t1=round(k / capacity, 3),
        )
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
        built = build_steady(["vllm_arc", "arc_cy"], cap, keys_a, keys_b)
        policies.update((f"{name}@{cap}", p) for name, p in built.items())
    bl.progress(TAG, f"growth: {len(policies)} policies built in {time.perf_counter() - t:.1f}s")
    fresh = stream.take((reps + 10) * n)
    res = run_evict(
        policies, n=n, reps=reps, warmup=10, fresh=fresh, label="growth (capacities interleaved)"
    )
    res.update(scenario="growth", capacities=list(caps))
    c = res["contenders"]
    res["growth_p50"] = {
        name: round(
            c[f"{name}@{caps[-1]}"]["evict"]["p50"] / c[f"{name}@{caps[0]}"]["evict"]["p50"], 3
        )
        for name in ("vllm_arc", "arc_cy")
    }
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
    names = list(bl.NAMES)
    policies = {name: bl.policy_class(name)(capacity) for name in names}
    chunks: dict[str, list[Any]] = {name: [] for name in names}
    ctx = _ctx()
    # Built in step (bl.interleaved), phase by phase.
    for name, part in bl.interleaved(names, range(half)):
        chunks[name] += bl.ready_chunks(len(part), start=part[0])
        for i in part:
            policies[name].insert(a_keys[i], chunks[name][i], ctx)
    for name in bl.interleaved(names):
        bl.reuse(policies[name], a_keys, ctx)  # reused: A moves to T2
    for name, part in bl.interleaved(names, range(half, capacity)):
        chunks[name] += bl.ready_chunks(len(part), start=part[0])
        for i in part:
            policies[name].insert(b_keys[i - half], chunks[name][i], ctx)  # B in T1
    for name in bl.interleaved(names):
        p = policies[name]
        ev = p.evict(n, set())  # T1's oldest become B1 ghosts
        ghosts = [k for k, _ in ev]
        for k, (_, c) in zip(g_keys, ev):
            p.insert(k, c, ctx)
        for _ in range(n_touch):  # B1 hits raise target_t1_size
            bl.ghost_hits(p, ghosts, ctx)
        _pin(p, [k for k in a_keys if p.get(k) is not None])  # all of T2 pinned
    for name in bl.ARC_LIKE:
        p = policies[name]
        assert len(p.t2) == half and all(c.ref_cnt > 0 for c in p.t2.values()), name
        assert len(p.t1) < int(p.target_t1_size), name
    state = (len(policies["vllm_arc"].t1), policies["vllm_arc"].target_t1_size)
    bl.progress(
        TAG,
        f"fallback {capacity}: built in {time.perf_counter() - t:.1f}s, "
        f"(len(t1), target) = {state}, t2 = {half} all pinned",
    )
    checked = [0]

    def check(name: str, p: Any) -> None:
        if name in bl.ARC_LIKE:
            assert len(p.t1) < int(p.target_t1_size) and len(p.t2) == half, name
            checked[0] += 1

    fresh = stream.take((reps + 10) * n)
    res = run_evict(
        policies,
        n=n,
        reps=reps,
        warmup=10,
        fresh=fresh,
        check=check,
        label=f"fallback cap {capacity}",
        floor_entries=half,
    )
    for name in bl.ARC_LIKE:
        assert len(policies[name].t2) == half and len(policies[name].b2) == 0, name
    res.update(
        scenario="fallback",
        capacity=capacity,
        pinned=half,
        protected=0,
        state_t1_target=state,
        fallback_checked_reps=checked[0],
    )
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
        bl.reuse(p, keys[:half], ctx)  # first half reused: T2
        ev = p.evict(n_ghost, set())  # oldest of T1 -> B1
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
                # touch: `batch` T2 keys (move to T2's MRU end), on a
                # policy that has touch (vLLM 0.34.0's have none)
                sl = r % n_slices
                tk = t2_keys[sl * batch : (sl + 1) * batch]
                if hasattr(p, "touch"):
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
    res: dict[str, Any] = {
        "scenario": "ops",
        "capacity": capacity,
        "batch": batch,
        "reps": reps,
        "contenders": {},
    }
    for name in names:
        d = {}
        for op, s in samples[name].items():
            d[op] = bl.stats(s)
            d[op + "_per_key"] = bl.stats(s, per=batch)
        res["contenders"][name] = d
    for op in ("get", "insert", "touch", "on_store_miss", "on_request_finished"):
        bl.add_ratios(res["contenders"], op)
    c = res["contenders"]
    bl.progress(
        TAG,
        "ops per key p50 (ns): "
        + "; ".join(
            f"{op}: "
            + ", ".join(f"{n} {1000 * c[n][op + '_per_key']['p50']:.0f}" for n in c if op in c[n])
            for op in ("get", "insert", "touch", "on_store_miss", "on_request_finished")
        ),
    )
    return res


def run(args: Any) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    if args.full:
        for cap in (10_000, 30_000, 100_000, 300_000, 1_000_000):
            extra = (
                dict(pinned=[1_000, 10_000, 50_000], protected=[1_000, 10_000, 50_000])
                if cap == 100_000
                else {}
            )
            if cap == 1_000_000:
                extra = dict(pinned=[500_000])
            results += capacity_case(
                cap, [16, 256, 1024], 300 if cap < 1_000_000 else 150, seed=cap, **extra
            )
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
    return {"results": results}


# --- the report -----------------------------------------------------------------


def floor_ratio(r: dict[str, Any] | None, unpinned_p50: float | None) -> float | None:
    """Effective read bandwidth of the compiled pinned scan over the sequential
    read bandwidth of an array of the same bytes (both measured in the same
    loop). The scan's time is arc_cy's evict p50 minus its p50 with nothing
    pinned (the same capacity's run)."""
    if r is None or "floor" not in r or not unpinned_p50:
        return None
    fl = r["floor"]
    scan_us = r["contenders"]["arc_cy"]["evict"]["p50"] - unpinned_p50
    if scan_us <= 0:
        return None
    return round(fl["sequential_read"]["p50"] / scan_us, 3)


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    ev = result["results"]
    e100 = bl.find(ev, scenario="evict", capacity=100_000, n=1024)
    rows = [
        bl.target(
            "evict(1024) at 100K chunks, nothing pinned: vLLM arc p50 / arc_cy p50",
            bl.ratio(bl.p50(e100, "vllm_arc", "evict"), bl.p50(e100, "arc_cy", "evict")),
            ">= 6x",
            lambda v: v >= 6,
            "evict.py",
            "the compiled eviction path got slower: compare evict.py's tables with the "
            "reference run's",
        )
    ]
    base = bl.p50(e100, "arc_cy", "evict")
    for sc, what in (
        ("pinned", "50K pinned at T1's LRU end"),
        ("fallback", "T2 (50K) all pinned, fallback to T1"),
    ):
        rr = bl.find(
            ev, scenario=sc, capacity=100_000, **({"pinned": 50_000} if sc == "pinned" else {})
        )
        rows.append(
            bl.target(
                f"compiled scan past pinned entries at 100K, {what}: its read speed (node + "
                "ChunkStatus bytes per pinned entry) / a sequential read of as many bytes",
                floor_ratio(rr, base),
                ">= 0.5",
                lambda v: v >= 0.5,
                "evict.py, same loop",
                "the scan does more per pinned entry than read its node and its ChunkStatus "
                "once (it is memory-bound when it does only that)",
            )
        )
    eg = bl.find(ev, scenario="growth")
    rows.append(
        bl.target(
            "compiled evict(1024), nothing pinned: p50 at 1M chunks / p50 at 10K "
            "(interleaved in one loop)",
            eg["growth_p50"]["arc_cy"] if eg else None,
            "<= 1.5x",
            lambda v: v <= 1.5,
            "evict.py",
            "eviction cost grows with the cache's size, not only with the chunks evicted",
        )
    )
    rows.append(
        bl.target(
            "pure twin evict(1024) at 100K: twin p50 / vLLM arc p50",
            bl.ratio(bl.p50(e100, "arc_cy_pure", "evict"), bl.p50(e100, "vllm_arc", "evict")),
            "<= 1.1x",
            lambda v: v <= 1.1,
            "evict.py",
            bl.TWIN_MISS,
        )
    )
    differ = sum(
        r["arc_decisions_mismatched_reps"] for r in ev if "arc_decisions_mismatched_reps" in r
    )
    rows.append(bl.decisions_target("repetitions (evicted keys)", differ, "evict.py"))
    return rows


def markdown(result: dict[str, Any]) -> str:
    fmt, L, N = bl.fmt, bl.LABELS, bl.NAMES
    out = ["## policy.evict(n) and other policy calls (evict.py)", ""]
    out.append(
        "Policies driven directly; steady state (T1 full, B1 full) restored after each "
        "call by re-inserting the evicted chunks under fresh keys."
    )
    for r in result["results"]:
        if r["scenario"] != "growth":
            continue
        out.append("")
        out.append(
            f"### Growth: evict({r['n']}), nothing pinned, capacities {r['capacities']} "
            f"interleaved in one loop, {r['reps']} reps"
        )
        out.append("")
        out.append("| policy@capacity | p50 | p90 | p99 | max |")
        out.append("|---|---:|---:|---:|---:|")
        for name, c in r["contenders"].items():
            s = c["evict"]
            out.append(
                f"| {name} | {fmt(s['p50'])} | {fmt(s['p90'])} | {fmt(s['p99'])} | "
                f"{fmt(s['max'])} |"
            )
        out.append("")
        out.append(
            "p50 growth from the smallest to the largest capacity: "
            + ", ".join(f"{L[k]} {v:.2f}x" for k, v in r["growth_p50"].items())
        )
    for r in result["results"]:
        if r["scenario"] in ("ops", "growth"):
            continue
        out.append("")
        if r["scenario"] == "evict":
            title = f"### evict({r['n']}) at {r['capacity']:,} chunks, nothing pinned"
        elif r["scenario"] == "pinned":
            title = (
                f"### evict({r['n']}) at {r['capacity']:,}, {r['pinned']:,} chunks pinned "
                f"at T1's LRU end"
            )
        elif r["scenario"] == "protected":
            title = (
                f"### evict({r['n']}) at {r['capacity']:,}, {r['protected']:,} keys at T1's "
                f"LRU end protected"
            )
        else:
            title = (
                f"### evict({r['n']}) at {r['capacity']:,}, fallback: T2 ({r['pinned']:,}) "
                f"all pinned, (len(T1), target) = {r['state_t1_target']}"
            )
        out.append(title + f", {r['reps']} reps")
        out.append("")
        out.extend(bl.latency_table(r, "evict"))
        out.append("")
        out.append(
            f"arc_cy's victims identical to vLLM arc's: "
            f"{'yes' if r['arc_decisions_mismatched_reps'] == 0 else 'NO'}"
        )
        if "floor" in r:
            fl = r["floor"]
            base = bl.p50(
                bl.find(result["results"], scenario="evict", capacity=r["capacity"], n=r["n"]),
                "arc_cy",
                "evict",
            )
            scan = r["contenders"]["arc_cy"]["evict"]["p50"] - (base or 0)
            out.append("")
            out.append(
                f"Memory floor: {fl['entries']:,} pinned entries x {fl['bytes_per_entry']} bytes "
                f"(node {fl['node_bytes']} + ChunkStatus object "
                f"{fl['bytes_per_entry'] - fl['node_bytes']}) "
                f"= {fl['bytes'] / 1e6:.1f} MB. Sequential read of that many bytes (numpy sum, "
                f"timed once per repetition in the same loop): p50 "
                f"{fl['sequential_read']['p50']:.1f} us "
                f"= {fl['bytes'] / fl['sequential_read']['p50'] / 1e3:.1f} GB/s. Compiled scan: "
                f"{scan:.1f} us over the unpinned evict(1024) p50 = "
                f"{fl['bytes'] / scan / 1e3 if scan > 0 else float('nan'):.1f} GB/s effective, "
                f"{fl['sequential_read']['p50'] / scan if scan > 0 else float('nan'):.2f} of the "
                "sequential read."
            )
    for r in result["results"]:
        if r["scenario"] != "ops":
            continue
        out.append("")
        out.append(
            f"### Per-key cost of policy calls at {r['capacity']:,} entries, "
            f"batch {r['batch']} (ns per key, p50 / p99)"
        )
        out.append("")
        ops = ("get", "insert", "touch", "on_store_miss", "on_request_finished")
        out.append("| contender | " + " | ".join(ops) + " |")
        out.append("|---|" + "---:|" * len(ops))
        for n in N:
            c = r["contenders"][n]
            out.append(
                f"| {L[n]} | "
                + " | ".join(
                    f"{1000 * c[op + '_per_key']['p50']:.0f} / "
                    f"{1000 * c[op + '_per_key']['p99']:.0f}"
                    if op in c
                    else "n/a"
                    for op in ops
                )
                + " |"
            )
        out.append("")
        out.append(
            "get and insert are timed as a loop of single calls (per key = per call); "
            "touch, on_store_miss and on_request_finished as one call on the batch. "
            "touch: T2 keys (n/a: the policy has no touch, as vLLM 0.34.0's); "
            "on_store_miss: B1 ghosts (target restored after); "
            "on_request_finished: half inserted-only T1 keys, half reused T2 keys."
        )
    return "\n".join(out) + "\n"


def plot(result: dict[str, Any], out_dir: str, plt: Any) -> list[tuple[str, str]]:
    ev = result["results"]
    C, L, N = bl.COLORS, bl.LABELS, bl.NAMES
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    n = 1024
    pts = sorted(
        ((r["capacity"], r) for r in ev if r["scenario"] == "evict" and r.get("n") == n),
        key=lambda t: t[0],
    )
    for name in N:
        ax.plot(
            [c for c, _ in pts],
            [r["contenders"][name]["evict"]["p50"] for _, r in pts],
            "o-",
            color=C.get(name),
            label=L[name],
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("capacity (chunks)")
    ax.set_ylabel("p50 us per call")
    ax.set_title(f"policy.evict({n}), nothing pinned")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    cap = 100_000
    pts3 = sorted(
        (
            (r["pinned"], r)
            for r in ev
            if r.get("capacity") == cap
            and r.get("n") == 1024
            and r["scenario"] in ("evict", "pinned")
        ),
        key=lambda t: t[0],
    )
    fb = bl.find(ev, scenario="fallback", capacity=cap)
    for name in N:
        ax.plot(
            [p for p, _ in pts3],
            [r["contenders"][name]["evict"]["p50"] for _, r in pts3],
            "o-",
            color=C.get(name),
            label=L[name],
        )
        if fb:
            ax.plot(
                [fb["pinned"]],
                [fb["contenders"][name]["evict"]["p50"]],
                "x",
                color=C.get(name),
                markersize=10,
            )
    ax.set_yscale("log")
    ax.set_xlabel("chunks pinned at T1's LRU end (x: T2 all pinned, fallback)")
    ax.set_ylabel("p50 us per call")
    ax.set_title(f"policy.evict(1024) at {cap:,} chunks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return [bl.save_plot(plt, fig, out_dir, *PLOTS[0])]


if __name__ == "__main__":
    bl.cli(sys.modules[__name__])
