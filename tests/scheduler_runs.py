"""What the scheduler-level tests (test_scheduler_e2e.py, test_tiering.py)
share: the pure twin's recorded runs in a child process, and the check
that every route to arc_cy decides as vLLM's arc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

from helpers import CHOSEN, MODULES
from recorder import SCENARIOS, recorded_run

TESTS_DIR = Path(__file__).resolve().parent
VLLM_ARC = "vllm.v1.kv_offload.cpu.policies.arc.ARCCachePolicy"
TWIN = f"{MODULES['python']}.ARCCachePolicy"
# What arc_cy's name and module path resolve to: the twin on a pure build.
RESOLVED = f"{MODULES[CHOSEN]}.ARCCachePolicy"


class TwinProcess:
    """vLLM's ARC and the pure twin on ``scenarios``, in a child process
    (started at once, so it overlaps the in-process runs)."""

    def __init__(
        self, model_dir: str, out: Path, scenarios: Collection[str] = tuple(SCENARIOS)
    ) -> None:
        env = dict(os.environ)
        env["ARC_CY_NO_EXTENSIONS"] = "1"
        # recorder and what it imports: tests/ and harness/ (pytest's
        # pythonpath), then the rest
        harness = TESTS_DIR.parent / "harness"
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(TESTS_DIR), str(harness), env.get("PYTHONPATH")) if p
        )
        self.out = out
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-P",
                "-m",
                "recorder",
                "--model-dir",
                model_dir,
                "--policies",
                "arc,arc_cy",
                "--load-plugins",
                "--scenarios",
                ",".join(scenarios),
                "--out",
                str(out),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._results: dict[str, Any] | None = None

    def results(self) -> dict[str, Any]:
        if self._results is None:
            output, _ = self.proc.communicate(timeout=600)
            assert self.proc.returncode == 0, output[-5000:]
            self._results = json.loads(self.out.read_text())
        return self._results


def check_every_route(
    model_dir: str,
    scenario: str,
    twin: TwinProcess,
    assert_same_run: Any,
    assert_exercised: Any,
) -> None:
    """arc_cy by plugin name, by module path, and the pure twin (in its
    child process) decide exactly as vLLM's arc in scenario."""
    import arc_cy

    oracle = recorded_run(model_dir, "arc", scenario)
    assert oracle["policy_class"] == VLLM_ARC
    assert_exercised(oracle, scenario)

    by_name = recorded_run(model_dir, "arc_cy", scenario)
    assert by_name["policy_class"] == RESOLVED, (
        f"'arc_cy' resolved to {by_name['policy_class']} "
        f"(arc_cy.IMPLEMENTATION={arc_cy.IMPLEMENTATION}); run without "
        "ARC_CY_NO_EXTENSIONS and with the compiled build installed"
    )
    assert_same_run(oracle, by_name)

    by_module = recorded_run(
        model_dir, "ARCCachePolicy", scenario, cache_policy_module_path="arc_cy"
    )
    assert by_module["policy_class"] == RESOLVED
    assert_same_run(oracle, by_module)

    child = twin.results()
    child_oracle, twin_run = child["arc"][scenario], child["arc_cy"][scenario]
    assert child_oracle["policy_class"] == VLLM_ARC
    assert_exercised(child_oracle, scenario)
    assert twin_run["arc_cy_implementation"] == "python"
    assert twin_run["policy_class"] == TWIN
    assert_same_run(child_oracle, twin_run)
