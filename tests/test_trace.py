"""The trace replay's pure parts (arc_cy._trace, arc_cy._replay), no vLLM:
the trace reader (Mooncake's format and arc_cy's recordings), the full
blocks a request asks, the service schedule and the offline optimum."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arc_cy import _replay as rp
from arc_cy import _trace as tr

pytestmark = pytest.mark.repo

DATA = Path(__file__).resolve().parent.parent / "bench" / "data"
SHIPPED = DATA / "mooncake_synthetic_trace.jsonl"
AGENTIC = DATA / "agentic_coding_sample.jsonl"
GOOD = {"timestamp": 10, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]}


def write(tmp_path: Path, lines: list[bytes], name: str = "t.jsonl") -> str:
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


def line(**fields: object) -> bytes:
    return json.dumps({**GOOD, **fields}).encode()


def raw_requests(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_bytes().splitlines() if x.strip()]


def test_the_shipped_trace_reads_and_its_hash_is_checked() -> None:
    trace = tr.read_trace(str(SHIPPED))
    assert len(trace) == 3993 and trace.recording is None
    assert (trace.timestamp_ms[0], trace.input_length[0], trace.output_length[0]) == (0, 40160, 6)
    assert list(trace.blocks(0)) == list(range(78))  # 40,160 // 512 full blocks of 79
    assert trace.hash_ids == 121_877
    raw = raw_requests(SHIPPED)
    assert len({h for r in raw for h in r["hash_ids"]}) == 43_924  # type: ignore[attr-defined]
    # The format: ceil(input_length / 512) blocks a request.
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // tr.TOKENS_PER_BLOCK) for r in raw)  # type: ignore[operator, arg-type]
    # The replay asks the full blocks only: 1,107 requests of fewer than 512
    # input tokens ask none.
    assert (len(trace.accesses), trace.distinct()) == (117_888, 40_148)
    assert sum(1 for i in range(len(trace)) if not trace.blocks(i)) == 1107
    # The report names the trace by the digest of the bytes read, the sidecar's.
    assert [trace.digest] == (SHIPPED.parent / (SHIPPED.name + ".sha256")).read_text().split()[:1]


def test_the_agentic_trace_reads_and_its_hash_is_checked() -> None:
    trace = tr.read_trace(str(AGENTIC))
    assert [trace.digest] == (DATA / (AGENTIC.name + ".sha256")).read_text().split()[:1]
    assert len(trace) == 1171 and trace.hash_ids == 324_760
    raw = raw_requests(AGENTIC)
    assert len({h for r in raw for h in r["hash_ids"]}) == 13_274  # type: ignore[attr-defined]
    # Its requests end on a partial block or on a block boundary (no id
    # for an empty block): the full blocks are all ids but such a last one.
    assert all(
        len(trace.blocks(i)) in (len(r["hash_ids"]), len(r["hash_ids"]) - 1)  # type: ignore[arg-type]
        for i, r in enumerate(raw)
    )
    assert (len(trace.accesses), trace.distinct()) == (323_718, 12_232)


def test_a_request_asks_its_full_blocks_only() -> None:
    trace = tr.trace_of(
        [
            (0, 1100, 1, (1, 2, 3)),  # 2 full blocks and 76 tokens
            (1, 1024, 1, (1, 2)),  # ends on a block boundary
            (2, 511, 1, (4,)),  # under one block: none
            (3, 2048, 1, (1, 2, 5)),  # fewer ids than full blocks: all of them
        ]
    )
    assert [list(trace.blocks(i)) for i in range(4)] == [[1, 2], [1, 2], [], [1, 2, 5]]
    assert list(trace.accesses) == [1, 2, 1, 2, 1, 2, 5]
    # One key per id: 36 bytes (vLLM's OffloadKey shape), equal ids equal keys.
    keys = [rp.trace_keys(trace)(i) for i in range(4)]
    assert [len(k) for k in keys] == [2, 2, 0, 3]
    assert keys[0][0] == keys[1][0] == keys[3][0] and keys[0][1] == keys[3][1]
    assert len({*keys[0], *keys[3]}) == 3 and all(len(k) == 36 for k in keys[3])


RECORDING = {
    "format": tr.FORMAT,
    "tokens_per_key": 256,
    "cache_capacity": 100,
    "vllm": "0.34.0",
    "arc_cy": "0.2.0",
    "policy": "ARCCachePolicy",
}


def test_a_recording_asks_every_id_and_is_put_in_arrival_order(tmp_path: Path) -> None:
    # A recording's lines come as requests finish; each holds the keys the
    # CPU tier saw, all full (input_length says the prompt's tokens).
    lines = [
        tr.encode_line(30, 100, 2, b"7,8,9", RECORDING),
        tr.encode_line(10, 512, 0, b"1,2"),
        tr.encode_line(20, 0, 0, b"3"),
    ]
    path = tmp_path / "rec.jsonl"
    path.write_bytes(b"".join(lines))
    trace = tr.read_trace(str(path))
    assert trace.recording == RECORDING
    assert list(trace.timestamp_ms) == [10, 20, 30]
    assert [list(trace.blocks(i)) for i in range(3)] == [[1, 2], [3], [7, 8, 9]]
    assert list(trace.input_length) == [512, 0, 100] and list(trace.output_length) == [0, 0, 2]
    # Mooncake's own fields, as Mooncake's tools read them.
    first = json.loads(lines[0])
    fields = {"timestamp": 30, "input_length": 100, "output_length": 2, "hash_ids": [7, 8, 9]}
    assert {k: first[k] for k in tr.FIELDS} == fields


@pytest.mark.parametrize(
    ("header", "what"),
    [
        ({**RECORDING, "format": 2}, "of format 2, not 1"),
        ({**RECORDING, "cache_capacity": "100"}, "no valid 'cache_capacity'"),
        ({**RECORDING, "tokens_per_key": True}, "no valid 'tokens_per_key'"),
        ([1], "must be an object, not list"),
    ],
)
def test_a_recording_header_is_checked(tmp_path: Path, header: object, what: str) -> None:
    path = write(tmp_path, [json.dumps({**GOOD, tr.HEADER: header}).encode()])
    with pytest.raises(tr.TraceError, match=f"line 1: .*{what}"):
        tr.read_trace(path)


def test_joined_recordings_are_refused(tmp_path: Path) -> None:
    first = json.dumps({**GOOD, tr.HEADER: RECORDING}).encode()
    path = write(tmp_path, [first, line(), first])
    with pytest.raises(tr.TraceError, match="line 3: a second 'arc_cy_recording'"):
        tr.read_trace(path)


def test_a_trace_that_is_not_the_file_its_hash_names_is_refused(tmp_path: Path) -> None:
    data = bytearray(SHIPPED.read_bytes())
    data[data.index(b'"output_length": 6') + 17] = ord("7")  # still a valid trace
    copy = tmp_path / SHIPPED.name
    copy.write_bytes(bytes(data))
    (tmp_path / (SHIPPED.name + ".sha256")).write_bytes(
        (SHIPPED.parent / (SHIPPED.name + ".sha256")).read_bytes()
    )
    with pytest.raises(tr.TraceError, match=r"SHA-256 is [0-9a-f]{64}, not the bd070915"):
        tr.read_trace(str(copy))
    (tmp_path / (SHIPPED.name + ".sha256")).unlink()  # no hash beside it: read as it is
    assert tr.read_trace(str(copy)).output_length[0] == 7


def bad_values() -> list[tuple[str, object]]:
    """Each field with each kind of wrong value (a list of fields, None: the
    field missing)."""
    wrong: list[object] = [None, "7", 7.5, True, -1, [], {}, 2**63, 10**400]
    return [
        (name, value)
        for name in tr.FIELDS
        for value in wrong
        if not (name == "hash_ids" and value == [])
    ]


@pytest.mark.parametrize(("field", "value"), bad_values(), ids=lambda v: f"{v!r:.12}")
def test_a_field_of_the_wrong_kind_is_refused_with_its_line_and_name(
    tmp_path: Path, field: str, value: object
) -> None:
    obj = dict(GOOD)
    if value is None:
        del obj[field]
    else:
        obj[field] = value
    path = write(tmp_path, [line(), line(timestamp=11), json.dumps(obj).encode()])
    with pytest.raises(tr.TraceError) as err:
        tr.read_trace(path)
    assert str(err.value).startswith(f"{path}: line 3: ")
    assert repr(field) in str(err.value)


MALFORMED: dict[str, tuple[bytes, str]] = {
    "not JSON": (b'{"timestamp": 1,', "not a JSON value"),
    "a list": (b"[1, 2]", "a JSON object expected, not list"),
    "a number": (b"12", "a JSON object expected, not int"),
    "a string": (b'"x"', "a JSON object expected, not str"),
    "bad UTF-8": (b'{"timestamp": "\xff"}', "not a JSON value"),
    "nested too deeply": (b"[" * 100_000 + b"]" * 100_000, "line 3: "),
    "a hash id not an integer": (line(hash_ids=[1, "2"]), "'hash_ids'[1] must be"),
    "a negative hash id": (line(hash_ids=[1, -2]), "'hash_ids'[1] must be"),
    "a hash id too large": (line(hash_ids=[1, 2**64]), "'hash_ids'[1] must be"),
    "a repeated hash id": (line(hash_ids=[4, 5, 4]), "hash id 4 appears twice"),
    "a header on a later line": (
        json.dumps({**GOOD, tr.HEADER: RECORDING}).encode(),
        "a second 'arc_cy_recording'",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_line_is_refused_with_its_line_and_what_is_wrong(
    tmp_path: Path, case: str
) -> None:
    raw, what = MALFORMED[case]
    path = write(tmp_path, [line(), line(timestamp=11), raw, line(timestamp=12)])
    with pytest.raises(tr.TraceError) as err:
        tr.read_trace(path)
    assert str(err.value).startswith(f"{path}: line 3: ")
    assert what in str(err.value)


def test_blank_lines_are_skipped_and_an_empty_trace_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, [b"", line(), b"  ", line(timestamp=10, hash_ids=[])])
    trace = tr.read_trace(path)
    assert [list(trace.blocks(i)) for i in range(len(trace))] == [[1, 2], []]
    with pytest.raises(tr.TraceError, match="no requests"):
        tr.read_trace(write(tmp_path, [b"", b" "], "empty.jsonl"))


def test_a_trace_out_of_order_is_put_in_arrival_order(tmp_path: Path) -> None:
    # Ties keep the file's order.
    stamps = [(5, 1), (3, 2), (5, 3), (4, 4)]
    path = write(tmp_path, [line(timestamp=t, hash_ids=[h]) for t, h in stamps])
    trace = tr.read_trace(path)
    assert list(trace.timestamp_ms) == [3, 4, 5, 5]
    assert [trace.blocks(i)[0] for i in range(4)] == [2, 4, 1, 3]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from([*tr.FIELDS, tr.HEADER, "x"]), inner, max_size=5)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=40) | json_values.map(lambda v: json.dumps(v).encode()), max_size=6)
)
def test_any_bytes_either_read_or_are_refused_with_a_trace_error(lines: list[bytes]) -> None:
    # Written through a fixed path per example: hypothesis and tmp_path do not mix.
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.jsonl"
        path.write_bytes(b"\n".join(lines))
        try:
            trace = tr.read_trace(str(path))
        except tr.TraceError as exc:
            assert str(exc).startswith(f"{path}: ")
        else:
            assert len(trace) and len(trace.starts) == len(trace) + 1


def requests_at(*spec: tuple[int, int, int]) -> tr.Trace:
    """(timestamp ms, input tokens, output tokens) each, one block each."""
    return tr.trace_of((t, i, o, (n,)) for n, (t, i, o) in enumerate(spec))


def test_the_schedule_follows_timestamps_and_lengths() -> None:
    # 10,000 tokens/s and 20 ms a token: request 0 runs 0 to 100 + 20 ms,
    # request 1 starts at 50 (overlaps), request 2 (of no length) starts
    # at 120 exactly as request 0 finishes (the finish goes first, but not
    # its own before its start), request 1 ends last.
    reqs = requests_at((0, 1000, 1), (50, 5000, 10), (120, 0, 0))
    assert rp.schedule(reqs) == [(0, 0), (0, 1), (1, 0), (0, 2), (1, 2), (1, 1)]
    # 1,000 tokens/s, decoding free: 0 to 1000, 50 to 5050, 120 to 120.
    assert rp.schedule(reqs, prefill_tps=1000, decode_ms=0) == [
        (0, 0), (0, 1), (0, 2), (1, 2), (1, 0), (1, 1),
    ]  # fmt: skip


def test_a_fixed_number_in_flight() -> None:
    reqs = requests_at(*[(t, 10**6, 10**6) for t in range(5)])
    assert rp.schedule(reqs, inflight=2) == [
        (0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (0, 3), (1, 2), (0, 4), (1, 3), (1, 4),
    ]  # fmt: skip
    with pytest.raises(ValueError):
        rp.schedule(reqs, inflight=0)


OPTIMUM_CASES = [
    # (sequence, capacity, hits), each worked by hand:
    ([1, 2, 3, 1, 2, 3, 1], 2, 3),  # 3 never beats 1 and 2: left out twice (LRU: 0 hits)
    ([1, 2, 3, 2, 3, 1], 2, 2),  # 3 evicts 1, used last
    ([1, 1, 1], 1, 2),
    ([1, 2, 1, 2], 0, 0),
    ([1, 2, 3, 4, 1, 2, 3, 4], 4, 4),
    ([1, 2, 3, 4, 1, 2, 3, 4], 3, 3),  # keep three of the four
]


@pytest.mark.parametrize(("sequence", "capacity", "hits"), OPTIMUM_CASES)
def test_the_optimum_on_hand_worked_sequences(
    sequence: list[int], capacity: int, hits: int
) -> None:
    assert rp.optimum_hits(sequence, capacity) == hits


def lru_hits(sequence: list[int], capacity: int) -> int:
    from collections import OrderedDict

    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for b in sequence:
        if b in cache:
            hits += 1
            cache.move_to_end(b)
            continue
        cache[b] = None
        if len(cache) > capacity:
            cache.popitem(last=False)
    return hits


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=80), st.integers(1, 8))
def test_the_optimum_is_never_below_lru_nor_above_every_repeat(
    sequence: list[int], capacity: int
) -> None:
    best = rp.optimum_hits(sequence, capacity)
    repeats = len(sequence) - len(set(sequence))
    assert lru_hits(sequence, capacity) <= best <= repeats
    if capacity >= len(set(sequence)):
        assert best == repeats  # everything fits: every repeat is a hit


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--only", "evict", "--trace", str(SHIPPED)], "--trace is replay's: add replay to --only"),
        (["--only", "replay", "--trace", "no/such.jsonl"], "--trace: no file no/such.jsonl"),
        (["--reference", "--trace", str(SHIPPED)], "--reference needs a whole run"),
    ],
)
def test_bench_run_refuses_a_trace_it_would_not_replay(args: list[str], error: str) -> None:
    import subprocess
    import sys

    run = SHIPPED.parent.parent / "run.py"
    proc = subprocess.run([sys.executable, "-P", str(run), *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert error in proc.stderr


def rec(pool: int, threshold: int, **hits: float) -> dict[str, object]:
    return {"pool_chunks": pool, "store_threshold": threshold, "hit_ratio": hits}


def test_the_answer_names_the_best_setting_only_past_the_margin() -> None:
    recs = [
        rec(100, 1, vllm_lru=0.200, vllm_arc=0.210, arc_cy=0.210, arc_cy_plus=0.230, optimum=0.5),
        rec(100, 2, vllm_lru=0.240, vllm_arc=0.220, arc_cy=0.220, arc_cy_plus=0.220, optimum=0.5),
        rec(200, 1, vllm_lru=0.400, vllm_arc=0.405, arc_cy=0.405, arc_cy_plus=0.390, optimum=0.6),
        rec(200, 2, vllm_lru=0.300, vllm_arc=0.300, arc_cy=0.300, arc_cy_plus=0.300, optimum=0.6),
        rec(300, 1, vllm_lru=0.400, vllm_arc=0.500, arc_cy=0.500, arc_cy_plus=0.450, optimum=0.6),
    ]
    assert rp.recommend(recs, 100) == (
        'At 100 chunks: run vLLM lru ("eviction_policy": "lru", "store_threshold": 2): hit '
        "ratio 0.240 against vLLM's default (lru, store_threshold 1) 0.200, 1.20x."
    )
    # 0.405 is 1.25% above 0.400: within the margin.
    assert rp.recommend(recs, 200).startswith("At 200 chunks: keep vLLM's default")
    # arc_cy before vLLM arc at the same hits (the same decisions, faster).
    assert 'run arc_cy ("eviction_policy": "arc_cy")' in rp.recommend(recs, 300)


def test_a_recordings_pools_spread_around_its_own() -> None:
    header = {"cache_capacity": 1000}
    trace = tr.trace_of([(0, 512, 1, (1,))], recording=header)
    assert rp.pools_for(trace, 3000, None, None) == [250, 500, 1000, 2000, 3000]
    assert rp.pools_for(trace, 3000, [0.5], None) == [1500]  # asked: as asked
    assert rp.pools_for(trace, 3000, None, [7, 7, 9]) == [7, 9]
    plain = tr.trace_of([(0, 512, 1, (1,))])
    assert rp.pools_for(plain, 1000, None, None) == [20, 50, 100, 250, 500, 1000]


def test_a_recordings_order_is_its_schedule(tmp_path: Path) -> None:
    # a looked up and loaded at 1, stored at 3 and finished at 6; b loaded
    # nothing (its lookups at its stores, 2), finished at 4; c stored
    # nothing either (all of it at 5).
    lines = [
        tr.encode_line(5, 64, 0, b"3", RECORDING, {"order": [5, 5, 5]}),
        tr.encode_line(2, 64, 0, b"2", None, {"order": [2, 2, 4]}),
        tr.encode_line(1, 64, 0, b"1", None, {"order": [1, 3, 6], "device_hits": 1, "loadable": 1}),
    ]
    path = tmp_path / "rec.jsonl"
    path.write_bytes(b"".join(lines))
    trace = tr.read_trace(str(path))
    assert trace.ordered() and list(trace.device_hits) == [1, 0, 0]
    assert list(trace.loadable) == [1, 1, 1]
    assert rp.schedule(trace, recorded=True) == [
        (0, 0), (0, 1), (2, 1), (2, 0), (1, 1), (0, 2), (2, 2), (1, 2), (1, 0),
    ]  # fmt: skip
    # Without the order on every line, there is no recorded schedule.
    assert not tr.read_trace(write(tmp_path, [line()])).ordered()


@pytest.mark.parametrize(
    ("fields", "what"),
    [
        ({"order": [3, 4]}, "'order' must be three non-negative integers"),
        ({"order": [3, 4, -1]}, "'order' must be three non-negative integers"),
        ({"order": [5, 4, 6]}, "'order' is not in order"),
        ({"device_hits": -1}, "'device_hits' must be a non-negative integer"),
        ({"loadable": "2"}, "'loadable' must be a non-negative integer"),
    ],
)
def test_a_recordings_line_fields_are_checked(tmp_path: Path, fields: dict, what: str) -> None:
    path = write(tmp_path, [line(), line(timestamp=11, **fields)])
    with pytest.raises(tr.TraceError, match=f"line 2: {what}"):
        tr.read_trace(path)
