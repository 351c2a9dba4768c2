"""``python -m arc_cy replay TRACE``: which policy to run on this traffic.

A trace (a Mooncake-format file, or a recording, ``arc_cy._trace``) is
replayed through the installed vLLM's own ``CPUOffloadingManager``, once per
cell: a policy (vLLM lru, vLLM arc, arc_cy, ARC+; each by the name an
operator configures) at a pool size and a ``store_threshold``; beside the
offline optimum (Belady's MIN) at each pool size. Cells run in parallel,
one process a core. It prints a table and one line a pool size that
answers the operator, writes ``--json`` and ``--plot`` when asked.

The model (docs/benchmarks.md, "The trace replay"), here as ``schedule`` and
``Replayer``: a request starts at its timestamp and runs ``input_length /
prefill_tps`` seconds plus ``output_length * decode_ms`` ms, or, with
``inflight=N``, until request i + N starts. At its start the manager gets
``on_new_request``, ``lookup`` of its blocks up to the first that is not a
ready hit, ``prepare_load`` of those, then ``prepare_store`` of the rest in
batches; at its finish ``complete_load``, ``complete_store`` and
``on_request_finished``. What it loads and stores stays pinned until then.
bench/replay.py times the same code, policy beside policy.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from ._trace import Trace, TraceError, block_key, read_trace

# route -> (eviction_policy, what an operator sets); the replay builds each
# by its policy name, as vLLM's spec does from kv_connector_extra_config.
ROUTES = {
    "vllm_lru": "lru",
    "vllm_arc": "arc",
    "arc_cy": "arc_cy",
    "arc_cy_plus": "arc_cy_plus",
}
LABELS = {
    "vllm_lru": "vLLM lru",
    "vllm_arc": "vLLM arc",
    "arc_cy": "arc_cy",
    "arc_cy_plus": "ARC+",
    "optimum": "optimum",
}
DEFAULT = ("vllm_lru", 1)  # vLLM's default: what a recommendation is against
MARGIN = 0.02
"""A setting is recommended over vLLM's default when it hits at least 2%
more: a smaller lead is within what a day's traffic moves (the two shipped
traces' policies differ by less than that at most pool sizes)."""
FRACTIONS = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0)  # a trace's pools: of its distinct blocks
AROUND = (0.25, 0.5, 1.0, 2.0, 4.0)  # a recording's pools: times its cache_capacity
STORE_BATCH = 16


# --- the model ---------------------------------------------------------------


def schedule(
    trace: Trace,
    *,
    prefill_tps: float = 10_000.0,
    decode_ms: float = 20.0,
    inflight: int | None = None,
    recorded: bool = False,
) -> list[tuple[int, int]]:
    """The replay's events in order: ``(0, i)`` request i starts (its
    lookups, load and stores), ``(1, i)`` it finishes (at equal times,
    finishes first, but never a request's own before its start).
    ``recorded``: in a recording's own order (arc_cy._trace.ORDER), where
    a request's start is its lookups and load, and ``(2, i)`` its stores;
    ``inflight=N``: request i finishes as request i + N starts; else by the
    timestamps and lengths."""
    n = len(trace)
    events: list[tuple[int, int]] = []
    if recorded:
        places = (trace.order_load, trace.order_store, trace.order_finish)
        # A request's events at one place (a load that pinned nothing, a
        # request that stored nothing) come in its own order.
        placed = [(at[i], rank, i) for rank, at in zip((0, 1, 2), places) for i in range(n)]
        placed.sort()
        return [((0, 2, 1)[rank], i) for _, rank, i in placed]
    if inflight is not None:
        if inflight < 1:
            raise ValueError("inflight must be at least 1")
        for i in range(n):
            if i >= inflight:
                events.append((1, i - inflight))
            events.append((0, i))
        events += [(1, i) for i in range(max(0, n - inflight), n)]
        return events
    if prefill_tps <= 0 or decode_ms < 0:
        raise ValueError("prefill_tps must be positive and decode_ms non-negative")
    # Arrivals are in order; finishes come off a heap: O(n log in-flight).
    ends: list[tuple[float, int]] = []
    ts, ins, outs = trace.timestamp_ms, trace.input_length, trace.output_length
    for i in range(n):
        start = float(ts[i])
        while ends and ends[0][0] <= start:
            events.append((1, heapq.heappop(ends)[1]))
        events.append((0, i))
        end = start + 1000.0 * ins[i] / prefill_tps + decode_ms * outs[i]
        if end <= start:
            events.append((1, i))
        else:
            heapq.heappush(ends, (end, i))
    while ends:
        events.append((1, heapq.heappop(ends)[1]))
    return events


