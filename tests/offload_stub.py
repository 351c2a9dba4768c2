"""An out-of-tree OffloadingSpec for driving vLLM's scheduler without a GPU.

vLLM loads it through ``kv_connector_extra_config``::

    {"spec_name": "StubOffloadingSpec", "spec_module_path": "offload_stub", ...}

(``tests/`` must be importable: pytest puts it on ``sys.path``; the bench adds
it explicitly.)

Scheduler side: vLLM's real ``CPUOffloadingManager``, configured like
``CPUOffloadingSpec`` configures it, from ``kv_connector_extra_config``:

- ``eviction_policy`` (default ``"lru"``) and ``cache_policy_module_path``;
- ``store_threshold`` (default 0) and ``max_tracker_size`` (default 64000);
- the size: ``num_chunks``, or else ``cpu_bytes_to_use`` divided by the KV
  bytes of one chunk (as vLLM's CPU spec does, without its alignment padding);
- ``record`` (default True): use ``RecordingCPUOffloadingManager``, which logs
  every decision the policy makes visible (see there). Off for benchmarks.

Worker side: ``StubOffloadingWorker``, which moves no data. A store completes
at the first ``get_finished()`` after its submission; a load after
``stub_load_delay_steps`` (default 0) further ``get_finished()`` calls, so
loads can be kept in flight across scheduler steps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

__all__ = [
    "RecordingCPUOffloadingManager",
    "StubOffloadingSpec",
    "StubOffloadingWorker",
]


class RecordingCPUOffloadingManager(CPUOffloadingManager):
    """vLLM's CPUOffloadingManager, logging what its policy decided.

    ``log`` is a list of tuples, in call order:

    - ``("hit", key)``: ``lookup()`` found ``key`` ready (a CPU cache hit);
    - ``("load", keys)``: ``prepare_load()`` pinned ``keys``;
    - ``("store", offered, stored, evicted, pinned)``: ``prepare_store()``
      accepted: ``stored`` are the keys it allocated, ``evicted`` the keys it
      evicted to make room, ``pinned`` how many chunks had loads in flight
      (ref_cnt > 0) at that moment;
    - ``("reject", offered)``: ``prepare_store()`` returned None.

    It also checks, on every eviction, that no evicted key was pinned by a
    load or still being stored (the policy must never pick such a chunk).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple] = []
        # Keys with loads in flight, counted per prepare_load.
        self._loading: Counter[OffloadKey] = Counter()
        # Keys allocated by prepare_store whose store has not completed.
        self._storing: set[OffloadKey] = set()
        # Store candidates skipped by store_threshold, before get_stats()
        # (called by the scheduler every step) reset the batch count.
        self._stores_skipped = 0

    @property
    def stores_skipped(self) -> int:
        return self._stores_skipped + self.stores_skipped_in_current_batch

    def get_stats(self) -> Any:
        self._stores_skipped += self.stores_skipped_in_current_batch
        return super().get_stats()

    @property
    def policy(self) -> Any:
        return self._policy

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        result = super().lookup(key, req_context)
        if result is LookupResult.HIT:
            self.log.append(("hit", key))
        return result

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        spec = super().prepare_load(keys, req_context)
        keys = tuple(keys)
        self._loading.update(keys)
        self.log.append(("load", keys))
        return spec

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        super().complete_load(keys, req_context)
        self._loading.subtract(keys)
        self._loading = +self._loading  # drop zero counts

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        offered = tuple(keys)
        output = super().prepare_store(offered, req_context)
        if output is None:
            self.log.append(("reject", offered))
            return None
        evicted = tuple(output.evicted_keys)
        # The policy must never pick a chunk pinned by a load or still being
        # stored.
        bad = self._storing.intersection(evicted)
        bad.update(key for key in evicted if key in self._loading)
        assert not bad, f"evicted {len(bad)} chunk(s) pinned by loads or stores"
        stored = tuple(output.keys_to_store)
        self._storing.update(stored)
        self.log.append(("store", offered, stored, evicted, len(self._loading)))
        return output

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        super().complete_store(keys, req_context, success)
        self._storing.difference_update(keys)

    def reset_cache(self) -> None:
        super().reset_cache()
        self._loading.clear()
        self._storing.clear()



