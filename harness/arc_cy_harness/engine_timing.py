"""Timing inside a real engine (bench/engine.py): the scheduler's time in the policy, per step.

``TimedVllmArc`` and ``TimedArcCy`` (the compiled core) are named by module
path (``"eviction_policy": "TimedArcCy", "cache_policy_module_path":
"engine_timing"``): each wraps its policy and adds the time of every call
into ``POLICY_NS``, the same wrapper for both. With ``"step_timing": true``
in ``kv_connector_extra_config``, ``CPUCopyOffloadingSpec`` calls
:func:`install`, which makes the manager's ``on_schedule_end`` (once per
scheduler step) append ``(time.perf_counter_ns(), POLICY_NS[0])`` to
``STEPS``. In-process engines only (arc_cy_harness.engine_run reads both).
"""

from __future__ import annotations

import abc
import importlib
import time
from typing import Any

from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

from arc_cy._policy import METHODS

POLICY_NS = [0]
STEPS: list[tuple[int, int]] = []


def install(manager: Any) -> None:
    inner = manager.on_schedule_end

    def on_schedule_end(context: Any) -> None:
        inner(context)
        STEPS.append((time.perf_counter_ns(), POLICY_NS[0]))

    manager.on_schedule_end = on_schedule_end


def take() -> list[tuple[int, int]]:
    steps = list(STEPS)
    STEPS.clear()
    POLICY_NS[0] = 0
    return steps


def _timed(name: str) -> Any:
    def method(self: Any, *args: Any) -> Any:
        t = time.perf_counter_ns()
        try:
            return getattr(self.inner, name)(*args)
        finally:
            POLICY_NS[0] += time.perf_counter_ns() - t

    method.__name__ = name
    return method


class _Timed(CachePolicy):
    MODULE = CLASS = ""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.inner = getattr(importlib.import_module(self.MODULE), self.CLASS)(cache_capacity)


for _name in METHODS:  # every method the manager calls, timed
    setattr(_Timed, _name, _timed(_name))
abc.update_abstractmethods(_Timed)


class TimedVllmArc(_Timed):
    MODULE, CLASS = "vllm.v1.kv_offload.cpu.policies.arc", "ARCCachePolicy"


class TimedArcCy(_Timed):
    MODULE, CLASS = "arc_cy._core.arc", "ARCCachePolicy"
