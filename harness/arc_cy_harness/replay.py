"""Replaying a KV-cache request trace through vLLM's CPUOffloadingManager.

The trace format is the Mooncake FAST'25 trace release's (one JSON object a
line: ``timestamp`` in ms, ``input_length`` and ``output_length`` in tokens,
``hash_ids``: the request's prefix blocks of 512 tokens, equal ids the same
block). ``read_trace`` reads any such file and refuses a malformed one with
the line and what is wrong (``TraceError``); a file with a ``.sha256`` beside
it (``sha256sum`` format) must match it.

The service model (``schedule``): request ``i`` starts at its timestamp and
finishes ``input_length / prefill_tps`` seconds plus ``output_length *
decode_ms`` milliseconds later, or, with ``inflight=N``, just before request
``i + N`` starts. Everything a request loads or stores stays in flight, its
chunks pinned, from its start to its finish.

``Replayer`` drives one manager as the scheduler-side connector does: at a
request's start, ``on_new_request``, ``lookup`` of its blocks in order up to
the first one that is not a ready hit, ``prepare_load`` of those hits, then
``prepare_store`` of the rest in batches (one chunked-prefill step each); at
its finish, ``complete_load``, ``complete_store`` and
``on_request_finished``. Each hash id is one offload key (one chunk).

Full blocks only (``full_blocks``): a request's blocks are the first
``input_length // 512`` of its hash ids, as vLLM offloads only full blocks
(the format's last id is nearly always a partial block, and a request of
fewer than 512 input tokens has no full block). ``block_keys`` (what the
replay looks up and stores) and ``accesses`` (what the optimum sees) both
take them, so the policies and the optimum count the same blocks.

``optimum_hits`` is the offline ceiling: Belady's MIN (evict the block whose
next use is farthest; do not admit a block used later than every resident
one) on the same block accesses and pool size.

``FreePolicy``: a policy whose decisions cost nothing, replaying another
run's victims, for the manager's own share of a replay's time.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TOKENS_PER_BLOCK = 512  # the format's block: one hash id, one offload key
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceError(ValueError):
    """A trace file that is not in the format, or not the file its hash names."""


@dataclass(frozen=True)
class TraceRequest:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


LIMIT = 2**63  # every number is a non-negative integer below this (an int64)


def _number(value: object) -> bool:
    return type(value) is int and 0 <= value < LIMIT


def _count(line: int, obj: dict[str, Any], name: str) -> int:
    value = obj[name]
    if not _number(value):
        raise TraceError(
            f"line {line}: {name!r} must be a non-negative integer below 2**63, not {value!r:.60}"
        )
    return value  # type: ignore[return-value]


def parse_line(line: int, raw: bytes) -> TraceRequest:
    """One request from line number ``line``'s bytes; TraceError if it is
    not one."""
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise TraceError(f"line {line}: JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, an int too long
        raise TraceError(f"line {line}: not a JSON value ({exc})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"line {line}: a JSON object expected, not {type(obj).__name__}")
    missing = [name for name in FIELDS if name not in obj]
    if missing:
        raise TraceError(f"line {line}: no {', '.join(map(repr, missing))}")
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        raise TraceError(f"line {line}: 'hash_ids' must be a list, not {type(ids).__name__}")
    for pos, h in enumerate(ids):
        if not _number(h):
            raise TraceError(
                f"line {line}: 'hash_ids'[{pos}] must be a non-negative integer below 2**63, "
                f"not {h!r:.60}"
            )
    if len(set(ids)) != len(ids):
        seen: set[int] = set()
        dup = next(h for h in ids if h in seen or seen.add(h))  # type: ignore[func-returns-value]
        raise TraceError(
            f"line {line}: hash id {dup} appears twice (a request's prefix blocks are distinct)"
        )
    return TraceRequest(
        _count(line, obj, "timestamp"),
        _count(line, obj, "input_length"),
        _count(line, obj, "output_length"),
        tuple(ids),
    )


def read_trace(path: str) -> list[TraceRequest]:
    """The requests of the trace at ``path``, in arrival order. Raises
    TraceError, naming the file and the line, for anything not in the format
    (a blank line is skipped); timestamps must not decrease. If
    ``path + ".sha256"`` exists, the file's SHA-256 must be the one it gives."""
    return read_trace_digest(path)[0]


def read_trace_digest(path: str) -> tuple[list[TraceRequest], str]:
    """read_trace's requests, and the SHA-256 of the bytes they were read
    from (the report names the trace by it)."""
    with open(path, "rb") as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    sidecar = path + ".sha256"
    if os.path.exists(sidecar):
        with open(sidecar, encoding="utf-8") as f:
            expected = f.read().split()[:1]
        if expected != [digest]:
            raise TraceError(
                f"{path}: its SHA-256 is {digest}, not the {expected[0] if expected else 'hash'} "
                f"that {os.path.basename(sidecar)} gives: this is not the file it names"
            )
    requests: list[TraceRequest] = []
    try:
        for number, raw in enumerate(data.split(b"\n"), 1):
            if not raw.strip():
                continue
            req = parse_line(number, raw)
            if requests and req.timestamp_ms < requests[-1].timestamp_ms:
                raise TraceError(
                    f"line {number}: timestamp {req.timestamp_ms} is before the previous "
                    f"request's {requests[-1].timestamp_ms} (the replay needs arrival order)"
                )
            requests.append(req)
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None
    if not requests:
        raise TraceError(f"{path}: no requests")
    return requests, digest


