"""Soak test of the compiled ARC core: memory must not grow under churn.

Drives ``arc_cy._core.arc.ARCCachePolicy`` (the compiled class, imported
directly) through vLLM's CachePolicy API with traffic shaped like
``CPUOffloadingManager``'s (arc_cy_harness.traffic's PolicyTraffic, the driver
the differential tests use too), for ``--ops`` policy calls (default 10**7) at
``--capacity`` chunks (default 100_000), and reports:

* RSS (psutil), in a first run without tracemalloc, sampled every
  ``--sample-every`` calls; the growth is measured from the end of the
  warmup (``--warmup`` fraction of the calls, default 0.2) to the end, and
  from the middle of the run to the end.
* tracemalloc, in a second run of the same traffic (tracemalloc's own
  tables grow as it traces, which would blur the RSS figures): tracing
  starts at the end of the warmup; snapshot A is taken
  at ``--snapshot-a`` (default 0.4) of the run, after the resident set and
  the ghost lists have turned over, snapshot B at the end (with the
  defaults both lie 1M calls after a clear(), so the policy is equally full). The B - A
  difference is reported for arc_cy's own files and, because the compiled
  core has no Python frames, for the lines of the driver
  (arc_cy_harness.traffic) that call the policy (tracemalloc charges the core's
  PyMem allocations to them), plus the largest differences anywhere.

One "op" is one call of a policy method. The traffic is a loop of
requests; each request takes 1-16 consecutive keys from a universe of
4 x capacity key ids (skewed towards low ids, so that there are hits and
ghost hits) and does what the manager does:

    get()                  one per key (lookup), and per key of a store offer
    touch()                the keys that hit
    mark_non_evictable()   per hit chunk whose ref_cnt goes 0 -> 1 (a load
                           pins it: ref_cnt += 1)
    on_store_miss()        the keys that missed
    evict(n, protected)    when the misses do not fit in the free chunks;
                           protected = the request's keys (a set)
    insert()               per missed key, a new chunk with ref_cnt -1
    on_request_finished()  one per request, with offload-key positions set
  and, two requests later (transfers are asynchronous):
    complete_store         per key, ref_cnt -1 -> 0 + mark_evictable() (95 %),
                           or remove() (5 %, a failed store)
    complete_load          ref_cnt -= 1, + mark_evictable() when it hits 0
  and one clear() every ``--clear-every`` calls (default 3_000_000).

Keys are fresh ``bytes`` objects built per request (as vLLM's hashes are),
so every key the policy holds was made at run time and churns.

Usage (not part of bench/run.sh; bench/ and harness/ on PYTHONPATH, as
bench/run.sh sets it):
    $PY -P bench/soak.py                 # full: 10**7 calls
    $PY -P bench/soak.py --ops 1000000   # shorter
Writes bench/results/soak.json and bench/results/soak.md (or --out PREFIX).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import sys
import time
import tracemalloc
from typing import Any

import psutil

import arc_cy
import benchlib as bl
from arc_cy._core.arc import ARCCachePolicy
from arc_cy_harness import traffic
from arc_cy_harness.traffic import Lockstep, PolicyTraffic

NAME = "soak"
HERE = os.path.dirname(os.path.abspath(__file__))


def make_driver(capacity: int, seed: int) -> PolicyTraffic:
    """arc_cy_harness.traffic's manager-shaped traffic on one compiled policy;
    its Lockstep counts the policy calls."""
    return PolicyTraffic(
        Lockstep([ARCCachePolicy(capacity)]),
        capacity,
        seed=seed,
        universe=4 * capacity,
        request_keys=(1, 16),
        load_delay=2,
        store_delay=2,
        store_fail=0.05,
    )


def rss() -> int:
    return psutil.Process().memory_info().rss


def _stat_dict(stat: tracemalloc.StatisticDiff) -> dict:
    frame = stat.traceback[0]
    return {
        "where": f"{bl.portable(frame.filename)}:{frame.lineno}",
        "size_diff": stat.size_diff,
        "count_diff": stat.count_diff,
        "size": stat.size,
    }


def run_phase(args: argparse.Namespace, traced: bool) -> dict:
    """One soak run; with traced, tracemalloc runs from the end of warmup."""
    drv = make_driver(args.capacity, args.seed)
    policy = drv.target.policies[0]
    req = 0
    warmup_at = int(args.ops * args.warmup)
    snap_a_at = int(args.ops * args.snapshot_a)
    samples: list[tuple[int, int]] = [(0, rss())]
    next_sample = args.sample_every
    next_clear = args.clear_every
    rss_warm = rss_mid = None
    snap_a = None
    t0 = time.perf_counter()
    clears = 0
    while drv.target.calls < args.ops:
        req += 1
        drv.request(req)
        drv.complete_due(req)
        ops = drv.target.calls
        if ops >= next_clear:
            drv.clear()
            clears += 1
            next_clear += args.clear_every
        if ops >= next_sample:
            samples.append((ops, rss()))
            next_sample += args.sample_every
        if rss_warm is None and ops >= warmup_at:
            gc.collect()
            rss_warm = (ops, rss())
            if traced:
                tracemalloc.start(1)
        if rss_mid is None and ops >= snap_a_at:
            gc.collect()
            rss_mid = (ops, rss())
            if traced:
                snap_a = tracemalloc.take_snapshot()
    elapsed = time.perf_counter() - t0
    gc.collect()
    rss_end = (drv.target.calls, rss())
    samples.append(rss_end)
    policy._check_invariants()
    pol = policy
    result: dict = {
        "ops": drv.target.calls,
        "requests": drv.stats["requests"],
        "evict_none": drv.stats["evict_none"],
        "clears": clears,
        "elapsed_s": round(elapsed, 2),
        "ops_per_s": round(drv.target.calls / elapsed),
        "final_sizes": {n: len(getattr(pol, n)) for n in ("t1", "t2", "b1", "b2")},
        "final_target_t1_size": pol.target_t1_size,
    }
    if not traced:
        result.update(
            {
                "rss_start": samples[0][1],
                "rss_after_warmup": rss_warm,
                "rss_mid": rss_mid,
                "rss_end": rss_end,
                "rss_max_after_warmup": max(r for o, r in samples if o >= rss_warm[0]),
                "rss_growth_after_warmup": rss_end[1] - rss_warm[1],
                "rss_growth_second_half": rss_end[1] - rss_mid[1],
                "rss_samples": samples,
            }
        )
        return result
    snap_b = tracemalloc.take_snapshot()
    tracemalloc.stop()
    package = os.path.dirname(os.path.abspath(arc_cy.__file__))
    ours = tracemalloc.Filter(True, os.path.join(package, "*"))
    driver = tracemalloc.Filter(True, os.path.abspath(traffic.__file__))
    diff_ours = snap_b.filter_traces([ours]).compare_to(snap_a.filter_traces([ours]), "lineno")
    diff_driver = snap_b.filter_traces([driver]).compare_to(
        snap_a.filter_traces([driver]), "lineno"
    )
    diff_all = snap_b.compare_to(snap_a, "filename")
    result["tracemalloc"] = {
        "started_at_op": rss_warm[0],
        "snapshot_a_at_op": rss_mid[0],
        "snapshot_b_at_op": rss_end[0],
        "arc_cy_files_size_diff": sum(s.size_diff for s in diff_ours),
        "arc_cy_files_size_at_b": sum(s.size for s in diff_ours),
        "arc_cy_files_top": [_stat_dict(s) for s in diff_ours[:10]],
        "driver_lines_size_diff": sum(s.size_diff for s in diff_driver),
        "driver_lines_top": [_stat_dict(s) for s in diff_driver[:10]],
        "all_files_size_diff": sum(s.size_diff for s in diff_all),
        "all_files_top": [_stat_dict(s) for s in diff_all[:10]],
    }
    return result


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--ops", type=int, default=10_000_000)
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--warmup", type=float, default=0.2)
    ap.add_argument("--snapshot-a", type=float, default=0.4)
    ap.add_argument("--sample-every", type=int, default=100_000)
    ap.add_argument("--clear-every", type=int, default=3_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-tracemalloc", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "soak"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict = {
        "command": "$ARC_CY_PY -P bench/soak.py " + shlex.join(sys.argv[1:]),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "cpu_model": bl.machine_info().get("cpu_model"),
        "git_commit": bl.git_commit(),
        "capacity": args.capacity,
        "seed": args.seed,
        "rss_run": run_phase(args, traced=False),
    }
    if not args.no_tracemalloc:
        result["tracemalloc_run"] = run_phase(args, traced=True)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    result = run(args)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    md = markdown(result)
    with open(args.out + ".md", "w") as f:
        f.write(md)
    print(md)
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:+.1f} MiB"


def markdown(res: dict[str, Any]) -> str:
    r = res["rss_run"]
    lines = [
        "# Soak: compiled ARC core under manager-shaped churn",
        "",
        f"Command: `{res['command']}` (Python {res['python']}, "
        f"{res['machine']}, {res['cpus']} CPUs)",
        "",
        f"Commit: {res.get('git_commit') or 'not recorded'}; machine: "
        f"{res.get('cpu_model') or 'not recorded'}",
        "",
        "RSS run (no tracemalloc):",
        "",
        f"- {r['ops']:,} policy calls ({r['requests']:,} requests), capacity "
        f"{res['capacity']:,}, {r['clears']} clear(), {r['evict_none']:,} failed "
        f"evictions; {r['elapsed_s']} s ({r['ops_per_s']:,} calls/s, "
        "driver included)",
        f"- final sizes {r['final_sizes']}, target_t1_size {r['final_target_t1_size']}",
        f"- RSS: start {r['rss_start'] / 2**20:.1f} MiB, after warmup "
        f"(op {r['rss_after_warmup'][0]:,}) {r['rss_after_warmup'][1] / 2**20:.1f}"
        f" MiB, middle (op {r['rss_mid'][0]:,}) {r['rss_mid'][1] / 2**20:.1f} MiB,"
        f" end {r['rss_end'][1] / 2**20:.1f} MiB, max after warmup "
        f"{r['rss_max_after_warmup'] / 2**20:.1f} MiB",
        f"- RSS growth after warmup: {_mib(r['rss_growth_after_warmup'])}; "
        f"over the second half: {_mib(r['rss_growth_second_half'])}",
    ]
    t = res.get("tracemalloc_run")
    if t:
        tm = t["tracemalloc"]
        lines += [
            "",
            f"tracemalloc run (same traffic, {t['elapsed_s']} s; tracing from op "
            f"{tm['started_at_op']:,}; snapshot A at op {tm['snapshot_a_at_op']:,},"
            f" B at op {tm['snapshot_b_at_op']:,}):",
            "",
            f"- arc_cy package files: B - A = {tm['arc_cy_files_size_diff']:+,} "
            f"bytes ({tm['arc_cy_files_size_at_b']:,} bytes live at B)",
            "- the driver's lines (arc_cy_harness.traffic; the compiled core has no "
            "Python frames, so its PyMem allocations are charged to the lines "
            "calling it): "
            f"B - A = {tm['driver_lines_size_diff']:+,} bytes",
            f"- all files: B - A = {tm['all_files_size_diff']:+,} bytes",
            "",
            "| where | size diff | count diff | size at B |",
            "|---|---:|---:|---:|",
        ]
        for s in tm["all_files_top"][:5] + tm["driver_lines_top"][:6]:
            lines.append(
                f"| {s['where']} | {s['size_diff']:+,} | {s['count_diff']:+,} | {s['size']:,} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