class PrimaryTierRecorder:
    """Logs the decisions of a ``CPUPrimaryTierOffloadingManager`` (vLLM's
    tiering route), in the format of ``RecordingCPUOffloadingManager.log``.

    vLLM's ``TieringOffloadingSpec`` builds its primary tier itself, so this
    wraps the instance's methods instead of subclassing. Besides the
    GPU-facing calls (``hit``, ``load``, ``store``, ``reject``) it logs the
    tiering manager's own uses of the primary tier:

    - ``("read", keys)``: a cascade to a secondary tier pinned ``keys``;
    - ``("promote", offered, stored, evicted, pinned)`` and
      ``("promote_reject", offered)``: a promotion from a secondary tier
      allocated (evicting) or failed to allocate primary chunks.

    As the recording manager does, it checks that no evicted key was pinned
    by a load or a cascade read, or still being written.
    """

    def __init__(self, primary: Any) -> None:
        self.primary = primary
        self.log: list[tuple] = []
        self._pinned: Counter[OffloadKey] = Counter()
        self._storing: set[OffloadKey] = set()
        self.store_threshold = 0
        self.stores_skipped = 0
        orig = {
            name: getattr(primary, name)
            for name in (
                "lookup", "prepare_load", "prepare_read", "complete_load",
                "complete_read", "prepare_store", "prepare_write",
                "complete_store", "complete_write",
            )
        }
        log = self.log

        def lookup(key: OffloadKey, req_context: ReqContext) -> LookupResult:
            result = orig["lookup"](key, req_context)
            if result is LookupResult.HIT:
                log.append(("hit", key))
            return result

        def pin(kind: str) -> Any:
            def prepare(keys: Collection[OffloadKey], req_context: ReqContext) -> Any:
                spec = orig["prepare_" + kind](keys, req_context)
                keys = tuple(keys)
                self._pinned.update(keys)
                log.append((kind, keys))
                return spec

            return prepare

        def unpin(name: str) -> Any:
            def complete(keys: Collection[OffloadKey], req_context: ReqContext) -> None:
                orig[name](keys, req_context)
                self._pinned.subtract(keys)
                self._pinned = +self._pinned

            return complete

        def allocate(name: str, kind: str) -> Any:
            def prepare(keys: Collection[OffloadKey], req_context: ReqContext) -> Any:
                offered = tuple(keys)
                output = orig[name](offered, req_context)
                if output is None:
                    log.append((kind + "_reject" if kind != "store" else "reject", offered))
                    return None
                evicted = tuple(output.evicted_keys)
                bad = self._storing.intersection(evicted)
                bad.update(key for key in evicted if key in self._pinned)
                assert not bad, f"evicted {len(bad)} chunk(s) pinned or being written"
                stored = tuple(output.keys_to_store)
                self._storing.update(stored)
                log.append((kind, offered, stored, evicted, len(self._pinned)))
                return output

            return prepare

        def written(name: str) -> Any:
            def complete(
                keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
            ) -> None:
                orig[name](keys, req_context, success)
                self._storing.difference_update(keys)

            return complete

        primary.lookup = lookup
        primary.prepare_load = pin("load")
        primary.prepare_read = pin("read")
        primary.complete_load = unpin("complete_load")
        primary.complete_read = unpin("complete_read")
        primary.prepare_store = allocate("prepare_store", "store")
        primary.prepare_write = allocate("prepare_write", "promote")
        primary.complete_store = written("complete_store")
        primary.complete_write = written("complete_write")

    @property
    def policy(self) -> Any:
        return self.primary._policy

    @property
    def _num_chunks(self) -> int:
        return self.primary._num_chunks


