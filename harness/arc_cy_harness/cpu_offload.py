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

It also checks that a load restores the KV of the blocks it is for. The
spec's manager adds to each store and load spec its chunks' offload keys,
in chunk order (an attribute, which survives the pickling to vLLM's worker
processes). On a store the worker keeps a checksum of each engine block it
reads (over every layer of its group), under what identifies the content:
its group, its chunk's offload key and its sub-block in the chunk; a later
store of the same key replaces it. After a load it checksums each engine
block written and counts a mismatch for each one whose checksum is not the
one kept for its key. A loaded block thus holds the KV last stored for its
key, whatever chunk, CPU row or engine block the copies went through; the
pairing of engine blocks with keys is the scheduler's, taken as given.

Loaded by vLLM through ``kv_connector_extra_config``, with this folder
(``harness/``) on the engine processes' ``PYTHONPATH``::

    {"spec_name": "CPUCopyOffloadingSpec", "spec_module_path": "arc_cy_harness.cpu_offload",
     "cpu_bytes_to_use": ..., "eviction_policy": "arc_cy"}

Further keys it reads:

- ``cpu_copy_report``: a folder; each process writes its counts there as
  ``scheduler-<pid>.json`` (the policy's class, the loads and the keys
  they load: the connector's CPU hits) and ``worker-<pid>.json`` (stores,
  loads, blocks checked, mismatches), rewritten after each job.
- ``step_timing``: true makes the manager record each scheduler step's
  end (arc_cy_harness.engine_timing, for bench/engine.py).
- ``cpu_copy_fault``: a wrong copy, reported as a success, for the tests
  that show the check catches it (``faults_injected`` counts them):
  ``{"kind": K, "load": N}`` hits the first load from the N-th (from 1)
  that it can: ``skip`` copies nothing; ``swap`` writes, in a group of two
  or more blocks, each block's rows into the next one's engine block (the
  last into the first); ``wrong_row`` reads its first chunk from another
  one, a chunk of the latest store, as if that store had overwritten it.
  ``{"kind": "lost_store", "store": N}``: the N-th store and every later
  one copy nothing into the CPU buffer.
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
    PrepareStoreOutput,
    ReqContext,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

# Each fault kind, and the job its count is of.
FAULT_KINDS = {"skip": "load", "swap": "load", "wrong_row": "load", "lost_store": "store"}


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _carry_keys(manager: OffloadingManager, counts: dict[str, Any], report: Any) -> None:
    """Makes the specs that the manager's prepare_load and prepare_store return
    carry their chunks' offload keys, in chunk order, as ``offload_keys``;
    counts the loads and the keys they load (the connector's CPU hits), and
    calls report() after each load."""
    prepare_load, prepare_store = manager.prepare_load, manager.prepare_store

    def load(keys: Any, req_context: ReqContext) -> LoadStoreSpec:
        spec = prepare_load(keys, req_context)
        spec.offload_keys = list(keys)  # type: ignore[attr-defined]
        counts["loads"] += 1
        counts["keys_loaded"] += len(spec.offload_keys)  # type: ignore[attr-defined]
        report()
        return spec

    def store(keys: Any, req_context: ReqContext) -> PrepareStoreOutput | None:
        out = prepare_store(keys, req_context)
        if out is not None:
            out.store_spec.offload_keys = list(out.keys_to_store)  # type: ignore[attr-defined]
        return out

    manager.prepare_load = load  # type: ignore[method-assign]
    manager.prepare_store = store  # type: ignore[method-assign]


