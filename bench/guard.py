"""What the vLLM code guard costs a process (arc_cy._guard): the one check a
vLLM process runs, when arc_cy's plugin registers or its first policy is
built.

Each process is fresh and imports what a vLLM server process has imported
by then (the CPU manager, the tiering manager, the policy factory and
vLLM's arc), as installed, .pyc files included; then it times the first
check (the cost that process pays) and, for comparison, ten more in the
same process (what repeating it would cost; the guard never repeats it).

Run: bench/run.sh --only guard, or alone with bench/ on PYTHONPATH:
$PY -P bench/guard.py [--full] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import benchlib as bl

NAME = TAG = "guard"
PLOTS: tuple[tuple[str, str], ...] = ()
GOAL_MS = 5.0  # issue 53: a verified release is accepted by its files' hashes
SERVER_MODULES = (
    "vllm.v1.kv_offload.cpu.manager",
    "vllm.v1.kv_offload.cpu.policies.arc",
    "vllm.v1.kv_offload.cpu.policies.factory",
    "vllm.v1.kv_offload.tiering.manager",
)


def child() -> dict[str, Any]:
    import importlib

    for module in SERVER_MODULES:
        importlib.import_module(module)
    from arc_cy import _guard

    t = time.perf_counter_ns()
    result = _guard.check_vllm_code()
    first = time.perf_counter_ns() - t
    assert result is not None and result.ok, result
    again = []
    for _ in range(10):
        t = time.perf_counter_ns()
        _guard.check_vllm_code()
        again.append(time.perf_counter_ns() - t)
    return {"first_ms": first / 1e6, "again_ms": [x / 1e6 for x in again]}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)


def run(args: Any) -> dict[str, Any] | None:
    if args.child:
        bl.print_result(child())
        return None
    processes = 10 if args.full else 5
    runs = []
    for i in range(processes):
        runs.append(bl.run_child(__file__, "--child"))
        bl.progress(TAG, f"process {i + 1}/{processes}: first check {runs[-1]['first_ms']:.1f} ms")
    first = sorted(r["first_ms"] for r in runs)
    again = sorted(x for r in runs for x in r["again_ms"])
    return {
        "processes": processes,
        "first_ms": first,
        "first_p50_ms": statistics.median(first),
        "first_max_ms": first[-1],
        "again_p50_ms": statistics.median(again),
        "again_p99_ms": again[min(len(again) - 1, int(0.99 * len(again)))],
    }


# --- the report -----------------------------------------------------------------


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        bl.target(
            "the vLLM code guard's check, once per process (ms, median of "
            f"{result['processes']} fresh processes)",
            result["first_p50_ms"],
            f"< {GOAL_MS:g}",
            lambda v: v < GOAL_MS,
            "guard.py",
            "the guard costs a server's start more than it should",
        )
    ]


def markdown(result: dict[str, Any]) -> str:
    return (
        "\n".join(
            [
                "## The vLLM code guard (guard.py)",
                "",
                f"{result['processes']} fresh processes, each with vLLM's managers, factory and "
                "arc imported as a server has them; the check is what one process pays once.",
                "",
                "| | p50 (ms) | worst (ms) |",
                "|---|---:|---:|",
                f"| first check in a process | {result['first_p50_ms']:.1f} | "
                f"{result['first_max_ms']:.1f} |",
                f"| a repeat in the same process | {result['again_p50_ms']:.1f} | "
                f"{result['again_p99_ms']:.1f} (p99) |",
            ]
        )
        + "\n"
    )


def plot(result: dict[str, Any], out_dir: str, plt: Any) -> list[tuple[str, str]]:
    return []


if __name__ == "__main__":
    bl.cli(sys.modules[__name__])
