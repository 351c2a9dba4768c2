"""``CPUCopyOffloadingSpec``: vLLM's CPU offloading spec, with a worker for the CPU platform.

vLLM's ``CPUOffloadingSpec`` (vllm/v1/kv_offload/cpu/spec.py) is used as it
is on the scheduler side: its ``CPUOffloadingManager``, the eviction policy
named by ``eviction_policy`` / ``cache_policy_module_path``, and its count
of chunks from ``cpu_bytes_to_use``. Only its worker side is replaced,
because ``CPUOffloadingSpec.get_worker`` refuses every platform that is not
CUDA-alike or XPU. ``CPUCopyWorker`` stands in for vLLM's GPU worker,
``CPUOffloadingWorker`` with its two ``SingleDirectionOffloadingHandler``s
(vllm/v1/kv_offload/cpu/gpu_worker.py, the direct, worker-private layout):
it allocates a CPU buffer of ``num_chunks`` chunks per KV tensor, copies
the engine's KV blocks into it on a store and back into the engine's blocks
on a load, with the same mapping of blocks to chunks (``blocks_per_chunk``
sub-blocks per chunk, a group's first block skipping ``block_index %
blocks_per_chunk`` sub-blocks), but synchronously, with torch copies on the
calling thread instead of DMA on CUDA streams: every job is done when it is
submitted and reported by the next ``get_finished()``.

It also checks the round trip: on a store it keeps a checksum of each
stored sub-block (over every layer of its group); after a load it
checksums the engine's blocks that the load wrote and counts a mismatch
for each one whose checksum is not the stored one.

Loaded by vLLM through ``kv_connector_extra_config``, with this folder
(``harness/``) on the engine processes' ``PYTHONPATH``::

    {"spec_name": "CPUCopyOffloadingSpec", "spec_module_path": "cpu_offload",
     "cpu_bytes_to_use": ..., "eviction_policy": "arc_cy"}

Further keys it reads:

- ``cpu_copy_report``: a folder; each process writes its counts there as
  ``scheduler-<pid>.json`` (the policy's class) and ``worker-<pid>.json``
  (stores, loads, blocks checked, mismatches), rewritten after each job.
- ``step_timing``: true makes the manager record each scheduler step's
  end (harness/engine_timing.py, for bench/engine.py).
- ``cpu_copy_fault``: ``{"kind": "skip", "load": N}`` makes the worker's
  N-th load (from 1) copy nothing while reporting success, for the test
  that shows the check catches a broken load.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingManager,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

FAULT_KINDS = ("skip",)


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


class CPUCopyWorker(OffloadingWorker):
    """Copies KV blocks between the engine's KV tensors and a CPU buffer (module docstring)."""

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        blocks_per_chunk: int,
        num_chunks: int,
        report_dir: str | None = None,
        fault: dict[str, Any] | None = None,
    ) -> None:
        if fault is not None and (
            fault.get("kind") not in FAULT_KINDS or int(fault.get("load", 0)) < 1
        ):
            raise ValueError(
                f"cpu_copy_fault: want {{'kind': one of {FAULT_KINDS}, "
                f"'load': N >= 1}}, got {fault!r}"
            )
        self.blocks_per_chunk = blocks_per_chunk
        # As CPUOffloadingWorker views them: one row of page_size_bytes per block.
        self.engine_tensors = [
            t.tensor.view(torch.int8).view((-1, t.page_size_bytes)) for t in kv_caches.tensors
        ]
        # One row per sub-block: chunk c's sub-block j is row c * blocks_per_chunk + j.
        self.cpu_tensors = [
            torch.zeros((num_chunks * blocks_per_chunk, t.page_size_bytes), dtype=torch.int8)
            for t in kv_caches.tensors
        ]
        self.group_refs = [
            [(r.tensor_idx, r.page_size_bytes) for r in refs] for refs in kv_caches.group_data_refs
        ]
        self.fault = fault
        self._checksums: dict[int, bytes] = {}  # CPU row -> checksum of what was stored there
        self._done: list[TransferResult] = []
        self.counts = {
            "stores": 0,
            "loads": 0,
            "blocks_stored": 0,
            "blocks_loaded": 0,
            "blocks_checked": 0,
            "checksum_mismatches": 0,
            "faults_injected": 0,
        }
        self._report = (
            os.path.join(report_dir, f"worker-{os.getpid()}.json") if report_dir else None
        )
        self._write_report()

    def _write_report(self) -> None:
        if self._report:
            _write_json(
                self._report,
                {
                    "pid": os.getpid(),
                    **self.counts,
                    "num_cpu_chunks": self.cpu_tensors[0].shape[0] // self.blocks_per_chunk,
                },
            )

    def _pairs(self, engine_spec: GPULoadStoreSpec, cpu_spec: BlockIDsLoadStoreSpec):
        """(group, engine block ids, CPU rows) for each group of the job."""
        engine_ids = engine_spec.block_ids
        chunk_ids = cpu_spec.block_ids
        bpc = self.blocks_per_chunk
        e_off = c_off = 0
        for g, (size, index) in enumerate(zip(engine_spec.group_sizes, engine_spec.block_indices)):
            if size == 0:
                continue
            skip = index % bpc
            n_chunks = -(-(size + skip) // bpc)
            chunks = chunk_ids[c_off : c_off + n_chunks].astype(np.int64)
            rows = (chunks[:, None] * bpc + np.arange(bpc)).ravel()[skip : skip + size]
            yield g, engine_ids[e_off : e_off + size].astype(np.int64), rows
            e_off += size
            c_off += n_chunks
        assert e_off == len(engine_ids) and c_off == len(chunk_ids), "job's specs disagree"

    def _checksum(self, tensors: list[torch.Tensor], g: int, row: int) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for t_idx, size in self.group_refs[g]:
            h.update(tensors[t_idx][row, :size].numpy().tobytes())
        return h.digest()

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        assert isinstance(dst_spec, BlockIDsLoadStoreSpec)
        for g, engine_ids, rows in self._pairs(src_spec, dst_spec):
            src, dst = torch.from_numpy(engine_ids), torch.from_numpy(rows)
            for t_idx, size in self.group_refs[g]:
                self.cpu_tensors[t_idx][dst, :size] = self.engine_tensors[t_idx][src, :size]
            for row in rows.tolist():
                self._checksums[row] = self._checksum(self.cpu_tensors, g, row)
            self.counts["blocks_stored"] += len(rows)
        self.counts["stores"] += 1
        self._done.append(TransferResult(job_id=job_id, success=True))
        self._write_report()
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        assert isinstance(src_spec, BlockIDsLoadStoreSpec)
        self.counts["loads"] += 1
        fault = None
        if self.fault is not None and self.counts["loads"] == int(self.fault["load"]):
            fault = self.fault["kind"]
            self.counts["faults_injected"] += 1
        for g, engine_ids, rows in self._pairs(dst_spec, src_spec):
            src, dst = torch.from_numpy(rows), torch.from_numpy(engine_ids)
            for t_idx, size in self.group_refs[g]:
                if fault != "skip":
                    self.engine_tensors[t_idx][dst, :size] = self.cpu_tensors[t_idx][src, :size]
            for block, row in zip(engine_ids.tolist(), rows.tolist()):
                if self._checksum(self.engine_tensors, g, block) != self._checksums.get(row):
                    self.counts["checksum_mismatches"] += 1
            self.counts["blocks_loaded"] += len(rows)
            self.counts["blocks_checked"] += len(rows)
        self._done.append(TransferResult(job_id=job_id, success=True))
        self._write_report()
        return True

    def get_finished(self) -> list[TransferResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return  # every job is done when submitted


class CPUCopyOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPUOffloadingSpec whose worker is ``CPUCopyWorker``."""

    def get_manager(self) -> OffloadingManager:
        fresh = self._manager is None
        manager = super().get_manager()
        if fresh and self.extra_config.get("step_timing"):
            import engine_timing

            engine_timing.install(manager)
        report_dir = self.extra_config.get("cpu_copy_report")
        if report_dir:
            policy = manager._policy  # type: ignore[attr-defined]
            _write_json(
                os.path.join(report_dir, f"scheduler-{os.getpid()}.json"),
                {
                    "pid": os.getpid(),
                    "num_chunks": self.num_chunks,
                    "policy_class": f"{type(policy).__module__}.{type(policy).__qualname__}",
                },
            )
        return manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            fault = self.extra_config.get("cpu_copy_fault")
            self._worker = CPUCopyWorker(  # type: ignore[assignment]
                kv_caches,
                self.blocks_per_chunk,
                self.num_chunks,
                report_dir=self.extra_config.get("cpu_copy_report"),
                fault=dict(fault) if fault else None,
            )
        return self._worker  # type: ignore[return-value]
