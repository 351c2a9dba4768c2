"""Recording (ARC_CY_RECORD_TRACE, arc_cy._record), on both policies and both
implementations: what a recording holds (the trace format, keys only as
keyed ids), that it never changes a decision (a lockstep through vLLM's
manager with it on and off), and that no fault stops serving: each is one
WARNING, recording off, the policy going on."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arc_cy import _record
from arc_cy import _trace as tr
from helpers import ALL_IMPLEMENTATIONS, ReqContext, keysnap, load_plus_class, load_policy_class

KEY16 = bytes(range(16))
K0, K1 = int.from_bytes(KEY16[:8], "little"), int.from_bytes(KEY16[8:], "little")
# SipHash-2-4 under the key 00..0f (Aumasson and Bernstein's paper and its
# reference vectors): of no bytes, and of the 15 bytes 00..0e.
VECTORS = {0: 0x726FDB47DD0E0E31, 15: 0xA129CA6149BE45E5}


def compiled_ids() -> Any:
    from arc_cy._core.arc import keyed_ids

    return keyed_ids


IDS = {"cython": compiled_ids, "python": lambda: _record.keyed_ids}


@pytest.mark.parametrize("impl", ALL_IMPLEMENTATIONS)
def test_ids_are_siphash_2_4_of_the_papers_vectors(impl: str) -> None:
    ids = IDS[impl]()
    for size, want in VECTORS.items():
        assert _record.siphash24(bytes(range(size)), K0, K1) == want
        assert ids([[bytes(range(size))], []], K0, K1) == [b"%d" % (want >> 1), b""]


@pytest.mark.sanitize
@pytest.mark.compiled
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.binary(max_size=70), max_size=12), max_size=4), st.integers(0, 2**64 - 1)
)
def test_the_compiled_ids_are_the_pythons(requests: list[list[bytes]], k0: int) -> None:
    want = _record.keyed_ids(requests, k0, K1)
    assert compiled_ids()(requests, k0, K1) == want
    assert compiled_ids()([tuple(keys) for keys in requests], k0, K1) == want


@pytest.mark.sanitize
@pytest.mark.core_only
@pytest.mark.parametrize(
    ("requests", "k0", "error"),
    [
        ([b"ab"], 1, TypeError),  # a request not a list or tuple
        (([b"a"],), 1, TypeError),  # requests not a list
        (iter([[b"a"]]), 1, TypeError),
        ([[b"a"], iter([b"a"])], 1, TypeError),
        ([[b"a", bytearray(b"b")]], 1, TypeError),  # an item not bytes
        ([[type("B", (bytes,), {})(b"a")]], 1, TypeError),  # nor a subclass of it
        ([[b"a"]], -1, OverflowError),  # a key outside 64 bits
        ([[b"a"]], 2**64, OverflowError),
    ],
)
def test_the_compiled_ids_refuse_what_is_not_a_list_of_bytes(
    impl: str, requests: Any, k0: int, error: type
) -> None:
    with pytest.raises(error):
        compiled_ids()(requests, k0, K1)


@pytest.mark.sanitize
@pytest.mark.core_only
def test_the_compiled_ids_hash_their_own_copy_while_another_thread_changes_the_list(
    impl: str,
) -> None:
    keys = [os.urandom(36) for _ in range(20_000)]
    done = threading.Event()

    def churn() -> None:
        while not done.is_set():
            keys.append(os.urandom(36))
            keys[0] = os.urandom(36)
            del keys[-1]

    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(50):
            # The ids of one state of the list (20,000 or 20,001 keys).
            [ids] = compiled_ids()([keys], K0, K1)
            assert ids.count(b",") + 1 in (20_000, 20_001)
    finally:
        done.set()
        t.join()


# --- a recording through the policy alone ------------------------------------


@pytest.fixture(params=["arc", "plus"])
def make_policy(request: pytest.FixtureRequest, impl: str) -> Any:
    """ARC or ARC+ of the implementation under test."""
    cls = (load_policy_class if request.param == "arc" else load_plus_class)(impl)
    return cls


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_logged() -> Iterator[list[str]]:
    handler = Warnings()
    _record.logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        _record.logger.removeHandler(handler)


def key(i: int) -> bytes:
    return i.to_bytes(32, "big") + b"\0\0\0\0"


def request(policy: Any, rid: str, blocks: list[int]) -> None:
    """A request as vLLM's manager shows it to a policy: its keys' access,
    then its finish, keys in prefix order (positions of 16 tokens a key)."""
    ctx = ReqContext(req_id=rid)
    keys = [key(b) for b in blocks]
    for j, k in enumerate(keys):
        ctx.set_offload_key_position(k, 16 * (j + 1))
    policy.on_request_access(keys, ctx)
    policy.on_store_miss(keys, ctx)
    policy.on_request_finished((tuple(keys),), set(keys), set(), ctx)


def flush() -> None:
    for rec in list(_record._RECORDERS):
        rec.flush()


REQUESTS = [("a", [1, 2, 3]), ("b", [1, 2, 4]), ("c", []), ("d", [5])]


def test_a_recording_holds_each_finished_request_keyed(
    make_policy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = [tmp_path / "1.jsonl", tmp_path / "2.jsonl"]
    for path in paths:
        monkeypatch.setenv(_record.ENV, str(path))
        policy = make_policy(cache_capacity=8)
        for rid, blocks in REQUESTS:
            request(policy, rid, blocks)
    flush()
    first, second = (tr.read_trace(str(p)) for p in paths)
    # One line a request that reached the CPU tier (c asked nothing), in
    # order; the same key the same id within a file, and only there.
    assert len(first) == 3
    ids = [list(first.blocks(i)) for i in range(3)]
    assert ids[0][:2] == ids[1][:2] and len({*ids[0], *ids[1], *ids[2]}) == 5
    assert set(first.accesses).isdisjoint(second.accesses)  # a new key each recording
    assert list(first.input_length) == [48, 48, 16]  # the last key's end position
    assert first.recording == {
        "format": tr.FORMAT,
        "tokens_per_key": 16,
        "cache_capacity": 8,
        "vllm": first.recording["vllm"],
        "arc_cy": __import__("arc_cy").__version__,
        "policy": make_policy.__name__,
    }
    # No key's bytes, raw or as hex, is in the file.
    data = paths[0].read_bytes()
    assert all(key(b) not in data and key(b).hex().encode() not in data for b in range(6))
    assert oct(paths[0].stat().st_mode & 0o777) == "0o600"


def faulty_path(case: str, tmp_path: Path) -> Path:
    path = tmp_path / "rec.jsonl"
    if case == "exists":
        path.write_bytes(b"an operator's file\n")
    elif case == "directory":
        path.mkdir()
    elif case == "fifo":
        os.mkfifo(path)
    elif case == "symlink":
        path.symlink_to(tmp_path / "elsewhere")
    elif case == "no folder":
        path = tmp_path / "missing" / "rec.jsonl"
    return path


FAULTS = {
    "exists": "it exists (never overwritten)",
    "directory": "it exists (never overwritten)",
    "fifo": "it exists (never overwritten)",
    "symlink": "it exists (never overwritten)",
    "no folder": "cannot create it: No such file or directory",
}


@pytest.mark.parametrize("case", sorted(FAULTS))
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_path_it_cannot_create_is_one_warning_and_the_policy_goes_on(
    make_policy: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    warnings_logged: list[str],
    case: str,
    when: str,
) -> None:
    """Found at construction (before), or made between it and the first
    finished request (after: the writer's exclusive create finds it)."""
    path = tmp_path / "rec.jsonl" if case != "no folder" else tmp_path / "missing" / "r.jsonl"
    if when == "before":
        path = faulty_path(case, tmp_path)
    plain = make_policy(cache_capacity=8)
    monkeypatch.setenv(_record.ENV, str(path))
    policy = make_policy(cache_capacity=8)
    monkeypatch.delenv(_record.ENV)
    if when == "after":
        path = faulty_path(case, tmp_path)
    before = path.read_bytes() if case == "exists" else None
    for rid, blocks in REQUESTS * 3:
        request(policy, rid, blocks)
        request(plain, rid, blocks)
    flush()
    assert len(warnings_logged) == 1 and FAULTS[case] in warnings_logged[0], warnings_logged
    assert keysnap(policy) == keysnap(plain)
    if before is not None:
        assert path.read_bytes() == before
    if case == "fifo":
        assert path.is_fifo()


def test_a_size_limit_ends_on_a_whole_line(
    make_policy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warnings_logged: list[str]
) -> None:
    path = tmp_path / "rec.jsonl"
    monkeypatch.setenv(_record.ENV, str(path))
    monkeypatch.setenv(_record.MAX_MB_ENV, "1")
    policy = make_policy(cache_capacity=64)
    for i in range(3000):  # about 20 bytes an id, 100 ids a line: 6 MB
        request(policy, f"r{i}", list(range(i, i + 100)))
        if i % 100 == 0:
            flush()
    flush()
    assert len(warnings_logged) == 1 and "size limit, 1 MiB" in warnings_logged[0]
    assert 0 < path.stat().st_size <= 1 << 20
    trace = tr.read_trace(str(path))  # whole lines only
    assert 100 < len(trace) < 3000 and path.read_bytes().endswith(b"}\n")


def test_a_disk_that_takes_nothing_stops_recording_not_the_scheduler(
    make_policy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warnings_logged: list[str]
) -> None:
    stuck = threading.Event()

    def never(self: Any, fd: int, lines: list[bytes]) -> None:
        stuck.wait(10)

    monkeypatch.setattr(_record.Recorder, "_write_lines", never)
    monkeypatch.setattr(_record, "BACKLOG", 1000)
    monkeypatch.setenv(_record.ENV, str(tmp_path / "rec.jsonl"))
    policy = make_policy(cache_capacity=64)
    for i in range(200):
        request(policy, f"r{i}", list(range(i, i + 20)))
    stuck.set()
    assert len(warnings_logged) == 1 and "has not taken the last 1,000 keys" in warnings_logged[0]


class AnswersOnce:
    """A context that tells each key's position once: to the policy's
    order_request_keys; the recorder's question then fails."""

    def __init__(self, rid: str) -> None:
        self.req_id, self.asked = rid, set()

    def get_offload_key_position(self, key: Any) -> int:
        if key in self.asked:
            raise RuntimeError("asked twice")
        self.asked.add(key)
        return len(self.asked)


def test_a_context_that_fails_is_one_warning_and_the_policy_goes_on(
    make_policy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warnings_logged: list[str]
) -> None:
    plain = make_policy(cache_capacity=8)
    monkeypatch.setenv(_record.ENV, str(tmp_path / "rec.jsonl"))
    policy = make_policy(cache_capacity=8)
    for p in (policy, plain):
        keys = [key(1), key(2)]
        p.on_request_access(keys, AnswersOnce("a"))
        p.on_request_finished((tuple(keys),), set(), set(keys), AnswersOnce("a"))
        request(p, "after", [3])
    flush()
    assert len(warnings_logged) == 1 and "RuntimeError: asked twice" in warnings_logged[0]
    assert keysnap(policy) == keysnap(plain)
    assert (tmp_path / "rec.jsonl").read_bytes() == b""  # off from the first line


def test_a_vllm_whose_manager_never_finishes_a_request_is_refused(
    make_policy: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warnings_logged: list[str]
) -> None:
    # vLLM 0.30's base: no on_request_finished (without vLLM, a caller may
    # drive the policy itself, and recording goes on).
    monkeypatch.setattr(_record, "HAVE_VLLM", True)
    monkeypatch.setattr(_record, "CachePolicy", type("CachePolicy", (), {}))
    monkeypatch.setenv(_record.ENV, str(tmp_path / "rec.jsonl"))
    policy = make_policy(cache_capacity=8)
    request(policy, "a", [1])
    flush()
    assert len(warnings_logged) == 1 and "never calls on_request_finished" in warnings_logged[0]
    assert not (tmp_path / "rec.jsonl").exists()


# --- other processes ----------------------------------------------------------

CHILD = """
from helpers import ReqContext, load_policy_class
policy = load_policy_class({impl!r})(cache_capacity=8)
for i in range({requests}):
    ctx = ReqContext(req_id=str(i))
    keys = [(i * 7 + j).to_bytes(36, "big") for j in range(50)]
    policy.on_request_access(keys, ctx)
    policy.on_request_finished((tuple(keys),), set(keys), set(), ctx)
"""


def child(impl: str, env: dict[str, str], requests: int = 2000, **kw: Any) -> Any:
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
    return subprocess.Popen(
        [sys.executable, "-P", "-c", code + CHILD.format(impl=impl, requests=requests)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # vLLM's logging writes to stdout
        text=True,
        **kw,
    )


def test_two_processes_never_write_the_same_file(impl: str, tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    procs = [child(impl, {_record.ENV: str(path)}) for _ in range(2)]
    errs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    # One made the file and wrote all its lines; the other said why not.
    assert len(tr.read_trace(str(path))) == 2000
    assert sum("it exists (never overwritten)" in e for e in errs) == 1, errs
    # {pid} gives each its own.
    each = str(tmp_path / "rec-{pid}.jsonl")
    procs = [child(impl, {_record.ENV: each}) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sorted(len(tr.read_trace(str(f))) for f in tmp_path.glob("rec-*.jsonl")) == [2000, 2000]


def test_a_full_disk_ends_the_file_on_a_whole_line(impl: str, tmp_path: Path) -> None:
    """The kernel's own refusal (RLIMIT_FSIZE, EFBIG) cuts a write short."""
    import resource
    import signal

    path = tmp_path / "rec.jsonl"

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))

    proc = child(impl, {_record.ENV: str(path)}, preexec_fn=limit)
    err = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, err
    assert err.count("arc_cy: not recording") == 1 and "writing failed: File too large" in err
    assert 0 < path.stat().st_size <= 300_000
    trace = tr.read_trace(str(path))
    assert 100 < len(trace) < 2000


# --- through vLLM's manager: no decision changes ------------------------------


@pytest.mark.needs_vllm
@pytest.mark.parametrize("policy", ["arc_cy", "arc_cy_plus"])
@pytest.mark.parametrize("threshold", [1, 2])
def test_recording_changes_no_decision(
    impl: str, policy: str, threshold: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped trace's first 1,000 requests through two managers in
    lockstep, recording on and off: the same result from every call, the
    same lists and target after every request's finish."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from arc_cy import _replay as rp

    twin = {"arc_cy": "arc_cy._twin.arc", "arc_cy_plus": "arc_cy._twin.plus"}[policy]
    module = {"cython": "arc_cy._core.arc", "python": twin}[impl]
    cls = "ARCPlusCachePolicy" if policy == "arc_cy_plus" else "ARCCachePolicy"
    trace = tr.read_trace(
        str(Path(__file__).parents[1] / "bench/data/mooncake_synthetic_trace.jsonl")
    )
    part = tr.trace_of(
        (trace.timestamp_ms[i], trace.input_length[i], trace.output_length[i], trace.blocks(i))
        for i in range(1000)
    )
    path = tmp_path / "rec.jsonl"
    managers = []
    for record in (True, False):
        if record:
            monkeypatch.setenv(_record.ENV, str(path))
        managers.append(
            CPUOffloadingManager(
                num_chunks=800,
                cache_policy=cls,
                cache_policy_module_path=module,
                store_threshold=threshold,
            )
        )
        monkeypatch.delenv(_record.ENV, raising=False)
    on, off = (rp.Replayer(m, rp.trace_keys(part), log=True) for m in managers)
    reached = []  # the requests some of whose keys reached the policy
    finished = off.m._policy.on_request_finished

    def counted(key_groups: Any, *args: Any) -> None:
        reached.append(any(key_groups))
        finished(key_groups, *args)

    off.m._policy.on_request_finished = counted
    for kind, i in rp.schedule(part):
        for r in (on, off):
            (r.start if kind == 0 else r.finish)(i)
        assert on.decisions == off.decisions
        if kind == 1:  # a finish: where the recorder is called
            assert keysnap(on.m._policy) == keysnap(off.m._policy)
    flush()
    # What the run reached: hits, evictions, ghost hits (ARC's target moved,
    # ARC+ counted ghosts that returned), and a line for each request some
    # of whose keys reached the policy.
    p = on.m._policy
    adapted = p.target_t1_size > 0 if policy == "arc_cy" else p.b1_returned + p.b2_returned > 0
    assert on.hits > 30 and on.evicted > 1000 and adapted
    assert len(tr.read_trace(str(path))) == sum(reached) > 50
