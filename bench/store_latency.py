"""Latency of CPUOffloadingManager.prepare_store and of the full store cycle
(prepare_store, complete_store, on_request_finished), cache full, every
store evicting, for vLLM arc, vLLM lru, arc_cy compiled and arc_cy pure.

Each contender has its own identically built vLLM CPUOffloadingManager
(arc_cy through cache_policy="ARCCachePolicy", cache_policy_module_path=
"arc_cy._core.arc" / "arc_cy._twin.arc"). Repetitions are interleaved round-robin
(the starting contender rotates), every contender gets the same keys, and
only the manager calls are timed (time.perf_counter_ns, gc disabled).

Scenarios:
  full      steady state, fresh keys each store, pinned fraction 0 or 0.5
            (the oldest resident chunks held by in-flight loads: prepare_load,
            released after the phase with complete_load)
  fallback  T1 below target_t1_size and every T2 chunk pinned by a load, so
            each eviction scans T2 and falls back to T1 (state built with
            stores, a reuse, ghost-list hits and loads; checked each rep)
  chat      a multi-turn, prefix-sharing chat trace (loads and stores of
            different requests interleaved)

Run: bench/run.sh --only store_latency, or alone with bench/ and harness/ on
PYTHONPATH (as bench/run.sh sets it): $PY -P bench/store_latency.py [--full] [--json out.json]
"""

from __future__ import annotations

import sys
import time
from typing import Any

import benchlib as bl
from arc_cy_harness.traffic import ManagerTraffic

NAME = TAG = "store_latency"
PLOTS = (("store_latency.png", "prepare_store: latency vs capacity and vs pinned fraction"),)


def fill(managers: dict[str, Any], keys: list[bytes], prefix: str, batch: int = 1024) -> None:
    """Store ``keys`` through every manager in batches and finish each
    request, the managers in step (bl.interleaved: none gains from being
    filled first)."""
    from vllm.v1.kv_offload.base import ReqContext

    for name, span in bl.interleaved(list(managers), range(len(keys)), step=batch):
        m, b = managers[name], span[0]
        part = keys[b : b + len(span)]
        ctx = ReqContext(f"{prefix}{b}")
        out = m.prepare_store(part, ctx)
        assert out is not None, (name, "fill failed")
        m.complete_store(out.keys_to_store, ctx)
        m.on_request_finished(ctx)


def arc_policy(m: Any) -> Any:
    # vLLM's manager keeps its policy in _policy (read-only use here: the
    # public t1/t2/target_t1_size of the policy, to check the state).
    return m._policy


def steady_phase(
    managers: dict[str, Any],
    stream: bl.KeyStream,
    stored: list[bytes],
    *,
    batch: int,
    reps: int,
    warmup: int,
    label: str,
    check: Any = None,
) -> dict[str, Any]:
    """Timed stores of fresh keys; every store must evict ``batch`` chunks."""
    from vllm.v1.kv_offload.base import ReqContext

    names = list(managers)
    t_prep: dict[str, list[int]] = {n: [] for n in names}
    t_cyc: dict[str, list[int]] = {n: [] for n in names}
    mismatches = 0
    pc = time.perf_counter_ns
    last = time.perf_counter()
    with bl.timed_phase():
        for r in range(warmup + reps):
            keys = stream.take(batch)
            stored.extend(keys)
            evicted: dict[str, list[bytes]] = {}
            for j in range(len(names)):
                name = names[(r + j) % len(names)]
                m = managers[name]
                ctx = ReqContext(f"{label}:{r}")
                for p, k in enumerate(keys):
                    ctx.set_offload_key_position(k, (p + 1) * 16)
                if check is not None:
                    check(name, m)
                t0 = pc()
                out = m.prepare_store(keys, ctx)
                t1 = pc()
                m.complete_store(out.keys_to_store, ctx)
                m.on_request_finished(ctx)
                t2 = pc()
                assert out is not None and len(out.keys_to_store) == batch, (name, label)
                assert len(out.evicted_keys) == batch, (name, label, "store did not evict")
                evicted[name] = out.evicted_keys
                if r >= warmup:
                    t_prep[name].append(t1 - t0)
                    t_cyc[name].append(t2 - t0)
            arc = [evicted[n] for n in bl.ARC_LIKE if n in evicted]
            if any(e != arc[0] for e in arc):
                mismatches += 1
            if time.perf_counter() - last > 10:
                bl.progress(TAG, f"{label}: rep {r + 1}/{warmup + reps}")
                last = time.perf_counter()
    res: dict[str, Any] = {"contenders": {}, "arc_decisions_mismatched_reps": mismatches}
    for n in names:
        res["contenders"][n] = {
            "prepare_store": bl.stats(t_prep[n]),
            "prepare_store_per_key": bl.stats(t_prep[n], per=batch),
            "store_cycle": bl.stats(t_cyc[n]),
            "store_cycle_per_key": bl.stats(t_cyc[n], per=batch),
        }
    for f in ("prepare_store", "store_cycle"):
        bl.add_ratios(res["contenders"], f)
    return res


