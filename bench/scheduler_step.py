"""Scheduler step time: vLLM's real v1 Scheduler with vLLM "arc" vs "arc_cy".

What is timed: ``Scheduler.schedule()`` + ``Scheduler.update_from_output()``
of vLLM 0.33.0, with the OffloadingConnector on a CPUOffloadingManager whose
policy is vLLM's ARC ("arc") or arc_cy's compiled core ("arc_cy", through
the plugin name after ``vllm.plugins.load_general_plugins()``). The worker
side (no GPU) and the workload bookkeeping between steps are not timed. The
harness is tests/offload_stub.py (StubOffloadingSpec, SchedulerHarness,
ChatWorkload), also used by tests/test_scheduler_e2e.py.

Method:
1. One scheduler per contender, each with a CPU cache of ``--cpu-chunks``
   chunks (>= 100K). A fill phase of unique long prompts (not timed) runs
   until every chunk is allocated, so from then on every store evicts.
2. Measurement: the same multi-turn chat workload (shared system prompts,
   growing conversations, aborts, preemptions, loads from the CPU cache) on
   each scheduler, in rounds of ``--steps-per-round`` steps, alternating
   which contender goes first (ABBA). Both make the same decisions, so step
   i is the same work for both; the run checks that (same tokens scheduled,
   loads and stores per step).
3. Report p50 and p99 step time per contender and the ratio arc_cy / arc
   (< 1: arc_cy faster), plus the median of the per-step paired ratios.

Output: ``scheduler_step.json`` and ``scheduler_step.md`` in ``--out`` (default:
$ARC_CY_BENCH_OUT, else bench/results/), and the markdown table on stdout.

    python -P bench/scheduler_step.py            # full run (~4 min on 2 cores)
    python -P bench/scheduler_step.py --quick    # ~70 s on 2 cores
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # offload_stub
sys.path.insert(0, HERE)  # benchlib

import benchlib as bl  # noqa: E402  (sets VLLM_LOGGING_LEVEL before vLLM loads)

TAG = "scheduler_step"
CONTENDERS = (("arc", "vLLM arc"), ("arc_cy", "arc_cy compiled"))
BLOCK_SIZE = 16

FULL = dict(cpu_chunks=131_072, rounds=24, steps_per_round=200, conversations=5000)
QUICK = dict(cpu_chunks=100_000, rounds=16, steps_per_round=100, conversations=1700)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short run (~2 min)")
    p.add_argument(
        "--out",
        default=os.environ.get("ARC_CY_BENCH_OUT") or os.path.join(HERE, "results"),
        help="output directory (default: $ARC_CY_BENCH_OUT or bench/results)",
    )
    p.add_argument("--cpu-chunks", type=int, help="CPU cache size in chunks")
    p.add_argument("--rounds", type=int, help="interleaved rounds")
    p.add_argument("--steps-per-round", type=int, help="steps per contender per round")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.cpu_chunks < 100_000:
        p.error("--cpu-chunks must be at least 100000")
    return args


def make_harness(model_dir: str, policy: str, cpu_chunks: int) -> Any:
    import offload_stub

    extra = offload_stub.offloading_extra_config(
        policy, num_chunks=cpu_chunks, record=False, stub_load_delay_steps=1
    )
    return offload_stub.SchedulerHarness(
        model_dir,
        extra,
        num_gpu_blocks=4096,  # 64K tokens: far below the chat working set
        block_size=BLOCK_SIZE,
        max_num_seqs=128,
        max_num_batched_tokens=8192,
        max_model_len=16384,
    )


def fill(harness: Any, cpu_chunks: int, seed: int) -> dict[str, Any]:
    """Unique 8K-token prompts until every CPU chunk is allocated."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    manager = harness.manager
    rng = random.Random(seed)
    prompt_len = 8192
    n = 0
    steps = 0
    t0 = time.perf_counter()
    while manager._num_allocated_chunks < cpu_chunks or harness.scheduler.has_requests():
        if manager._num_allocated_chunks < cpu_chunks and len(harness.scheduler.waiting) < 4:
            raw = rng.randbytes(2 * prompt_len)
            tokens = [
                1 + int.from_bytes(raw[i : i + 2], "little") % 31999
                for i in range(0, len(raw), 2)
            ]
            harness.scheduler.add_request(
                Request(
                    request_id=f"fill{n}",
                    prompt_token_ids=tokens,
                    sampling_params=SamplingParams(max_tokens=1, ignore_eos=True),
                    pooling_params=None,
                    block_hasher=harness.block_hasher,
                )
            )
            n += 1
        harness.step()
        steps += 1
        if steps > 100_000:
            raise RuntimeError("fill did not finish")
    return {
        "requests": n,
        "steps": steps,
        "seconds": round(time.perf_counter() - t0, 1),
        "allocated_chunks": manager._num_allocated_chunks,
        "free_chunks": manager._get_num_free_chunks(),
    }


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values), q))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    bl.progress(TAG, f"importing vLLM ({'quick' if args.quick else 'full'} run)")
    import tempfile

    import arc_cy
    import offload_stub
    import vllm.plugins

    vllm.plugins.load_general_plugins()
    model_dir = offload_stub.write_model_config(
        tempfile.mkdtemp(prefix="arc_cy_sched_"), max_model_len=16384
    )

    harnesses: dict[str, Any] = {}
    fills: dict[str, Any] = {}
    for name, _ in CONTENDERS:
        harness = make_harness(model_dir, name, args.cpu_chunks)
        policy_cls = type(harness.manager._policy)
        bl.progress(TAG, f"{name}: {policy_cls.__module__}.{policy_cls.__qualname__}")
        if name == "arc_cy" and policy_cls.__module__ != "arc_cy._arc_c":
            raise SystemExit(
                f"'arc_cy' resolved to {policy_cls.__module__} "
                f"(arc_cy.IMPLEMENTATION={arc_cy.IMPLEMENTATION}); the compiled "
                "core is needed for this benchmark"
            )
        fills[name] = fill(harness, args.cpu_chunks, args.seed)
        bl.progress(TAG, f"{name}: filled {fills[name]}")
        harnesses[name] = harness

    workload_cfg = offload_stub.WorkloadConfig(
        seed=args.seed + 1,
        num_conversations=args.conversations,
        num_system_prompts=32,
        system_prompt_len=(256, 2048),
        turns=(2, 12),
        user_len=(32, 512),
        output_len=(16, 128),
        arrival_gap=1,
        think_steps=(5, 100),
        abort_prob=0.03,
        abort_after=(0, 20),
        abort_on_load_prob=0.02,
        max_request_len=16384 - 256,
    )
    workloads = {name: offload_stub.ChatWorkload(workload_cfg) for name, _ in CONTENDERS}
    start = {name: len(h.step_times) for name, h in harnesses.items()}
    counters0 = {
        name: (h.num_store_jobs, h.num_load_jobs, h.num_stored_chunks, h.num_loaded_chunks)
        for name, h in harnesses.items()
    }
    for h in harnesses.values():
        assert h.manager._get_num_free_chunks() == 0, "CPU cache not full"
    gc.collect()
    gc.freeze()  # as vLLM's engine core does after start-up

    names = [name for name, _ in CONTENDERS]
    bl.progress(
        TAG,
        f"measuring: {args.rounds} rounds x {args.steps_per_round} steps per "
        "contender, ABBA order",
    )
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            workload, harness = workloads[name], harnesses[name]
            for _ in range(args.steps_per_round):
                if workload.done() and not harness.scheduler.has_requests():
                    break
                workload.step(harness)
        bl.progress(
            TAG,
            f"round {r + 1}/{args.rounds}: step {workloads[names[0]].step_index}, "
            + ", ".join(
                f"{n} p50 {1e3 * percentile(harnesses[n].step_times[start[n]:], 50):.3f} ms"
                for n in names
            ),
        )
    gc.unfreeze()

    times = {n: harnesses[n].step_times[start[n] :] for n in names}
    sigs = {n: harnesses[n].signatures[start[n] :] for n in names}
    if sigs["arc"] != sigs["arc_cy"]:
        raise SystemExit("arc and arc_cy schedulers diverged (different steps)")
    num_steps = len(times["arc"])

    results: dict[str, Any] = {}
    for name, label in CONTENDERS:
        h = harnesses[name]
        c0 = counters0[name]
        ms = [1e3 * t for t in times[name]]
        results[name] = {
            "label": label,
            "policy_class": f"{type(h.manager._policy).__module__}."
            f"{type(h.manager._policy).__qualname__}",
            "step_ms": {
                "p50": round(percentile(ms, 50), 4),
                "p90": round(percentile(ms, 90), 4),
                "p99": round(percentile(ms, 99), 4),
                "mean": round(sum(ms) / len(ms), 4),
                "max": round(max(ms), 4),
                "n": len(ms),
            },
            "store_jobs": h.num_store_jobs - c0[0],
            "load_jobs": h.num_load_jobs - c0[1],
            # the cache was full, so every stored chunk evicted one
            "evicted_chunks": h.num_stored_chunks - c0[2],
            "loaded_chunks": h.num_loaded_chunks - c0[3],
            "fill": fills[name],
        }
    a, c = results["arc"]["step_ms"], results["arc_cy"]["step_ms"]
    paired = sorted(y / x for x, y in zip(times["arc"], times["arc_cy"]) if x > 0)
    ratio = {
        "p50": round(c["p50"] / a["p50"], 4),
        "p99": round(c["p99"] / a["p99"], 4),
        "median_paired": round(paired[len(paired) // 2], 4),
    }
    stats = workloads["arc"].stats
    command = "python -P bench/scheduler_step.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    data = {
        "benchmark": "scheduler_step",
        "command": command.strip(),
        "what": "Scheduler.schedule() + update_from_output() wall time per step",
        "config": {
            "cpu_chunks": args.cpu_chunks,
            "block_size": BLOCK_SIZE,
            "blocks_per_chunk": 1,
            "gpu_blocks": 4096,
            "max_num_seqs": 128,
            "max_num_batched_tokens": 8192,
            "rounds": args.rounds,
            "steps_per_round": args.steps_per_round,
            "seed": args.seed,
            "workload": dict(workload_cfg.__dict__),
        },
        "measured_steps": num_steps,
        "workload_stats": {
            "requests": stats.requests,
            "finished": stats.finished,
            "aborted": stats.aborted,
            "aborted_while_loading": stats.aborted_while_loading,
        },
        "contenders": results,
        "ratio_arc_cy_over_arc": ratio,
        "identical_decisions": True,
        "machine": bl.machine_info(),
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    md = markdown(data)
    with open(os.path.join(args.out, "scheduler_step.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(args.out, "scheduler_step.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


def markdown(data: dict[str, Any]) -> str:
    cfg = data["config"]
    r = data["ratio_arc_cy_over_arc"]
    lines = [
        "## Scheduler step time: vLLM arc vs arc_cy",
        "",
        f"`{data['command']}`",
        "",
        f"vLLM {data['machine'].get('vllm')} v1 Scheduler + OffloadingConnector, "
        f"CPU cache {cfg['cpu_chunks']:,} chunks (full: every store evicts), "
        f"{data['measured_steps']:,} measured steps per contender in "
        f"{cfg['rounds']} interleaved rounds. Time = schedule() + "
        "update_from_output().",
        "",
        "| contender | p50 ms | p90 ms | p99 ms | mean ms | stores | evicted chunks | loads |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, res in data["contenders"].items():
        s = res["step_ms"]
        lines.append(
            f"| {res['label']} | {s['p50']:.3f} | {s['p90']:.3f} | {s['p99']:.3f} | "
            f"{s['mean']:.3f} | {res['store_jobs']:,} | {res['evicted_chunks']:,} | "
            f"{res['load_jobs']:,} |"
        )
    lines += [
        "",
        f"arc_cy / arc: p50 {r['p50']:.3f}, p99 {r['p99']:.3f}, median of "
        f"per-step ratios {r['median_paired']:.3f} (< 1: arc_cy faster). "
        "Both schedulers made identical decisions step by step.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
