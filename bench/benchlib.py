"""Helpers shared by the arc_cy benchmarks (bench/*.py).

Contenders, key and chunk factories, timing statistics, progress output,
machine information, the benchmark modules' command line (``cli``) and what
their reports share (``target``, ``figure``, ``note``, ``fmt``,
``latency_table``, ``COLORS``). Every benchmark drives the installed vLLM's
real objects (0.34.0 in CI): CPUOffloadingManager for the manager-level
figures, the policy classes themselves for the policy-level ones.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# (name, cache_policy, cache_policy_module_path): the four contenders of
# every run. arc_cy is selected exactly as a user would, through vLLM's
# CachePolicyFactory with a module path.
CONTENDERS: tuple[tuple[str, str, str | None], ...] = (
    ("vllm_arc", "arc", None),
    ("vllm_lru", "lru", None),
    ("arc_cy", "ARCCachePolicy", "arc_cy._core.arc"),
    ("arc_cy_pure", "ARCCachePolicy", "arc_cy._twin.arc"),
)
ARC_LIKE: tuple[str, ...] = ("vllm_arc", "arc_cy", "arc_cy_pure")  # must decide identically
BASELINE = "vllm_arc"
LABELS = {
    "vllm_arc": "vLLM arc",
    "vllm_lru": "vLLM lru",
    "arc_cy": "arc_cy compiled",
    "arc_cy_pure": "arc_cy pure",
}
# ARC_CY_BENCH_BASE: directories from bench/base.sh, separated by ":"; the
# core each holds (package arc_cy_*) joins as a contender of that name, for
# side-by-side A/B runs of revisions of the core. Each package is imported
# from its directory by file location (sys.path is left as it is), so that
# vLLM's CachePolicyFactory finds its core (``<name>._core.arc``, or
# ``<name>._arc_c`` in a revision from before the core had a folder) in
# sys.modules' package.


def _import_base(directory: str, name: str) -> None:
    package = os.path.join(directory, name)
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(package, "__init__.py"), submodule_search_locations=[package]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"ARC_CY_BENCH_BASE: no package {name} in {directory}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


for _base in filter(None, os.environ.get("ARC_CY_BENCH_BASE", "").split(":")):
    for _name in sorted(os.listdir(_base)):
        if _name.startswith("arc_cy_") and os.path.isdir(os.path.join(_base, _name)):
            _import_base(_base, _name)
            _core = "_core.arc" if os.path.isdir(os.path.join(_base, _name, "_core")) else "_arc_c"
            CONTENDERS += ((_name, "ARCCachePolicy", f"{_name}.{_core}"),)
            ARC_LIKE += (_name,)
            LABELS[_name] = f"arc_cy compiled ({_name}, bench/base.sh)"
NAMES = tuple(c[0] for c in CONTENDERS)

GROUP_SUFFIX = (0).to_bytes(4, "big", signed=False)


def reuse(policy: Any, keys: Sequence[bytes], ctx: Any) -> None:
    """A request that reused ``keys`` (all resident and ready), as vLLM's
    manager reports it when the request finishes: ARC moves them from T1
    to T2's MRU end, LRU to its MRU end (what 0.30 to 0.33's touch did)."""
    policy.on_request_finished((tuple(keys),), set(), set(keys), ctx)


def ghost_hits(policy: Any, keys: Sequence[bytes], ctx: Any) -> None:
    """Store misses on ``keys`` (ghosts for ARC), as vLLM's manager reports
    them before it stores: each B1 hit raises target_t1_size."""
    policy.on_store_miss(list(keys), ctx)


def interleaved(names: Sequence[str], items: Sequence[Any] | None = None, step: int = 1024):  # type: ignore[no-untyped-def]
    """How a benchmark builds its contenders' state: in step, so that the
    order they are built in favours none (a structure built first or last
    sat in other memory, and its scans ran up to 25% apart:
    bench/reference/NOTES.md). Without items: the names, rotated by one
    per call. With items: (name, slice of items) pairs, ``step`` items
    for each name in turn, the order of names rotating by one per slice."""
    global _ROTATION
    _ROTATION += 1
    if items is None:
        k = _ROTATION % len(names)
        return list(names[k:]) + list(names[:k])
    out = []
    for turn, start in enumerate(range(0, len(items), step)):
        part = items[start : start + step]
        for j in range(len(names)):
            out.append((names[(turn + j) % len(names)], part))
    return out


_ROTATION = 0

_T0 = time.perf_counter()


def progress(tag: str, msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:7.1f}s] {tag}: {msg}", file=sys.stderr, flush=True)


def quiet_vllm() -> None:
    """Silence vLLM's import-time log chatter (warnings stay on stderr)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


quiet_vllm()


