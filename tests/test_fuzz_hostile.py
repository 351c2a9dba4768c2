"""The hostile fuzzer, run in a child process.

tests/progs/hostile_fuzz.py is a hypothesis state machine whose keys,
chunks, protected containers, targets, n, key iterables, request contexts,
gc.callbacks hooks and __del__ methods act (raise, re-enter, read, copy,
collect). It runs in a child so that a crash fails the test instead of
killing pytest; the child inherits os.environ, so the sanitizer build's
LD_PRELOAD and PYTHONPATH reach it. Each test asserts a clean exit and that
the run reached what it is for (the COVERAGE line's counts).

    agree           the core and vLLM (behind an adapter for arc_cy's
                    documented divergences) side by side
    chaos-cython,   one compiled class, with contract-breaking keys,
    chaos-plus      mutating __del__ and gc hooks, non-chunk objects and
                    containers that are not iterable: no crash, allowed
                    exceptions only, _check_invariants(), and a failed
                    call changed nothing; chaos-plus runs the compiled
                    ARC+ (arc_cy._core.arc.ARCPlusCachePolicy), half its
                    runs from ghost fates that guard t2, and checks its
                    rules where the step's keys keep the contract

The compiled classes alone: hostile input is the core's rules' business
(docs/hardening.md); the twins, vLLM's code, are exposed to it as vLLM's
ARC is.

tests/progs/surface_fuzz.py attacks what Python code can reach of the core
besides the arguments, in a child too (each test asserts what its COVERAGE
line reached):

    surface-reflect every type and callable of arc_cy._core.arc, and of user
                    subclasses and chunk types, called with
                    hostile arguments, positionally and by keyword, from
                    the top and from inside calls (gc.get_referrers);
                    coverage complete
    surface-threads three threads on one policy, with keys and chunks whose
                    __del__ calls back: calls overlapped
    surface-hooks   trace, profile and signal hooks that raise (also
                    KeyboardInterrupt, also in finally clauses) or re-enter
                    inside calls, __init__ again and __del__ included; the
                    policy still agrees with vLLM's ARC

ARC_CY_FUZZ_PROFILE=long runs the long profile; ARC_CY_FUZZ_SEED=N fixes
the seed (every run prints its seed; rerun the program by hand with
``--seed N``, see its docstring).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from childproc import child_env, run_modes

pytestmark = pytest.mark.sanitize

TESTS = os.path.dirname(os.path.abspath(__file__))
PROG = os.path.join(TESTS, "progs", "hostile_fuzz.py")
PROFILE = os.environ.get("ARC_CY_FUZZ_PROFILE", "ci")
# Generous: the ci profile takes ~25 s here (imports included), 3-5x that under ASan.
TIMEOUT = {"ci": 1200, "long": 8 * 3600}[PROFILE]

# Counts every run must reach (a quarter or less of what ci-profile runs
# reached). Keys are the program's counters.
COMMON_MIN = {
    "cb_hash": 1000,  # each callback kind fired
    "cb_eq": 100,
    "cb_contains": 200,
    "cb_next": 400,
    "cb_ctx": 200,
    "cb_index": 20,
    "cb_target_int": 5,
    "cb_target_float": 5,
    "cb_del_key": 10,
    "cb_del_chunk": 5,
    "refused": 1000,  # re-entrant mutators refused
    "collect_in_call": 100,  # collections started inside a call
    "gc_in_call": 200,
    "ghost_hit": 20,
    "evict_full": 30,  # successful evictions of a full cache
    "evict_pinned_skip": 15,
    "evict_protected_skip": 5,
    "view_iter_in_call": 200,  # views iterated during a call
    "gc_hook_action": 50,
    "exc_HostileError": 100,
}
# Acting copies of keys and chunks whose __del__ calls the policy: where
# they fired (in clear(), in __init__ again, after a call's return), nested,
# and what they did there.
MDEL_MIN = {
    "mdel_fired": 110,
    "mdel_in_clear": 34,
    "mdel_in_init": 23,
    "mdel_after_call": 54,
    "mdel_nested": 10,
    "mdel_write_in_clear": 13,
}
MIN = {
    "agree": {
        **COMMON_MIN,
        "copy_taken": 50,
        "copy_refused": 20,
        # compared with vLLM's ARC, whose __del__s do the same
        **MDEL_MIN,
        "mdel_fired": 400,
        "mdel_in_clear": 95,
        "mdel_in_init": 100,
        "mdel_after_call": 200,
        "mdel_nested": 40,
        "mdel_init_in_clear": 10,
        "mdel_write_in_clear": 45,
        "mdel_mutate_in_init": 65,
    },
    "chaos-cython": {
        **COMMON_MIN,
        **MDEL_MIN,
        "copy_refused": 50,
        "mutate_accepted": 10,
        "unchanged_checked": 1100,  # failed calls found to have changed nothing
    },
    "chaos-plus": {
        # ARC+ has no target: no target's arithmetic calls back
        **{k: v for k, v in COMMON_MIN.items() if not k.startswith("cb_target_")},
        **MDEL_MIN,
        "copy_refused": 50,
        "mutate_accepted": 10,
        "unchanged_checked": 1100,
        # fewer evictions pass over a protected key (first-seen offers
        # refused, and tiny capacities)
        "evict_protected_skip": 3,
        # ARC+'s rules (arc_cy._policy.PLUS_DOC) at work: runs started from
        # fates that guard t2 (plus_seeded), half of them with t2 full
        # (plus_seeded_t2: a refusal at the first offer); first-seen offers evicted
        # under that guard (plus_guarded), from t1 alone (admitted), or
        # refused where ARC would have evicted (plus_refused); keys
        # remembered in b1 and ghosts moved to b2 by on_request_finished,
        # ghosts that insert() took back into t2, a protected that is not
        # iterable refused (TypeError); each rule checked (PlusRules)
        "plus_seeded": 110,
        "plus_seeded_t2": 130,
        "plus_guarded": 25,
        "plus_guarded_admitted": 5,
        "plus_refused": 40,
        "plus_remembered": 300,
        "plus_ghost_b2": 55,
        "plus_ghost_t2": 65,
        "plus_not_iterable": 25,
        "plus_rule1_checked": 25,
        "plus_rule2_checked": 70,
        "plus_rule3_checked": 150,
    },
}


def run_fuzzer(mode: str, impl: str) -> dict:
    cmd = [sys.executable, "-P", PROG, "--mode", mode, "--impl", impl, "--profile", PROFILE]
    if os.environ.get("ARC_CY_FUZZ_SEED"):
        cmd += ["--seed", os.environ["ARC_CY_FUZZ_SEED"]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=child_env())
    if proc.returncode != 0:
        how = f"exit {proc.returncode}"
        if proc.returncode < 0:
            how = f"killed by {signal.Signals(-proc.returncode).name} (a crash)"
        pytest.fail(f"{' '.join(cmd)}: {how}\n{proc.stderr[-8000:]}", pytrace=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("COVERAGE ")]
    assert len(lines) == 1, proc.stdout[-2000:]
    counts = json.loads(lines[0][len("COVERAGE ") :])
    print(f"\n[{mode} {impl} {PROFILE}] {lines[0]}")
    return counts


@pytest.mark.parametrize(
    ("mode", "impl"),
    [
        # vLLM's ARC beside arc_cy; chaos needs no oracle
        pytest.param("agree", "cython", marks=pytest.mark.needs_vllm),
        ("chaos", "cython"),
        ("chaos", "plus"),
    ],
    ids=["agree", "chaos-cython", "chaos-plus"],
)
@pytest.mark.compiled
def test_hostile_fuzz(mode: str, impl: str, fuzz_coverage: dict) -> None:
    counts = run_fuzzer(mode, impl)
    key = mode if mode == "agree" else f"{mode}-{impl}"
    fuzz_coverage[f"{key} ({PROFILE})"] = counts
    low = {k: (counts.get(k, 0), want) for k, want in MIN[key].items() if counts.get(k, 0) < want}
    assert not low, f"coverage below the minimum (reached, minimum): {low}; all: {counts}"


# Counts each surface_fuzz run must reach (about a quarter of what ci-profile
# runs reached here; under ASan the counts are the same, as the run is sized
# by steps). Reflect mode also fails by itself when a callable it enumerated
# was never called. A run's own entry ("hooks-cython") adds to its mode's.
SURFACE_MIN = {
    "reflect": {
        "types": 12,  # the core's own types, those its calls hand out, the user's
        "callables_found": 370,
        "calls_top": 1500,
        "calls_in_call": 2000,  # from a key's __eq__, protected, a gc callback
        "half_built": 10,  # T.__new__(T)
        "in_call_found": 5000,  # objects gc.get_referrers / get_objects found
        # by keyword: the right names (some returned), wrong names, duplicates
        "calls_kw_right": 100,
        "calls_kw_right_returned": 50,
        "calls_kw_wrong": 500,
        "calls_kw_dup": 40,
        "kw_compared": 50,  # the same keyword call on the core and the twin
        # user subclasses' overrides: calling into the policy, skipping
        # super(), raising
        "user_rounds": 12,
        "user_init_call": 7,
        "user_init_skip": 7,
        "user_init_raise": 8,
        # (the twin's types are no longer enumerated: CPython 3.13's run
        # reached 9, 8 and 6 of these, 3.11's 11, 10 and 12)
        "user_setattr_call": 4,
        "user_setattr_skip": 4,
        "user_setattr_raise": 4,
        "user_bool_call": 5,
        "user_bool_raise": 5,
        "user_call_refused": 14,  # mutators from user code, refused in a call
        "user_call_accepted": 12,  # and accepted outside one
        # hostile chunks' truth tests: in get() (t1), raising, falsy
        "chunk_bool": 50,
        "chunk_len": 13,
        "chunk_raised": 10,
        "chunk_falsy": 11,
        "chunk_in_get": 10,  # calling into the policy whose get() tests it
        "truth_t1": 25,
        "truth_t2": 50,
    },
    # a SlowKey's hash gives the GIL away: 30,000 to 43,000 refused per run here
    "threads": {
        "calls": 30000,
        "overlaps": 1000,
        "refused": 3000,
        # __del__ calling the policy back, from keys and from chunks
        "del_key": 5000,
        "del_chunk": 1000,
        "del_read": 2000,
        "del_refused": 3000,  # by another thread's call
        "del_mutator_accepted": 400,
        "del_accepted_in_release": 80,  # released by its own thread's clear() or __init__
    },
    "hooks": {
        "trace_fired": 80,
        "profile_fired": 80,
        "signal_fired": 10,
        "hook_raised": 100,
        "hook_raised_interrupt": 40,  # KeyboardInterrupt, not HostileError
        "reentry_refused": 30,  # mutators re-entered from a hook
        "reentry_read": 50,
        "compared": 600,  # steps that agreed with the reference afterwards
        "steps___init__": 50,  # __init__ again, as a step
        "fired_in_init": 17,  # hooks that fired inside it
        "del_calls": 25,  # a key's __del__ calling back
        "del_in_release": 8,  # released by a clear() or __init__
        "works_after": 1200,  # a mutator accepted after the step
    },
}


# Nothing is left out of the reflect run (`--exclude` is for triage by hand).
SURFACE_EXCLUDE = ""


@pytest.fixture(scope="module")
def surface_run(tmp_path_factory) -> dict:
    """One child for every surface mode (--mode all): one import of vLLM,
    most of a run's time under ASan. Each run prints its own COVERAGE line,
    so a crash fails the run it happened in and those after it."""
    last = tmp_path_factory.mktemp("surface") / "last_call"
    args = ("--mode", "all", "--profile", PROFILE, "--last-call", str(last))
    runs, how, stdout, stderr = run_modes(
        "surface_fuzz.py", *args, "--exclude", SURFACE_EXCLUDE, timeout=TIMEOUT
    )
    running = last.read_text().strip() if last.exists() else "?"
    return {
        "runs": runs,
        "why": f"{how}\nlast call: {running}\n{stdout[-2000:]}\n{stderr[-8000:]}",
    }


@pytest.mark.compiled  # surface_fuzz.py drives the core
@pytest.mark.parametrize(
    "run",
    # hooks' reference is vLLM's ARC (without vLLM, the twin)
    ["reflect", "threads-cython", "hooks-cython"],
)
def test_surface_fuzz(run: str, surface_run: dict, fuzz_coverage: dict) -> None:
    if run not in surface_run["runs"]:
        pytest.fail(f"{run} did not pass: {surface_run['why']}", pytrace=False)
    counts = surface_run["runs"][run]
    print(f"\n[surface {run} {PROFILE}] {counts}")
    fuzz_coverage[f"surface {run} ({PROFILE})"] = counts
    if run == "reflect":
        assert counts["callables_called"] == counts["callables_found"], counts
    minima = {**SURFACE_MIN[run.split("-")[0]], **SURFACE_MIN.get(run, {})}
    low = {k: (counts.get(k, 0), want) for k, want in minima.items() if counts.get(k, 0) < want}
    assert not low, f"coverage below the minimum (reached, minimum): {low}; all: {counts}"
