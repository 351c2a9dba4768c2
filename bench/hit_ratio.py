"""Hit ratio of arc_cy vs vLLM lru and vLLM arc on the same traces, through
the installed vLLM's real CPUOffloadingManager: lookup the prefix, prepare_load /
complete_load the hits, prepare_store / complete_store the misses (chunked,
256 keys a call), on_request_finished; four requests in flight, so loads and
stores of different requests interleave (arc_cy_harness.traffic's ManagerTraffic).

Traces: a multi-turn prefix-sharing chat, a looping scan larger than the
cache, a Zipf mix of shared documents plus unique questions, at several
capacities. Also checks that arc_cy (compiled and pure) matches vLLM arc hit
for hit: the same hits and the same evicted keys, request by request.

Run: bench/run.sh --only hit_ratio, or alone with bench/ and harness/ on
PYTHONPATH (as bench/run.sh sets it): $PY -P bench/hit_ratio.py [--full] [--json out.json]
"""

from __future__ import annotations

import sys
import time
from typing import Any

import benchlib as bl
from arc_cy_harness.traffic import ManagerTraffic

NAME = TAG = "hit_ratio"
PLOTS = (("hit_ratio.png", "Hit ratio"),)


def run_trace(trace_name: str, trace: list[list[bytes]], capacity: int) -> dict[str, Any]:
    t = time.perf_counter()
    drivers = {n: ManagerTraffic(bl.make_manager(n, capacity)) for n in bl.NAMES}
    names = list(drivers)
    for i, keys in enumerate(trace):
        for j in range(len(names)):
            drivers[names[(i + j) % len(names)]].step(keys, f"{trace_name}{i}")
    for d in drivers.values():
        d.drain()
    ref = drivers["vllm_arc"].per_request
    res: dict[str, Any] = {
        "trace": trace_name,
        "capacity": capacity,
        "requests": len(trace),
        "keys": drivers["vllm_arc"].keys,
        "distinct_keys": len({k for r in trace for k in r}),
        "contenders": {},
    }
    for n, d in drivers.items():
        res["contenders"][n] = {
            "hit_ratio": round(d.hit_ratio(), 5),
            "hits": d.hits,
            "stored": d.stored,
            "evicted": d.evicted,
            "store_failures": d.store_failures,
        }
    same = {}
    for n in ("arc_cy", "arc_cy_pure"):
        per = drivers[n].per_request
        diff = [i for i, (a, b) in enumerate(zip(ref, per)) if a != b]
        same[n] = {
            "identical": not diff and len(per) == len(ref),
            "requests_compared": len(ref),
            "evictions_compared": sum(len(e) for _, e in ref),
            "first_difference_at_request": diff[0] if diff else None,
            "differing_requests": len(diff),
        }
    res["matches_vllm_arc"] = same
    c = res["contenders"]
    bl.progress(
        TAG,
        f"{trace_name} cap {capacity} ({len(trace)} req, "
        f"{time.perf_counter() - t:.1f}s): "
        + ", ".join(f"{n} {c[n]['hit_ratio']:.3f}" for n in c)
        + "; identical to vLLM arc: "
        + ", ".join(f"{n} {same[n]['identical']}" for n in same),
    )
    return res


def run(args: Any) -> dict[str, Any]:
    k = 3 if args.full else 1
    chat = bl.chat_trace(600 * k, seed=21)
    loop = bl.loop_trace(400 * k, loop_blocks=3000)
    zipf = bl.zipf_trace(1500 * k, seed=22)
    results = []
    full = args.full
    for cap in (1000, 2000, 4000, 8000) if full else (1000, 3000, 6000):
        results.append(run_trace("chat", chat, cap))
    for cap in (1000, 2000, 2500, 4000) if full else (2000, 4000):
        results.append(run_trace("loop", loop, cap))
    for cap in (1000, 2000, 4000, 8000) if full else (1000, 4000):
        results.append(run_trace("zipf", zipf, cap))
    identical = all(v["identical"] for r in results for v in r["matches_vllm_arc"].values())
    bl.progress(TAG, f"arc_cy identical to vLLM arc on every trace: {identical}")
    return {"results": results, "all_identical_to_vllm_arc": identical}


# --- the report -----------------------------------------------------------------


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    differ = sum(
        0 if all(v["identical"] for v in r["matches_vllm_arc"].values()) else 1
        for r in result["results"]
    )
    return [bl.decisions_target("traces (hits and evicted keys)", differ, "hit_ratio.py")]


def markdown(result: dict[str, Any]) -> str:
    L, N = bl.LABELS, bl.NAMES
    out = ["## Hit ratio through the real manager (hit_ratio.py)", ""]
    identical = "yes" if result["all_identical_to_vllm_arc"] else "NO"
    out.append(
        f"arc_cy (compiled and pure) identical to vLLM arc, hit for hit and eviction for "
        f"eviction, on every trace: **{identical}**"
    )
    out.append("")
    out.append(
        "| trace | capacity | requests | "
        + " | ".join(L[n] for n in N)
        + " | identical to vLLM arc |"
    )
    out.append("|---|---:|---:|" + "---:|" * len(N) + "---|")
    for r in result["results"]:
        ident = all(v["identical"] for v in r["matches_vllm_arc"].values())
        ev = r["matches_vllm_arc"]["arc_cy"]["evictions_compared"]
        out.append(
            f"| {r['trace']} | {r['capacity']:,} | {r['requests']} | "
            + " | ".join(f"{r['contenders'][n]['hit_ratio']:.3f}" for n in N)
            + f" | {'yes' if ident else 'NO'} ({ev:,} evictions compared) |"
        )
    return "\n".join(out) + "\n"


def plot(result: dict[str, Any], out_dir: str, plt: Any) -> list[tuple[str, str]]:
    hr = result["results"]
    traces = sorted({r["trace"] for r in hr}, key=lambda t: ["chat", "loop", "zipf"].index(t))
    fig, axes = plt.subplots(1, len(traces), figsize=(4 * len(traces), 3.6), squeeze=False)
    for ax, tr in zip(axes[0], traces):
        rs = sorted(((r["capacity"], r) for r in hr if r["trace"] == tr), key=lambda t: t[0])
        for name, style in (
            ("vllm_lru", "s-"),
            ("vllm_arc", "o-"),
            ("arc_cy", "x--"),
            ("arc_cy_pure", "+:"),
        ):
            ax.plot(
                [c for c, _ in rs],
                [r["contenders"][name]["hit_ratio"] for _, r in rs],
                style,
                color=bl.COLORS[name],
                label=bl.LABELS[name],
            )
        ax.set_title(f"{tr} trace")
        ax.set_xlabel("capacity (chunks)")
        ax.set_ylabel("hit ratio")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return [bl.save_plot(plt, fig, out_dir, *PLOTS[0])]


if __name__ == "__main__":
    bl.cli(sys.modules[__name__])
