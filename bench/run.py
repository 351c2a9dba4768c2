"""The benchmark suite: runs evict.py, store_latency.py, memory.py,
hit_ratio.py and multi_turn.py (and bench/scheduler_step.py --quick, if
present), then writes results.json, results.md (tables + Targets) and PNG
plots.

Run: bench/run.sh [--full] [--out DIR]   (= $ARC_CY_PY -P bench/run.py ...)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import benchlib as bl  # noqa: E402

TAG = "run"
SUITE = ("evict", "store_latency", "memory", "hit_ratio", "multi_turn")
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


# --- scheduler_step hook ----------------------------------------------------
# bench/scheduler_step.py is written by another helper. If it exists, it is
# run with --quick (the out dir is passed in ARC_CY_BENCH_OUT); if it then
# leaves scheduler_step.json in the out dir, that JSON is included.
def run_scheduler_step(out_dir: str) -> dict[str, Any] | None:
    script = os.path.join(HERE, "scheduler_step.py")
    if not os.path.exists(script):
        return None
    bl.progress(TAG, "running scheduler_step.py --quick (hook)")
    env = dict(os.environ, ARC_CY_BENCH_OUT=out_dir)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-P", script, "--quick"], cwd=ROOT, env=env)
    res: dict[str, Any] = {"returncode": proc.returncode,
                           "wall_s": round(time.perf_counter() - t, 1)}
    path = os.path.join(out_dir, "scheduler_step.json")
    if os.path.exists(path):
        with open(path) as f:
            res["results"] = json.load(f)
    return res


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


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    ev = data["evict"]["results"]
    sl = data["store_latency"]["results"]
    mem = data["memory"]["results"][0]["contenders"]
    rows = []

    def add(what: str, value: float | None, goal: str, ok: bool | None, src: str) -> None:
        rows.append({"target": what, "measured": value, "goal": goal,
                     "status": "n/a" if ok is None else ("PASS" if ok else "MISS"),
                     "source": src})

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    e100 = find(ev, scenario="evict", capacity=100_000, n=1024)
    r = ratio(p50(e100, "vllm_arc", "evict"), p50(e100, "arc_cy", "evict"))
    add("evict(1024) at 100K, nothing pinned: speedup vs vLLM arc", r, ">= 6x",
        None if r is None else r >= 6, "evict.py p50")
    base = p50(e100, "arc_cy", "evict")
    for sc, what in (("pinned", "50K pinned at T1's LRU end"),
                     ("fallback", "T2 (50K) all pinned, fallback to T1")):
        rr = find(ev, scenario=sc, capacity=100_000, **({"pinned": 50_000} if sc == "pinned" else {}))
        bw = floor_ratio(rr, base)
        add(f"compiled pinned scan at 100K, {what}: effective read bandwidth "
            "(node + ChunkStatus bytes per pinned entry x entries/s) / sequential read of "
            "the same bytes", bw, ">= 0.5", None if bw is None else bw >= 0.5,
            "evict.py p50 (same run)")
    eg = find(ev, scenario="growth")
    r = eg["growth_p50"]["arc_cy"] if eg else None
    add("compiled evict(1024), nothing pinned: cost at 1M / cost at 10K "
        "(both capacities interleaved in one loop)", r, "<= 1.5x",
        None if r is None else r <= 1.5, "evict.py p50, growth")
    s50 = find(sl, scenario="full", capacity=50_000, batch=256, pinned_fraction=0.0)
    r = ratio(p50(s50, "vllm_arc", "prepare_store"), p50(s50, "arc_cy", "prepare_store"))
    add("prepare_store at 50K, batch 256, full cache: vLLM arc p50 / arc_cy p50", r, ">= 1.4x",
        None if r is None else r >= 1.4, "store_latency.py p50")
    r = ratio(p50(s50, "vllm_lru", "prepare_store"), p50(s50, "arc_cy", "prepare_store"))
    add("prepare_store at 50K, batch 256, full cache: vLLM lru p50 / arc_cy p50", r, "> 1x",
        None if r is None else r > 1, "store_latency.py p50")
    r = ratio(mem["arc_cy"]["rss_bytes_per_entry"], mem["vllm_arc"]["rss_bytes_per_entry"])
    add(f"policy memory per entry (RSS, {data['memory']['results'][0]['capacity']} chunks, "
        "T1/T2/B1/B2 populated): arc_cy / vLLM arc", r, "<= 0.5",
        None if r is None else r <= 0.5, "memory.py")
    r = ratio(p50(s50, "arc_cy_pure", "prepare_store"), p50(s50, "vllm_arc", "prepare_store"))
    add("pure twin prepare_store at 50K/256: pure p50 / vLLM arc p50", r, "<= 1.1x",
        None if r is None else r <= 1.1, "store_latency.py p50")
    r = ratio(p50(e100, "arc_cy_pure", "evict"), p50(e100, "vllm_arc", "evict"))
    add("pure twin evict(1024) at 100K: pure p50 / vLLM arc p50", r, "<= 1.1x",
        None if r is None else r <= 1.1, "evict.py p50")

    mt = data.get("multi_turn", {}).get("results", [])
    for cap in (100_000, 1_000_000):
        m = find(mt, capacity=cap, load_latency_steps=8)
        tag = f"{cap // 1000}K" if cap < 1_000_000 else "1M"
        if m is None:
            if cap == 1_000_000:
                add("multi-turn at 1M chunks (the targets above, at 10^6)", None,
                    "run bench/run.sh --full", None, "multi_turn.py")
            continue
        for q in ("p50", "p99"):
            g = m["arc_cy_gap_to_bound_over_vllm_arc"][q]
            add(f"multi-turn at {tag} chunks, loads held 8 steps: arc_cy {q} step time - "
                f"bound {q} (vLLM arc step - its policy time), / vLLM arc {q}", g, "<= 0.05",
                g <= 0.05, "multi_turn.py")
        e = m["evict_mean_ratio"]
        add(f"multi-turn at {tag}, loads held 8 steps: eviction time per step (mean), "
            "arc_cy / vLLM arc", e, "<= 0.1x", None if e is None else e <= 0.1, "multi_turn.py")
        # Per step, the parts' sum (instrumented scheduler) over the plain
        # scheduler's time for the same step, median over steps: robust to a
        # stall landing on one scheduler's step and not the other's. The
        # ratio of means is in the breakdown table.
        dev = max(abs(x["breakdown"][c]["sum_over_plain_paired_median"] - 1)
                  for x in mt if x["capacity"] == cap for c in ("vllm_arc", "arc_cy"))
        add(f"multi-turn at {tag}: step-time breakdown, parts' sum vs measured step time, "
            "worst abs(median over steps of sum/step - 1) over contenders and load latencies",
            round(dev, 3), "<= 0.1", dev <= 0.1, "multi_turn.py")
    return rows


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


def latency_table(r: dict[str, Any], field: str, unit_note: str = "us") -> list[str]:
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


def markdown(data: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    m = data["machine"]
    out = ["# arc_cy benchmark results", ""]
    out.append(f"Command: `{data['command']}`  ")
    out.append(f"Wall time: {data['wall_s']:.0f} s ({'full grid' if data['full'] else 'default suite'})  ")
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
    out.append("| target | measured | goal | status | source |")
    out.append("|---|---:|---|---|---|")
    for r in rows:
        out.append(f"| {r['target']} | {fmt(r['measured'], 2)} | {r['goal']} | **{r['status']}** | {r['source']} |")
    out.append("")

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

    out.append("")
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

    out.append("")
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

    out.append("")
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

    if data.get("multi_turn"):
        out.extend(multi_turn_markdown(data["multi_turn"]))

    if data.get("scheduler_step"):
        out.append("")
        out.append("## scheduler_step.py --quick")
        out.append("")
        ss = data["scheduler_step"]
        out.append(f"exit status {ss['returncode']}, {ss['wall_s']} s; "
                   + ("results in results.json (scheduler_step)." if "results" in ss
                      else "it wrote no scheduler_step.json."))

    out.append("")
    out.append("## Plots")
    out.append("")
    for png, what in (("latency_vs_capacity.png", "Latency vs capacity"),
                      ("latency_vs_pinned.png", "Latency vs pinned entries"),
                      ("hit_ratio.png", "Hit ratio"),
                      ("step_breakdown.png", "Scheduler step-time breakdown")):
        out.append(f"![{what}]({png})")
        out.append("")
    return "\n".join(out) + "\n"


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
                   "arc_cy / vLLM arc p50 / p99 | bound p50 / p99 | arc_cy gap to bound / vLLM arc "
                   "p50 / p99 | most a policy can save p50 / p99 |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|")
        for r in rs:
            a, c = r["step_ms"]["vllm_arc"], r["step_ms"]["arc_cy"]
            q, b, g, sv = (r["ratio_arc_cy_over_vllm_arc"], r["bound_ms"],
                           r["arc_cy_gap_to_bound_over_vllm_arc"],
                           r["most_a_policy_can_save_over_vllm_arc"])
            out.append(f"| {r['load_latency_steps']} | {a['p50']:.3f} / {a['p99']:.3f} / {a['max']:.2f} | "
                       f"{c['p50']:.3f} / {c['p99']:.3f} / {c['max']:.2f} | {q['p50']:.3f} / {q['p99']:.3f} | "
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


def breakdown_plot(mt: dict[str, Any], out_dir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "step_breakdown.png"), dpi=90)
    plt.close(fig)


# --- plots ------------------------------------------------------------------

COLORS = {"vllm_arc": "tab:blue", "vllm_lru": "tab:green", "arc_cy": "tab:red",
          "arc_cy_pure": "tab:orange"}


def plots(data: dict[str, Any], out_dir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "latency_vs_capacity.png"), dpi=90)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    cap = 100_000
    pts3 = sorted(((r["pinned"], r) for r in ev if r.get("capacity") == cap and r.get("n") == 1024
                   and r["scenario"] in ("evict", "pinned")), key=lambda t: t[0])
    for name in N:
        ax.plot([p for p, _ in pts3], [r["contenders"][name]["evict"]["p50"] for _, r in pts3],
                "o-", color=COLORS[name], label=L[name])
        fb = find(ev, scenario="fallback", capacity=cap)  # noqa: F841
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
    labels = []
    for gi, (c, b) in enumerate(groups):
        for fi, frac in enumerate((0.0, 0.5)):
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
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "latency_vs_pinned.png"), dpi=90)
    plt.close(fig)

    hr = data["hit_ratio"]["results"]
    traces = sorted({r["trace"] for r in hr}, key=lambda t: ["chat", "loop", "zipf"].index(t))
    fig, axes = plt.subplots(1, len(traces), figsize=(4 * len(traces), 3.6))
    for ax, tr in zip(axes, traces):
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
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "hit_ratio.png"), dpi=90)
    plt.close(fig)

    if data.get("multi_turn"):
        breakdown_plot(data["multi_turn"], out_dir)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the whole grid (long: over an hour; the multi-turn part at 1M chunks alone about 35 minutes)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="output folder")
    ap.add_argument("--only", help="comma-separated subset of " + ",".join(SUITE))
    ap.add_argument("--reuse", action="store_true",
                    help="reuse the per-script JSON already in OUT/tmp (report only)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out_dir = os.path.abspath(args.out)
    tmp = os.path.join(out_dir, "tmp")
    os.makedirs(tmp, exist_ok=True)
    command = os.environ.get("ARC_CY_BENCH_COMMAND") or shlex.join(
        [sys.executable, "-P", os.path.relpath(os.path.abspath(__file__), ROOT)]
        + (argv if argv is not None else sys.argv[1:]))
    data: dict[str, Any] = {"command": command, "argv": sys.argv, "full": args.full,
                            "machine": bl.machine_info()}
    only = args.only.split(",") if args.only else SUITE
    for name in SUITE:
        cached = os.path.join(tmp, f"{name}.json")
        if args.reuse and os.path.exists(cached):
            with open(cached) as f:
                data[name] = json.load(f)
            bl.progress(TAG, f"reusing {cached}")
        elif name in only:
            data[name] = run_script(name, tmp, args.full)
    ss_json = os.path.join(out_dir, "scheduler_step.json")
    if args.reuse and os.path.exists(ss_json):
        with open(ss_json) as f:
            data["scheduler_step"] = {"returncode": None, "wall_s": None, "results": json.load(f)}
    else:
        data["scheduler_step"] = run_scheduler_step(out_dir)
    data["wall_s"] = round(time.perf_counter() - t0, 1)
    if all(name in data for name in SUITE):
        rows = targets(data)
        data["targets"] = rows
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump(data, f, indent=1)
        with open(os.path.join(out_dir, "results.md"), "w") as f:
            f.write(markdown(data, rows))
        plots(data, out_dir)
        for r in rows:
            bl.progress(TAG, f"{r['status']:4} {r['target']}: {r['measured']} (goal {r['goal']})")
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(data, f, indent=1)
    bl.progress(TAG, f"suite done in {data['wall_s']:.0f}s; results in {out_dir}")


if __name__ == "__main__":
    main()
