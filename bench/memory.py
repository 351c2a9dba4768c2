"""Bytes per entry of each policy's own bookkeeping, T1, T2, B1 and B2
populated, for vLLM arc, vLLM lru, arc_cy compiled and arc_cy pure.

ARC+ (arc_cy_plus, compiled) is measured beside them, populated the same
way (its evictions with an empty protected are not offers it judges; it
has no target to raise, so its second C/4 victims are t1's too: it ends
with T1 = C/2, T2 = C/2, B1 = C/2, the same 1.5*C entries).

Each measurement runs in a fresh subprocess. The keys, the ChunkStatus
objects and a ReqContext are created (and the policy class imported) before
the baseline reading, so they are not charged to the policy; then the policy
is populated through its public API and the RSS growth (psutil, after
gc.collect() and malloc_trim(0), so C allocations count) is divided by the
number of entries. A second policy is then built the same way under
tracemalloc, which sees PyMem/PyObject allocations (the compiled core's
arrays included).

Population for capacity C: insert C chunks; reuse the first C/2 (T2);
evict C/4 (T1's oldest -> B1); raise target_t1_size to C (public setter) and
evict C/4 more (T2's oldest -> B2); insert C/2 new chunks (T1). That leaves
T1 = 3C/4, T2 = C/4, B1 = C/4, B2 = C/4: 1.5*C entries. vLLM lru has no
ghost lists: it ends with C resident entries (its only entries).

Run: bench/run.sh --only memory, or alone with bench/ and harness/ on
PYTHONPATH (as bench/run.sh sets it): $PY -P bench/memory.py [--full] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import sys
import time
from typing import Any

import benchlib as bl

NAME = TAG = "memory"
PLOTS: tuple[tuple[str, str], ...] = ()
# ARC+ (the compiled ARCPlusCachePolicy) beside the contenders: its memory
# per entry is a target of its own (at most vLLM arc's).
PLUS = "arc_cy_plus"
NAMES = (*bl.NAMES, PLUS)
LABELS = {**bl.LABELS, PLUS: "arc_cy ARC+ compiled"}


def policy_class(name: str) -> type:
    if name != PLUS:
        return bl.policy_class(name)
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    return CachePolicyFactory.get_cache_policy_cls("ARCPlusCachePolicy", "arc_cy._core.arc")


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass


def populate(p: Any, keys: list[bytes], refill: list[bytes], chunks: list[Any], ctx: Any) -> None:
    c = len(chunks)
    for k, ch in zip(keys, chunks):
        p.insert(k, ch, ctx)
    bl.reuse(p, keys[: c // 2], ctx)
    ev = p.evict(c // 4, set())
    if hasattr(p, "target_t1_size"):
        p.target_t1_size = c
    ev += p.evict(c // 4, set())
    for k, (_, ch) in zip(refill, ev):
        p.insert(k, ch, ctx)
    del ev


def entries_of(p: Any) -> dict[str, int]:
    if hasattr(p, "b1"):
        return {w: len(getattr(p, w)) for w in ("t1", "t2", "b1", "b2")}
    return {"resident": len(p.chunks)}


def child(name: str, capacity: int) -> dict[str, Any]:
    import tracemalloc

    import psutil
    from vllm.v1.kv_offload.base import ReqContext

    proc = psutil.Process()
    stream = bl.KeyStream(capacity)
    keys = stream.take(capacity)
    refill = stream.take(capacity // 2)
    chunks = bl.ready_chunks(capacity)
    ctx = ReqContext("memory")
    cls = policy_class(name)
    warm = cls(16)  # any lazy class-level set-up happens before the baseline
    populate(warm, keys[:16], refill[:8], chunks[:16], ctx)
    del warm
    _trim()
    rss0 = proc.memory_info().rss
    t = time.perf_counter()
    p = cls(capacity)
    populate(p, keys, refill, chunks, ctx)
    build_s = time.perf_counter() - t
    _trim()
    rss1 = proc.memory_info().rss
    ent = entries_of(p)
    n = sum(ent.values())
    res: dict[str, Any] = {
        "contender": name,
        "capacity": capacity,
        "entries": ent,
        "n_entries": n,
        "rss_delta_bytes": rss1 - rss0,
        "rss_bytes_per_entry": round((rss1 - rss0) / n, 1),
        "rss_bytes_per_resident_chunk": round((rss1 - rss0) / capacity, 1),
        "build_s": round(build_s, 2),
    }
    # tracemalloc: a second, identical policy (the first one stays alive, so
    # the chunks and keys are shared and nothing of theirs is counted).
    _trim()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    p2 = cls(capacity)
    populate(p2, keys, refill, chunks, ctx)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    res["tracemalloc_delta_bytes"] = after - before
    res["tracemalloc_bytes_per_entry"] = round((after - before) / n, 1)
    assert entries_of(p2) == ent
    del p, p2
    return res


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--child", nargs=2, metavar=("CONTENDER", "CAPACITY"), help=argparse.SUPPRESS)


def run(args: Any) -> dict[str, Any] | None:
    if args.child:
        bl.print_result(child(args.child[0], int(args.child[1])))
        return None
    caps = [100_000, 1_000_000] if args.full else [100_000]
    results = []
    for cap in caps:
        per: dict[str, Any] = {}
        for name in NAMES:
            t = time.perf_counter()
            per[name] = bl.run_child(__file__, "--child", name, str(cap))
            bl.progress(
                TAG,
                f"cap {cap} {name}: {per[name]['rss_bytes_per_entry']} B/entry RSS, "
                f"{per[name]['tracemalloc_bytes_per_entry']} B/entry tracemalloc "
                f"({time.perf_counter() - t:.1f}s)",
            )
        base = per["vllm_arc"]
        for d in per.values():
            d["rss_vs_vllm_arc"] = round(d["rss_bytes_per_entry"] / base["rss_bytes_per_entry"], 3)
            d["tracemalloc_vs_vllm_arc"] = round(
                d["tracemalloc_bytes_per_entry"] / base["tracemalloc_bytes_per_entry"], 3
            )
        results.append({"capacity": cap, "contenders": per})
    return {"results": results}


# --- the report -----------------------------------------------------------------


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    mr = result["results"][0]
    mem = mr["contenders"]
    return [
        bl.target(
            f"policy memory per entry (RSS, {mr['capacity']:,} chunks, T1/T2/B1/B2 populated): "
            "arc_cy / vLLM arc",
            bl.ratio(mem["arc_cy"]["rss_bytes_per_entry"], mem["vllm_arc"]["rss_bytes_per_entry"]),
            "<= 0.5",
            lambda v: v <= 0.5,
            "memory.py",
            "an entry's node or the key index grew",
        ),
        bl.target(
            f"ARC+ policy memory per entry (RSS, {mr['capacity']:,} chunks, T1/T2/B1/B2 "
            "populated): arc_cy_plus / vLLM arc",
            bl.ratio(mem[PLUS]["rss_bytes_per_entry"], mem["vllm_arc"]["rss_bytes_per_entry"]),
            "<= 1.0",
            lambda v: v <= 1.0,
            "memory.py",
            "ARC+ holds more per entry than vLLM's arc: its nodes or its key index grew",
        ),
    ]


def markdown(result: dict[str, Any]) -> str:
    out = ["## Memory (memory.py)"]
    for mr in result["results"]:
        out.append("")
        out.append(
            f"Capacity {mr['capacity']:,}: each policy built in a fresh process; keys and "
            "ChunkStatus objects exist before the baseline. Entries = T1+T2+B1+B2 "
            "(vLLM lru: resident chunks; it keeps no ghosts)."
        )
        out.append("")
        out.append(
            "| contender | entries | RSS bytes/entry | vs vLLM arc "
            "| tracemalloc bytes/entry | vs vLLM arc |"
        )
        out.append("|---|---:|---:|---:|---:|---:|")
        for n in NAMES:
            d = mr["contenders"][n]
            out.append(
                f"| {LABELS[n]} | {d['n_entries']:,} | {d['rss_bytes_per_entry']:.1f} | "
                f"{d['rss_vs_vllm_arc']:.2f} | {d['tracemalloc_bytes_per_entry']:.1f} | "
                f"{d['tracemalloc_vs_vllm_arc']:.2f} |"
            )
    return "\n".join(out) + "\n"


def plot(result: dict[str, Any], out_dir: str, plt: Any) -> list[tuple[str, str]]:
    return []


if __name__ == "__main__":
    bl.cli(sys.modules[__name__])
