"""End to end: vLLM's real v1 Scheduler + OffloadingConnector on CPU.

The same multi-turn chat workload (shared system prompts, conversations that
grow by their earlier turns, preemptions, aborts, loads in flight across
steps) runs through the installed vLLM's ``Scheduler`` (0.33.0 in the test
suite, older releases under ``tools/vllm_compat.sh``) with the CPU offloading
manager on:

- ``"arc"``: vLLM's own ARC policy (the oracle);
- ``"arc_cy"``: the name the plugin registers, after
  ``vllm.plugins.load_general_plugins()``, as an operator configures it; it
  must resolve to the compiled core;
- ``"ARCCachePolicy"`` + ``cache_policy_module_path="arc_cy"``: the
  documented route without the plugin;
- ``"arc_cy"`` in a fresh process with ``ARC_CY_NO_EXTENSIONS=1``: the pure
  Python twin, chosen the operator way.

Every run must make exactly the decisions of vLLM's ARC: the same lookups
hit, the same keys stored, evicted, loaded and rejected in the same order,
and the same final T1/T2/B1/B2 state. The stub spec and the harness are in
``arc_cy_harness.offload_stub``, the workload in ``arc_cy_harness.chat_workload``, the
recorder and the scenarios in ``tests/recorder.py``.

The child process runs vLLM's ARC too, and the twin is compared with that
run: vLLM's scheduler iterates sets of request ids (e.g. finished requests'
final stores), so the order of manager calls, and with it the decisions,
depends on the process's string hash seed. Runs are comparable within one
process, or across processes with the same PYTHONHASHSEED.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any

import pytest

pytest.importorskip("vllm")  # the imports below need it


from arc_cy_harness import offload_stub
from recorder import SCENARIOS, TEST_HARNESS
from scheduler_runs import TwinProcess, check_every_route

pytestmark = pytest.mark.compat


@pytest.fixture(scope="module")
def twin(model_dir: str, tmp_path_factory: pytest.TempPathFactory):
    process = TwinProcess(model_dir, tmp_path_factory.mktemp("twin") / "runs.json")
    yield process
    if process.proc.poll() is None:
        process.proc.kill()
        process.proc.communicate()


def _by_kind(log: list[list[Any]]) -> dict[str, list[Any]]:
    """The log split into the sequences the policies must agree on."""
    return {
        "hits": [e[1] for e in log if e[0] == "hit"],
        "loads": [e[1] for e in log if e[0] == "load"],
        "stores": [e[2] for e in log if e[0] == "store"],
        "evictions": [e[3] for e in log if e[0] == "store"],
        "rejects": [e[1] for e in log if e[0] == "reject"],
    }


def _assert_same_run(oracle: dict[str, Any], other: dict[str, Any]) -> None:
    label = other["policy_class"]
    expected, actual = _by_kind(oracle["log"]), _by_kind(other["log"])
    for kind in expected:
        assert actual[kind] == expected[kind], f"{label}: {kind} differ"
    # No store that vLLM's ARC accepts is ever rejected (or vice versa).
    oracle_verdicts = [e[0] for e in oracle["log"] if e[0] in ("store", "reject")]
    verdicts = [e[0] for e in other["log"] if e[0] in ("store", "reject")]
    for i, (want, got) in enumerate(zip(oracle_verdicts, verdicts)):
        assert got == want, f"{label}: store #{i} {got}, vLLM arc {want}"
    assert len(verdicts) == len(oracle_verdicts)
    # The whole interleaving, the same raw keys, the same end state.
    assert other["log"] == oracle["log"], label
    assert other["keys_sha256"] == oracle["keys_sha256"], label
    assert other["state"] == oracle["state"], label
    assert other["stats"] == oracle["stats"], label
    assert other["worker"] == oracle["worker"], label
    assert other["stores_skipped"] == oracle["stores_skipped"], label


def _assert_workload_exercised(run: dict[str, Any], scenario: str) -> None:
    """The run did what the scenario is there for (no vacuous pass)."""
    log, stats = run["log"], run["stats"]
    kinds = Counter(e[0] for e in log)
    evicting = [e for e in log if e[0] == "store" and e[3]]
    evicted_while_loading = [e for e in evicting if e[4] > 0]

    # Every conversation turn ended, normally or by abort.
    assert stats["requests"] == stats["finished"] + stats["aborted"]
    assert stats["finished"] > 100
    assert stats["aborted"] > 0
    assert stats["preempted"] > 0
    assert kinds["store"] > 50
    assert len(evicting) > 20
    assert sum(len(e[3]) for e in evicting) > 200
    assert kinds["hit"] > 0 and kinds["load"] > 0
    assert evicted_while_loading, "no store evicted while a load was in flight"
    # Every load job the scheduler sent reached the worker and completed.
    assert run["worker"]["loads"] == stats["load_jobs"] == kinds["load"]
    assert run["worker"]["stores"] == stats["store_jobs"]
    state = run["state"]
    assert len(state["b1"]) + len(state["b2"]) > 0
    if scenario == "roomy":
        assert kinds["load"] >= 10
        assert len(evicted_while_loading) >= 10
        assert stats["aborted_while_loading"] > 0
        # Reused chunks were promoted to T2 and evicted from it, and ghost
        # hits moved the adaptive target.
        assert state["t2"] and state["b2"]
        assert state["target_t1_size_max"] > 0
    if scenario == "tight":
        assert run["num_chunks"] == 24  # from cpu_bytes_to_use
        assert kinds["reject"] > 0
    else:
        assert run["num_chunks"] == SCENARIOS[scenario]["num_chunks"]
    if scenario == "threshold":
        assert run["store_threshold"] == 2
        assert run["stores_skipped"] > 0
    else:
        assert run["stores_skipped"] == 0


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scheduler_runs_identical_with_arc_cy(
    scenario: str, model_dir: str, twin: TwinProcess, plugins_loaded: None
) -> None:
    check_every_route(model_dir, scenario, twin, _assert_same_run, _assert_workload_exercised)


def test_stub_spec_is_loaded_out_of_tree(model_dir: str) -> None:
    """vLLM built the connector's spec from spec_module_path, and its
    manager is the real CPUOffloadingManager."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    harness = offload_stub.SchedulerHarness(
        model_dir,
        offload_stub.offloading_extra_config("lru", num_chunks=8),
        **TEST_HARNESS,
    )
    assert type(harness.manager) is CPUOffloadingManager
    assert harness.manager._num_chunks == 8
    assert isinstance(harness.stub_worker, offload_stub.StubOffloadingWorker)
    with pytest.raises(ValueError, match="num_chunks or cpu_bytes_to_use"):
        offload_stub.SchedulerHarness(
            model_dir,
            offload_stub.offloading_extra_config("lru"),
            **TEST_HARNESS,
        )