def schedule(
    requests: Sequence[TraceRequest],
    *,
    prefill_tps: float = 10_000.0,
    decode_ms: float = 20.0,
    inflight: int | None = None,
) -> list[tuple[int, int]]:
    """The replay's events in order: ``(0, i)`` request i starts, ``(1, i)``
    it finishes (at equal times, finishes first)."""
    n = len(requests)
    if inflight is not None:
        if inflight < 1:
            raise ValueError("inflight must be at least 1")
        events: list[tuple[int, int]] = []
        for i in range(n):
            if i >= inflight:
                events.append((1, i - inflight))
            events.append((0, i))
        events += [(1, i) for i in range(max(0, n - inflight), n)]
        return events
    if prefill_tps <= 0 or decode_ms < 0:
        raise ValueError("prefill_tps must be positive and decode_ms non-negative")
    timed = []
    for i, r in enumerate(requests):
        start = float(r.timestamp_ms)
        end = start + 1000.0 * r.input_length / prefill_tps + decode_ms * r.output_length
        # At equal times finishes go first, but never a request's own
        # before its start (a request of no length).
        timed.append((start, 1, i, 0))
        timed.append((end, 0 if end > start else 2, i, 1))
    timed.sort()
    return [(kind, i) for _, _, i, kind in timed]


