"""The engine tests' constants and drivers (conftest.py starts them): each
driver is one arc_cy_harness.engine_run process, in the engine environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "harness"
TIMEOUT_S = 1200

BLOCK_SIZE = 32
NUM_GPU_BLOCKS = 64
CPU_BYTES = 2_000_000  # 61 chunks of this model's 32 KiB
ENGINE = {
    "block_size": BLOCK_SIZE,
    "gpu_memory_utilization": 0.1,
    "num_gpu_blocks_override": NUM_GPU_BLOCKS,
    "max_model_len": 1024,
    "max_num_seqs": 8,
    "enforce_eager": True,
}
WORKLOAD = {
    "conversations": 8,
    "rounds": 12,
    "per_round": 4,
    "first": 128,
    "turn": 48,
    "max_tokens": 8,
}
MODEL = {"layers": 2, "kv_heads": 2, "seed": 0}
# The same 48 requests, one at a time (a generate() call each).
ONE_AT_A_TIME = {"rounds": 48, "per_round": 1}

# The CPU worker's injected faults (arc_cy_harness.cpu_offload's cpu_copy_fault),
# one run each: a copy that goes wrong while reported a success.
FAULTS = {
    "skip_one_load": {"kind": "skip", "load": 3},
    "swap_one_load": {"kind": "swap", "load": 3},
    "wrong_row_one_load": {"kind": "wrong_row", "load": 3},
    "lost_stores": {"kind": "lost_store", "store": 17},
}


def connector(report: Path | None, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "spec_name": "CPUCopyOffloadingSpec",
        "spec_module_path": "arc_cy_harness.cpu_offload",
        "cpu_bytes_to_use": CPU_BYTES,
    }
    if report is not None:
        report.mkdir(parents=True, exist_ok=True)
        cfg["cpu_copy_report"] = str(report)
    cfg.update(extra)
    return cfg


class Driver:
    """One arc_cy_harness.engine_run process, started now, awaited on first use."""

    def __init__(
        self,
        work: Path,
        name: str,
        runs: list[dict[str, Any]],
        in_process: bool,
        overlay: Path | None = None,
    ) -> None:
        self.work = work / name
        self.work.mkdir(parents=True)
        self.config = {
            "model_dir": str(self.work / "model"),
            "model": MODEL,
            "in_process": in_process,
            "engine": ENGINE,
            "workload": WORKLOAD,
            "runs": runs,
            "out": str(self.work / "out.json"),
        }
        (self.work / "config.json").write_text(json.dumps(self.config))
        env = dict(
            os.environ,
            VLLM_CPU_KVCACHE_SPACE="1",
            # a vLLM whose ARC decides otherwise (arc_cy_harness.vllm_overlay)
            **({"FAKE_VLLM_OVERLAY": "1"} if overlay else {}),
            PYTHONPATH=os.pathsep.join(map(str, [*filter(None, [overlay]), HARNESS])),
        )
        self.log = self.work / "log.txt"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    "-m",
                    "arc_cy_harness.engine_run",
                    str(self.work / "config.json"),
                ],
                cwd=self.work,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._done = False

    def wait(self) -> tuple[int, str, dict[str, Any]]:
        if not self._done:
            try:
                self.proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._done = True
        out = Path(self.config["out"])
        results = json.loads(out.read_text()) if out.exists() else {}
        return self.proc.returncode, self.log.read_text(errors="replace"), results

    def results(self) -> dict[str, Any]:
        rc, log, results = self.wait()
        assert rc == 0, f"{self.work.name} driver failed ({rc}):\n{log[-6000:]}"
        return results