@pytest.mark.parametrize("allocate", ["prepare_store", "prepare_write"])
@pytest.mark.parametrize("pin", ["prepare_load", "prepare_read"])
def test_recorder_rejects_evicting_a_pinned_chunk(allocate: str, pin: str) -> None:
    """The recorder's safety check, on both routes' calls: a store (or a
    tiering promotion) that evicts a chunk pinned by a load (or a cascade
    read), or one still being stored, fails the run."""
    from types import SimpleNamespace

    from recorder import DecisionRecorder

    evicting: list[bytes] = []

    def allocate_chunks(keys: Collection[bytes], ctx: Any) -> Any:
        return SimpleNamespace(keys_to_store=list(keys), evicted_keys=list(evicting))

    manager = SimpleNamespace(
        **{pin: lambda keys, ctx: None, allocate: allocate_chunks},
        stores_skipped_in_current_batch=0,
    )
    recorder = DecisionRecorder(manager)
    getattr(manager, pin)([b"pinned"], None)
    getattr(manager, allocate)([b"new"], None)  # evicts nothing: fine
    for victim in (b"pinned", b"new"):  # loading; still being stored
        evicting[:] = [victim]
        with pytest.raises(AssertionError, match="pinned or still being stored"):
            getattr(manager, allocate)([b"other"], None)
    kinds = {"prepare_store": "store", "prepare_write": "promote"}
    assert [e[0] for e in recorder.log] == [pin.removeprefix("prepare_"), kinds[allocate]]