def _num_chunks(config: OffloadingConfig, extra: dict[str, Any]) -> int:
    if extra.get("num_chunks") is not None:
        return int(extra["num_chunks"])
    cpu_bytes = extra.get("cpu_bytes_to_use")
    if not cpu_bytes:
        raise ValueError(
            "StubOffloadingSpec needs num_chunks or cpu_bytes_to_use in "
            "kv_connector_extra_config"
        )
    bytes_per_chunk = (
        config.worker_kv_bytes_per_block
        * config.parallel.world_size
        * config.cache.blocks_per_chunk
    )
    if bytes_per_chunk <= 0:
        raise ValueError("KV bytes per chunk unknown: give num_chunks instead")
    return int(cpu_bytes) // bytes_per_chunk


class StubOffloadingSpec(OffloadingSpec):
    """Real CPUOffloadingManager on the scheduler side; no-op worker."""

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        extra = dict(self.extra_config)
        self.num_chunks = _num_chunks(config, extra)
        self.eviction_policy: str = extra.get("eviction_policy", "lru")
        self.cache_policy_module_path: str | None = extra.get(
            "cache_policy_module_path"
        )
        self.store_threshold = int(extra.get("store_threshold", 0))
        self.max_tracker_size = int(extra.get("max_tracker_size", 64_000))
        self.record = bool(extra.get("record", True))
        self.load_delay_steps = int(extra.get("stub_load_delay_steps", 0))
        self._manager: CPUOffloadingManager | None = None
        self._worker: StubOffloadingWorker | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            cls = RecordingCPUOffloadingManager if self.record else CPUOffloadingManager
            self._manager = cls(
                num_chunks=self.num_chunks,
                cache_policy=self.eviction_policy,
                cache_policy_module_path=self.cache_policy_module_path,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                store_threshold=self.store_threshold,
                max_tracker_size=self.max_tracker_size,
            )
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = StubOffloadingWorker(self.load_delay_steps)
        return self._worker


class StubOffloadingWorker(OffloadingWorker):
    """Completes every transfer without moving data (see module docstring)."""

    def __init__(self, load_delay_steps: int = 0) -> None:
        self.load_delay_steps = load_delay_steps
        # job_id -> get_finished() calls still to wait
        self._pending: dict[int, int] = {}
        self.num_stores = 0
        self.num_loads = 0

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        self.num_stores += 1
        self._pending[job_id] = 0
        return True

    def submit_load(
        self,
        job_id: int,
        src_spec: LoadStoreSpec,
        dst_spec: GPULoadStoreSpec,
        expedited: bool = False,
    ) -> bool:
        self.num_loads += 1
        self._pending[job_id] = 0 if expedited else self.load_delay_steps
        return True

    def get_finished(self) -> list[TransferResult]:
        done = [job_id for job_id, wait in self._pending.items() if wait <= 0]
        for job_id in done:
            del self._pending[job_id]
        for job_id in self._pending:
            self._pending[job_id] -= 1
        return [TransferResult(job_id=job_id, success=True) for job_id in done]

    def wait(self, job_ids: set[int]) -> None:
        # Flushed or synchronous jobs: done now, reported by get_finished().
        for job_id in job_ids:
            if job_id in self._pending:
                self._pending[job_id] = 0


# ---------------------------------------------------------------------------
# Scheduler harness: vLLM's real v1 Scheduler with the OffloadingConnector on
# this spec, a simulated model runner, and a multi-turn chat workload.
# Shared by tests/test_scheduler_e2e.py and bench/scheduler_step.py.
# ---------------------------------------------------------------------------

import hashlib  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

SPEC_NAME = "StubOffloadingSpec"
SPEC_MODULE = "offload_stub"
LAYER_NAMES = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
VOCAB_SIZE = 32000


def write_model_config(directory: str, max_model_len: int = 8192) -> str:
    """Write a tiny Llama ``config.json`` (no weights, no tokenizer) and
    return the directory, for ``ModelConfig(model=directory)``."""
    import transformers

    transformers.LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=len(LAYER_NAMES),
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_model_len,
    ).save_pretrained(directory)
    return directory


def offloading_extra_config(policy: str, **extra: Any) -> dict[str, Any]:
    """kv_connector_extra_config selecting this spec and ``policy``."""
    return {
        "spec_name": SPEC_NAME,
        "spec_module_path": SPEC_MODULE,
        "eviction_policy": policy,
        **extra,
    }