def _offload_keys(spec: BlockIDsLoadStoreSpec) -> list[bytes]:
    keys = spec.offload_keys  # type: ignore[attr-defined]
    assert len(keys) == len(spec.block_ids), "a key per chunk"
    return keys


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
        self.fault_kind, self.fault_at = None, 0
        if fault is not None:
            job = FAULT_KINDS.get(fault.get("kind"))  # type: ignore[arg-type]
            if job is None or int(fault.get(job, 0)) < 1:
                raise ValueError(
                    f"cpu_copy_fault: want {{'kind': K, JOB: N >= 1}}, JOB as in "
                    f"{FAULT_KINDS}, got {fault!r}"
                )
            self.fault_kind, self.fault_at = fault["kind"], int(fault[job])
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
        # (group, offload key, sub-block) -> checksum of the engine block last stored for it
        self._stored: dict[tuple[int, bytes, int], bytes] = {}
        self._last_store_chunks: list[int] = []
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

    def _pairs(self, engine_spec: GPULoadStoreSpec, chunk_ids: np.ndarray):
        """(group, engine block ids, CPU rows, sub-blocks) for each group of the job.

        Sub-block s is sub-block ``s % blocks_per_chunk`` of the job's chunk
        ``s // blocks_per_chunk``."""
        engine_ids = engine_spec.block_ids
        chunk_ids = chunk_ids.astype(np.int64)
        bpc = self.blocks_per_chunk
        e_off = c_off = 0
        for g, (size, index) in enumerate(zip(engine_spec.group_sizes, engine_spec.block_indices)):
            if size == 0:
                continue
            skip = index % bpc
            subs = c_off * bpc + skip + np.arange(size)
            rows = chunk_ids[subs // bpc] * bpc + subs % bpc
            yield g, engine_ids[e_off : e_off + size].astype(np.int64), rows, subs
            e_off += size
            c_off += -(-(size + skip) // bpc)
        assert e_off == len(engine_ids) and c_off == len(chunk_ids), "job's specs disagree"

    def _checksum(self, tensors: list[torch.Tensor], g: int, row: int) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for t_idx, size in self.group_refs[g]:
            h.update(tensors[t_idx][row, :size].numpy().tobytes())
        return h.digest()

    def _copy(
        self,
        g: int,
        dst: list[torch.Tensor],
        dst_rows: np.ndarray,
        src: list[torch.Tensor],
        src_rows: np.ndarray,
    ) -> None:
        d, s = torch.from_numpy(dst_rows), torch.from_numpy(src_rows)
        for t_idx, size in self.group_refs[g]:
            dst[t_idx][d, :size] = src[t_idx][s, :size]

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        assert isinstance(dst_spec, BlockIDsLoadStoreSpec)
        keys = _offload_keys(dst_spec)
        self.counts["stores"] += 1
        lost = self.fault_kind == "lost_store" and self.counts["stores"] >= self.fault_at
        self.counts["faults_injected"] += lost
        bpc = self.blocks_per_chunk
        for g, engine_ids, rows, subs in self._pairs(src_spec, dst_spec.block_ids):
            if not lost:
                self._copy(g, self.cpu_tensors, rows, self.engine_tensors, engine_ids)
            for block, s in zip(engine_ids.tolist(), subs.tolist()):
                self._stored[(g, keys[s // bpc], s % bpc)] = self._checksum(
                    self.engine_tensors, g, block
                )
            self.counts["blocks_stored"] += len(rows)
        self._last_store_chunks = dst_spec.block_ids.tolist()
        self._done.append(TransferResult(job_id=job_id, success=True))
        self._write_report()
        return True

    def _load_fault(self, chunk_ids: np.ndarray, dst_spec: GPULoadStoreSpec) -> str | None:
        """The fault this load gets, if any; for ``wrong_row``, chunk_ids is changed here."""
        kind = self.fault_kind
        if FAULT_KINDS.get(kind) != "load" or self.counts["faults_injected"]:
            return None
        if self.counts["loads"] < self.fault_at:
            return None
        if kind == "swap" and max(dst_spec.group_sizes) < 2:
            return None
        if kind == "wrong_row":
            # The latest store came after the store of every chunk loaded
            # here, so each of its chunks that this load does not read holds
            # another key's KV.
            others = [c for c in self._last_store_chunks if c not in set(chunk_ids.tolist())]
            if not others:
                return None
            chunk_ids[0] = others[0]
        self.counts["faults_injected"] += 1
        return kind

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        assert isinstance(src_spec, BlockIDsLoadStoreSpec)
        keys = _offload_keys(src_spec)
        self.counts["loads"] += 1
        chunk_ids = src_spec.block_ids.copy()
        fault = self._load_fault(chunk_ids, dst_spec)
        bpc = self.blocks_per_chunk
        for g, engine_ids, rows, subs in self._pairs(dst_spec, chunk_ids):
            if fault == "swap":
                rows = np.roll(rows, 1)
            if fault != "skip":
                self._copy(g, self.engine_tensors, engine_ids, self.cpu_tensors, rows)
            for block, s in zip(engine_ids.tolist(), subs.tolist()):
                want = self._stored.get((g, keys[s // bpc], s % bpc))
                if self._checksum(self.engine_tensors, g, block) != want:
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
        report_dir = self.extra_config.get("cpu_copy_report")
        policy = manager._policy  # type: ignore[attr-defined]
        counts: dict[str, Any] = {
            "pid": os.getpid(),
            "num_chunks": self.num_chunks,
            "policy_class": f"{type(policy).__module__}.{type(policy).__qualname__}",
            "loads": 0,
            "keys_loaded": 0,
        }

        def report() -> None:
            if report_dir:
                _write_json(os.path.join(report_dir, f"scheduler-{os.getpid()}.json"), counts)

        if fresh:
            _carry_keys(manager, counts, report)
        if fresh and self.extra_config.get("step_timing"):
            from arc_cy_harness import engine_timing

            engine_timing.install(manager)
        report()
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
