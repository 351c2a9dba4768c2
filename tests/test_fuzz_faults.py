"""The faults fuzzer, run in a child process (tests/progs/faults_fuzz.py):
objects the garbage collector cleared, used by finalizers while it clears
them (docs/hardening.md rule 13), and allocations that fail at random
points of random calls (rule 11, and the core's fallbacks when memory runs
out): the compiled classes' rules, memory safety, which the twins (vLLM's
Python code, exposed as vLLM's ARC is) are not held to. One child runs
every mode on both compiled classes (--mode all --impl all: the core and
the compiled ARC+); each run prints its counts, which its test asserts; a
crash fails the run it happened in and those after it.

    cleared-cython  random reference graphs through policies, views,
                    iterators, keys and chunks, collected; finalizers call
                    random methods on what they find, cleared or not:
                    allowed exceptions only, and rescued policies pass
                    _check_invariants()
    nomem-cython    random calls with _testcapi.set_nomemory armed:
                    MemoryError or the call's own result, a failed call
                    changed nothing, a call that returned agrees with an
                    unarmed shadow
    cleared-plus, nomem-plus        the same for the compiled ARC+
                    (arc_cy._core.arc.ARCPlusCachePolicy), checked as the
                    core is, the shadow an unarmed ARC+, with calls that
                    reach its rules: on_request_finished remembering keys
                    in b1 (new, repeated, more than the capacity: b1
                    trimmed, ghosts to b2), evict judging offers of
                    first-seen keys (refused, or kept to t1's victims,
                    while b1's ghosts come back less than b2's)

The module is marked gc_stress (the GC-stress leg runs it: the child reads
ARC_CY_GC_STRESS and runs its nomem rounds with gc.set_threshold(1)) and
sanitize (.ci/sanitize.sh runs it under ASan). ARC_CY_FUZZ_PROFILE=long
runs the long profile; ARC_CY_FUZZ_SEED=N fixes the seed (rerun the
program by hand with --seed N, --mode and --impl: see its docstring).
"""

from __future__ import annotations

import os

import pytest

from childproc import run_modes

# compiled: the child runs the compiled classes.
pytestmark = [pytest.mark.sanitize, pytest.mark.gc_stress, pytest.mark.compiled]

PROFILE = os.environ.get("ARC_CY_FUZZ_PROFILE", "ci")
# Generous: the ci profile takes ~30 s here, 50 s in GC stress, 3-5x under ASan.
TIMEOUT = {"ci": 1200, "long": 8 * 3600}[PROFILE]

# What a cleared core reaches, ARC's or ARC+'s (ARC+'s run gives the
# collector slightly fewer calls to poke: its minimum for those is its own).
CLEARED_CORE = {
    "collections": 2500,
    "fin_run": 8000,  # finalizers of the garbage that called methods
    "key_del": 2000,  # keys' and chunks' __del__ while the collector works
    "chunk_del": 2000,
    "cycle_through_entry": 1500,  # policy -> key or chunk -> list -> policy
    "late_run": 2400,  # Late finalizers, run while the collector clears
    "late_found": 1900,  # ... that found the round's objects
    "poke_late_cleared_core": 1600,  # calls on a core the collector emptied
    "late_iter_RuntimeError": 35,  # its iterators refuse (MSG_MUTATED)
    "late_view_AttributeError": 750,  # cleared views refuse
    "survivor_policy_checked": 140,  # rescued cores pass _check_invariants()
}