class SchedulerHarness:
    """A real ``Scheduler`` plus a simulated worker process.

    The worker side is vLLM's real ``OffloadingConnector`` in the WORKER role
    (its ``OffloadingConnectorWorker`` turns job metadata into transfer
    submissions and completion reports), with this module's stub transfer
    worker under it. ``step()`` does what the engine core and the model runner
    do for one step, in their order.
    """

    def __init__(
        self,
        model_dir: str,
        extra_config: dict[str, Any],
        *,
        num_gpu_blocks: int,
        block_size: int = 16,
        max_num_seqs: int = 8,
        max_num_batched_tokens: int = 512,
        max_model_len: int = 8192,
    ) -> None:
        import torch
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            KVTransferConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
            OffloadingConnector,
        )
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import (
            get_request_block_hasher,
            init_none_hash,
        )
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
        )
        from vllm.v1.structured_output import StructuredOutputManager

        model_config = ModelConfig(
            model=model_dir,
            skip_tokenizer_init=True,
            dtype="float16",
            seed=0,
            max_model_len=max_model_len,
        )
        vllm_config = VllmConfig(
            model_config=model_config,
            scheduler_config=SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len,
                is_encoder_decoder=False,
                async_scheduling=False,
            ),
            cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=True),
            kv_transfer_config=KVTransferConfig(
                kv_connector="OffloadingConnector",
                kv_role="kv_both",
                kv_connector_extra_config=dict(extra_config),
            ),
            device_config=DeviceConfig("cpu"),
        )
        vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
        kv_cache_config = KVCacheConfig(
            num_blocks=num_gpu_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    list(LAYER_NAMES),
                    FullAttentionSpec(
                        block_size=block_size,
                        num_kv_heads=2,
                        head_size=16,
                        dtype=torch.float16,
                    ),
                )
            ],
        )
        self.vllm_config = vllm_config
        self.scheduler = Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=block_size,
            log_stats=False,
        )
        assert isinstance(self.scheduler.connector, OffloadingConnector)
        self.worker_connector = OffloadingConnector(
            vllm_config, KVConnectorRole.WORKER, kv_cache_config
        )
        connector_worker = self.worker_connector.connector_worker
        if isinstance(connector_worker.spec, StubOffloadingSpec):
            # What register_kv_caches() ends in; the stub worker needs no
            # tensors.
            connector_worker._init_worker(CanonicalKVCaches([], []))
        else:
            # A vLLM spec (e.g. TieringOffloadingSpec) whose worker needs a
            # GPU: its scheduler side is used as is, its transfers go to the
            # stub worker, configured by the same stub_load_delay_steps.
            connector_worker.worker = StubOffloadingWorker(
                int(extra_config.get("stub_load_delay_steps", 0))
            )
        hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.block_hasher = get_request_block_hasher(block_size, hash_fn)
        # Seconds spent in Scheduler.schedule() + update_from_output(), per step.
        self.step_times: list[float] = []
        # Per step: (tokens scheduled, load jobs, store jobs, preempted,
        # finished), to check that two runs took the same steps.
        self.signatures: list[tuple[int, ...]] = []
        self.num_preempted = 0
        self.num_load_jobs = 0
        self.num_store_jobs = 0
        self.num_loaded_chunks = 0
        self.num_stored_chunks = 0
        # Optional: an object whose enter() and leave() are called just
        # outside the two timed regions of each step (bench/multi_turn.py
        # uses it to attribute time to layers only inside them).
        self.probe: Any = None

    @property
    def manager(self) -> CPUOffloadingManager:
        return self.scheduler.connector.connector_scheduler.manager

    @property
    def stub_worker(self) -> StubOffloadingWorker:
        return self.worker_connector.connector_worker.worker

    def step(self) -> Any:
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        scheduler = self.scheduler
        probe = self.probe
        if probe is not None:
            probe.enter()
        t0 = time.perf_counter()
        out = scheduler.schedule()
        t1 = time.perf_counter()
        if probe is not None:
            probe.leave()

        # The model runner: connector work around a forward pass that samples
        # one token for every request whose prompt is now fully computed.
        meta = out.kv_connector_metadata
        # Count before the worker side pops flushed store jobs.
        self.num_load_jobs += len(meta.load_jobs)
        self.num_store_jobs += len(meta.store_jobs)
        self.num_loaded_chunks += sum(
            len(job.src_spec.block_ids) for job in meta.load_jobs.values()
        )
        self.num_stored_chunks += sum(
            len(job.dst_spec.block_ids) for job in meta.store_jobs.values()
        )
        self.num_preempted += len(out.preempted_req_ids or ())
        self.signatures.append(
            (
                out.total_num_scheduled_tokens,
                len(meta.load_jobs),
                len(meta.store_jobs),
                len(out.preempted_req_ids or ()),
                len(out.finished_req_ids),
            )
        )
        wc = self.worker_connector
        wc.bind_connector_metadata(meta)
        wc.handle_preemptions(meta)
        wc.start_load_kv(None)
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for req_id in req_ids:
            req = scheduler.requests[req_id]
            sampled.append(
                [_output_token(req_id, req.num_output_tokens)]
                if req.num_computed_tokens >= req.num_tokens
                else []
            )
        wc.wait_for_save()
        finished_sending, finished_recving = wc.get_finished(out.finished_req_ids)
        worker_meta = wc.build_connector_worker_meta()
        wc.clear_connector_metadata()
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(
                finished_sending=finished_sending or None,
                finished_recving=finished_recving or None,
                kv_connector_worker_meta=worker_meta,
            ),
        )

        if probe is not None:
            probe.enter()
        t2 = time.perf_counter()
        scheduler.update_from_output(out, runner_output)
        t3 = time.perf_counter()
        if probe is not None:
            probe.leave()
        self.step_times.append((t1 - t0) + (t3 - t2))
        return out


