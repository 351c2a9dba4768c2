"""The tiering route: arc_cy as the policy of vLLM's TieringOffloadingSpec.

vLLM 0.33's ``TieringOffloadingSpec`` (``spec_name`` only: it is registered
in vLLM) builds a ``TieringOffloadingManager`` whose CPU primary tier, a
``CPUPrimaryTierOffloadingManager``, takes the same ``eviction_policy`` and
``cache_policy_module_path`` settings as the plain CPU spec. The real v1
Scheduler runs the chat workload of tests/test_scheduler_e2e.py through it,
on CPU:

- ``tier_example``: with vLLM's in-memory ``"example"`` secondary tier, the
  one that needs no hardware. Every stored chunk is cascaded to it (pinned
  in the primary tier while the cascade is in flight), and chunks evicted
  from the primary tier are found there and promoted back, which allocates
  (and evicts) in the primary tier from the tiering manager's own path;
- ``tier_primary_only``: no secondary tier.

The spec's GPU worker cannot run here; the harness puts the stub transfer
worker under it (loads held for two steps). Everything on the scheduler
side is vLLM's.

arc_cy, by plugin name (``"arc_cy"``) and by module path
(``"ARCCachePolicy"`` + ``cache_policy_module_path="arc_cy"``), and the pure
twin (plugin name, child process with ``ARC_CY_NO_EXTENSIONS=1``) must make
exactly vLLM arc's decisions through the primary tier: the same hits, loads,
cascade reads, stores, promotions, evictions and rejections in the same
order, and the same final T1/T2/B1/B2 state.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

pytest.importorskip("vllm")  # the imports below need it


from recorder import TIERING_SCENARIOS, recorded_run
from scheduler_runs import TwinProcess, check_every_route

pytestmark = pytest.mark.compat

VLLM_LRU = "vllm.v1.kv_offload.cpu.policies.lru.LRUCachePolicy"


@pytest.fixture(scope="module")
def twin(model_dir: str, tmp_path_factory: pytest.TempPathFactory):
    process = TwinProcess(
        model_dir, tmp_path_factory.mktemp("twin") / "runs.json", TIERING_SCENARIOS
    )
    yield process
    if process.proc.poll() is None:
        process.proc.kill()
        process.proc.communicate()


def _assert_same_run(oracle: dict[str, Any], other: dict[str, Any]) -> None:
    label = other["policy_class"]
    for kind in ("hit", "load", "read", "store", "promote", "reject", "promote_reject"):
        expected = [e for e in oracle["log"] if e[0] == kind]
        assert [e for e in other["log"] if e[0] == kind] == expected, f"{label}: {kind}"
    assert other["log"] == oracle["log"], label
    assert other["keys_sha256"] == oracle["keys_sha256"], label
    assert other["state"] == oracle["state"], label
    assert other["stats"] == oracle["stats"], label
    assert other["worker"] == oracle["worker"], label


def _assert_workload_exercised(run: dict[str, Any], scenario: str) -> None:
    """The run went through the paths the scenario is there for."""
    log, stats = run["log"], run["stats"]
    kinds = Counter(e[0] for e in log)
    evicting = [e for e in log if e[0] in ("store", "promote") and e[3]]
    assert stats["requests"] == stats["finished"] + stats["aborted"]
    assert stats["finished"] > 100 and stats["aborted"] > 0
    assert kinds["store"] > 50 and kinds["hit"] > 0 and kinds["load"] > 10
    assert len(evicting) > 20
    assert sum(len(e[3]) for e in evicting) > 200
    assert any(e[4] > 0 for e in evicting), "no eviction while chunks were pinned"
    assert run["worker"]["loads"] == stats["load_jobs"] == kinds["load"]
    assert run["state"]["t2"] and run["state"]["b1"]
    if scenario == "tier_example":
        assert run["num_chunks"] == 64
        # Cascades pinned chunks, promotions allocated and evicted.
        assert kinds["read"] > 50
        assert kinds["promote"] > 50
        assert sum(1 for e in evicting if e[0] == "promote") > 20
    else:
        assert run["num_chunks"] == 48
        assert kinds["read"] == kinds["promote"] == kinds["promote_reject"] == 0


@pytest.mark.parametrize("scenario", list(TIERING_SCENARIOS))
def test_tiering_primary_tier_decides_like_vllm_arc(
    scenario: str, model_dir: str, twin: TwinProcess, plugins_loaded: None
) -> None:
    check_every_route(model_dir, scenario, twin, _assert_same_run, _assert_workload_exercised)


def test_tiering_comparison_tells_policies_apart(model_dir: str) -> None:
    """The setting reaches the primary tier, and the comparison above sees a
    different policy: vLLM's lru decides differently from vLLM's arc."""
    arc = recorded_run(model_dir, "arc", "tier_example")
    lru = recorded_run(model_dir, "lru", "tier_example")
    assert lru["policy_class"] == VLLM_LRU
    assert [e for e in lru["log"] if e[0] in ("store", "promote")] != [
        e for e in arc["log"] if e[0] in ("store", "promote")
    ]