class Replayer:
    """Drives one CPUOffloadingManager through a schedule's events.

    ``keys(i)`` gives request i's offload keys in order. ``decisions`` (with
    ``log=True``) lists what the policy decided, call by call: ``("load", i,
    hits)`` for request i's lookups, ``("store", i, evicted keys)`` for each
    prepare_store (None for a failed one). ``manager_ns``: the time spent in
    manager calls, and ``start_ns`` each request's share at its start."""

    def __init__(
        self,
        manager: Any,
        keys: Callable[[int], list[bytes]],
        *,
        store_batch: int = STORE_BATCH,
        tokens_per_key: int = 512,
        log: bool = False,
        trace: Trace | None = None,
        done: bool = False,
    ) -> None:
        from vllm.v1.kv_offload.base import LookupResult, ReqContext

        self.m = manager
        self.keys = keys
        self.store_batch = store_batch
        self.tokens_per_key = tokens_per_key
        # done: each transfer completes before the request's next call, as
        # in an engine; else a request's loads and stores stay pinned until
        # it finishes.
        self.done = done
        self.split = False  # run(): a recorded order places each request's stores apart
        # A recording's counts of each request's leading ids (arc_cy._trace.COUNTS).
        self.counts = (trace.device_hits, trace.loadable) if trace is not None else None
        # vLLM 0.30 (no on_request_finished): its scheduler touches a
        # request's keys after its lookups and after a store that allocated.
        self.touch = None if hasattr(manager, "on_request_finished") else manager.touch
        self._HIT = LookupResult.HIT
        self._ctx = ReqContext
        # request -> (its context, its loads and stores in flight, its
        # offer, its place in start_ns)
        self.live: dict[int, tuple[Any, list[bytes], list[list[bytes]], list[bytes], int]] = {}
        self.log = log
        self.decisions: list[tuple[str, int, Any]] = []
        self.asked = self.hits = 0
        self.store_calls = self.store_failures = self.stored = self.evicted = 0
        self.manager_ns = 0
        self.start_ns = array("q")

    def run(self, events: Sequence[tuple[int, int]]) -> Replayer:
        """Each event: 0 starts request i (its stores too, unless a 2, its
        stores, comes later: a recorded order), 1 finishes it."""
        self.split = any(kind == 2 for kind, _ in events)
        calls = (self.start, self.finish, self.store)
        for kind, i in events:
            calls[kind](i)
        return self

    def start(self, i: int) -> None:
        """Request i's lookups and load; its stores too unless split (a
        recorded order places them apart)."""
        m, keys, pc = self.m, self.keys(i), time.perf_counter_ns
        ctx = self._ctx(f"req-{i}")
        position = getattr(ctx, "set_offload_key_position", None)
        if position is not None:  # vLLM 0.31 and later: the prefix order
            per_key = self.tokens_per_key
            for j, k in enumerate(keys):
                position(k, (j + 1) * per_key)
        device, loadable = (
            (0, len(keys)) if self.counts is None else (self.counts[0][i], self.counts[1][i])
        )
        HIT, lookup, touch = self._HIT, m.lookup, self.touch
        t0 = pc()
        m.on_new_request(ctx)
        hits = 0
        for k in keys[device:loadable]:
            if lookup(k, ctx) is not HIT:
                break
            hits += 1
        if touch is not None:
            touch(keys, ctx)
        loaded = keys[device : device + hits]
        if loaded:
            m.prepare_load(loaded, ctx)
            if self.done:
                m.complete_load(loaded, ctx)
        spent = pc() - t0
        self.manager_ns += spent
        self.start_ns.append(spent)
        if self.log:
            self.decisions.append(("load", i, hits))
        self.asked += len(keys) - device
        self.hits += hits
        # As vLLM's connector offers them: from the first key not loaded,
        # the device's hits too when nothing was loaded.
        offer = keys[device + hits if hits else 0 :]
        self.live[i] = (ctx, [] if self.done else loaded, [], offer, len(self.start_ns) - 1)
        if not self.split:
            self.store(i)

    def store(self, i: int) -> None:
        """Request i's stores, in batches."""
        m, pc, log, touch = self.m, time.perf_counter_ns, self.log, self.touch
        ctx, loaded, stores, offer, at = self.live[i]
        batch, spent = self.store_batch, 0
        for b in range(0, len(offer), batch):
            t0 = pc()
            out = m.prepare_store(offer[b : b + batch], ctx)
            self.store_calls += 1
            if out is None:
                spent += pc() - t0
                self.store_failures += 1
                if log:
                    self.decisions.append(("store", i, None))
                continue
            if out.keys_to_store:
                self.stored += len(out.keys_to_store)
                if self.done:
                    m.complete_store(out.keys_to_store, ctx)
                else:
                    stores.append(out.keys_to_store)
                if touch is not None:
                    touch(self.keys(i), ctx)
            spent += pc() - t0
            if log:
                self.decisions.append(("store", i, tuple(out.evicted_keys)))
            self.evicted += len(out.evicted_keys)
        self.manager_ns += spent
        self.start_ns[at] += spent  # a request's start: its lookups, load and stores

    def finish(self, i: int) -> None:
        m, pc = self.m, time.perf_counter_ns
        ctx, loaded, stores, _, _ = self.live.pop(i)
        t0 = pc()
        if loaded:
            m.complete_load(loaded, ctx)
        for keys in stores:
            m.complete_store(keys, ctx)
        if self.touch is None:  # vLLM 0.31 and later
            m.on_request_finished(ctx)
        self.manager_ns += pc() - t0

    def hit_ratio(self) -> float:
        return self.hits / self.asked if self.asked else 0.0


