"""The scheduler harness: vLLM's real v1 scheduler driven without a GPU.

- ``StubOffloadingSpec``: an out-of-tree ``OffloadingSpec``, loaded by vLLM
  through ``kv_connector_extra_config``::

      {"spec_name": "StubOffloadingSpec", "spec_module_path": "arc_cy_harness.offload_stub", ...}

  (``harness/`` must be importable: pytest's ``pythonpath`` setting and
  bench/run.sh's ``PYTHONPATH`` put it on ``sys.path``.) Its scheduler side is vLLM's real
  ``CPUOffloadingManager``, configured as ``CPUOffloadingSpec`` configures
  it: ``eviction_policy`` (default ``"lru"``) and
  ``cache_policy_module_path``; ``store_threshold`` (default 0) and
  ``max_tracker_size`` (default 64000); the size, ``num_chunks``, or else
  ``cpu_bytes_to_use`` divided by the KV bytes of one chunk (as vLLM's CPU
  spec does, without its alignment padding).
- ``StubOffloadingWorker``: its worker side, which moves no data. A store
  completes at the first ``get_finished()`` after its submission; a load
  after ``stub_load_delay_steps`` (default 0) further ``get_finished()``
  calls, so loads can be kept in flight across scheduler steps.
- ``SchedulerHarness``: a real ``Scheduler`` on this spec (or on a vLLM spec
  such as ``TieringOffloadingSpec``) and a simulated model runner.

The workload that drives it is in ``chat_workload.py``; the recorder of the
policy's decisions and the recorded runs of the end-to-end tests are in
``tests/recorder.py``. ``bench/multi_turn.py`` uses the harness and the workload.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import Any

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.outputs import ModelRunnerOutput


def _num_chunks(config: OffloadingConfig, extra: dict[str, Any]) -> int:
    if extra.get("num_chunks") is not None:
        return int(extra["num_chunks"])
    cpu_bytes = extra.get("cpu_bytes_to_use")
    if not cpu_bytes:
        raise ValueError(
            "StubOffloadingSpec needs num_chunks or cpu_bytes_to_use in kv_connector_extra_config"
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
        self.cache_policy_module_path: str | None = extra.get("cache_policy_module_path")
        self.store_threshold = int(extra.get("store_threshold", 0))
        self.max_tracker_size = int(extra.get("max_tracker_size", 64_000))
        self.load_delay_steps = int(extra.get("stub_load_delay_steps", 0))
        self._manager: CPUOffloadingManager | None = None
        self._worker: StubOffloadingWorker | None = None

    def get_manager(self) -> OffloadingManager:
        if self._manager is None:
            self._manager = CPUOffloadingManager(
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


SPEC_NAME = "StubOffloadingSpec"
SPEC_MODULE = "arc_cy_harness.offload_stub"
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
        # What register_kv_caches() ends in; the stub worker needs no
        # tensors. One (empty) data-ref list per KV cache group: 0.34's
        # connector worker resolves device pointers before each submit.
        kv_caches = CanonicalKVCaches([], [[] for _ in kv_cache_config.kv_cache_groups])
        if isinstance(connector_worker.spec, StubOffloadingSpec):
            connector_worker._init_worker(kv_caches)
        else:
            # A vLLM spec (e.g. TieringOffloadingSpec) whose worker needs a
            # GPU: its scheduler side is used as is, its transfers go to the
            # stub worker, configured by the same stub_load_delay_steps.
            connector_worker.worker = StubOffloadingWorker(
                int(extra_config.get("stub_load_delay_steps", 0))
            )
            connector_worker._kv_caches = kv_caches
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
        from vllm.v1.outputs import KVConnectorOutput

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
        # req_id_to_index: until 0.33 (0.34 indexes by req_ids alone)
        index = (
            {"req_id_to_index": {r: i for i, r in enumerate(req_ids)}}
            if _RUNNER_OUTPUT_INDEXES
            else {}
        )
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            **index,
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


_RUNNER_OUTPUT_INDEXES = "req_id_to_index" in {
    f.name for f in dataclasses.fields(ModelRunnerOutput)
}


def _output_token(req_id: str, index: int) -> int:
    """The token the simulated model samples: a function of the request and
    the output position only, so every run sees the same text."""
    digest = hashlib.blake2b(f"{req_id}/{index}".encode(), digest_size=4).digest()
    return 1 + int.from_bytes(digest, "little") % (VOCAB_SIZE - 1)