def policy_class(name: str) -> type:
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    _, policy, module = next(c for c in CONTENDERS if c[0] == name)
    return CachePolicyFactory.get_cache_policy_cls(policy, module)


def make_manager(name: str, num_chunks: int) -> Any:
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    _, policy, module = next(c for c in CONTENDERS if c[0] == name)
    return CPUOffloadingManager(
        num_chunks=num_chunks, cache_policy=policy, cache_policy_module_path=module
    )


class KeyStream:
    """Deterministic OffloadKeys: 32 random hash bytes + 4-byte group index 0,
    like vLLM's make_offload_key(block_hash, 0)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def take(self, n: int) -> list[bytes]:
        raw = self._rng.randbytes(32 * n)
        return [raw[i : i + 32] + GROUP_SUFFIX for i in range(0, 32 * n, 32)]


def label_key(label: str) -> bytes:
    """A stable OffloadKey for a named block (for traces with shared prefixes)."""
    import hashlib

    return hashlib.sha256(label.encode()).digest() + GROUP_SUFFIX


def ready_chunks(n: int, start: int = 0) -> list[Any]:
    """n vLLM ChunkStatus objects with ref_cnt 0 (stored, evictable)."""
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

    out = []
    for i in range(start, start + n):
        c = ChunkStatus(i)
        c.ref_cnt = 0
        out.append(c)
    return out


def stats(samples_ns: Sequence[int], per: float = 1.0) -> dict[str, float]:
    """p50/p90/p99/max/mean in microseconds, divided by ``per`` (e.g. keys)."""
    a = np.asarray(samples_ns, dtype=np.float64) / 1000.0 / per
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "p50": round(float(p50), 4),
        "p90": round(float(p90), 4),
        "p99": round(float(p99), 4),
        "max": round(float(a.max()), 4),
        "mean": round(float(a.mean()), 4),
        "n": int(a.size),
    }


def add_ratios(per_contender: dict[str, dict[str, Any]], field: str) -> None:
    """Add ``speedup_vs_vllm_arc`` (vLLM arc stat / contender stat; > 1 means
    faster than vLLM arc) for each percentile of ``field``."""
    base = per_contender.get(BASELINE, {}).get(field)
    if not base:
        return
    for _name, d in per_contender.items():
        s = d.get(field)
        if not s:
            continue
        d.setdefault("speedup_vs_vllm_arc", {})[field] = {
            q: round(base[q] / s[q], 3) if s[q] > 0 else None for q in ("p50", "p90", "p99", "max")
        }


class timed_phase:
    """gc.collect() before, gc.disable() during, gc.enable() after."""

    def __enter__(self) -> timed_phase:
        gc.collect()
        gc.disable()
        return self

    def __exit__(self, *exc: object) -> None:
        gc.enable()


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def portable(path: str) -> str:
    """A path as a report records it, naming no machine: relative to the
    checkout, else ``<env>/...`` (this Python's environment) or
    ``<python>/...`` (its installation), else ``<elsewhere>/NAME``."""
    if not os.path.isabs(path):
        return path
    path = os.path.normpath(path)
    for base, name in ((ROOT, ""), (sys.prefix, "<env>"), (sys.base_prefix, "<python>")):
        if path == base or path.startswith(base.rstrip(os.sep) + os.sep):
            rel = os.path.relpath(path, base)
            return os.path.join(name, rel) if name else rel
    return os.path.join("<elsewhere>", os.path.basename(path))


def portable_argv(argv: list[str]) -> list[str]:
    """A command line with each absolute path made portable()."""
    return [portable(a) if os.path.isabs(a) else a for a in argv]


def git_state() -> tuple[str, bool] | None:
    """The checkout's commit and whether tracked files changed; None
    outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except Exception:
        return None
    return commit, bool(dirty)


def git_commit() -> str | None:
    """The checkout's commit, with "+dirty" when tracked files changed."""
    state = git_state()
    return None if state is None else state[0] + ("+dirty" if state[1] else "")


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cores": os.cpu_count(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        info["cpu_model"] = platform.processor()
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # pragma: no cover - psutil is in the bench venv
        pass
    for mod in ("vllm", "Cython", "numpy", "torch"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            info[mod] = None
    try:
        import arc_cy

        info["arc_cy"] = getattr(arc_cy, "__version__", None)
        info["arc_cy_IMPLEMENTATION"] = arc_cy.IMPLEMENTATION
        info["arc_cy_file"] = portable(arc_cy.__file__)
    except Exception as exc:
        info["arc_cy_error"] = repr(exc)
    state = git_state()
    info["git_commit"] = None if state is None else state[0]
    if state is not None:
        info["git_dirty"] = state[1]
    try:
        info["loadavg"] = os.getloadavg()
    except OSError:
        pass
    return info


def cli(module: Any, argv: list[str] | None = None) -> dict[str, Any]:
    """A benchmark module's command line (``python -P bench/NAME.py``):
    ``--full``, ``--json``, and the module's own options
    (``add_arguments(ap)``, if it has one); runs ``module.run(args)`` and
    writes its result, with the benchmark's name, the options and its wall
    time, as JSON (to ``--json``, or to stdout)."""
    ap = argparse.ArgumentParser(description=(module.__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--full", action="store_true", help="the whole grid (what bench/run.sh --full runs)"
    )
    ap.add_argument("--json", help="write results here (default: stdout)")
    if hasattr(module, "add_arguments"):
        module.add_arguments(ap)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    result = module.run(args)
    if result is None:  # a helper mode (memory.py's --child) printed its own
        return {}
    out = {
        "benchmark": module.NAME,
        "full": args.full,
        "argv": portable_argv(sys.argv),
        "wall_s": round(time.perf_counter() - t0, 1),
        **result,
    }
    write_json(args.json, out)
    progress(module.NAME, f"done in {out['wall_s']}s")
    return out


RESULT = "RESULT "  # the line a child process reports on (print_result)


def print_result(data: dict[str, Any]) -> None:
    """A child process's report (a module's ``--child`` mode), for run_child."""
    print(RESULT + json.dumps(data), flush=True)


def run_child(script: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs ``python -P script *args`` in a fresh process (with env added to
    the environment) and returns what it reported with print_result; stops
    the benchmark, with the child's stderr, if it failed or reported nothing."""
    proc = subprocess.run(
        [sys.executable, "-P", os.path.abspath(script), *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-3000:])
        name = os.path.basename(script)
        raise SystemExit(f"{name} {' '.join(args)} failed (exit status {proc.returncode})")
    return json.loads(lines[-1][len(RESULT) :])  # type: ignore[no-any-return]


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if not path:
        json.dump(data, sys.stdout, indent=1)
        print()
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


# --- what the benchmark modules' reports share ------------------------------
#
# A module's targets(result) returns rows of three kinds, which bench/run.py
# renders in its Targets section: targets (a goal, PASS/MISS), figures
# (reported without a goal, with what they say) and notes (a line of text).


def target(
    what: str, value: float | None, goal: str, ok: Callable[[float], bool], source: str, miss: str
) -> dict[str, Any]:
    """A target: ``value`` measured in this run against ``goal`` (``ok``
    tells whether it is met); ``miss`` says what a miss means."""
    status = "n/a" if value is None else ("PASS" if ok(value) else "MISS")
    return {
        "kind": "target",
        "target": what,
        "measured": value,
        "goal": goal,
        "status": status,
        "source": source,
        "a_miss_means": miss,
    }


def decisions_target(units: str, differ: int, source: str) -> dict[str, Any]:
    """The decisions target of a module that compares them: ``differ``
    ``units`` (repetitions, traces, ...) in which arc_cy (compiled or pure)
    decided otherwise than vLLM arc; the goal is none."""
    return target(
        f"decisions: {units} where arc_cy (compiled or pure) decided otherwise than vLLM arc",
        differ,
        "0",
        lambda v: v == 0,
        source,
        "a bug: arc_cy is no longer a drop-in for vLLM arc; run the differential tests",
    )


def figure(what: str, value: Any, about: str) -> dict[str, Any]:
    """A figure reported without PASS/MISS; ``about`` says what it tells."""
    return {"kind": "figure", "figure": what, "measured": value, "about": about}


def note(text: str) -> dict[str, Any]:
    """A line for the Targets section (e.g. what a bigger run would add)."""
    return {"kind": "note", "text": text}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def find(results: list[dict[str, Any]], **kw: Any) -> dict[str, Any] | None:
    """The first result whose fields have these values."""
    for r in results:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def p50(r: dict[str, Any] | None, name: str, field: str) -> float | None:
    if r is None:
        return None
    return r["contenders"][name][field]["p50"]


def fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def latency_table(r: dict[str, Any], field: str) -> list[str]:
    """One result's ``field`` per contender: percentiles, per key, speedup."""
    c = r["contenders"]
    lines = [
        "| contender | p50 | p90 | p99 | max | p50 per key | p99 per key | "
        "speedup vs vLLM arc (p50 / p99) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in NAMES:
        if n not in c:
            continue
        s = c[n][field]
        pk = c[n].get(field + "_per_key", {})
        sp = c[n].get("speedup_vs_vllm_arc", {}).get(field, {})
        lines.append(
            f"| {LABELS[n]} | {fmt(s['p50'])} | {fmt(s['p90'])} | {fmt(s['p99'])} | "
            f"{fmt(s['max'])} | "
            f"{fmt(pk.get('p50'), 3)} | {fmt(pk.get('p99'), 3)} | "
            f"{fmt(sp.get('p50'), 2)}x / {fmt(sp.get('p99'), 2)}x |"
        )
    return lines


def save_plot(plt: Any, fig: Any, out_dir: str, file: str, title: str) -> tuple[str, str]:
    """Writes a module's figure to out_dir/file; returns (file, title)."""
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, file), dpi=90)
    plt.close(fig)
    return file, title


COLORS = {
    "vllm_arc": "tab:blue",
    "vllm_lru": "tab:green",
    "arc_cy": "tab:red",
    "arc_cy_pure": "tab:orange",
}
TWIN_MISS = (
    "the pure twin, for debugging in vLLM arc's place, costs over 10% more than "
    "vLLM arc: its checks or bookkeeping grew"
)
TWIN_STORE_GOAL = 1.35
TWIN_STORE_MISS = (
    "the pure twin's store costs more than it did: a ceiling, not a speed goal. The twin is "
    "for debugging: vLLM arc's code, each of whose mutating calls enters a re-entry guard "
    "(arc_cy._twin.arc.mutating, docs/hardening.md), which weighs most against vLLM arc's C "
    "OrderedDict calls in a store's many short calls (1.12x to 1.34x of vLLM arc while the "
    "twin kept the core's busy protocol and checks); over 1.35x, its guard or bookkeeping grew"
)


# --- traces shared by store_latency.py (chat latency) and hit_ratio.py -----


def chat_trace(
    n_requests: int,
    *,
    seed: int = 1,
    active: int = 32,
    n_system: int = 8,
    system_blocks: int = 64,
    user_blocks: tuple[int, int] = (4, 32),
    reply_blocks: tuple[int, int] = (4, 32),
    max_turns: int = 8,
) -> list[list[bytes]]:
    """Multi-turn chat with prefix sharing: every conversation starts with one
    of ``n_system`` system prompts; turn t's prompt is the system prompt, all
    earlier turns (user and assistant blocks) and the new user blocks.
    ``active`` conversations are interleaved; a finished one is replaced."""
    rng = random.Random(seed)
    systems = [[label_key(f"sys{p}:{j}") for j in range(system_blocks)] for p in range(n_system)]
    next_id = 0

    def new_conv() -> dict[str, Any]:
        nonlocal next_id
        next_id += 1
        p = min(int(rng.paretovariate(1.2)) - 1, n_system - 1)  # popular prompts
        return {"id": next_id, "keys": list(systems[p]), "left": rng.randint(1, max_turns)}

    def extend(conv: dict[str, Any], n: int) -> None:
        base = len(conv["keys"])
        conv["keys"].extend(label_key(f"c{conv['id']}:{base + j}") for j in range(n))

    convs = [new_conv() for _ in range(active)]
    out = []
    for _ in range(n_requests):
        i = rng.randrange(active)
        conv = convs[i]
        extend(conv, rng.randint(*user_blocks))
        out.append(list(conv["keys"]))
        extend(conv, rng.randint(*reply_blocks))
        conv["left"] -= 1
        if conv["left"] == 0:
            convs[i] = new_conv()
    return out


def loop_trace(n_requests: int, loop_blocks: int, request_blocks: int = 16) -> list[list[bytes]]:
    """A looping scan over ``loop_blocks`` distinct blocks, ``request_blocks``
    per request (a classic LRU-defeating pattern when the loop > capacity)."""
    keys = [label_key(f"loop:{j}") for j in range(loop_blocks)]
    out = []
    pos = 0
    for _ in range(n_requests):
        req = [keys[(pos + j) % loop_blocks] for j in range(request_blocks)]
        pos = (pos + request_blocks) % loop_blocks
        out.append(req)
    return out


def zipf_trace(
    n_requests: int,
    *,
    seed: int = 2,
    n_docs: int = 400,
    doc_blocks: int = 32,
    unique_blocks: tuple[int, int] = (2, 16),
    s: float = 1.0,
) -> list[list[bytes]]:
    """Zipf-popular shared documents (prefix) + a unique question (suffix)."""
    rng = random.Random(seed)
    docs = [[label_key(f"doc{d}:{j}") for j in range(doc_blocks)] for d in range(n_docs)]
    weights = [1.0 / (r + 1) ** s for r in range(n_docs)]
    choice = rng.choices(range(n_docs), weights=weights, k=n_requests)
    out = []
    for i, d in enumerate(choice):
        u = rng.randint(*unique_blocks)
        out.append(docs[d] + [label_key(f"q{i}:{j}") for j in range(u)])
    return out
