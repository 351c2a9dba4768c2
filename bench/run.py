"""The benchmark suite, the main job: runs evict.py, store_latency.py,
memory.py, hit_ratio.py and multi_turn.py, then writes results.json (every
figure), results.md (the targets, then every table) and PNG plots.

Run: bench/run.sh [--full] [--only evict,store_latency] [--out DIR] [--reference]
     (= $ARC_CY_PY -P bench/run.py ...)

Results go to bench/results/, which git ignores (or to --out DIR). A subset
run (--only) reports what it ran and the targets that it can compute.
--reference also copies the report of a whole run to bench/reference/pyX.Y/
(this Python's version), the committed reference run for that Python: it
changes only on purpose.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REFERENCE = os.path.join(HERE, "reference")
SUITE = ("evict", "store_latency", "memory", "hit_ratio", "multi_turn")
sys.path.insert(0, HERE)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench/run.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="the whole grid (long: over an hour; "
                    "the multi-turn part at 1M chunks alone about 35 minutes)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"),
                    help="output folder (default: bench/results/, ignored by git)")
    ap.add_argument("--only", help="comma-separated subset of " + ",".join(SUITE))
    ap.add_argument("--reuse", action="store_true",
                    help="reuse the per-script JSON already in OUT/tmp (report only)")
    ap.add_argument("--reference", action="store_true",
                    help="also copy the report to bench/reference/pyX.Y/, the committed "
                    "reference run for this Python (a whole run only: not with --only or --reuse)")
    return ap


if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    # Before anything the benchmarks need is imported: bench/run.sh --help
    # runs this on a bare Python.
    parser().parse_args()

import benchlib as bl  # noqa: E402

TAG = "run"
TWIN_MISS = ("the pure twin, for debugging in vLLM arc's place, costs over 10% more than "
             "vLLM arc: its checks or bookkeeping grew")
N = bl.NAMES
L = bl.LABELS


def run_script(name: str, tmp: str, full: bool) -> dict[str, Any]:
    path = os.path.join(tmp, f"{name}.json")
    cmd = [sys.executable, "-P", os.path.join(HERE, f"{name}.py"), "--json", path]
    if full:
        cmd.append("--full")
    bl.progress(TAG, f"running {name}.py")
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{name}.py failed with exit status {proc.returncode}")
    with open(path) as f:
        data = json.load(f)
    bl.progress(TAG, f"{name}.py finished in {time.perf_counter() - t:.1f}s")
    return data


# --- lookups ----------------------------------------------------------------

def find(results: list[dict[str, Any]], **kw: Any) -> dict[str, Any] | None:
    for r in results:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def p50(r: dict[str, Any] | None, name: str, field: str) -> float | None:
    if r is None:
        return None
    return r["contenders"][name][field]["p50"]


def targets(data: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The targets that the scripts which ran allow: each with its goal and
    what a miss means. Then the figures reported without PASS/MISS, each
    with the reason (former targets, and the breakdown's accuracy)."""
    rows: list[dict[str, Any]] = []
    reported: list[dict[str, Any]] = []

    def add(what: str, value: float | None, goal: str, ok: Callable[[float], bool],
            source: str, miss: str) -> None:
        status = "n/a" if value is None else ("PASS" if ok(value) else "MISS")
        rows.append({"target": what, "measured": value, "goal": goal, "status": status,
                     "source": source, "a_miss_means": miss})

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    ev = data["evict"]["results"] if "evict" in data else None
    sl = data["store_latency"]["results"] if "store_latency" in data else None
    if ev is not None:
        e100 = find(ev, scenario="evict", capacity=100_000, n=1024)
        add("evict(1024) at 100K chunks, nothing pinned: vLLM arc p50 / arc_cy p50",
            ratio(p50(e100, "vllm_arc", "evict"), p50(e100, "arc_cy", "evict")), ">= 6x",
            lambda v: v >= 6, "evict.py",
            "the compiled eviction path got slower: compare evict.py's tables with the "
            "reference run's")
        base = p50(e100, "arc_cy", "evict")
        for sc, what in (("pinned", "50K pinned at T1's LRU end"),
                         ("fallback", "T2 (50K) all pinned, fallback to T1")):
            rr = find(ev, scenario=sc, capacity=100_000, **({"pinned": 50_000} if sc == "pinned" else {}))
            add(f"compiled scan past pinned entries at 100K, {what}: its read speed (node + "
                "ChunkStatus bytes per pinned entry) / a sequential read of as many bytes",
                floor_ratio(rr, base), ">= 0.5", lambda v: v >= 0.5, "evict.py, same loop",
                "the scan does more per pinned entry than read its node and its ChunkStatus "
                "once (it is memory-bound when it does only that)")
        eg = find(ev, scenario="growth")
        add("compiled evict(1024), nothing pinned: p50 at 1M chunks / p50 at 10K "
            "(interleaved in one loop)", eg["growth_p50"]["arc_cy"] if eg else None, "<= 1.5x",
            lambda v: v <= 1.5, "evict.py",
            "eviction cost grows with the cache's size, not only with the chunks evicted")
        add("pure twin evict(1024) at 100K: twin p50 / vLLM arc p50",
            ratio(p50(e100, "arc_cy_pure", "evict"), p50(e100, "vllm_arc", "evict")), "<= 1.1x",
            lambda v: v <= 1.1, "evict.py",
            TWIN_MISS)
    if sl is not None:
        s50 = find(sl, scenario="full", capacity=50_000, batch=256, pinned_fraction=0.0)
        add("prepare_store of 256 keys at 50K chunks, full cache: vLLM arc p50 / arc_cy p50",
            ratio(p50(s50, "vllm_arc", "prepare_store"), p50(s50, "arc_cy", "prepare_store")),
            ">= 1.4x", lambda v: v >= 1.4, "store_latency.py",
            "the per-key calls of a store (get, insert, on_store_miss, evict) got slower")
        add("prepare_store of 256 keys at 50K: vLLM lru p50 / arc_cy p50",
            ratio(p50(s50, "vllm_lru", "prepare_store"), p50(s50, "arc_cy", "prepare_store")),
            "> 1x", lambda v: v > 1, "store_latency.py",
            "arc_cy costs more per store than vLLM's simplest policy")
        add("pure twin prepare_store of 256 keys at 50K: twin p50 / vLLM arc p50",
            ratio(p50(s50, "arc_cy_pure", "prepare_store"), p50(s50, "vllm_arc", "prepare_store")),
            "<= 1.1x", lambda v: v <= 1.1, "store_latency.py",
            TWIN_MISS)
    if "memory" in data:
        mr = data["memory"]["results"][0]
        mem = mr["contenders"]
        add(f"policy memory per entry (RSS, {mr['capacity']:,} chunks, T1/T2/B1/B2 populated): "
            "arc_cy / vLLM arc",
            ratio(mem["arc_cy"]["rss_bytes_per_entry"], mem["vllm_arc"]["rss_bytes_per_entry"]),
            "<= 0.5", lambda v: v <= 0.5, "memory.py", "an entry's node or the key index grew")
    # Decisions: every scenario that compares them (multi_turn.py stops on a
    # difference).
    counts = [r.get("arc_decisions_mismatched_reps", r.get("arc_decisions_mismatched_requests"))
              for rs in (ev or [], sl or []) for r in rs]
    differ = [c for c in counts if c is not None]
    if "hit_ratio" in data:
        differ += [0 if all(v["identical"] for v in r["matches_vllm_arc"].values()) else 1
                   for r in data["hit_ratio"]["results"]]
    ran = [s for s in ("evict", "store_latency", "hit_ratio") if s in data]
    if ran:
        add(f"decisions: repetitions or traces where arc_cy (compiled or pure) evicted other "
            f"keys than vLLM arc ({', '.join(ran)})", sum(differ), "0", lambda v: v == 0,
            ", ".join(s + ".py" for s in ran),
            "a bug: arc_cy is no longer a drop-in for vLLM arc; run the differential tests")

    for cap in sorted({r["capacity"] for r in data.get("multi_turn", {}).get("results", [])}):
        rs = [r for r in data["multi_turn"]["results"] if r["capacity"] == cap]
        tag = f"{cap // 1000}K" if cap < 1_000_000 else f"{cap // 1_000_000}M"
        lat = ", ".join(str(r["load_latency_steps"]) for r in rs)
        paired = [r["ratio_arc_cy_over_vllm_arc"].get("paired_median") for r in rs]
        add(f"multi-turn at {tag} chunks: scheduler step, arc_cy / vLLM arc, median over "
            f"identical steps, worst over load latencies {lat}",
            None if None in paired else max(paired), "< 1", lambda v: v < 1, "multi_turn.py",
            "arc_cy makes vLLM's scheduler step slower on vLLM's own workload")
        # Pooled over the latencies: arc_cy's policy time is small next to the
        # timing wrappers' cost subtracted from it, whose calibration error
        # moves one latency's ratio (docs/benchmarks.md).
        pol = [sum(r["breakdown"][c]["mean_ms"]["policy"] * r["measured_steps"] for r in rs)
               for c in ("arc_cy", "vllm_arc")]
        add(f"multi-turn at {tag}: time in the policy per step, arc_cy / vLLM arc, all load "
            "latencies pooled", round(pol[0] / pol[1], 3), "<= 0.5", lambda v: v <= 0.5,
            "multi_turn.py",
            "arc_cy's per-call cost (260 to 300 calls a step: get, insert, touch, mark_*) "
            "regressed toward the interpreter's; this is all arc_cy can save in a step")
        l8 = find(rs, load_latency_steps=8) or rs[-1]
        held = f"loads held {l8['load_latency_steps']} steps"
        dev = max(abs(r["breakdown"][c]["sum_over_plain_paired_median"] - 1)
                  for r in rs for c in ("vllm_arc", "arc_cy"))
        reported.append({
            "figure": f"multi-turn at {tag}: the breakdown's parts' sum vs the measured step, "
                      "worst abs(median over steps of sum/step - 1) over contenders and latencies",
            "measured": round(dev, 3), "former_goal": "<= 0.1",
            "why": "it says how far to trust the breakdown's parts, not how good arc_cy is. "
                   "The timing wrappers cost more inside the scheduler than in their "
                   "calibration loop, by an amount that varies from run to run and with the "
                   "machine's load, so it passed and missed a goal of 0.1 by chance "
                   "(docs/benchmarks.md has the runs)."})
        reported.append({
            "figure": f"multi-turn at {tag}, {held}: eviction time per step (mean), "
                      "arc_cy / vLLM arc", "measured": l8["evict_mean_ratio"],
            "former_goal": "<= 0.1x",
            "why": "the wrong yardstick. Evictions here are small (about 20 chunks a call), "
                   "so arc_cy's evict is bound by fixed per-call costs, not by the per-chunk "
                   "costs of evict(1024) that the goal assumed, and eviction is about 1% of "
                   "vLLM arc's step. evict.py's targets judge eviction, the policy-time "
                   "target what arc_cy changes in a step."})
        gap = l8["arc_cy_gap_to_bound_over_vllm_arc"]
        reported.append({
            "figure": f"multi-turn at {tag}, {held}: arc_cy's distance to the bound (vLLM arc's "
                      "step less its policy time), / vLLM arc's step, p50 / p99",
            "measured": f"{gap['p50']:.3f} / {gap['p99']:.3f}", "former_goal": "<= 0.05",
            "why": "noise-level. The distance is arc_cy's own policy time, about 0.05 of "
                   "the step, so the goal sat on the measured value (the p50 was 0.02 to 0.05 "
                   "from run to run), and a single run's p99 on a shared 2-core machine moves "
                   "by as much as the policy's whole share. The policy-time target judges "
                   "that time directly."})
    return rows, reported


