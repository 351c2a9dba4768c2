"""GC stress, ARC_CY_GC_STRESS=1 (docs/hardening.md, "Checks"): the
gc.callbacks hook, what it reads, and its counts. conftest.py runs each test
marked gc_stress under it and prints the counts; test_suite.py tests the
reader."""

from __future__ import annotations

import contextlib
import gc
import os
import sys

from arc_cy._flags import env_flag
from arc_cy._guard import vllm_guard
from helpers import ARC_CY_DIR, has_null_item

# For the hostile-input tests: a collection runs at every allocation of a
# container (gc.set_threshold(1)), and at the start of each one a
# gc.callbacks hook reads every young object (generations 0 and 1, where
# anything a running method just made sits) and, every 500th collection,
# every object gc.get_objects() returns. A list with NULL items, or a core
# whose tp_traverse sees a half-made entry, crashes the run.
# A list with a NULL item is read no further: it fails the test if the
# collection started in arc_cy's code or a test's, and is counted if not
# (CPython's own code fills some lists after tracking them).

GC_STRESS = env_flag("ARC_CY_GC_STRESS")
GC_STRESS_RUNS = {"collections": 0, "objects": 0, "policies": 0, "half_built_cpython": 0}
GC_STRESS_HALF_BUILT: list[str] = []  # where arc_cy's or a test's code left one

_OURS = (ARC_CY_DIR, os.path.dirname(os.path.abspath(__file__)) + os.sep)


def read(obj: object, frame) -> None:
    """What the hook reads of one object, ``frame`` being what was running
    when the collection started."""
    # Tuples are left out: CPython fills some after tracking them, which
    # is CPython's business, not ours.
    if isinstance(obj, list) and has_null_item(obj):
        where = frame.f_code.co_filename if frame is not None else "?"
        if where.startswith(_OURS):
            GC_STRESS_HALF_BUILT.append(f"{where}:{frame.f_lineno} ({frame.f_code.co_name})")
        else:
            GC_STRESS_RUNS["half_built_cpython"] += 1
        return
    if type(obj) in (list, dict, set, frozenset):
        list(obj)
    elif isinstance(obj, (list, dict, set, frozenset)):
        list(obj.__iter__())
    for ref in gc.get_referents(obj):  # runs tp_traverse (the core's too)
        type(ref)


def hook(phase: str, info: dict) -> None:
    if phase != "start":
        return
    runs = GC_STRESS_RUNS
    runs["collections"] += 1
    if runs["collections"] % 500 == 0:
        objects = gc.get_objects()
    else:
        objects = gc.get_objects(generation=0) + gc.get_objects(generation=1)
    frame = sys._getframe(1)  # what was running when the collection started
    for obj in objects:
        runs["objects"] += 1
        if type(obj).__name__ == "ARCCachePolicy":
            runs["policies"] += 1
        try:
            read(obj, frame)
        except Exception:  # a read may fail (an iterator in use); crashes may not
            pass


GC_STRESS_UNHOOKED: list[int] = []  # the collector's thresholds outside a stressed test


@contextlib.contextmanager
def paused():
    """Unhooked, at the usual thresholds, while pytest itself runs inside a
    stressed test (its reports)."""
    if hook not in gc.callbacks:
        yield
        return
    gc.callbacks.remove(hook)
    stressed = gc.get_threshold()
    gc.set_threshold(*GC_STRESS_UNHOOKED)
    try:
        yield
    finally:
        gc.set_threshold(*stressed)
        gc.callbacks.append(hook)


@contextlib.contextmanager
def stressed():
    """Hooked, with a collection at every allocation, while the block (a
    test) runs; then fails if arc_cy's or a test's code left a half-built
    list, or if the hook saw nothing. Yields a dict that then holds what the
    hook did meanwhile (GC_STRESS_RUNS's counts)."""
    if vllm_guard.pending:
        # The guard's once-per-process check, which the first policy runs,
        # parses vLLM's source: ast's C code fills lists after making them,
        # CPython's business as the tuples above are. Run it unhooked.
        vllm_guard.check()
    GC_STRESS_UNHOOKED[:] = gc.get_threshold()
    before = dict(GC_STRESS_RUNS)
    done: dict[str, int] = {}
    gc.callbacks.append(hook)
    gc.set_threshold(1)
    try:
        yield done
    finally:
        gc.set_threshold(*GC_STRESS_UNHOOKED)
        gc.callbacks.remove(hook)
    half_built = GC_STRESS_HALF_BUILT[:]
    GC_STRESS_HALF_BUILT.clear()
    assert not half_built, f"a list with NULL items, made under {half_built[:3]}"
    # The hook did run, and saw objects.
    assert GC_STRESS_RUNS["collections"] > before["collections"]
    assert GC_STRESS_RUNS["objects"] > before["objects"]
    done.update({k: GC_STRESS_RUNS[k] - before[k] for k in GC_STRESS_RUNS})