def full_cache_case(
    capacity: int,
    batches: list[int],
    pinned_fracs: list[float],
    reps_for: Any,
    seed: int,
) -> list[dict[str, Any]]:
    """Build one full cache per contender, then run every (pinned, batch)."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    stream = bl.KeyStream(seed)
    t = time.perf_counter()
    managers = {n: bl.make_manager(n, capacity) for n in bl.NAMES}
    stored = stream.take(capacity)
    with bl.timed_phase():
        fill(managers, stored, "fill")
    bl.progress(TAG, f"capacity {capacity}: 4 full caches built in {time.perf_counter() - t:.1f}s")
    out = []
    for frac in sorted(pinned_fracs):
        pinned: list[bytes] = []
        loads: dict[str, Any] = {}
        if frac > 0:
            # The oldest resident chunks (T1's LRU end, read from vLLM arc's
            # policy; all ARC contenders hold the same order): held by
            # in-flight loads for the whole phase.
            t1 = arc_policy(managers["vllm_arc"]).t1
            assert len(t1) == capacity
            pinned = [k for k, _ in zip(t1, range(int(frac * capacity)))]
            for n, m in managers.items():
                ctx = ReqContext(f"loads{frac}")
                m.on_new_request(ctx)
                assert all(m.lookup(k, ctx) is LookupResult.HIT for k in pinned), n
                if n in bl.ARC_LIKE:
                    assert list(zip(arc_policy(m).t1, range(len(pinned)))) == list(
                        zip(pinned, range(len(pinned)))
                    ), n
                m.prepare_load(pinned, ctx)
                loads[n] = ctx
        for batch in batches:
            reps, warmup = reps_for(capacity, batch, frac)
            t = time.perf_counter()
            res = steady_phase(
                managers,
                stream,
                stored,
                batch=batch,
                reps=reps,
                warmup=warmup,
                label=f"cap{capacity}/b{batch}/pin{frac}",
            )
            res.update(
                scenario="full",
                capacity=capacity,
                batch=batch,
                pinned_fraction=frac,
                pinned=len(pinned),
                reps=reps,
                warmup=warmup,
            )
            out.append(res)
            c = res["contenders"]
            bl.progress(
                TAG,
                (
                    f"cap {capacity} batch {batch} pinned {frac:.0%}: prepare_store p50 "
                    + ", ".join(f"{n} {c[n]['prepare_store']['p50']:.1f}us" for n in c)
                    + f" ({time.perf_counter() - t:.1f}s)"
                ),
            )
        for n, ctx in loads.items():
            managers[n].complete_load(pinned, ctx)
            managers[n].on_request_finished(ctx)
    return out


def fallback_case(capacity: int, batch: int, reps: int, warmup: int, seed: int) -> dict[str, Any]:
    """T1 below its target and all of T2 pinned: evict() falls back to T1."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    stream = bl.KeyStream(seed)
    t = time.perf_counter()
    managers = {n: bl.make_manager(n, capacity) for n in bl.NAMES}
    half = capacity // 2
    a_keys = stream.take(half)  # reused once -> T2
    b_keys = stream.take(capacity - half)  # stored once -> T1
    ghosts = stream.take(batch)  # stored last: evicts b's oldest to B1
    n_touch = (capacity - half + 4 * batch) // batch + 1
    loads = {}
    with bl.timed_phase():
        fill(managers, a_keys, "a")
        for _n, m in managers.items():
            ctx = ReqContext("reuse")
            m.prepare_load(a_keys, ctx)
            m.complete_load(a_keys, ctx)
            m.on_request_finished(ctx)  # a request reused A: A moves to T2
        fill(managers, b_keys, "b")
        for n, m in managers.items():
            ctx = ReqContext("g")
            out = m.prepare_store(ghosts, ctx)  # evicts T1's oldest to B1
            assert out is not None and len(out.evicted_keys) == batch, n
            evicted_b = out.evicted_keys
            if n in bl.ARC_LIKE:
                assert all(k in arc_policy(m).b1 for k in evicted_b), n
            m.complete_store(out.keys_to_store, ctx)
            m.on_request_finished(ctx)
            ctx = ReqContext("ghost-hits")
            for _ in range(n_touch):  # each B1 ghost hit raises target_t1_size by 1
                bl.ghost_hits(arc_policy(m), evicted_b, ctx)  # what a store miss calls
            lctx = ReqContext("long-loads")
            # every T2 chunk pinned by a load (vLLM lru evicted some of A)
            held = [k for k in a_keys if m.lookup(k, lctx) is LookupResult.HIT]
            m.prepare_load(held, lctx)
            loads[n] = (lctx, held)
    for n in bl.ARC_LIKE:
        p = arc_policy(managers[n])
        assert len(p.t2) == half and all(c.ref_cnt > 0 for c in p.t2.values()), n
        assert len(p.t1) < int(p.target_t1_size), (n, len(p.t1), p.target_t1_size)
    state = {
        n: (len(arc_policy(managers[n]).t1), arc_policy(managers[n]).target_t1_size)
        for n in bl.ARC_LIKE
    }
    bl.progress(
        TAG,
        f"fallback state built in {time.perf_counter() - t:.1f}s: "
        f"(len(t1), target) = {state['vllm_arc']}, t2 = {half} all pinned",
    )
    a_set = set(a_keys)
    checked = {"reps_checked": 0}

    def check(name: str, m: Any) -> None:
        if name in bl.ARC_LIKE:
            p = arc_policy(m)
            # T1 under target: evict() tries T2 first, finds every chunk
            # pinned, and falls back to T1.
            assert len(p.t1) < int(p.target_t1_size), name
            assert len(p.t2) == half, name
            checked["reps_checked"] += 1

    stored = a_keys + b_keys + ghosts
    res = steady_phase(
        managers,
        stream,
        stored,
        batch=batch,
        reps=reps,
        warmup=warmup,
        label=f"fallback{capacity}",
        check=check,
    )
    for n in bl.ARC_LIKE:
        p = arc_policy(managers[n])
        assert all(k in p.t2 for k in a_keys[:64]), n  # nothing left T2
        assert a_set.isdisjoint(p.b2), n
    for n, m in managers.items():
        m.complete_load(loads[n][1], loads[n][0])
    res.update(
        scenario="fallback",
        capacity=capacity,
        batch=batch,
        pinned=half,
        reps=reps,
        warmup=warmup,
        state_t1_target=state["vllm_arc"],
        fallback_checked_reps=checked["reps_checked"],
    )
    c = res["contenders"]
    bl.progress(
        TAG,
        "fallback prepare_store p50 "
        + ", ".join(f"{n} {c[n]['prepare_store']['p50']:.1f}us" for n in c),
    )
    return res


