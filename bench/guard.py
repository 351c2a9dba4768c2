"""What the vLLM code guard costs a process (arc_cy._guard): the one check a
vLLM process runs, when arc_cy's plugin registers or its first policy is
built, on a verified release (the hash path).

Four configurations, their processes interleaved: each route as it comes
first in a server (the plugin first: vLLM's plugin loading has imported
base.py and the policy factory; the module path first: the CPU and tiering
managers and the factory are imported), each with vLLM's judged files as
pip installs them (with .pyc files) and as uv installs them by default or
PYTHONDONTWRITEBYTECODE leaves them (without). The files are vLLM's own,
copied into an overlay put first on the path (arc_cy_harness.vllm_overlay's
sitecustomize imports vLLM's modules from it), with or without the .pyc
files compileall writes, written before the processes start. Each process
times its first check (the cost it pays) and, for comparison, ten more.

Run: bench/run.sh --only guard, or alone with bench/ and harness/ on
PYTHONPATH: $PY -P bench/guard.py [--full] [--json out.json]
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import sys
import tempfile
import time
from importlib.util import find_spec
from typing import Any

import benchlib as bl
from arc_cy._guard.files import FILES

NAME = TAG = "guard"
PLOTS: tuple[tuple[str, str], ...] = ()
GOAL_MS = 5.0  # issues 53 and 59: however vLLM was installed, by either route
JUDGED = tuple(FILES)  # arc.py, base.py and the CPU and tiering managers
IMPORTED = {  # what a server process has imported when the route's check runs
    "plugin first": ("vllm.v1.kv_offload.cpu.policies.factory",),
    "module path first": (
        "vllm.v1.kv_offload.cpu.manager",
        "vllm.v1.kv_offload.cpu.policies.factory",
        "vllm.v1.kv_offload.tiering.manager",
    ),
}
PYC = {"with .pyc": True, "without .pyc": False}


def child(route: str) -> dict[str, Any]:
    import importlib

    importlib.import_module("arc_cy._vllm")  # base.py, as arc_cy's import has it
    for module in IMPORTED[route]:
        importlib.import_module(module)
    from arc_cy import _guard

    t = time.perf_counter_ns()
    result = _guard.check_vllm_code()
    first = time.perf_counter_ns() - t
    assert result is not None and result.ok and result.by_hash, result
    imported = [m for m in JUDGED if m in sys.modules]
    assert all(
        sys.modules[m].__file__.startswith(os.environ["ARC_CY_GUARD_OVERLAY"]) for m in imported
    )
    again = []
    for _ in range(10):
        t = time.perf_counter_ns()
        _guard.check_vllm_code()
        again.append(time.perf_counter_ns() - t)
    return {"first_ms": first / 1e6, "again_ms": [x / 1e6 for x in again], "imported": imported}


def overlay(root: str, pyc: bool) -> str:
    """vLLM's four judged files, as installed, in an overlay; .pyc or none."""
    import arc_cy_harness

    spec = find_spec("vllm")
    assert spec is not None and spec.origin
    site = os.path.dirname(os.path.dirname(spec.origin))
    for module in JUDGED:
        path = os.path.join(*module.split(".")) + ".py"
        os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
        shutil.copy(os.path.join(site, path), os.path.join(root, path))
    here = os.path.dirname(arc_cy_harness.__file__)
    shutil.copy(
        os.path.join(here, "fake_vllm_sitecustomize.py"), os.path.join(root, "sitecustomize.py")
    )
    if pyc:
        assert compileall.compile_dir(os.path.join(root, "vllm"), quiet=1)
    return root


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--child", help=argparse.SUPPRESS)


def run(args: Any) -> dict[str, Any] | None:
    if args.child:
        bl.print_result(child(args.child))
        return None
    processes = 10 if args.full else 5
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {p: overlay(os.path.join(tmp, p.replace(" ", "_")), has) for p, has in PYC.items()}
        time.sleep(0.1)  # the files predate the processes (files._written)
        for i in range(processes):
            for route in IMPORTED:
                for pyc, tree in trees.items():
                    env = {"FAKE_VLLM_OVERLAY": "1", "PYTHONDONTWRITEBYTECODE": "1"}
                    env["PYTHONPATH"] = os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])
                    env["ARC_CY_GUARD_OVERLAY"] = tree
                    done = bl.run_child(__file__, "--child", route, env=env)
                    runs.setdefault(f"{route}, {pyc}", []).append(done)
            bl.progress(TAG, f"processes {i + 1}/{processes} of each configuration")
        assert not any(
            os.path.isdir(os.path.join(trees["without .pyc"], "vllm", d)) for d in ("__pycache__",)
        )
    out: dict[str, Any] = {"processes": processes, "configurations": {}}
    for name, done in runs.items():
        first = sorted(r["first_ms"] for r in done)
        again = sorted(x for r in done for x in r["again_ms"])
        out["configurations"][name] = {
            "imported": done[0]["imported"],
            "first_ms": first,
            "first_p50_ms": statistics.median(first),
            "first_p99_ms": first[min(len(first) - 1, int(0.99 * len(first)))],
            "again_p50_ms": statistics.median(again),
            "again_p99_ms": again[min(len(again) - 1, int(0.99 * len(again)))],
        }
    return out


# --- the report -----------------------------------------------------------------


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        bl.target(
            f"the vLLM code guard's check, once per process, {name} (ms, median of "
            f"{result['processes']} fresh processes)",
            c["first_p50_ms"],
            f"< {GOAL_MS:g}",
            lambda v: v < GOAL_MS,
            "guard.py",
            "the guard costs a server's start more than it should, or depends on how vLLM "
            "was installed: compare the four configurations in guard.py's table",
        )
        for name, c in result["configurations"].items()
    ]


def markdown(result: dict[str, Any]) -> str:
    n = result["processes"]
    rows = [
        f"| {name} | {', '.join(FILES[m] for m in c['imported'])} | "
        f"{c['first_p50_ms']:.2f} | {c['first_p99_ms']:.2f} | {c['again_p50_ms']:.2f} | "
        f"{c['again_p99_ms']:.2f} |"
        for name, c in result["configurations"].items()
    ]
    return (
        "\n".join(
            [
                "## The vLLM code guard (guard.py)",
                "",
                f"{n} fresh processes per configuration, interleaved; vLLM's judged files as "
                "installed, in an overlay with or without their .pyc files. The first check is "
                "what a process pays once; a repeat in the same process is for comparison "
                f"(10 per process). p99 of {n} processes is their worst.",
                "",
                "| route, files | judged modules imported | first check p50 (ms) | "
                "first check p99 (ms) | repeat p50 (ms) | repeat p99 (ms) |",
                "|---|---|---:|---:|---:|---:|",
                *rows,
            ]
        )
        + "\n"
    )


def plot(result: dict[str, Any], out_dir: str, plt: Any) -> list[tuple[str, str]]:
    return []


if __name__ == "__main__":
    bl.cli(sys.modules[__name__])
