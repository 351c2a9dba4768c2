"""The trace format, read and written: the Mooncake FAST'25 trace release's
(one JSON object a line: ``timestamp`` in ms, ``input_length`` and
``output_length`` in tokens, ``hash_ids``: the request's prefix blocks, equal
ids the same block), which arc_cy's recordings extend with one field on
their first line, ``"arc_cy_recording"``: what the replay needs that the
format lacks (tokens per key, the pool's ``cache_capacity``, the vLLM
release). Mooncake's own tools read the four fields and ignore it.

A Mooncake trace's blocks are 512 tokens, and vLLM offloads full blocks
only, so a request asks the first ``input_length // 512`` of its ids. A
recording holds the keys the CPU tier saw, all full: a request asks every
id. ``read_trace`` reads either into a ``Trace`` (about 8 bytes a block
asked), in arrival order, and refuses a malformed file with the line and
what is wrong (``TraceError``); a file with a ``.sha256`` beside it
(``sha256sum`` format) must match it.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

TOKENS_PER_BLOCK = 512  # a Mooncake trace's block: one hash id, one offload key
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
HEADER = "arc_cy_recording"  # the recording's field, on its first line
ORDER = "order"
"""A recording's field of a line: where the request looked up and loaded,
where it stored, and where it finished, in the order of the policy's
events, which the replay follows (its first load's pin, else its stores';
its first store of a miss, else its finish; its finish)."""
COUNTS = ("device_hits", "loadable")
"""A recording's fields of a line, each a count of the line's leading ids:
``device_hits``, those the device's prefix cache served (never looked up
in the CPU tier; offered for store when nothing was loaded), default 0;
``loadable``, those the CPU tier may load (a key past the prompt's last
token but one is not looked up), default all."""
FORMAT = 1  # the recording format's version, HEADER's "format"
LIMIT = 2**63  # every number is a non-negative integer below this (an int64)


class TraceError(ValueError):
    """A trace file that is not in the format, or not the file its hash names."""


class Trace:
    """A trace's requests in arrival order (stable by timestamp), held as
    arrays: request i arrives at ``timestamp_ms[i]``, has ``input_length[i]``
    and ``output_length[i]`` tokens, and asks ``blocks(i)``, the ids of its
    full blocks (``accesses`` holds them all, request after request).
    ``recording`` is a recording's header (``HEADER``), None for a Mooncake
    trace; ``hash_ids`` counts the ids read, partial blocks included."""

    __slots__ = (
        "path",
        "digest",
        "recording",
        "hash_ids",
        "timestamp_ms",
        "input_length",
        "output_length",
        "starts",
        "accesses",
        "device_hits",
        "loadable",
        "order_load",
        "order_store",
        "order_finish",
    )

    def __init__(self, path: str, digest: str, recording: dict[str, Any] | None) -> None:
        self.path, self.digest, self.recording = path, digest, recording
        self.hash_ids = 0
        self.timestamp_ms = array("q")
        self.input_length = array("q")
        self.output_length = array("q")
        self.starts = array("q", [0])  # request i's blocks: accesses[starts[i]:starts[i + 1]]
        self.accesses = array("q")
        self.device_hits = array("q")  # COUNTS, each request's
        self.loadable = array("q")
        self.order_load = array("q")  # ORDER, each request's (-1: none)
        self.order_store = array("q")
        self.order_finish = array("q")

    def __len__(self) -> int:
        return len(self.timestamp_ms)

    def blocks(self, i: int) -> array[int]:
        return self.accesses[self.starts[i] : self.starts[i + 1]]

    def distinct(self) -> int:
        return len(set(self.accesses))

    def _add(
        self,
        timestamp: int,
        input_length: int,
        output_length: int,
        ids: list[int],
        device_hits: int = 0,
        loadable: int | None = None,
        order: tuple[int, int, int] = (-1, -1, -1),
    ) -> None:
        self.timestamp_ms.append(timestamp)
        self.input_length.append(input_length)
        self.output_length.append(output_length)
        self.hash_ids += len(ids)
        if self.recording is None:
            ids = ids[: input_length // TOKENS_PER_BLOCK]
        self.accesses.extend(ids)
        self.starts.append(len(self.accesses))
        self.device_hits.append(min(device_hits, len(ids)))
        self.loadable.append(len(ids) if loadable is None else min(loadable, len(ids)))
        self.order_load.append(order[0])
        self.order_store.append(order[1])
        self.order_finish.append(order[2])

    def ordered(self) -> bool:
        """Whether every request has its place in the recorded order."""
        return len(self) > 0 and min(self.order_load) >= 0

    def _sort(self) -> None:
        """Arrival order: a recording is written as requests finish."""
        ts = self.timestamp_ms
        if all(ts[i] <= ts[i + 1] for i in range(len(ts) - 1)):
            return
        order = sorted(range(len(ts)), key=ts.__getitem__)
        starts, accesses = self.starts, self.accesses
        self.starts, self.accesses = array("q", [0]), array("q")
        for i in order:
            self.accesses.extend(accesses[starts[i] : starts[i + 1]])
            self.starts.append(len(self.accesses))
        for name in self.__slots__[4:]:
            if name in ("starts", "accesses"):
                continue
            old = getattr(self, name)
            setattr(self, name, array("q", (old[i] for i in order)))


def block_key(block: int) -> bytes:
    """The offload key the replay asks for a block id: 36 bytes, as vLLM's
    (a block hash, then a 4-byte group index, 0), the same bytes for the
    same id."""
    return block.to_bytes(8, "big") * 4 + b"\0\0\0\0"


def _number(value: object) -> bool:
    return type(value) is int and 0 <= value < LIMIT


def _count(line: int, obj: dict[str, Any], name: str) -> int:
    value = obj[name]
    if not _number(value):
        raise TraceError(
            f"line {line}: {name!r} must be a non-negative integer below 2**63, not {value!r:.60}"
        )
    assert isinstance(value, int)
    return value


def _object(line: int, raw: bytes) -> dict[str, Any]:
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
    return obj


def _ids(line: int, obj: dict[str, Any]) -> list[int]:
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
    return ids


def _order(line: int, obj: dict[str, Any]) -> tuple[int, int, int]:
    value = obj[ORDER]
    if not (isinstance(value, list) and len(value) == 3 and all(map(_number, value))):
        raise TraceError(f"line {line}: {ORDER!r} must be three non-negative integers")
    if not value[0] <= value[1] <= value[2]:
        raise TraceError(f"line {line}: {ORDER!r} is not in order (load, store, finish)")
    return value[0], value[1], value[2]


HEADER_FIELDS: dict[str, Any] = {
    "format": int,
    "tokens_per_key": (int, type(None)),
    "cache_capacity": int,
    "vllm": str,
    "arc_cy": str,
    "policy": str,
}


def _header(line: int, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TraceError(f"line {line}: {HEADER!r} must be an object, not {type(value).__name__}")
    if value.get("format") != FORMAT:
        raise TraceError(
            f"line {line}: {HEADER!r} is of format {value.get('format')!r:.20}, not {FORMAT}: "
            "a recording of another arc_cy; replay it with that one"
        )
    for name, kind in HEADER_FIELDS.items():
        if not isinstance(value.get(name), kind) or isinstance(value.get(name), bool):
            raise TraceError(f"line {line}: {HEADER!r} has no valid {name!r}")
    return value


def _lines(path: str, digest: Any) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            digest.update(raw)
            if raw.strip():
                yield number, raw


def read_trace(path: str) -> Trace:
    """The trace at ``path``. Raises TraceError, naming the file and the
    line, for anything not in the format (a blank line is skipped), and if
    ``path + ".sha256"`` exists and gives another SHA-256 than the file's.
    A recording's header must be on its first line, and no other."""
    digest = hashlib.sha256()
    trace: Trace | None = None
    try:
        for number, raw in _lines(path, digest):
            obj = _object(number, raw)
            if HEADER in obj and trace is not None:
                raise TraceError(
                    f"line {number}: a second {HEADER!r} (recordings joined?): replay one "
                    "recording at a time, each is one engine's cache"
                )
            if trace is None:
                header = _header(number, obj[HEADER]) if HEADER in obj else None
                trace = Trace(path, "", header)
            ids = _ids(number, obj)
            counts = [_count(number, obj, name) if name in obj else None for name in COUNTS]
            trace._add(
                _count(number, obj, "timestamp"),
                _count(number, obj, "input_length"),
                _count(number, obj, "output_length"),
                ids,
                counts[0] or 0,
                counts[1],
                _order(number, obj) if ORDER in obj else (-1, -1, -1),
            )
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None
    if trace is None:
        raise TraceError(f"{path}: no requests")
    trace.digest = digest.hexdigest()
    sidecar = path + ".sha256"
    if os.path.exists(sidecar):
        with open(sidecar, encoding="utf-8") as f:
            expected = f.read().split()[:1]
        if expected != [trace.digest]:
            raise TraceError(
                f"{path}: its SHA-256 is {trace.digest}, not the "
                f"{expected[0] if expected else 'hash'} that {os.path.basename(sidecar)} "
                "gives: this is not the file it names"
            )
    trace._sort()
    return trace