def chat_case(capacity: int, n_requests: int, seed: int) -> dict[str, Any]:
    t = time.perf_counter()
    trace = bl.chat_trace(n_requests, seed=seed)
    drivers = {n: ManagerTraffic(bl.make_manager(n, capacity), timed=True) for n in bl.NAMES}
    names = list(drivers)
    with bl.timed_phase():
        for i, keys in enumerate(trace):
            for j in range(len(names)):
                drivers[names[(i + j) % len(names)]].step(keys, f"chat{i}")
    for d in drivers.values():
        d.drain()
    res: dict[str, Any] = {
        "scenario": "chat",
        "capacity": capacity,
        "requests": n_requests,
        "contenders": {},
    }
    for n, d in drivers.items():
        nonzero = [(t_, k) for t_, k in zip(d.t_store, d.t_store_keys) if k]
        per_key = [t_ / k for t_, k in nonzero]
        cyc_per_key = [t_ / k for t_, k in zip(d.t_cycle, d.cycle_keys)]
        res["contenders"][n] = {
            "prepare_store": bl.stats(d.t_store),
            "prepare_store_per_key": bl.stats(per_key),
            "store_cycle": bl.stats(d.t_cycle),
            "store_cycle_per_key": bl.stats(cyc_per_key),
            "hit_ratio": round(d.hit_ratio(), 4),
            "evicted": d.evicted,
            "store_failures": d.store_failures,
            "mean_keys_per_store": round(sum(d.t_store_keys) / max(1, len(d.t_store_keys)), 1),
        }
    ref = drivers["vllm_arc"].per_request
    res["arc_decisions_mismatched_requests"] = sum(
        sum(a != b for a, b in zip(ref, drivers[n].per_request)) for n in ("arc_cy", "arc_cy_pure")
    )
    for f in ("prepare_store", "store_cycle"):
        bl.add_ratios(res["contenders"], f)
    c = res["contenders"]
    bl.progress(
        TAG,
        f"chat (cap {capacity}, {n_requests} requests, "
        f"{time.perf_counter() - t:.1f}s): prepare_store p50 "
        + ", ".join(f"{n} {c[n]['prepare_store']['p50']:.1f}us" for n in c),
    )
    return res