def trace_keys(trace: Trace) -> Callable[[int], list[bytes]]:
    """keys(i) for a Replayer: request i's blocks as offload keys, made as
    it starts (``block_key``)."""
    blocks = trace.blocks
    return lambda i: [block_key(h) for h in blocks(i)]


def next_uses(sequence: Sequence[int]) -> array[int]:
    """For each access, the index of its block's next access (len(sequence)
    if none): 8 bytes an access, and a dict of the distinct blocks while it
    runs."""
    n = len(sequence)
    nxt = array("q", bytes(8 * n))
    last: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        b = sequence[i]
        nxt[i] = last.get(b, n)
        last[b] = i
    return nxt


def optimum_hits(sequence: Sequence[int], capacity: int, nxt: Sequence[int] | None = None) -> int:
    """Belady's MIN with bypass: the most hits any cache of ``capacity``
    blocks can have on ``sequence`` (a block is a hit when it is resident as
    it is asked). It knows the future, ignores pins and prefix order, and
    may leave a block out. ``nxt``: next_uses(sequence), if made already;
    the heap is kept within twice the resident blocks."""
    n = len(sequence)
    if nxt is None:
        nxt = next_uses(sequence)
    resident: dict[int, int] = {}  # block -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, block), stale entries skipped
    hits = 0
    for i in range(n):
        b, use = sequence[i], nxt[i]
        if b in resident:
            hits += 1
        elif use == n or capacity <= 0:
            continue
        elif len(resident) >= capacity:
            while True:
                neg, victim = heap[0]
                if resident.get(victim) == -neg:
                    break
                heapq.heappop(heap)
            if -neg <= use:  # every resident block is used before this one
                continue
            heapq.heappop(heap)
            del resident[victim]
        if use == n:
            del resident[b]
        else:
            resident[b] = use
            heapq.heappush(heap, (-use, b))
            if len(heap) > 2 * len(resident) + 64:
                heap = [(-u, k) for k, u in resident.items()]
                heapq.heapify(heap)
    return hits


