"""Hit ratio of arc_cy vs vLLM lru and vLLM arc on the same traces, through
the real vLLM 0.33.0 CPUOffloadingManager: lookup the prefix, prepare_load /
complete_load the hits, prepare_store / complete_store the misses (chunked,
256 keys a call), on_request_finished; four requests in flight, so loads and
stores of different requests interleave (benchlib.TraceDriver).

Traces: a multi-turn prefix-sharing chat, a looping scan larger than the
cache, a Zipf mix of shared documents plus unique questions, at several
capacities. Also checks that arc_cy (compiled and pure) matches vLLM arc hit
for hit: the same hits and the same evicted keys, request by request.

Run: $PY -P bench/hit_ratio.py [--full] [--json out.json]
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib as bl  # noqa: E402

TAG = "hit_ratio"


def run_trace(trace_name: str, trace: list[list[bytes]], capacity: int) -> dict[str, Any]:
    t = time.perf_counter()
    drivers = {n: bl.TraceDriver(bl.make_manager(n, capacity)) for n in bl.NAMES}
    names = list(drivers)
    for i, keys in enumerate(trace):
        for j in range(len(names)):
            drivers[names[(i + j) % len(names)]].step(keys, f"{trace_name}{i}")
    for d in drivers.values():
        d.drain()
    ref = drivers["vllm_arc"].per_request
    res: dict[str, Any] = {
        "trace": trace_name, "capacity": capacity, "requests": len(trace),
        "keys": drivers["vllm_arc"].keys, "distinct_keys": len({k for r in trace for k in r}),
        "contenders": {},
    }
    for n, d in drivers.items():
        res["contenders"][n] = {
            "hit_ratio": round(d.hit_ratio(), 5), "hits": d.hits, "stored": d.stored,
            "evicted": d.evicted, "store_failures": d.store_failures,
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
    bl.progress(TAG, f"{trace_name} cap {capacity} ({len(trace)} req, "
                f"{time.perf_counter() - t:.1f}s): " + ", ".join(
                    f"{n} {c[n]['hit_ratio']:.3f}" for n in c)
                + "; identical to vLLM arc: " + ", ".join(
                    f"{n} {same[n]['identical']}" for n in same))
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = bl.arg_parser(__doc__).parse_args(argv)
    t0 = time.perf_counter()
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
    return bl.finish(TAG, args, t0, results, all_identical_to_vllm_arc=identical)


if __name__ == "__main__":
    main()