def _output_token(req_id: str, index: int) -> int:
    """The token the simulated model samples: a function of the request and
    the output position only, so every run sees the same text."""
    digest = hashlib.blake2b(f"{req_id}/{index}".encode(), digest_size=4).digest()
    return 1 + int.from_bytes(digest, "little") % (VOCAB_SIZE - 1)


@dataclass
class WorkloadConfig:
    """A multi-turn chat workload; everything random is drawn up front from
    ``seed``, so it does not depend on how the run goes."""

    seed: int = 0
    num_conversations: int = 24
    num_system_prompts: int = 3
    system_prompt_len: tuple[int, int] = (48, 112)
    turns: tuple[int, int] = (2, 5)
    user_len: tuple[int, int] = (16, 64)
    output_len: tuple[int, int] = (6, 24)
    # steps between conversation starts, and the pause after each reply
    arrival_gap: int = 3
    think_steps: tuple[int, int] = (0, 12)
    # probability that a turn is aborted, and when (steps after submission)
    abort_prob: float = 0.1
    abort_after: tuple[int, int] = (0, 6)
    # probability that a turn is aborted as soon as it is seen waiting for
    # a load from the CPU cache (if it ever does)
    abort_on_load_prob: float = 0.0
    # a conversation ends before a turn whose prompt plus reply would exceed
    # this many tokens (keep it below the GPU KV cache, or the turn can never
    # be scheduled)
    max_request_len: int = 1 << 30


@dataclass
class _Turn:
    user: list[int]
    max_tokens: int
    think: int
    abort_after: int | None
    abort_on_load: bool


@dataclass
class _Conversation:
    index: int
    system: list[int]
    turns: list[_Turn]
    start_step: int
    history: list[int] = field(default_factory=list)
    next_turn: int = 0
    ready_step: int = 0
    active: Any = None  # the Request of the turn in flight
    abort_step: int | None = None
    abort_on_load: bool = False
    done: bool = False


@dataclass
class RunStats:
    steps: int = 0
    requests: int = 0
    finished: int = 0
    aborted: int = 0
    aborted_while_loading: int = 0
    preempted: int = 0
    load_jobs: int = 0
    store_jobs: int = 0