def full_blocks(request: TraceRequest) -> tuple[int, ...]:
    """The hash ids of the request's full blocks: the first ``input_length //
    512`` (vLLM offloads only full blocks; the trace's last id is the partial
    block, if the input does not end on a block boundary)."""
    return request.hash_ids[: request.input_length // TOKENS_PER_BLOCK]


def block_keys(requests: Sequence[TraceRequest]) -> list[list[bytes]]:
    """Each request's offload keys, its full blocks' only (``full_blocks``):
    a 32-byte hash of the hash id, group 0 (vLLM's make_offload_key layout),
    one bytes object per id."""
    made: dict[int, bytes] = {}
    zero = (0).to_bytes(4, "big")
    out = []
    for r in requests:
        keys = []
        for h in full_blocks(r):
            k = made.get(h)
            if k is None:
                k = made[h] = hashlib.sha256(b"block %d" % h).digest() + zero
            keys.append(k)
        out.append(keys)
    return out


def accesses(requests: Sequence[TraceRequest]) -> list[int]:
    """Every block asked, in arrival order: each request's full blocks
    (``full_blocks``), the blocks ``block_keys`` gives the replay."""
    return [h for r in requests for h in full_blocks(r)]


def optimum_hits(sequence: Sequence[Any], capacity: int) -> int:
    """Belady's MIN with bypass: the most hits any cache of ``capacity``
    blocks can have on ``sequence`` (a block is a hit when it is resident as
    it is asked). It knows the future, ignores pins and prefix order, and
    may leave a block out."""
    never = len(sequence)
    nxt = [never] * len(sequence)
    last: dict[Any, int] = {}
    for i in range(len(sequence) - 1, -1, -1):
        b = sequence[i]
        nxt[i] = last.get(b, never)
        last[b] = i
    resident: dict[Any, int] = {}  # block -> its next use
    heap: list[tuple[int, Any]] = []  # (-next use, block), stale entries skipped
    hits = 0
    for i, b in enumerate(sequence):
        n = nxt[i]
        if b in resident:
            hits += 1
        elif n == never or capacity <= 0:
            continue
        elif len(resident) >= capacity:
            while True:
                neg, victim = heap[0]
                if resident.get(victim) == -neg:
                    break
                heapq.heappop(heap)
            if -neg <= n:  # every resident block is used before this one
                continue
            heapq.heappop(heap)
            del resident[victim]
        if n == never:
            del resident[b]
        else:
            resident[b] = n
            heapq.heappush(heap, (-n, b))
    return hits


class Replayer:
    """Drives one CPUOffloadingManager through a schedule's events.

    ``decisions`` lists what the policy decided, call by call: ``("load", i,
    hits)`` for request i's lookups, ``("store", i, evicted keys)`` for each
    prepare_store (None for a failed one). ``manager_ns``: the time spent
    in manager calls (perf_counter_ns around runs of calls only), and
    ``start_ns`` each request's share at its start.
    ``log_evictions``: also log each evict() result (``evictions``), for a
    FreePolicy to replay."""

    def __init__(
        self,
        manager: Any,
        keys: Sequence[Sequence[bytes]],
        *,
        store_batch: int = 16,
        log_evictions: bool = False,
    ) -> None:
        from vllm.v1.kv_offload.base import LookupResult, ReqContext

        self.m = manager
        self.keys = keys
        self.store_batch = store_batch
        self._HIT = LookupResult.HIT
        self._ctx = ReqContext
        self.live: dict[int, tuple[Any, list[bytes], list[list[bytes]]]] = {}
        self.decisions: list[tuple[str, int, Any]] = []
        self.asked = self.hits = 0
        self.store_calls = self.store_failures = self.stored = self.evicted = 0
        self.manager_ns = 0
        self.start_ns: list[int] = []  # each request's start: its lookups, load and stores
        # log_evictions: every evict() result, in order (FreePolicy's script);
        # the policy's evict is wrapped, so that run is not one to time.
        self.evictions: list[Any] = []
        if log_evictions:
            policy = manager._policy
            evict = policy.evict

            def logged(n: int, protected: Any) -> Any:
                out = evict(n, protected)
                self.evictions.append(None if out is None else [k for k, _ in out])
                return out

            policy.evict = logged

    def run(self, events: Sequence[tuple[int, int]]) -> Replayer:
        start, finish = self.start, self.finish
        for kind, i in events:
            if kind == 0:
                start(i)
            else:
                finish(i)
        return self

    def start(self, i: int) -> None:
        m, keys, pc = self.m, self.keys[i], time.perf_counter_ns
        ctx = self._ctx(f"req-{i}")
        for j, k in enumerate(keys):
            ctx.set_offload_key_position(k, (j + 1) * TOKENS_PER_BLOCK)
        HIT, lookup = self._HIT, m.lookup
        t0 = pc()
        m.on_new_request(ctx)
        hits = 0
        for k in keys:
            if lookup(k, ctx) is not HIT:
                break
            hits += 1
        loaded = keys[:hits]
        if loaded:
            m.prepare_load(loaded, ctx)
        spent = pc() - t0
        self.decisions.append(("load", i, hits))
        stores = []
        batch = self.store_batch
        for b in range(hits, len(keys), batch):
            offer = keys[b : b + batch]
            t0 = pc()
            out = m.prepare_store(offer, ctx)
            spent += pc() - t0
            self.store_calls += 1
            if out is None:
                self.store_failures += 1
                self.decisions.append(("store", i, None))
                continue
            self.decisions.append(("store", i, tuple(out.evicted_keys)))
            self.evicted += len(out.evicted_keys)
            if out.keys_to_store:
                stores.append(out.keys_to_store)
                self.stored += len(out.keys_to_store)
        self.manager_ns += spent
        self.start_ns.append(spent)
        self.asked += len(keys)
        self.hits += hits
        self.live[i] = (ctx, loaded, stores)

    def finish(self, i: int) -> None:
        m, pc = self.m, time.perf_counter_ns
        ctx, loaded, stores = self.live.pop(i)
        t0 = pc()
        if loaded:
            m.complete_load(loaded, ctx)
        for keys in stores:
            m.complete_store(keys, ctx)
        m.on_request_finished(ctx)
        self.manager_ns += pc() - t0

    def hit_ratio(self) -> float:
        return self.hits / self.asked if self.asked else 0.0


def lockstep(replayers: Sequence[Replayer], events: Sequence[tuple[int, int]]) -> None:
    """Runs the same events through several replayers at once, event by
    event, the order rotating by one each event: a burst of load on a
    shared machine falls on every one of them alike."""
    n = len(replayers)
    for e, (kind, i) in enumerate(events):
        for j in range(n):
            r = replayers[(e + j) % n]
            if kind == 0:
                r.start(i)
            else:
                r.finish(i)


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The index of the first call where two decision lists differ, or None."""
    for n, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return n
    return None if len(a) == len(b) else min(len(a), len(b))


def mismatches(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The calls where two decision lists differ (a missing call counts)."""
    return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))


class FreePolicy:
    """A cache policy whose decisions cost nothing: ``get``, ``insert`` and
    ``remove`` are one dict operation on the resident chunks, ``evict``
    hands back the next victims of a recorded run (another policy's, on the
    same events), every other call does nothing. A manager driven with it
    makes that run's calls, so its time is the manager's own share of them
    (plus one empty Python call per policy call)."""

    def __init__(self, victims: Sequence[Sequence[bytes] | None]) -> None:
        self.chunks: dict[bytes, Any] = {}
        self.get = self.chunks.get
        self._victims = iter(victims)

    def insert(self, key: bytes, chunk: Any, req_context: Any = None) -> None:
        self.chunks[key] = chunk

    def remove(self, key: bytes) -> None:
        self.chunks.pop(key, None)

    def evict(self, n: int, protected: Any) -> list[tuple[bytes, Any]] | None:
        keys = next(self._victims)
        if keys is None:
            return None
        if len(keys) != n:
            raise RuntimeError(f"FreePolicy: the recorded run evicted {len(keys)} here, not {n}")
        pop = self.chunks.pop
        return [(k, pop(k)) for k in keys]

    def clear(self) -> None:
        self.chunks.clear()

    def _nothing(self, *args: Any) -> None:
        return None

    touch = mark_evictable = mark_non_evictable = _nothing
    on_store_miss = on_request_access = on_request_finished = _nothing