def floor_ratio(r: dict[str, Any] | None, unpinned_p50: float | None) -> float | None:
    """Effective read bandwidth of the compiled pinned scan over the sequential
    read bandwidth of an array of the same bytes (both measured in the same
    loop). The scan's time is arc_cy's evict p50 minus its p50 with nothing
    pinned (evict.py's 100K run)."""
    if r is None or "floor" not in r or not unpinned_p50:
        return None
    fl = r["floor"]
    scan_us = r["contenders"]["arc_cy"]["evict"]["p50"] - unpinned_p50
    if scan_us <= 0:
        return None
    return round(fl["sequential_read"]["p50"] / scan_us, 3)


# --- markdown ---------------------------------------------------------------

def fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def latency_table(r: dict[str, Any], field: str) -> list[str]:
    c = r["contenders"]
    lines = [
        "| contender | p50 | p90 | p99 | max | p50 per key | p99 per key | "
        "speedup vs vLLM arc (p50 / p99) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in N:
        if n not in c:
            continue
        s = c[n][field]
        pk = c[n].get(field + "_per_key", {})
        sp = c[n].get("speedup_vs_vllm_arc", {}).get(field, {})
        lines.append(
            f"| {L[n]} | {fmt(s['p50'])} | {fmt(s['p90'])} | {fmt(s['p99'])} | {fmt(s['max'])} | "
            f"{fmt(pk.get('p50'), 3)} | {fmt(pk.get('p99'), 3)} | "
            f"{fmt(sp.get('p50'), 2)}x / {fmt(sp.get('p99'), 2)}x |")
    return lines


def markdown(data: dict[str, Any], rows: list[dict[str, Any]],
             reported: list[dict[str, Any]], pngs: list[tuple[str, str]]) -> str:
    m = data["machine"]
    ran = [s for s in SUITE if s in data]
    scope = ("full grid" if data["full"] else "default suite") if len(ran) == len(SUITE) \
        else "subset: " + ", ".join(ran)
    out = ["# arc_cy benchmark results", ""]
    out.append(f"Command: `{data['command']}`  ")
    out.append(f"Wall time: {data['wall_s']:.0f} s ({scope})  ")
    out.append(f"Machine: {m.get('cpu_model')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB; "
               f"Python {m.get('python')}, vLLM {m.get('vllm')}, Cython {m.get('Cython')}, "
               f"arc_cy IMPLEMENTATION={m.get('arc_cy_IMPLEMENTATION')}  ")
    out.append(f"Commit: `{m.get('git_commit')}`{' (tracked files modified)' if m.get('git_dirty') else ''}; "
               f"load average at start {m.get('loadavg')}")
    out.append("")
    out.append("Times are microseconds per call unless marked otherwise (time.perf_counter_ns "
               "around each single call, gc disabled). Contenders run round-robin, one "
               "repetition each in turn, each on its own identically built manager or policy. "
               "\"speedup vs vLLM arc\" = vLLM arc's figure / the contender's (> 1 is faster).")
    out.append("")
    out.append("## Targets")
    out.append("")
    skipped = [s for s in SUITE if s not in data]
    out.append("Every target is measured in this run, contenders side by side"
               + (f"; not run: {', '.join(skipped)} (their targets are left out)."
                  if skipped else "."))
    if "multi_turn" in data and not any(r["capacity"] >= 1_000_000
                                        for r in data["multi_turn"]["results"]):
        out.append("The multi-turn targets at 1M chunks need `bench/run.sh --full`.")
    out.append("")
    out.append("| target | measured | goal | status | a miss means | source |")
    out.append("|---|---:|---|---|---|---|")
    for r in rows:
        out.append(f"| {r['target']} | {fmt(r['measured'], 2)} | {r['goal']} | **{r['status']}** | "
                   f"{r['a_miss_means']} | {r['source']} |")
    if reported:
        out += ["", "Reported, not judged (no PASS/MISS), with the reason:", ""]
        for r in reported:
            out.append(f"- {r['figure']}: **{fmt(r['measured'], 3)}** (former goal {r['former_goal']}). "
                       f"Not a target: {r['why']}")
    for name, section in (("store_latency", store_latency_markdown), ("evict", evict_markdown),
                          ("memory", memory_markdown), ("hit_ratio", hit_ratio_markdown),
                          ("multi_turn", lambda d: multi_turn_markdown(d["multi_turn"]))):
        if name in data:
            out.extend(section(data))
    if pngs:
        out += ["", "## Plots", ""]
        for png, what in pngs:
            out += [f"![{what}]({png})", ""]
    return "\n".join(out) + "\n"


def store_latency_markdown(data: dict[str, Any]) -> list[str]:
    out = [""]
    out.append("## Store latency through CPUOffloadingManager (store_latency.py)")
    out.append("")
    out.append("Cache full, every store evicts. `prepare_store` alone, and the full store cycle "
               "(prepare_store + complete_store + on_request_finished).")
    for r in data["store_latency"]["results"]:
        out.append("")
        if r["scenario"] == "full":
            title = (f"### capacity {r['capacity']:,}, batch {r['batch']}, "
                     f"pinned {r['pinned_fraction']:.0%} ({r['pinned']:,} chunks at the LRU end), "
                     f"{r['reps']} reps")
        elif r["scenario"] == "fallback":
            title = (f"### fallback: capacity {r['capacity']:,}, batch {r['batch']}, T2 "
                     f"({r['pinned']:,}) all pinned, (len(T1), target) = {r['state_t1_target']}, "
                     f"{r['reps']} reps (state checked before {r['fallback_checked_reps']} calls)")
        else:
            title = (f"### chat trace: capacity {r['capacity']:,}, {r['requests']} requests "
                     f"(variable batch; per-request cycle)")
        out.append(title)
        mism = r.get("arc_decisions_mismatched_reps", r.get("arc_decisions_mismatched_requests"))
        out.append("")
        out.append(f"arc_cy's evictions identical to vLLM arc's: {'yes' if mism == 0 else f'NO ({mism} differ)'}")
        for field, name in (("prepare_store", "prepare_store"), ("store_cycle", "store cycle")):
            out.append("")
            out.append(f"{name}:")
            out.append("")
            out.extend(latency_table(r, field))
        if r["scenario"] == "chat":
            out.append("")
            out.append("hit ratio: " + ", ".join(
                f"{L[n]} {r['contenders'][n]['hit_ratio']:.3f}" for n in N))
    return out


def evict_markdown(data: dict[str, Any]) -> list[str]:
    out = [""]
    out.append("## policy.evict(n) and other policy calls (evict.py)")
    out.append("")
    out.append("Policies driven directly; steady state (T1 full, B1 full) restored after each "
               "call by re-inserting the evicted chunks under fresh keys.")
    for r in data["evict"]["results"]:
        if r["scenario"] != "growth":
            continue
        out.append("")
        out.append(f"### Growth: evict({r['n']}), nothing pinned, capacities {r['capacities']} "
                   f"interleaved in one loop, {r['reps']} reps")
        out.append("")
        out.append("| policy@capacity | p50 | p90 | p99 | max |")
        out.append("|---|---:|---:|---:|---:|")
        for name, c in r["contenders"].items():
            s = c["evict"]
            out.append(f"| {name} | {fmt(s['p50'])} | {fmt(s['p90'])} | {fmt(s['p99'])} | {fmt(s['max'])} |")
        out.append("")
        out.append("p50 growth from the smallest to the largest capacity: " + ", ".join(
            f"{L[k]} {v:.2f}x" for k, v in r["growth_p50"].items()))
    for r in data["evict"]["results"]:
        if r["scenario"] in ("ops", "growth"):
            continue
        out.append("")
        if r["scenario"] == "evict":
            title = f"### evict({r['n']}) at {r['capacity']:,} chunks, nothing pinned"
        elif r["scenario"] == "pinned":
            title = f"### evict({r['n']}) at {r['capacity']:,}, {r['pinned']:,} chunks pinned at T1's LRU end"
        elif r["scenario"] == "protected":
            title = f"### evict({r['n']}) at {r['capacity']:,}, {r['protected']:,} keys at T1's LRU end protected"
        else:
            title = (f"### evict({r['n']}) at {r['capacity']:,}, fallback: T2 ({r['pinned']:,}) all "
                     f"pinned, (len(T1), target) = {r['state_t1_target']}")
        out.append(title + f", {r['reps']} reps")
        out.append("")
        out.extend(latency_table(r, "evict"))
        out.append("")
        out.append(f"arc_cy's victims identical to vLLM arc's: "
                   f"{'yes' if r['arc_decisions_mismatched_reps'] == 0 else 'NO'}")
        if "floor" in r:
            fl = r["floor"]
            base = p50(find(data["evict"]["results"], scenario="evict", capacity=r["capacity"],
                            n=r["n"]), "arc_cy", "evict")
            scan = r["contenders"]["arc_cy"]["evict"]["p50"] - (base or 0)
            out.append("")
            out.append(
                f"Memory floor: {fl['entries']:,} pinned entries x {fl['bytes_per_entry']} bytes "
                f"(node {fl['node_bytes']} + ChunkStatus object {fl['bytes_per_entry'] - fl['node_bytes']}) "
                f"= {fl['bytes'] / 1e6:.1f} MB. Sequential read of that many bytes (numpy sum, "
                f"timed once per repetition in the same loop): p50 {fl['sequential_read']['p50']:.1f} us "
                f"= {fl['bytes'] / fl['sequential_read']['p50'] / 1e3:.1f} GB/s. Compiled scan: "
                f"{scan:.1f} us over the unpinned evict(1024) p50 = "
                f"{fl['bytes'] / scan / 1e3 if scan > 0 else float('nan'):.1f} GB/s effective, "
                f"{fl['sequential_read']['p50'] / scan if scan > 0 else float('nan'):.2f} of the "
                "sequential read.")
    for r in data["evict"]["results"]:
        if r["scenario"] != "ops":
            continue
        out.append("")
        out.append(f"### Per-key cost of policy calls at {r['capacity']:,} entries, batch {r['batch']} "
                   f"(ns per key, p50 / p99)")
        out.append("")
        ops = ("get", "insert", "touch", "on_store_miss", "on_request_finished")
        out.append("| contender | " + " | ".join(ops) + " |")
        out.append("|---|" + "---:|" * len(ops))
        for n in N:
            c = r["contenders"][n]
            out.append(f"| {L[n]} | " + " | ".join(
                f"{1000 * c[op + '_per_key']['p50']:.0f} / {1000 * c[op + '_per_key']['p99']:.0f}"
                for op in ops) + " |")
        out.append("")
        out.append("get and insert are timed as a loop of single calls (per key = per call); "
                   "touch, on_store_miss and on_request_finished as one call on the batch. "
                   "touch: T2 keys; on_store_miss: B1 ghosts (target restored after); "
                   "on_request_finished: half inserted-only T1 keys, half reused T2 keys.")
    return out


def memory_markdown(data: dict[str, Any]) -> list[str]:
    out = [""]
    out.append("## Memory (memory.py)")
    for mr in data["memory"]["results"]:
        out.append("")
        out.append(f"Capacity {mr['capacity']:,}: each policy built in a fresh process; keys and "
                   "ChunkStatus objects exist before the baseline. Entries = T1+T2+B1+B2 "
                   "(vLLM lru: resident chunks; it keeps no ghosts).")
        out.append("")
        out.append("| contender | entries | RSS bytes/entry | vs vLLM arc | tracemalloc bytes/entry | vs vLLM arc |")
        out.append("|---|---:|---:|---:|---:|---:|")
        for n in N:
            d = mr["contenders"][n]
            out.append(f"| {L[n]} | {d['n_entries']:,} | {d['rss_bytes_per_entry']:.1f} | "
                       f"{d['rss_vs_vllm_arc']:.2f} | {d['tracemalloc_bytes_per_entry']:.1f} | "
                       f"{d['tracemalloc_vs_vllm_arc']:.2f} |")
    return out


def hit_ratio_markdown(data: dict[str, Any]) -> list[str]:
    out = [""]
    out.append("## Hit ratio through the real manager (hit_ratio.py)")
    out.append("")
    hr = data["hit_ratio"]
    out.append(f"arc_cy (compiled and pure) identical to vLLM arc, hit for hit and eviction for "
               f"eviction, on every trace: **{'yes' if hr['all_identical_to_vllm_arc'] else 'NO'}**")
    out.append("")
    out.append("| trace | capacity | requests | " + " | ".join(L[n] for n in N) + " | identical to vLLM arc |")
    out.append("|---|---:|---:|" + "---:|" * len(N) + "---|")
    for r in hr["results"]:
        ident = all(v["identical"] for v in r["matches_vllm_arc"].values())
        ev = r["matches_vllm_arc"]["arc_cy"]["evictions_compared"]
        out.append(f"| {r['trace']} | {r['capacity']:,} | {r['requests']} | " + " | ".join(
            f"{r['contenders'][n]['hit_ratio']:.3f}" for n in N)
            + f" | {'yes' if ident else 'NO'} ({ev:,} evictions compared) |")
    return out


PARTS = (("scheduler_core", "vLLM scheduler core"),
         ("connector_scheduler", "OffloadingConnector (scheduler side)"),
         ("manager_without_policy", "CPUOffloadingManager without the policy"),
         ("policy", "the policy"))


def multi_turn_markdown(mt: dict[str, Any]) -> list[str]:
    h = mt["harness"]
    cal = mt["wrapper_calibration"]
    out = ["", "## Scheduler step time on vLLM's multi-turn workload (multi_turn.py)", ""]
    out.append(
        f"`{mt.get('command')}`. vLLM's v1 Scheduler + OffloadingConnector + CPUOffloadingManager; "
        f"workload read from `{mt['workload_file']}` (vLLM's `generate_multi_turn.json`), "
        f"{h['clients']} conversations at once, GPU KV cache {h['gpu_blocks']:,} blocks of "
        f"{h['block_size']} tokens, max_num_seqs {h['max_num_seqs']}. The CPU cache is filled first "
        "(every store evicts). Loads complete L steps after they are scheduled. Four schedulers "
        "run the same steps interleaved (rotating order, blocks of steps): vLLM arc and arc_cy plain "
        "(step times) and instrumented (breakdown, eviction time, pinned counts); all four took "
        "identical steps and the two instrumented ones evicted the same keys in the same order. "
        "Times in ms per step (schedule() + update_from_output()).")
    caps = sorted({r["capacity"] for r in mt["results"]})
    for cap in caps:
        rs = [r for r in mt["results"] if r["capacity"] == cap]
        r0 = rs[0]
        out += ["", f"### {cap:,} CPU chunks: {r0['conversations']:,} conversations "
                f"({r0['conversations_scale']} x the file's {r0['conversations_base']}), "
                f"{r0['conversations_started']:,} started; the workload stored "
                f"{r0['turnover_whole_run']:.2f} x the cache during the run; "
                f"{rs[0]['measured_steps']:,} measured steps per scheduler and latency", ""]
        out.append("| load latency (steps) | vLLM arc p50 / p99 / max | arc_cy p50 / p99 / max | "
                   "arc_cy / vLLM arc: per-step median / p50 / p99 | bound p50 / p99 | arc_cy gap "
                   "to bound / vLLM arc p50 / p99 | most a policy can save p50 / p99 |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|")
        for r in rs:
            a, c = r["step_ms"]["vllm_arc"], r["step_ms"]["arc_cy"]
            q, b, g, sv = (r["ratio_arc_cy_over_vllm_arc"], r["bound_ms"],
                           r["arc_cy_gap_to_bound_over_vllm_arc"],
                           r["most_a_policy_can_save_over_vllm_arc"])
            out.append(f"| {r['load_latency_steps']} | {a['p50']:.3f} / {a['p99']:.3f} / {a['max']:.2f} | "
                       f"{c['p50']:.3f} / {c['p99']:.3f} / {c['max']:.2f} | {fmt(q.get('paired_median'), 3)} / "
                       f"{q['p50']:.3f} / {q['p99']:.3f} | "
                       f"{b['p50']:.3f} / {b['p99']:.3f} | {g['p50']:+.3f} / {g['p99']:+.3f} | "
                       f"{sv['p50']:.3f} / {sv['p99']:.3f} |")
        out += ["", "Eviction (time inside `policy.evict`, ms per step, all steps; instrumented "
                "schedulers) and pinned chunks (ref_cnt > 0, loads in flight) when each eviction ran:", ""]
        out.append("| L | evict calls | vLLM arc mean / p99 / max | arc_cy mean / p99 / max | "
                   "arc_cy / vLLM arc (mean) | chunks evicted per call p50 / p99 | pinned p50 / p99 / max | "
                   "of which in T1 p50 / p99 | in T2 p50 / p99 | arc_cy scan visits per call p50 / p99 |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rs:
            ea, ec, pn = r["evict_ms_per_step"]["vllm_arc"], r["evict_ms_per_step"]["arc_cy"], r["pinned_at_evict"]
            out.append(
                f"| {r['load_latency_steps']} | {ea['calls']:,} | {ea['mean']:.4f} / {ea['p99']:.4f} / {ea['max']:.3f} | "
                f"{ec['mean']:.4f} / {ec['p99']:.4f} / {ec['max']:.3f} | {fmt(r['evict_mean_ratio'], 3)} | "
                f"{pn['evict_n']['p50']:.0f} / {pn['evict_n']['p99']:.0f} | "
                f"{pn['total']['p50']:.0f} / {pn['total']['p99']:.0f} / {pn['total']['max']:.0f} | "
                f"{pn['in_t1']['p50']:.0f} / {pn['in_t1']['p99']:.0f} | {pn['in_t2']['p50']:.0f} / {pn['in_t2']['p99']:.0f} | "
                f"{pn['arc_cy_scan_visits_per_call']['p50']:.0f} / {pn['arc_cy_scan_visits_per_call']['p99']:.0f} |")
        out += ["", "Where a step's time goes (mean ms per step; timing wrappers around every call "
                "into the connector's scheduler side, the manager and the policy, each layer "
                "exclusive of the layers it calls; the wrappers' calibrated cost "
                f"({cal['inner_ns']:.0f} ns inside + {cal['outer_ns']:.0f} ns outside per call) and "
                "the instrumentation's bookkeeping subtracted; the core is the rest of the "
                "instrumented step):", ""]
        out.append("| L | contender | " + " | ".join(lbl for _, lbl in PARTS)
                   + " | sum | measured step (plain, mean) | sum / step | paired median |")
        out.append("|---:|---|" + "---:|" * (len(PARTS) + 4))
        for r in rs:
            for name, lbl in (("vllm_arc", "vLLM arc"), ("arc_cy", "arc_cy")):
                b = r["breakdown"][name]
                out.append(f"| {r['load_latency_steps']} | {lbl} | " + " | ".join(
                    f"{b['mean_ms'][k]:.3f}" for k, _ in PARTS)
                    + f" | {b['sum_ms']:.3f} | {b['plain_step_mean_ms']:.3f} | "
                    f"{b['sum_over_plain']:.3f} | {b['sum_over_plain_paired_median']:.3f} |")
    out += ["", "The bound is vLLM arc's plain step time minus its policy time, step by step: "
            "the step time a policy that cost nothing would give. \"Most a policy can save\" is "
            "vLLM arc's step time minus the bound, over vLLM arc's step time.", ""]
    return out


def breakdown_plot(plt: Any, data: dict[str, Any]) -> Any:
    mt = data["multi_turn"]
    caps = sorted({r["capacity"] for r in mt["results"]})
    fig, axes = plt.subplots(1, len(caps), figsize=(6.5 * len(caps), 5.2), squeeze=False)
    colors = ("tab:gray", "tab:purple", "tab:cyan", "tab:red")
    for ax, cap in zip(axes[0], caps):
        rs = [r for r in mt["results"] if r["capacity"] == cap]
        x = 0.0
        ticks, labels = [], []
        for r in rs:
            for name, lbl in (("vllm_arc", "vLLM arc"), ("arc_cy", "arc_cy")):
                b = r["breakdown"][name]
                bottom = 0.0
                for (k, plbl), col in zip(PARTS, colors):
                    v = b["mean_ms"][k]
                    ax.bar(x, v, 0.8, bottom=bottom, color=col,
                           label=plbl if x == 0 else None)
                    bottom += v
                ax.plot([x - 0.4, x + 0.4], [b["plain_step_mean_ms"]] * 2, "k-", lw=2,
                        label="measured step (plain)" if x == 0 else None)
                ticks.append(x)
                labels.append(f"{lbl}\nL={r['load_latency_steps']}")
                x += 1
            x += 0.6
        ax.set_xticks(ticks)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("mean ms per step")
        ax.set_title(f"Scheduler step breakdown, {cap:,} CPU chunks (multi-turn)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
        ax.grid(True, axis="y", alpha=0.3)
    return fig


# --- plots ------------------------------------------------------------------

COLORS = {"vllm_arc": "tab:blue", "vllm_lru": "tab:green", "arc_cy": "tab:red",
          "arc_cy_pure": "tab:orange"}


def capacity_plot(plt: Any, data: dict[str, Any]) -> Any:
    ev = data["evict"]["results"]
    sl = data["store_latency"]["results"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    n = 1024
    pts = sorted(((r["capacity"], r) for r in ev if r["scenario"] == "evict" and r.get("n") == n),
                 key=lambda t: t[0])
    for name in N:
        ax.plot([c for c, _ in pts], [r["contenders"][name]["evict"]["p50"] for _, r in pts],
                "o-", color=COLORS[name], label=L[name])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("capacity (chunks)")
    ax.set_ylabel("p50 us per call")
    ax.set_title(f"policy.evict({n}), nothing pinned")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    full = [r for r in sl if r["scenario"] == "full" and r["pinned_fraction"] == 0]
    for name in N:
        for batch, marker in ((16, "s"), (256, "o"), (1024, "^")):
            pts2 = sorted(((r["capacity"], r) for r in full if r["batch"] == batch), key=lambda t: t[0])
            if not pts2:
                continue
            ax.plot([c for c, _ in pts2],
                    [r["contenders"][name]["prepare_store_per_key"]["p50"] for _, r in pts2],
                    marker + "-", color=COLORS[name],
                    label=f"{L[name]} b{batch}" if name == "vllm_arc" or batch == 256 else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("capacity (chunks)")
    ax.set_ylabel("p50 us per key")
    ax.set_title("prepare_store, full cache (s=16, o=256, ^=1024 keys)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def pinned_plot(plt: Any, data: dict[str, Any]) -> Any:
    ev = data["evict"]["results"]
    sl = data["store_latency"]["results"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    cap = 100_000
    pts3 = sorted(((r["pinned"], r) for r in ev if r.get("capacity") == cap and r.get("n") == 1024
                   and r["scenario"] in ("evict", "pinned")), key=lambda t: t[0])
    fb = find(ev, scenario="fallback", capacity=cap)
    for name in N:
        ax.plot([p for p, _ in pts3], [r["contenders"][name]["evict"]["p50"] for _, r in pts3],
                "o-", color=COLORS[name], label=L[name])
        if fb:
            ax.plot([fb["pinned"]], [fb["contenders"][name]["evict"]["p50"]], "x",
                    color=COLORS[name], markersize=10)
    ax.set_yscale("log")
    ax.set_xlabel("chunks pinned at T1's LRU end (x: T2 all pinned, fallback)")
    ax.set_ylabel("p50 us per call")
    ax.set_title(f"policy.evict(1024) at {cap:,} chunks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    groups = sorted({(r["capacity"], r["batch"]) for r in sl if r["scenario"] == "full"})
    width = 0.8 / max(1, len(N))
    labels: list[str] = []
    for c, b in groups:
        for frac in (0.0, 0.5):
            r = find(sl, scenario="full", capacity=c, batch=b, pinned_fraction=frac)
            if r is None:
                continue
            x = len(labels)
            labels.append(f"{c // 1000}K/b{b}\npinned {frac:.0%}")
            for ni, name in enumerate(N):
                ax.bar(x + (ni - 1.5) * width, r["contenders"][name]["prepare_store"]["p50"],
                       width, color=COLORS[name], label=L[name] if x == 0 else None)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("prepare_store p50 us per call")
    ax.set_title("prepare_store vs pinned fraction")
    ax.legend(fontsize=8)
    return fig


def hit_ratio_plot(plt: Any, data: dict[str, Any]) -> Any:
    hr = data["hit_ratio"]["results"]
    traces = sorted({r["trace"] for r in hr}, key=lambda t: ["chat", "loop", "zipf"].index(t))
    fig, axes = plt.subplots(1, len(traces), figsize=(4 * len(traces), 3.6), squeeze=False)
    for ax, tr in zip(axes[0], traces):
        rs = sorted(((r["capacity"], r) for r in hr if r["trace"] == tr), key=lambda t: t[0])
        for name, style in (("vllm_lru", "s-"), ("vllm_arc", "o-"), ("arc_cy", "x--"),
                            ("arc_cy_pure", "+:")):
            ax.plot([c for c, _ in rs], [r["contenders"][name]["hit_ratio"] for _, r in rs],
                    style, color=COLORS[name], label=L[name])
        ax.set_title(f"{tr} trace")
        ax.set_xlabel("capacity (chunks)")
        ax.set_ylabel("hit ratio")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return fig


# (file, title, the scripts it needs, the function that draws it)
PLOTS = (
    ("latency_vs_capacity.png", "Latency vs capacity", ("evict", "store_latency"), capacity_plot),
    ("latency_vs_pinned.png", "Latency vs pinned entries", ("evict", "store_latency"), pinned_plot),
    ("hit_ratio.png", "Hit ratio", ("hit_ratio",), hit_ratio_plot),
    ("step_breakdown.png", "Scheduler step-time breakdown", ("multi_turn",), breakdown_plot),
)


def plots(data: dict[str, Any], out_dir: str) -> list[tuple[str, str]]:
    """Draws the plots whose data this run has, removes the others (an
    earlier run's), and returns (file, title) of those drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = []
    for png, title, needs, draw in PLOTS:
        path = os.path.join(out_dir, png)
        if not all(n in data for n in needs):
            if os.path.exists(path):
                os.remove(path)
            continue
        fig = draw(plt, data)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        drawn.append((png, title))
    return drawn


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    only = args.only.split(",") if args.only else list(SUITE)
    if set(only) - set(SUITE):
        ap.error(f"--only: unknown {sorted(set(only) - set(SUITE))}; choose from {','.join(SUITE)}")
    if args.reference and (args.only or args.reuse):
        ap.error("--reference needs a whole run (no --only, no --reuse)")
    t0 = time.perf_counter()
    out_dir = os.path.abspath(args.out)
    tmp = os.path.join(out_dir, "tmp")
    os.makedirs(tmp, exist_ok=True)
    command = os.environ.get("ARC_CY_BENCH_COMMAND") or shlex.join(
        [sys.executable, "-P", os.path.relpath(os.path.abspath(__file__), ROOT)]
        + (argv if argv is not None else sys.argv[1:]))
    data: dict[str, Any] = {"command": command, "argv": sys.argv, "full": args.full,
                            "machine": bl.machine_info()}
    for name in SUITE:
        if name not in only:
            continue
        cached = os.path.join(tmp, f"{name}.json")
        if args.reuse and os.path.exists(cached):
            with open(cached) as f:
                data[name] = json.load(f)
            bl.progress(TAG, f"reusing {cached}")
        else:
            data[name] = run_script(name, tmp, args.full)
    data["wall_s"] = round(time.perf_counter() - t0, 1)
    rows, reported = targets(data)
    data["targets"], data["reported"] = rows, reported
    pngs = plots(data, out_dir)
    report = ["results.json", "results.md", *(png for png, _ in pngs)]
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(markdown(data, rows, reported, pngs))
    for r in rows:
        bl.progress(TAG, f"{r['status']:4} {r['target']}: {r['measured']} (goal {r['goal']})")
    bl.progress(TAG, f"done in {data['wall_s']:.0f}s; results in {out_dir}")
    if args.reference:
        reference = os.path.join(REFERENCE, "py%d.%d" % sys.version_info[:2])
        os.makedirs(reference, exist_ok=True)
        for name in report:
            shutil.copy2(os.path.join(out_dir, name), os.path.join(reference, name))
        bl.progress(TAG, f"reference run refreshed: {', '.join(report)} copied to {reference}; "
                    "commit them")


if __name__ == "__main__":
    main()