def trace_of(
    requests: Iterable[tuple[int, int, int, Sequence[int]]],
    recording: dict[str, Any] | None = None,
) -> Trace:
    """A Trace of (timestamp ms, input tokens, output tokens, hash ids)
    rows, unchecked: for tests and tools that make traffic."""
    trace = Trace("<made>", "", recording)
    for timestamp, input_length, output_length, ids in requests:
        trace._add(timestamp, input_length, output_length, list(ids))
    trace._sort()
    return trace


def encode_line(
    timestamp_ms: int,
    input_length: int,
    output_length: int,
    ids: bytes,
    header: dict[str, Any] | None = None,
    counts: dict[str, int | list[int]] | None = None,
) -> bytes:
    """One request's line: ``ids`` are its hash ids, comma-separated ASCII
    decimals; ``header`` (a recording's first line) its HEADER field;
    ``counts`` the recording's fields of the line (COUNTS, ORDER): integers
    or lists of them, whose repr is their JSON."""
    extra = "".join([f', "{k}": {v!r}' for k, v in (counts or {}).items()]).encode()
    if header is not None:
        extra += b', "%s": %s' % (HEADER.encode(), json.dumps(header, sort_keys=True).encode())
    return b'{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]%s}\n' % (
        timestamp_ms,
        input_length,
        output_length,
        ids,
        extra,
    )
