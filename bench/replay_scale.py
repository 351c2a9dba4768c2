"""How `python -m arc_cy replay` scales with a recording's size.

It makes a recording of about --accesses block accesses (10 million by
default) from the shipped Mooncake trace, repeated: each copy with block
ids of its own (63-bit, as a recording's keyed ids are) and timestamps
after the previous copy's, in arc_cy's recording format with a pool of 5%
of its distinct blocks; then runs `python -m arc_cy replay` on it with its
defaults (the recorded pool and four sizes around it, vLLM lru, vLLM arc,
arc_cy and ARC+ at store_threshold 1 and 2, the optimum), --jobs processes,
and samples the memory of the replay's processes (the sum of their
proportional set sizes, so pages the forked workers share count once).
It prints, and writes with --json: the wall time, the peak memory, and
both per block access. Not in bench/run.sh's suite (about half an hour on
2 cores); the figures are in docs/benchmarks.md ("How the replay scales").

Run: $PY -P bench/replay_scale.py [--accesses N] [--jobs N] [--json FILE]
(bench/ on PYTHONPATH, as bench/run.sh sets it; psutil, from the [bench]
extra).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

from arc_cy import __version__
from arc_cy._trace import FORMAT, encode_line, read_trace

SHIPPED = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "data", "mooncake_synthetic_trace.jsonl"
)
MIX = 0x9E3779B97F4A7C15  # odd: a bijection of 64-bit values, spreading ids over 63 bits


def make_recording(path: str, accesses: int) -> dict[str, int]:
    """Write the recording; return its requests, accesses and distinct blocks."""
    base = read_trace(SHIPPED)
    per_copy, distinct = len(base.accesses), base.distinct()
    copies = max(1, round(accesses / per_copy))
    span = base.timestamp_ms[-1] + 1
    header = {
        "format": FORMAT,
        "tokens_per_key": 512,
        "cache_capacity": round(0.05 * distinct * copies),
        "vllm": "scale test",
        "arc_cy": __version__,
        "policy": "ARCCachePolicy",
    }
    requests = 0
    with open(path, "wb") as f:
        for c in range(copies):
            for i in range(len(base)):
                blocks = base.blocks(i)
                if not blocks:
                    continue
                ids = b",".join(b"%d" % ((((c << 32) | h) * MIX) % 2**63) for h in blocks)
                f.write(
                    encode_line(
                        c * span + base.timestamp_ms[i],
                        base.input_length[i],
                        base.output_length[i],
                        ids,
                        header if requests == 0 else None,
                    )
                )
                requests += 1
    return {"requests": requests, "accesses": per_copy * copies, "distinct": distinct * copies}


def pss(proc: psutil.Process) -> int:
    """The proportional set size of proc and its children, in bytes."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accesses", type=int, default=10_000_000)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="arc_cy-scale-") as work:
        path = os.path.join(work, "recording.jsonl")
        t = time.perf_counter()
        made = make_recording(path, args.accesses)
        made_s = time.perf_counter() - t
        print(
            f"replay_scale: made {made['accesses']:,} accesses, {made['distinct']:,} distinct, "
            f"{made['requests']:,} requests ({os.path.getsize(path) / 2**20:,.0f} MiB) "
            f"in {made_s:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        out = os.path.join(work, "replay.json")
        cmd = [sys.executable, "-P", "-m", "arc_cy", "replay", path, "--jobs", str(args.jobs)]
        t = time.perf_counter()
        proc = subprocess.Popen([*cmd, "--json", out])
        watched, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            peak = max(peak, pss(watched))
            time.sleep(0.5)
        wall = time.perf_counter() - t
        if proc.returncode:
            raise SystemExit(f"replay_scale: the replay failed ({proc.returncode})")
        with open(out) as f:
            cells = len(json.load(f)["replay"])
    result: dict[str, Any] = {
        **made,
        "jobs": args.jobs,
        "records": cells,
        "wall_s": round(wall, 1),
        "peak_pss_mib": round(peak / 2**20, 1),
        "bytes_per_access": round(peak / made["accesses"], 1),
        "us_per_access": round(1e6 * wall / made["accesses"], 2),
        "command": " ".join(["python -P -m arc_cy replay", "RECORDING", "--jobs", str(args.jobs)]),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