def run(args: Any) -> dict[str, Any]:
    results: list[dict[str, Any]] = []

    def reps_default(capacity: int, batch: int, frac: float) -> tuple[int, int]:
        if capacity == 50_000 and batch == 256:
            return (1000 if frac == 0 else 400), 30
        if capacity >= 1_000_000:
            return 100, 10
        return (300 if frac == 0 else 150), 20

    def reps_full(capacity: int, batch: int, frac: float) -> tuple[int, int]:
        if capacity >= 1_000_000 and frac > 0:
            return 60, 5
        return (600 if batch < 1024 else 300), 20

    if args.full:
        for cap in (10_000, 50_000, 100_000, 1_000_000):
            batches = [256] if cap == 50_000 else [16, 256, 1024]
            results += full_cache_case(cap, batches, [0.0, 0.5], reps_full, seed=cap)
        results.append(fallback_case(100_000, 1024, 300, 20, seed=7))
        results.append(fallback_case(1_000_000, 1024, 60, 5, seed=8))
        results.append(chat_case(20_000, 4000, seed=11))
    else:
        # 256-key stores from 10K to 1M chunks (the growth with capacity), and
        # the targets' cases: 256 keys at 50K, 1024 at 100K, pinned or not.
        results += full_cache_case(10_000, [256], [0.0], reps_default, seed=10)
        results += full_cache_case(50_000, [256], [0.0, 0.5], reps_default, seed=50)
        results += full_cache_case(100_000, [256, 1024], [0.0, 0.5], reps_default, seed=100)
        results += full_cache_case(1_000_000, [256], [0.0], reps_default, seed=1000)
        results.append(fallback_case(100_000, 1024, 150, 20, seed=7))
        results.append(chat_case(10_000, 1500, seed=11))
    return {"results": results}


# --- the report -----------------------------------------------------------------


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    sl = result["results"]
    s50 = bl.find(sl, scenario="full", capacity=50_000, batch=256, pinned_fraction=0.0)
    prep = "prepare_store"
    rows = [
        bl.target(
            "prepare_store of 256 keys at 50K chunks, full cache: vLLM arc p50 / arc_cy p50",
            bl.ratio(bl.p50(s50, "vllm_arc", prep), bl.p50(s50, "arc_cy", prep)),
            ">= 1.4x",
            lambda v: v >= 1.4,
            "store_latency.py",
            "the per-key calls of a store (get, insert, on_store_miss, evict) got slower",
        ),
        bl.target(
            "prepare_store of 256 keys at 50K: vLLM lru p50 / arc_cy p50",
            bl.ratio(bl.p50(s50, "vllm_lru", prep), bl.p50(s50, "arc_cy", prep)),
            "> 1x",
            lambda v: v > 1,
            "store_latency.py",
            "arc_cy costs more per store than vLLM's simplest policy",
        ),
        bl.target(
            "pure twin prepare_store of 256 keys at 50K: twin p50 / vLLM arc p50",
            bl.ratio(bl.p50(s50, "arc_cy_pure", prep), bl.p50(s50, "vllm_arc", prep)),
            f"<= {bl.TWIN_STORE_GOAL}x",
            lambda v: v <= bl.TWIN_STORE_GOAL,
            "store_latency.py",
            bl.TWIN_STORE_MISS,
        ),
    ]
    differ = sum(
        r.get("arc_decisions_mismatched_reps", r.get("arc_decisions_mismatched_requests")) or 0
        for r in sl
    )
    rows.append(
        bl.decisions_target(
            "repetitions or chat requests (evicted keys)", differ, "store_latency.py"
        )
    )
    return rows