class ChatWorkload:
    """Drives a ``SchedulerHarness`` with multi-turn conversations that share
    system prompts and grow by their earlier turns; some turns are aborted,
    and a small GPU KV cache makes the scheduler preempt."""

    def __init__(
        self,
        config: WorkloadConfig,
        prefix: str = "c",
        *,
        conversations: list[tuple[list[int], list[tuple[list[int], int, int]]]]
        | None = None,
        max_live: int | None = None,
    ) -> None:
        """``conversations``, if given, replaces the conversations drawn from
        ``config``: one ``(prefix tokens, [(user tokens, max_tokens, think
        steps), ...])`` per conversation, started ``config.arrival_gap``
        steps apart, never aborted. ``max_live`` caps the conversations in
        progress (a closed loop of that many clients): a conversation due to
        start waits for a free client."""
        rng = random.Random(config.seed)
        self.max_live = max_live

        def tokens(bounds: tuple[int, int]) -> list[int]:
            return [rng.randrange(1, VOCAB_SIZE) for _ in range(rng.randint(*bounds))]

        self.conversations: list[_Conversation] = []
        for i, (head, spec) in enumerate(conversations or ()):
            # The token lists are shared, never mutated: several workloads
            # can run the same conversations.
            turns = [_Turn(u, m, t, None, False) for u, m, t in spec]
            start = i * config.arrival_gap
            self.conversations.append(
                _Conversation(i, head, turns, start, ready_step=start)
            )
        systems = [tokens(config.system_prompt_len) for _ in range(config.num_system_prompts)]
        for i in range(0 if conversations is not None else config.num_conversations):
            system = systems[rng.randrange(len(systems))]
            turns = [
                _Turn(
                    user=tokens(config.user_len),
                    max_tokens=rng.randint(*config.output_len),
                    think=rng.randint(*config.think_steps),
                    abort_after=(
                        rng.randint(*config.abort_after)
                        if rng.random() < config.abort_prob
                        else None
                    ),
                    abort_on_load=rng.random() < config.abort_on_load_prob,
                )
                for _ in range(rng.randint(*config.turns))
            ]
            start = i * config.arrival_gap + rng.randint(0, config.arrival_gap)
            self.conversations.append(
                _Conversation(i, system, turns, start, ready_step=start)
            )
        self.max_request_len = config.max_request_len
        self.prefix = prefix
        self.step_index = 0
        self.stats = RunStats()
        # Not yet started, by start step; started and not done, by index.
        self._pending = sorted(self.conversations, key=lambda c: (c.start_step, c.index))
        self._pending.reverse()
        self._live: list[_Conversation] = []

    def done(self) -> bool:
        return not self._pending and not self._live

    def _submit(self, harness: SchedulerHarness, conv: _Conversation) -> None:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        turn = conv.turns[conv.next_turn]
        prompt = conv.system + conv.history + turn.user
        request = Request(
            request_id=f"{self.prefix}{conv.index}-t{conv.next_turn}",
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=turn.max_tokens, ignore_eos=True),
            pooling_params=None,
            block_hasher=harness.block_hasher,
        )
        harness.scheduler.add_request(request)
        conv.active = request
        conv.abort_step = (
            None if turn.abort_after is None else self.step_index + turn.abort_after
        )
        conv.abort_on_load = turn.abort_on_load
        self.stats.requests += 1

    def step(self, harness: SchedulerHarness) -> None:
        """Submit due turns, abort due requests, run one scheduler step, and
        advance conversations whose turn finished."""
        from vllm.v1.request import RequestStatus

        stats = self.stats
        pending, live = self._pending, self._live
        if pending and pending[-1].start_step <= self.step_index:
            cap = self.max_live
            while (
                pending
                and pending[-1].start_step <= self.step_index
                and (cap is None or len(live) < cap)
            ):
                live.append(pending.pop())
            live.sort(key=lambda c: c.index)
        for conv in live:
            if conv.done:
                continue
            if conv.active is None and conv.ready_step <= self.step_index:
                turn = conv.turns[conv.next_turn]
                length = len(conv.system) + len(conv.history) + len(turn.user)
                if length + turn.max_tokens > self.max_request_len:
                    conv.done = True
                    continue
                self._submit(harness, conv)
            request = conv.active
            if request is None or request.is_finished():
                continue
            loading = request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            if (conv.abort_on_load and loading) or (
                conv.abort_step is not None and conv.abort_step <= self.step_index
            ):
                stats.aborted_while_loading += loading
                harness.scheduler.finish_requests(
                    request.request_id, RequestStatus.FINISHED_ABORTED
                )
                conv.abort_step = None
                conv.abort_on_load = False

        harness.step()
        self.step_index += 1

        for conv in live:
            request = conv.active
            if request is None or not request.is_finished():
                continue
            conv.active = None
            if request.status == RequestStatus.FINISHED_ABORTED:
                stats.aborted += 1
                conv.done = True
                continue
            stats.finished += 1
            turn = conv.turns[conv.next_turn]
            conv.history += turn.user + list(request.output_token_ids)
            conv.next_turn += 1
            conv.ready_step = self.step_index + turn.think
            conv.done = conv.next_turn == len(conv.turns)
        if any(conv.done for conv in live):
            live[:] = [conv for conv in live if not conv.done]

    def run(self, harness: SchedulerHarness, max_steps: int = 20_000) -> RunStats:
        """Step until every conversation is over and the scheduler and the
        connector are idle."""
        while not self.done() or harness.scheduler.has_requests():
            if self.step_index >= max_steps:
                raise RuntimeError(f"workload still running after {max_steps} steps")
            self.step(harness)
        stats = self.stats
        stats.steps = self.step_index
        stats.preempted = harness.num_preempted
        stats.load_jobs = harness.num_load_jobs
        stats.store_jobs = harness.num_store_jobs
        return stats


