"""arc_cy inside vLLM's real CPUOffloadingManager, against vLLM's own ARC."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")  # the imports below need it

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

import arc_cy
from childproc import PROGS, child_env
from helpers import CHOSEN, MODULES, ghost_hits, manager_state, reuse


def key(i: int) -> bytes:
    return make_offload_key(f"block-{i}".encode(), 0)


def keys(*ids: int) -> list[bytes]:
    return [key(i) for i in ids]


def make_manager(impl: str | None, num_chunks: int) -> CPUOffloadingManager:
    """impl None is vLLM's own ARC; else an arc_cy implementation."""
    if impl is None:
        return CPUOffloadingManager(num_chunks=num_chunks, cache_policy="arc")
    return CPUOffloadingManager(
        num_chunks=num_chunks,
        cache_policy="ARCCachePolicy",
        cache_policy_module_path=MODULES[impl],
    )


def store(
    manager: CPUOffloadingManager, ids: list[int], req: str, finish: bool = True
) -> list[bytes]:
    ctx = ReqContext(req_id=req)
    out = manager.prepare_store(keys(*ids), ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    if finish:
        # refreshes recency head-to-tail: the first block ends up MRU
        manager.on_request_finished(ctx)
    return out.evicted_keys


def adaptive_state(impl: str | None) -> CPUOffloadingManager:
    """The state of vLLM PR 55461's tests: target 3, T1=[3,4], T2=[6,5]."""
    manager = make_manager(impl, num_chunks=4)
    assert store(manager, [1, 2, 3, 4], "r1", finish=False) == []
    assert store(manager, [5, 6], "r2", finish=False) == keys(1, 2)
    ghost_hits(manager, keys(1, 2))  # two b1 ghost hits
    ghost_hits(manager, keys(1))  # one more
    reuse(manager, keys(5, 6))  # ready chunks move to t2
    policy = manager._policy
    assert policy.target_t1_size == 3
    assert list(policy.t1) == keys(3, 4)
    assert list(policy.t2) == keys(6, 5)
    return manager


# pinned, protected, new, evicted (None: the store fails and nothing changes)
PR_55461_CASES = [
    ((), (), (7, 8, 9), (6, 5, 3)),
    ((), (), (7, 8, 9, 10), (6, 5, 3, 4)),
    ((5, 6), (), (7, 8), (3, 4)),
    ((), (5, 6), (7, 8), (3, 4)),
    ((5, 6), (3,), (7,), (4,)),
    ((5, 6), (3,), (7, 8), None),
]


@pytest.mark.compat
@pytest.mark.parametrize("pinned,protected,new,evicted", PR_55461_CASES)
def test_pr_55461_fallback_to_t1(impl, pinned, protected, new, evicted):
    check_pr_55461(impl, pinned, protected, new, evicted)


@pytest.mark.compat
@pytest.mark.parametrize("pinned,protected,new,evicted", PR_55461_CASES)
def test_pr_55461_fallback_to_t1_in_vllm(pinned, protected, new, evicted):
    """The expected outcomes are vLLM's own (run once, not per impl)."""
    check_pr_55461(None, pinned, protected, new, evicted)


def check_pr_55461(impl, pinned, protected, new, evicted):
    manager = adaptive_state(impl)
    if pinned:
        manager.prepare_load(keys(*pinned), ReqContext(req_id="load"))
    before = manager_state(manager)
    out = manager.prepare_store(keys(*protected, *new), ReqContext(req_id="store"))
    if evicted is None:
        assert out is None
        assert manager_state(manager) == before
    else:
        assert out is not None
        assert out.evicted_keys == keys(*evicted)
        assert out.keys_to_store == keys(*new)


@pytest.mark.compat
@pytest.mark.parametrize("pinned,protected,new,evicted", PR_55461_CASES)
def test_pr_55461_state_matches_vllm(impl, pinned, protected, new, evicted):
    managers = [adaptive_state(None), adaptive_state(impl)]
    for manager in managers:
        if pinned:
            manager.prepare_load(keys(*pinned), ReqContext(req_id="load"))
        manager.prepare_store(keys(*protected, *new), ReqContext(req_id="store"))
    assert manager_state(managers[1]) == manager_state(managers[0])


def full_cycle(manager: CPUOffloadingManager) -> None:
    """Store, complete, look up, load, and evict through the manager."""
    assert store(manager, [1, 2, 3], "a") == []
    ctx = ReqContext(req_id="b")
    assert [manager.lookup(k, ctx) for k in keys(1, 2, 3, 4)] == [
        LookupResult.HIT,
        LookupResult.HIT,
        LookupResult.HIT,
        LookupResult.MISS,
    ]
    spec = manager.prepare_load(keys(1), ctx)
    assert len(spec.block_ids) == 1
    out = manager.prepare_store(keys(4, 5), ctx)  # evicts 2: 1 is loading
    assert out is not None and out.evicted_keys == keys(3, 2)  # 1 was MRU
    assert manager.lookup(key(4), ctx) == LookupResult.HIT_PENDING
    manager.complete_store(out.keys_to_store, ctx)
    manager.complete_load(keys(1), ctx)
    manager.on_request_finished(ctx)
    assert manager.lookup(key(2), ctx) == LookupResult.MISS
    assert manager.lookup(key(4), ctx) == LookupResult.HIT


def test_swap_by_module_path(impl, policy_cls):
    manager = make_manager(impl, num_chunks=3)
    assert type(manager._policy) is policy_cls
    full_cycle(manager)


def test_swap_by_module_path_of_the_package():
    manager = CPUOffloadingManager(
        num_chunks=3, cache_policy="ARCCachePolicy", cache_policy_module_path="arc_cy"
    )
    assert type(manager._policy) is arc_cy.ARCCachePolicy
    full_cycle(manager)


def test_swap_by_plugin_name():
    import vllm.plugins

    from arc_cy.plugin import register

    vllm.plugins.load_general_plugins()
    register()  # again: vLLM may load plugins more than once
    register()
    manager = CPUOffloadingManager(num_chunks=3, cache_policy="arc_cy")
    assert type(manager._policy) is arc_cy.ARCCachePolicy
    full_cycle(manager)


def test_plugin_entry_point_in_fresh_processes():
    """tests/progs/plugin_entry_point.py, twice at once, and beside them once
    with ARC_CY_NO_EXTENSIONS mistyped: vLLM's own loader then returns, the
    plugin logs the flag and registers nothing (docs/usage.md, "The guard")."""
    runs = [{}, {}, {"ARC_CY_NO_EXTENSIONS": "y"}]
    procs = [
        subprocess.Popen(
            [sys.executable, "-P", os.path.join(PROGS, "plugin_entry_point.py")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(**extra),
        )
        for extra in runs
    ]
    for extra, proc in zip(runs, procs):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        last = out.strip().splitlines()[-1]
        if extra:
            assert last == "not registered", out
            log = out + err  # vLLM's handler writes to stdout
            assert "ARC_CY_NO_EXTENSIONS='y' is not a boolean" in log, log
            assert "The 'arc_cy' cache policy is NOT registered." in log, log
        else:
            assert last == MODULES[CHOSEN]


def test_plugin_refuses_a_foreign_registration(monkeypatch):
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    from arc_cy.plugin import register

    registry = dict(CachePolicyFactory._registry)
    registry.pop("arc_cy", None)
    monkeypatch.setattr(CachePolicyFactory, "_registry", registry)
    CachePolicyFactory.register_cache_policy(
        "arc_cy", "vllm.v1.kv_offload.cpu.policies.lru", "LRUCachePolicy"
    )
    with pytest.raises(RuntimeError, match="already registered"):
        register()


def test_is_a_vllm_cache_policy(policy_cls):
    assert issubclass(policy_cls, CachePolicy)
    assert isinstance(policy_cls(4), CachePolicy)
