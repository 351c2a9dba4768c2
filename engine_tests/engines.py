"""The engine tests' constants and drivers (conftest.py starts them): each
driver is one harness/engine_run.py process, in the engine environment."""

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

# The CPU worker's injected faults (harness/cpu_offload.py's cpu_copy_fault),
# one run each: a copy that goes wrong while reported a success.
FAULTS = {
    "skip_one_load": {"kind": "skip", "load": 3},
    "swap_one_load": {"kind": "swap", "load": 3},
    "wrong_row_one_load": {"kind": "wrong_row", "load": 3},
    "lost_stores": {"kind": "lost_store", "store": 17},
}

# One decision of vLLM's arc.py, changed: T1 is chosen only when strictly
# larger than its target.
ARC_DECISION = (
    "if virtual_t1_size >= int(self.target_t1_size):",
    "if virtual_t1_size > int(self.target_t1_size):",
)

# An overlay on PYTHONPATH: vllm's modules come from this folder where it has
# a file (every process of the engine imports sitecustomize first).
OVERLAY_SITECUSTOMIZE = """\
import importlib.abc, importlib.util, os, sys
HERE = os.path.dirname(os.path.abspath(__file__))
class Overlay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        file = os.path.join(HERE, *name.split(".")) + ".py"
        if name.startswith("vllm.") and os.path.isfile(file):
            return importlib.util.spec_from_file_location(name, file)
        return None
sys.meta_path.insert(0, Overlay())
"""


def connector(report: Path | None, **extra: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "spec_name": "CPUCopyOffloadingSpec",
        "spec_module_path": "cpu_offload",
        "cpu_bytes_to_use": CPU_BYTES,
    }
    if report is not None:
        report.mkdir(parents=True, exist_ok=True)
        cfg["cpu_copy_report"] = str(report)
    cfg.update(extra)
    return cfg


class Driver:
    """One harness/engine_run.py process, started now, awaited on first use."""

    def __init__(
        self,
        work: Path,
        name: str,
        runs: list[dict[str, Any]],
        in_process: bool,
        pythonpath: list[Path] = (),
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
            PYTHONPATH=os.pathsep.join(map(str, [*pythonpath, HARNESS])),
        )
        self.log = self.work / "log.txt"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    str(HARNESS / "engine_run.py"),
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


def guard_overlay(root: Path) -> Path:
    """vLLM's arc.py with ARC_DECISION changed, as an overlay folder."""
    import importlib.util

    # find_spec of the top-level package only: importing vLLM here takes a minute.
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin
    source = (
        Path(spec.origin)
        .parent.joinpath("v1", "kv_offload", "cpu", "policies", "arc.py")
        .read_text()
    )
    assert source.count(ARC_DECISION[0]) == 1
    target = root.joinpath("vllm", "v1", "kv_offload", "cpu", "policies", "arc.py")
    target.parent.mkdir(parents=True)
    target.write_text(source.replace(*ARC_DECISION))
    (root / "sitecustomize.py").write_text(OVERLAY_SITECUSTOMIZE)
    return root