# Counts each run must reach (about a quarter of what ci-profile runs
# reached here; the same under ASan: runs are sized by rounds).
MIN = {
    "cleared-cython": CLEARED_CORE,
    "nomem-cython": {
        "calls_armed": 9800,
        "failed_unchanged": 5300,  # a call that raised changed nothing
        "agreed": 11000,  # a call that returned agreed with the shadow
        "nomem_insert": 1150,  # MemoryError per method
        "nomem_touch": 980,
        "nomem_evict": 940,
        "nomem_on_store_miss": 480,
        "nomem_on_request_finished": 550,
        "nomem_remove": 120,
        "nomem_insert_table_grows": 40,  # where the table had to grow
        "nomem_insert_nodes_grow": 500,  # where the node array had to
        "nomem_many_keys": 320,  # calls of over 64 keys (working storage)
        "ok_armed_clear": 800,  # clear() cannot fail: it allocates nothing
        # __init__ neither: its capacity is a C value
        "ok_armed___init__": 880,
        "ok_armed_insert_grows": 520,
    },
    "cleared-plus": {
        **CLEARED_CORE,
        "poke_late_cleared_core": 1550,
        "plus_finished": 200,  # on_request_finished with keys to remember
        "plus_offer": 210,  # evict() offered new keys (protected)
    },
    "nomem-plus": {
        "calls_armed": 11000,
        "failed_unchanged": 5500,
        "agreed": 13000,
        "nomem_insert": 1300,
        "nomem_touch": 1050,
        "nomem_evict": 520,
        "nomem_on_store_miss": 520,
        "nomem_on_request_finished": 820,
        "nomem_remove": 125,
        "nomem_insert_table_grows": 40,
        "nomem_insert_nodes_grow": 600,
        "nomem_many_keys": 430,
        "ok_armed_clear": 870,
        "ok_armed___init__": 860,
        "ok_armed_insert_grows": 520,
        # ARC+'s rules (arc_cy._policy.PLUS_DOC) under failing allocations:
        # on_request_finished failed with keys to remember in b1 ...
        "nomem_plus_remember": 800,
        "nomem_plus_remember_repeated": 490,  # ... one of them repeated
        "nomem_plus_trim": 350,  # ... b1 to trim past cache_capacity
        "nomem_plus_table_grows": 390,  # ... the table had to grow for them
        "nomem_plus_nodes_grow": 380,  # ... the node array too
        # ... at one of its last allocations (the reserves: the same call,
        # failing one allocation later, returned)
        "nomem_plus_near_end": 30,
        "ok_armed_plus_remember": 145,  # ... returned, armed
        "plus_remember": 620,  # returned and agreed (armed or not)
        "plus_trim": 260,
        "nomem_plus_first_seen": 190,  # evict() of an offer of first-seen keys failed
        "nomem_plus_guarded": 25,  # ... while b1's ghosts came back less than b2's
        # rounds started from such fates (half; the rest reach them by
        # asking b2's ghosts again), and what the guard then did: evictions
        # refused (a first-seen offer returned None with enough victims),
        # or admitted with t1's victims alone
        "plus_seeded": 350,
        "plus_guarded": 240,
        "plus_evict_refused": 24,
        "ok_armed_plus_evict_refused": 8,
        "plus_evict_guarded_admitted": 80,
        "plus_ghosts_to_b2": 120,  # on_request_finished moved asked ghosts to b2
        "plus_ghost_t2": 160,  # insert() of a ghost put it in t2 (rule 1)
    },
}


@pytest.fixture(scope="module")
def faults_run() -> dict:
    runs, how, _, stderr = run_modes(
        "faults_fuzz.py", "--mode", "all", "--impl", "all", "--profile", PROFILE, timeout=TIMEOUT
    )
    return {"runs": runs, "why": f"{how}\n{stderr[-8000:]}"}


@pytest.mark.parametrize("run", list(MIN))
def test_faults_fuzz(run: str, faults_run: dict, fuzz_coverage: dict) -> None:
    if run not in faults_run["runs"]:
        pytest.fail(f"{run} did not pass: {faults_run['why']}", pytrace=False)
    counts = faults_run["runs"][run]
    print(f"\n[faults {run} {PROFILE}] {counts}")
    fuzz_coverage[f"faults {run} ({PROFILE})"] = counts
    low = {k: (counts.get(k, 0), want) for k, want in MIN[run].items() if counts.get(k, 0) < want}
    assert not low, f"coverage below the minimum (reached, minimum): {low}; all: {counts}"