# --- the cells ----------------------------------------------------------------

# What forked workers read (set before the pool starts: a fork shares it).
_JOB: dict[str, Any] = {}


def make_manager(route: str, pool: int, threshold: int) -> Any:
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    return CPUOffloadingManager(
        num_chunks=pool, cache_policy=ROUTES[route], store_threshold=threshold
    )


def _cell(task: tuple[str, int, int]) -> dict[str, Any]:
    route, pool, threshold = task
    trace: Trace = _JOB["trace"]
    done: bool = _JOB.get("done", False)
    t = time.perf_counter()
    if route == "optimum":
        hits = optimum_hits(trace.accesses, pool, _JOB.get("nxt"))
        return {
            "route": route,
            "pool": pool,
            "threshold": 0,
            "hits": hits,
            "asked": len(trace.accesses),
            "seconds": time.perf_counter() - t,
        }
    per_key = (trace.recording or {}).get("tokens_per_key") or 512
    r = Replayer(
        make_manager(route, pool, threshold),
        trace_keys(trace),
        tokens_per_key=per_key,
        trace=trace,
        done=done,
    )
    r.run(_JOB["events"])
    return {
        "route": route,
        "pool": pool,
        "threshold": threshold,
        "hits": r.hits,
        "asked": r.asked,
        "stored": r.stored,
        "evicted": r.evicted,
        "store_failures": r.store_failures,
        "manager_s": r.manager_ns / 1e9,
        "seconds": time.perf_counter() - t,
    }


def check_routes(routes: Sequence[str]) -> list[str]:
    """The routes this vLLM builds, arc_cy's names resolving to arc_cy's
    classes; SystemExit if arc_cy's plugin did not register."""
    import vllm.plugins
    import vllm.v1.kv_offload.cpu.manager
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    import arc_cy

    vllm.plugins.load_general_plugins()  # type: ignore[no-untyped-call]
    ours = {"arc_cy": arc_cy.ARCCachePolicy, "arc_cy_plus": arc_cy.ARCPlusCachePolicy}
    usable = []
    for route in routes:
        try:
            cls = CachePolicyFactory.get_cache_policy_cls(ROUTES[route])
        except Exception:
            if route == "arc_cy_plus":  # vLLM 0.30: no on_request_finished
                continue
            raise SystemExit(
                f"replay: vLLM knows no cache policy {ROUTES[route]!r}: run `python -m arc_cy`"
            ) from None
        if route in ours and cls is not ours[route]:
            raise SystemExit(f"replay: {ROUTES[route]!r} is {cls!r}, not arc_cy's")
        usable.append(route)
    return usable