# ---------------------------------------------------------------------------
# One recorded run, in this process or (``python -m offload_stub``) another.
# ---------------------------------------------------------------------------

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
    summary: the manager's log with keys numbered by first appearance
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
    manager: Any
    if tiering:
        from vllm.v1.kv_offload.tiering.manager import (
            CPUPrimaryTierOffloadingManager,
            TieringOffloadingManager,
        )

        assert type(harness.manager) is TieringOffloadingManager
        assert type(harness.manager.primary_tier) is CPUPrimaryTierOffloadingManager
        manager = PrimaryTierRecorder(harness.manager.primary_tier)
    else:
        manager = harness.manager
        assert isinstance(manager, RecordingCPUOffloadingManager)
    try:
        stats = ChatWorkload(TEST_WORKLOAD).run(harness)
    finally:
        if tiering:
            harness.scheduler.shutdown()  # unmaps and removes its /dev/shm file
    policy_obj = manager.policy
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
    for entry in manager.log:
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
        state = {
            name: nums(getattr(policy_obj, name).keys())
            for name in ("t1", "t2", "b1", "b2")
        }
        state["target_t1_size"] = policy_obj.target_t1_size
        state["target_t1_size_type"] = type(policy_obj.target_t1_size).__name__
    policy_cls = type(policy_obj)
    return {
        "policy": policy,
        "scenario": scenario,
        "policy_class": f"{policy_cls.__module__}.{policy_cls.__qualname__}",
        "num_chunks": manager._num_chunks,
        "store_threshold": manager.store_threshold,
        "stores_skipped": manager.stores_skipped,
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
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="comma-separated"
    )
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    import arc_cy

    results: dict[str, dict[str, Any]] = {}
    for policy in args.policies.split(","):
        for scenario in args.scenarios.split(","):
            summary = recorded_run(
                args.model_dir, policy, scenario, load_plugins=args.load_plugins
            )
            summary["arc_cy_implementation"] = arc_cy.IMPLEMENTATION
            results.setdefault(policy, {})[scenario] = summary
    with open(args.out, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    # Run as the module vLLM imports (``offload_stub``), not as __main__, so
    # the spec classes vLLM loads are the ones the run inspects.
    import offload_stub

    raise SystemExit(offload_stub._main())