def markdown(result: dict[str, Any]) -> str:
    L, N = bl.LABELS, bl.NAMES
    out = ["## Store latency through CPUOffloadingManager (store_latency.py)", ""]
    out.append(
        "Cache full, every store evicts. `prepare_store` alone, and the full store cycle "
        "(prepare_store + complete_store + on_request_finished)."
    )
    for r in result["results"]:
        out.append("")
        if r["scenario"] == "full":
            title = (
                f"### capacity {r['capacity']:,}, batch {r['batch']}, "
                f"pinned {r['pinned_fraction']:.0%} ({r['pinned']:,} chunks at the LRU end), "
                f"{r['reps']} reps"
            )
        elif r["scenario"] == "fallback":
            title = (
                f"### fallback: capacity {r['capacity']:,}, batch {r['batch']}, T2 "
                f"({r['pinned']:,}) all pinned, (len(T1), target) = {r['state_t1_target']}, "
                f"{r['reps']} reps (state checked before {r['fallback_checked_reps']} calls)"
            )
        else:
            title = (
                f"### chat trace: capacity {r['capacity']:,}, {r['requests']} requests "
                f"(variable batch; per-request cycle)"
            )
        out.append(title)
        mism = r.get("arc_decisions_mismatched_reps", r.get("arc_decisions_mismatched_requests"))
        out.append("")
        same = "yes" if mism == 0 else f"NO ({mism} differ)"
        out.append(f"arc_cy's evictions identical to vLLM arc's: {same}")
        for field, name in (("prepare_store", "prepare_store"), ("store_cycle", "store cycle")):
            out.append("")
            out.append(f"{name}:")
            out.append("")
            out.extend(bl.latency_table(r, field))
        if r["scenario"] == "chat":
            out.append("")
            out.append(
                "hit ratio: "
                + ", ".join(f"{L[n]} {r['contenders'][n]['hit_ratio']:.3f}" for n in N)
            )
    return "\n".join(out) + "\n"


def plot(result: dict[str, Any], out_dir: str, plt: Any) -> list[tuple[str, str]]:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    sl = result["results"]
    C, L, N = bl.COLORS, bl.LABELS, bl.NAMES
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    ax = axes[0]
    full = [r for r in sl if r["scenario"] == "full" and r["pinned_fraction"] == 0]
    markers = {16: "s", 256: "o", 1024: "^"}
    batches = sorted({r["batch"] for r in full})
    for name in N:
        for batch in batches:
            pts = sorted(
                ((r["capacity"], r) for r in full if r["batch"] == batch), key=lambda t: t[0]
            )
            ax.plot(
                [c for c, _ in pts],
                [r["contenders"][name]["prepare_store_per_key"]["p50"] for _, r in pts],
                markers.get(batch, "D") + ("-" if batch == 256 else ":"),
                color=C.get(name, "tab:purple"),
            )
    capacities = sorted({r["capacity"] for r in full})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(FixedLocator(capacities))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _count(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("capacity (chunks), cache full")
    ax.set_ylabel("prepare_store p50, us per key")
    ax.set_title("prepare_store per key against capacity")
    ax.grid(True, which="major", alpha=0.3)
    # One legend entry per colour (contender) and per marker (keys a store).
    handles = [Line2D([], [], color=C.get(n, "tab:purple"), lw=2, label=L[n]) for n in N]
    handles += [
        Line2D(
            [],
            [],
            color="black",
            marker=markers.get(b, "D"),
            linestyle="none",
            label=f"{b} keys a store",
        )
        for b in batches
    ]
    ax.legend(handles=handles, fontsize=7)
    ax = axes[1]
    # The cases run both unpinned and with half the cache pinned.
    groups = sorted(
        {
            (r["capacity"], r["batch"])
            for r in sl
            if r["scenario"] == "full" and r["pinned_fraction"]
        }
    )
    width = 0.8 / max(1, len(N))
    labels: list[str] = []
    for c, b in groups:
        for frac in (0.0, 0.5):
            r = bl.find(sl, scenario="full", capacity=c, batch=b, pinned_fraction=frac)
            if r is None:
                continue
            x = len(labels)
            labels.append(f"{_count(c)} chunks\n{b} keys\n{frac:.0%} pinned")
            for ni, name in enumerate(N):
                ax.bar(
                    x + (ni - (len(N) - 1) / 2) * width,
                    r["contenders"][name]["prepare_store"]["p50"],
                    width,
                    color=C.get(name),
                    label=L[name] if x == 0 else None,
                )
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("prepare_store p50, us per call")
    ax.set_title("prepare_store vs pinned fraction")
    ax.legend(fontsize=8)
    return [bl.save_plot(plt, fig, out_dir, *PLOTS[0])]


def _count(n: float) -> str:
    """10000 -> 10K, 1000000 -> 1M."""
    for div, unit in ((1_000_000, "M"), (1_000, "K")):
        if n >= div:
            return f"{n / div:g}{unit}"
    return f"{n:g}"


if __name__ == "__main__":
    bl.cli(sys.modules[__name__])