def run_cells(
    tasks: list[tuple[str, int, int]], jobs: int, progress: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Each task's cell, in parallel (fork: the workers share the trace)."""
    order = sorted(tasks, key=lambda t: (t[0] == "optimum", t[1]), reverse=True)
    done: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    def note(rec: dict[str, Any]) -> None:
        done.append(rec)
        left = len(tasks) - len(done)
        what = LABELS[rec["route"]] + (
            f", store_threshold {rec['threshold']}" if rec["threshold"] else ""
        )
        ratio = rec["hits"] / rec["asked"] if rec["asked"] else 0.0
        elapsed = time.perf_counter() - t0
        eta = f", about {elapsed / len(done) * left / max(1, jobs):.0f} s left" if left else ""
        progress(
            f"replay: {len(done)}/{len(tasks)}: {what} at {rec['pool']:,} chunks: hit ratio "
            f"{ratio:.3f} ({rec['seconds']:.1f} s{eta})"
        )

    if jobs <= 1 or len(order) <= 1:
        for task in order:
            note(_cell(task))
        return done
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(min(jobs, len(order))) as pool:
        for rec in pool.imap_unordered(_cell, order):
            note(rec)
    return done


# --- the report -----------------------------------------------------------------


def pools_for(
    trace: Trace, distinct: int, fractions: Sequence[float] | None, chunks: Sequence[int] | None
) -> list[int]:
    """The pool sizes to replay, in chunks: those asked, else a recording's
    cache_capacity and a spread around it, else fractions of the distinct
    blocks."""
    if chunks:
        sizes = list(chunks)
    elif fractions is None and trace.recording is not None:
        capacity = trace.recording["cache_capacity"]
        sizes = [min(distinct, max(1, round(capacity * f))) for f in AROUND]
    else:
        sizes = [max(1, round(f * distinct)) for f in (fractions or FRACTIONS)]
    return sorted(set(sizes))


def records(cells: list[dict[str, Any]], distinct: int) -> list[dict[str, Any]]:
    """One record a pool size and threshold (bench/replay.py's shape):
    ``hit_ratio`` by route name, the optimum's beside them."""
    optimum = {c["pool"]: c["hits"] / c["asked"] for c in cells if c["route"] == "optimum"}
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for c in sorted(cells, key=lambda c: (c["pool"], c["threshold"], c["route"])):
        if c["route"] == "optimum":
            continue
        rec = out.setdefault(
            (c["pool"], c["threshold"]),
            {
                "pool_chunks": c["pool"],
                "pool_fraction": round(c["pool"] / distinct, 5),
                "store_threshold": c["threshold"],
                "hit_ratio": {},
                "hits": {},
                "store_failures": {},
                "manager_s": {},
                "blocks": c["asked"],
            },
        )
        rec["hit_ratio"][c["route"]] = round(c["hits"] / c["asked"], 5) if c["asked"] else 0.0
        rec["hits"][c["route"]] = c["hits"]
        rec["store_failures"][c["route"]] = c["store_failures"]
        rec["manager_s"][c["route"]] = round(c["manager_s"], 4)
        rec["hit_ratio"]["optimum"] = round(optimum[c["pool"]], 5)
    return list(out.values())


def _setting(route: str, threshold: int) -> str:
    name = f'"eviction_policy": "{ROUTES[route]}"'
    return name if threshold == 1 else f'{name}, "store_threshold": {threshold}'


def recommend(recs: list[dict[str, Any]], pool: int) -> str:
    """The one line for the operator at pool size ``pool``."""
    at = [r for r in recs if r["pool_chunks"] == pool]
    ratio = {
        (route, r["store_threshold"]): h
        for r in at
        for route, h in r["hit_ratio"].items()
        if route != "optimum"
    }
    base = ratio.get(DEFAULT)
    if base is None:
        return f"At {pool:,} chunks: vLLM's default (lru, store_threshold 1) did not run."
    # The best setting; at equal hits arc_cy before vLLM arc (the same
    # decisions, less scheduler time) and store_threshold 1 before 2.
    preference = ("arc_cy", "arc_cy_plus", "vllm_lru", "vllm_arc")
    best = max(ratio, key=lambda s: (ratio[s], -s[1], -preference.index(s[0])))
    if ratio[best] <= base * (1 + MARGIN):
        return (
            f"At {pool:,} chunks: keep vLLM's default (lru, store_threshold 1): no policy or "
            f"store_threshold beats its hit ratio ({base:.3f}) by more than {MARGIN:.0%}."
        )
    lead = f"{ratio[best] / base:.2f}x" if base else "where it hits nothing"
    return (
        f"At {pool:,} chunks: run {LABELS[best[0]]} ({_setting(*best)}): hit ratio "
        f"{ratio[best]:.3f} against vLLM's default (lru, store_threshold 1) {base:.3f}, {lead}."
    )


def table(recs: list[dict[str, Any]], routes: Sequence[str], thresholds: Sequence[int]) -> str:
    cols = [(r, t) for r in routes for t in thresholds]
    head = ["pool (chunks)", *(f"{LABELS[r]} t{t}" for r, t in cols), "optimum"]
    rows = []
    for pool in sorted({r["pool_chunks"] for r in recs}):
        at = {r["store_threshold"]: r for r in recs if r["pool_chunks"] == pool}
        any_rec = next(iter(at.values()))
        cells = [f"{pool:,} ({any_rec['pool_fraction']:.1%})"]
        cells += [
            f"{at[t]['hit_ratio'][r]:.3f}" if t in at and r in at[t]["hit_ratio"] else "-"
            for r, t in cols
        ]
        cells.append(f"{any_rec['hit_ratio']['optimum']:.3f}")
        rows.append(cells)
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths))

    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def plot(
    path: str, recs: list[dict[str, Any]], routes: Sequence[str], thresholds: Sequence[int]
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("replay: --plot needs matplotlib: pip install 'arc_cy[plot]'") from None
    pools = sorted({r["pool_chunks"] for r in recs})
    fig, ax = plt.subplots(figsize=(8, 5))
    ratio = {(r["pool_chunks"], r["store_threshold"]): r["hit_ratio"] for r in recs}
    for route in routes:
        for t in thresholds:
            ys = [ratio.get((p, t), {}).get(route, math.nan) for p in pools]
            ax.plot(
                pools,
                ys,
                marker="o",
                linestyle="-" if t == 1 else "--",
                label=f"{LABELS[route]}, store_threshold {t}",
            )
    best = [next(r["hit_ratio"]["optimum"] for r in recs if r["pool_chunks"] == p) for p in pools]
    ax.plot(pools, best, color="black", linestyle=":", label="optimum (Belady's MIN)")
    ax.set_xscale("log")
    ax.set_xlabel("CPU pool (chunks)")
    ax.set_ylabel("hit ratio (blocks loaded / blocks asked)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _atomic(path, lambda f: fig.savefig(f, format="png", dpi=120), "wb")
    plt.close(fig)


def _atomic(path: str, write: Callable[[Any], None], mode: str = "w") -> None:
    """Write path whole or not at all."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            write(f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _numbers(text: str, kind: type, what: str) -> list[Any]:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: comma-separated numbers, not {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"{what}: at least one")
    return values


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m arc_cy replay",
        description="Replay a KV-cache trace (a recording made with ARC_CY_RECORD_TRACE, or "
        "any Mooncake-format trace) through this vLLM's CPUOffloadingManager with vLLM lru, "
        "vLLM arc, arc_cy and ARC+ at store_threshold 1 and 2, beside the offline optimum, "
        "and say which to run.",
    )
    ap.add_argument("trace", help="the trace file")
    ap.add_argument(
        "--pools",
        type=lambda s: _numbers(s, float, "--pools"),
        help="pool sizes as fractions of the trace's distinct blocks, comma-separated "
        f"(default for a trace: {','.join(map(str, FRACTIONS))})",
    )
    ap.add_argument(
        "--chunks",
        type=lambda s: _numbers(s, int, "--chunks"),
        help="pool sizes in chunks, comma-separated (default for a recording: its "
        f"cache_capacity times {', '.join(map(str, AROUND))})",
    )
    ap.add_argument(
        "--thresholds",
        default=[1, 2],
        type=lambda s: _numbers(s, int, "--thresholds"),
        help="store_threshold values (default 1,2)",
    )
    ap.add_argument(
        "--timestamps",
        action="store_true",
        help="overlap a recording's requests by their timestamps and lengths, not in the "
        "order the policy saw their events (a recording's default)",
    )
    ap.add_argument(
        "--transfers",
        choices=("done", "held"),
        help="done: a load or store completes before the request's next call, as in an engine "
        "(a recording's default); held: a request's loads and stores stay pinned until it "
        "finishes (a trace's default, bench/replay.py's model)",
    )
    ap.add_argument(
        "--inflight",
        type=int,
        help="a fixed number of requests in flight (request "
        "i finishes as request i+N starts) instead of the timestamps' overlap",
    )
    ap.add_argument(
        "--prefill-tps",
        type=float,
        default=10_000.0,
        help="prefill tokens per second, for the overlap (default 10,000)",
    )
    ap.add_argument(
        "--decode-ms",
        type=float,
        default=20.0,
        help="ms per output token, for the overlap (default 20)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="cells in parallel, one process each (default: one a core)",
    )
    ap.add_argument("--json", metavar="FILE", help="write the records (JSON) to FILE")
    ap.add_argument(
        "--plot",
        metavar="FILE",
        help="draw the hit ratios to FILE (PNG; needs matplotlib: pip install 'arc_cy[plot]')",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if any(not 0 < f <= 1 for f in args.pools or ()) or any(c < 1 for c in args.chunks or ()):
        raise SystemExit("replay: --pools are fractions in (0, 1], --chunks at least 1")
    if any(t < 1 for t in args.thresholds) or args.jobs < 1:
        raise SystemExit("replay: --thresholds and --jobs are at least 1")
    t0 = time.perf_counter()
    try:
        trace = read_trace(args.trace)
    except (OSError, TraceError) as exc:
        raise SystemExit(f"replay: {exc}") from None
    distinct = trace.distinct()
    if not distinct:
        raise SystemExit("replay: the trace asks no full block")
    rec = trace.recording
    recorded = args.inflight is None and not args.timestamps and rec is not None and trace.ordered()
    events = schedule(
        trace,
        prefill_tps=args.prefill_tps,
        decode_ms=args.decode_ms,
        inflight=args.inflight,
        recorded=recorded,
    )
    done = (args.transfers or ("done" if rec is not None else "held")) == "done"
    progress(
        f"replay: {os.path.basename(args.trace)}: {len(trace):,} requests, "
        f"{len(trace.accesses):,} blocks asked, {distinct:,} distinct"
        + (
            f"; recorded on vLLM {rec['vllm']} with a pool of {rec['cache_capacity']:,} chunks"
            if rec
            else ""
        )
        + f" (read in {time.perf_counter() - t0:.1f} s)"
    )
    pools = pools_for(trace, distinct, args.pools, args.chunks)
    routes = check_routes(tuple(ROUTES))
    # What every cell reads, made once before the workers fork.
    _JOB.update(trace=trace, events=events, done=done, nxt=next_uses(trace.accesses))
    tasks = [(r, p, t) for p in pools for r in routes for t in args.thresholds]
    tasks += [("optimum", p, 0) for p in pools]
    cells = run_cells(tasks, args.jobs, progress)
    _JOB.clear()
    recs = records(cells, distinct)
    print(
        f"Hit ratio (blocks loaded / blocks asked) of {args.trace}, by pool size and "
        "store_threshold (t1, t2):"
    )
    print(table(recs, routes, args.thresholds))
    if rec is not None and not args.chunks and not args.pools:
        answers = [recommend(recs, min(distinct, rec["cache_capacity"]))]
    else:
        answers = [recommend(recs, p) for p in pools]
    for line in answers:
        print(line)
    if args.json:
        result = {
            "trace": {
                "path": args.trace,
                "sha256": trace.digest,
                "requests": len(trace),
                "blocks": len(trace.accesses),
                "distinct_blocks": distinct,
                "recording": rec,
            },
            "model": {
                "order": "recorded" if recorded else "inflight" if args.inflight else "timestamps",
                "transfers": "done" if done else "held",
                "inflight": args.inflight,
                "prefill_tps": args.prefill_tps,
                "decode_ms": args.decode_ms,
                "store_batch": STORE_BATCH,
            },
            "replay": recs,
            "recommendation": answers,
        }
        _atomic(args.json, lambda f: json.dump(result, f, indent=1))
    if args.plot:
        plot(args.plot, recs, routes, args.thresholds)
    progress(f"replay: done in {time.perf_counter() - t0:.0f} s")
    return 0
