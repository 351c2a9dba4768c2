"""What a policy decided in a scheduler run: the recorder, and the recorded
runs that tests/test_scheduler_e2e.py and tests/test_tiering.py compare.

``DecisionRecorder`` logs the decisions of a CPU offloading manager: vLLM's
``CPUOffloadingManager`` (the stub spec's, in ``offload_stub.py``) or the
tiering route's ``CPUPrimaryTierOffloadingManager``. vLLM builds both
itself, so it wraps the instance's methods rather than subclassing.

``recorded_run()`` runs a scenario's chat workload on one policy and returns
the log; ``python -m recorder`` does the same in another process (the tests
run the pure twin that way).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection
from typing import Any

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext

from arc_cy_harness.chat_workload import ChatWorkload, WorkloadConfig
from arc_cy_harness.offload_stub import LAYER_NAMES, SchedulerHarness, offloading_extra_config


class DecisionRecorder:
    """Logs what the policy of ``manager`` decided, in call order, in ``log``:

    - ``("hit", key)``: ``lookup()`` found ``key`` ready (a CPU cache hit);
    - ``("load", keys)``: ``prepare_load()`` pinned ``keys`` for the GPU;
    - ``("store", offered, stored, evicted, pinned)``: ``prepare_store()``
      accepted: ``stored`` are the keys it allocated, ``evicted`` the keys it
      evicted to make room, ``pinned`` how many chunks were pinned (loads or
      reads in flight, ref_cnt > 0) at that moment;
    - ``("reject", offered)``: ``prepare_store()`` returned None;

    and, on the tiering route's primary tier, the tiering manager's own uses
    of it:

    - ``("read", keys)``: a cascade to a secondary tier pinned ``keys``;
    - ``("promote", offered, stored, evicted, pinned)`` and
      ``("promote_reject", offered)``: a promotion from a secondary tier
      allocated (evicting) or failed to allocate primary chunks.

    On every eviction it checks that no evicted key was pinned by a load or
    a cascade read, or still being stored or written: the policy must never
    pick such a chunk. ``stores_skipped`` counts the store candidates that
    ``store_threshold`` skipped (the manager resets its own count at every
    ``get_stats()``, which the scheduler calls every step).
    """

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.log: list[tuple] = []
        # Keys with loads or cascade reads in flight, counted per call.
        self._pinned: Counter[OffloadKey] = Counter()
        # Keys allocated by prepare_store/prepare_write, not yet completed.
        self._storing: set[OffloadKey] = set()
        self._skipped = 0
        # The largest target_t1_size seen after a store (ARC policies only):
        # whether ghost hits moved it, whatever its final value.
        self.target_max: float = 0
        # (The primary tier's read/write methods are its aliases of
        # load/store, bound at its __init__: wrapped separately below.)
        wrappers = {
            "lookup": self._lookup,
            "prepare_load": self._pin("load"),
            "prepare_read": self._pin("read"),
            "complete_load": self._unpin,
            "complete_read": self._unpin,
            "prepare_store": self._allocate("store", "reject"),
            "prepare_write": self._allocate("promote", "promote_reject"),
            "complete_store": self._written,
            "complete_write": self._written,
            "get_stats": self._get_stats,
            "reset_cache": self._reset_cache,
        }
        for name, wrap in wrappers.items():
            if hasattr(manager, name):
                setattr(manager, name, wrap(getattr(manager, name)))

    @property
    def policy(self) -> Any:
        return self.manager._policy

    @property
    def stores_skipped(self) -> int:
        return self._skipped + self.manager.stores_skipped_in_current_batch

    def _lookup(self, orig: Any) -> Any:
        def lookup(key: OffloadKey, req_context: ReqContext) -> LookupResult:
            result = orig(key, req_context)
            if result is LookupResult.HIT:
                self.log.append(("hit", key))
            return result

        return lookup

    def _pin(self, kind: str) -> Any:
        def wrap(orig: Any) -> Any:
            def prepare(keys: Collection[OffloadKey], req_context: ReqContext) -> Any:
                spec = orig(keys, req_context)
                keys = tuple(keys)
                self._pinned.update(keys)
                self.log.append((kind, keys))
                return spec

            return prepare

        return wrap

    def _unpin(self, orig: Any) -> Any:
        def complete(keys: Collection[OffloadKey], req_context: ReqContext) -> None:
            orig(keys, req_context)
            self._pinned.subtract(keys)
            self._pinned = +self._pinned  # drop zero counts

        return complete

    def _allocate(self, kind: str, reject: str) -> Any:
        def wrap(orig: Any) -> Any:
            def prepare(keys: Collection[OffloadKey], req_context: ReqContext) -> Any:
                offered = tuple(keys)
                output = orig(offered, req_context)
                if output is None:
                    self.log.append((reject, offered))
                    return None
                evicted = tuple(output.evicted_keys)
                # The policy must never pick a chunk pinned by a load or a
                # read, or still being stored or written.
                bad = self._storing.intersection(evicted)
                bad.update(key for key in evicted if key in self._pinned)
                assert not bad, f"evicted {len(bad)} chunk(s) pinned or still being stored"
                stored = tuple(output.keys_to_store)
                self._storing.update(stored)
                self.log.append((kind, offered, stored, evicted, len(self._pinned)))
                policy = getattr(self.manager, "_policy", None)  # none on a stub
                self.target_max = max(self.target_max, getattr(policy, "target_t1_size", 0))
                return output

            return prepare

        return wrap

    def _written(self, orig: Any) -> Any:
        def complete(
            keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
        ) -> None:
            orig(keys, req_context, success)
            self._storing.difference_update(keys)

        return complete

    def _get_stats(self, orig: Any) -> Any:
        def get_stats() -> Any:
            self._skipped += self.manager.stores_skipped_in_current_batch
            return orig()

        return get_stats

    def _reset_cache(self, orig: Any) -> Any:
        def reset_cache() -> None:
            orig()
            self._pinned.clear()
            self._storing.clear()

        return reset_cache


# Scenarios for the end-to-end test. All run a chat workload on a small GPU
# KV cache (40 blocks of 16 tokens), so the scheduler preempts and loses
# prefixes the CPU cache then serves; loads stay in flight for two steps, so
# stores evict while loads are pinned, and some turns are aborted while
# loading.
TEST_WORKLOAD = WorkloadConfig(
    num_conversations=48,
    num_system_prompts=6,
    turns=(3, 8),
    think_steps=(4, 30),
    arrival_gap=1,
    abort_prob=0.1,
    abort_after=(0, 3),
    abort_on_load_prob=0.15,
    max_request_len=40 * 16 - 64,
)
TEST_HARNESS: dict[str, Any] = dict(
    num_gpu_blocks=40, block_size=16, max_num_seqs=6, max_num_batched_tokens=256
)
# KV bytes of one GPU block of TEST_HARNESS's model: K and V, 16 tokens,
# 2 heads of 16 fp16 values, 2 layers.
TEST_BYTES_PER_BLOCK = 2 * 16 * 2 * 16 * 2 * len(LAYER_NAMES)
SCENARIOS: dict[str, dict[str, Any]] = {
    # 128 chunks: many CPU hits, loads and T2 promotions; ghost hits in both
    # B1 and B2 move target_t1_size both ways.
    "roomy": {"num_chunks": 128},
    # 24 chunks, sized in bytes: stores also get rejected (every resident
    # chunk pinned by loads or still being stored).
    "tight": {"cpu_bytes_to_use": 24 * TEST_BYTES_PER_BLOCK},
    # store_threshold 2: a chunk is stored when offered the second time.
    "threshold": {"num_chunks": 64, "store_threshold": 2},
}
# The tiering route: vLLM's own TieringOffloadingSpec (spec_name only, no
# module path), whose CPUPrimaryTierOffloadingManager runs the policy. Its
# worker needs a GPU, so the harness puts the stub worker under it.
TIERING_SCENARIOS: dict[str, dict[str, Any]] = {
    # vLLM's in-memory "example" secondary tier (no hardware): every stored
    # chunk is cascaded to it (pinning the chunk until the cascade is
    # polled), and a chunk evicted from the primary tier is found there and
    # promoted back, evicting in turn.
    "tier_example": {
        "cpu_bytes_to_use": 64 * TEST_BYTES_PER_BLOCK,
        "secondary_tiers": [{"type": "example"}],
    },
    # The primary tier alone.
    "tier_primary_only": {"cpu_bytes_to_use": 48 * TEST_BYTES_PER_BLOCK},
}


def recorded_run(
    model_dir: str,
    policy: str,
    scenario: str,
    *,
    cache_policy_module_path: str | None = None,
    load_plugins: bool = False,
    load_delay_steps: int = 2,
) -> dict[str, Any]:
    """Run the chat workload of ``scenario`` on one policy; return a JSON-able
    summary: the recorder's log with keys numbered by first appearance
    (``log``), the policy's final state (``state``), a digest of the raw keys
    in numbering order (``keys_sha256``), run statistics, and the policy
    class that ran."""
    if load_plugins:
        import vllm.plugins

        vllm.plugins.load_general_plugins()
    tiering = scenario in TIERING_SCENARIOS
    if tiering:
        import copy

        extra = {
            "spec_name": "TieringOffloadingSpec",
            "eviction_policy": policy,
            "stub_load_delay_steps": load_delay_steps,
            # no poll thread: tiers are serviced at step ends, deterministically
            "tier_poll_interval_s": 0,
            **copy.deepcopy(TIERING_SCENARIOS[scenario]),
        }
    else:
        extra = offloading_extra_config(
            policy, stub_load_delay_steps=load_delay_steps, **SCENARIOS[scenario]
        )
    if cache_policy_module_path is not None:
        extra["cache_policy_module_path"] = cache_policy_module_path
    harness = SchedulerHarness(model_dir, extra, **TEST_HARNESS)
    if tiering:
        from vllm.v1.kv_offload.tiering.manager import (
            CPUPrimaryTierOffloadingManager,
            TieringOffloadingManager,
        )

        assert type(harness.manager) is TieringOffloadingManager
        assert type(harness.manager.primary_tier) is CPUPrimaryTierOffloadingManager
        recorder = DecisionRecorder(harness.manager.primary_tier)
    else:
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

        assert type(harness.manager) is CPUOffloadingManager
        recorder = DecisionRecorder(harness.manager)
    try:
        stats = ChatWorkload(TEST_WORKLOAD).run(harness)
    finally:
        if tiering:
            harness.scheduler.shutdown()  # unmaps and removes its /dev/shm file
    policy_obj = recorder.policy
    check = getattr(policy_obj, "_check_invariants", None)
    if check is not None:  # arc_cy's policies
        check()

    ids: dict[bytes, int] = {}
    digest = hashlib.sha256()

    def num(key: bytes) -> int:
        if key not in ids:
            ids[key] = len(ids)
            digest.update(key)
        return ids[key]

    def nums(keys: Any) -> list[int]:
        return [num(key) for key in keys]

    log: list[list[Any]] = []
    for entry in recorder.log:
        kind = entry[0]
        if kind == "hit":
            log.append([kind, num(entry[1])])
        elif kind in ("load", "read", "reject", "promote_reject"):
            log.append([kind, nums(entry[1])])
        else:
            _, offered, stored, evicted, pinned = entry
            log.append([kind, nums(offered), nums(stored), nums(evicted), pinned])
    state: dict[str, Any] = {}
    if hasattr(policy_obj, "target_t1_size"):  # ARC (vLLM lru has no lists)
        state = {name: nums(getattr(policy_obj, name).keys()) for name in ("t1", "t2", "b1", "b2")}
        state["target_t1_size"] = policy_obj.target_t1_size
        state["target_t1_size_type"] = type(policy_obj.target_t1_size).__name__
        state["target_t1_size_max"] = recorder.target_max
    policy_cls = type(policy_obj)
    return {
        "policy": policy,
        "scenario": scenario,
        "policy_class": f"{policy_cls.__module__}.{policy_cls.__qualname__}",
        "num_chunks": recorder.manager._num_chunks,
        "store_threshold": recorder.manager.store_threshold,
        "stores_skipped": recorder.stores_skipped,
        "log": log,
        "state": state,
        "keys_sha256": digest.hexdigest(),
        "stats": dict(stats.__dict__),
        "worker": {
            "stores": harness.stub_worker.num_stores,
            "loads": harness.stub_worker.num_loads,
        },
    }


def _main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(
        description="Run the scenarios on each policy; write "
        "{policy: {scenario: recorded_run(...)}} as JSON."
    )
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--policies", required=True, help="comma-separated")
    parser.add_argument("--load-plugins", action="store_true")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    import arc_cy

    results: dict[str, dict[str, Any]] = {}
    for policy in args.policies.split(","):
        for scenario in args.scenarios.split(","):
            summary = recorded_run(args.model_dir, policy, scenario, load_plugins=args.load_plugins)
            summary["arc_cy_implementation"] = arc_cy.IMPLEMENTATION
            results.setdefault(policy, {})[scenario] = summary
    with open(args.out, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
