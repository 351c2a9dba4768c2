"""Decisions: the policy's results and state match vLLM's ARCCachePolicy
(the oracle) in the cases where user code takes part in them: ref_cnt
changing during evict's scan, targets that are Fractions or lack int(),
or lie beyond float range (int(target_t1_size) taken at each step of
evict, as vLLM does), keys both inserted-only and reused, on_store_miss
with resident keys. Where vLLM is not the judge (hostile corner cases),
the two implementations agree with each other, but where the core's own
rules decide (a failed call changes nothing, a read refuses a mutator:
core_only).

(Decisions on ordinary traffic: test_differential.py and
test_fuzz_stateful.py, in-process; test_manager.py and the scheduler
modules inside vLLM.)
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from arc_cy._messages import MSG_REENTRANT
from helpers import CTX, IMPLEMENTATIONS, ChunkStatus, K, VllmARC, keysnap, load_policy_class, ready
from hostile import EqRaises, HostileError, Key, after, hostile, populated, with_ghosts

pytestmark = pytest.mark.gc_stress

# --- against vLLM's ARC ---------------------------------------------------------


@pytest.mark.needs_vllm
def test_ref_cnt_changing_mid_scan_matches_vllm(policy_cls):
    """protected.__contains__ pins and unpins other chunks while evict()
    scans: the decisions follow the live values, exactly as vLLM's."""

    def scenario(cls):
        policy = cls(4)
        chunks = {}
        for i in range(8):
            chunks[K(i)] = ready(i)
            policy.insert(K(i), chunks[K(i)], CTX)
        policy.touch([K(5), K(6), K(7)], CTX)  # t1 = 0..4, t2 = 5..7
        policy.target_t1_size = 4

        class Flipper:
            calls = 0

            def __contains__(self, key):
                Flipper.calls += 1
                n = Flipper.calls
                if n == 1:
                    chunks[K(1)].ref_cnt = 1  # pin the next t1 candidate
                    chunks[key].ref_cnt = 3  # and the one being examined
                elif n == 2:
                    chunks[K(5)].ref_cnt = -1
                    chunks[K(1)].ref_cnt = 0  # already passed: not revisited
                elif n == 4:
                    chunks[K(7)].ref_cnt = 2
                return key == K(2)

        result = policy.evict(4, Flipper())
        return (
            [(k, c.chunk_id) for k, c in result or ()],
            Flipper.calls,
            keysnap(policy),
            {k: c.ref_cnt for k, c in chunks.items()},
        )

    got = scenario(policy_cls)
    assert got == scenario(VllmARC)
    assert got[0]  # the scenario does evict something


@pytest.mark.needs_vllm
def test_fraction_target_ghost_hits_match_vllm(policy_cls):
    """target_t1_size may be any real number: a Fraction's arithmetic runs
    Python code (and may start a collection) in the middle of touch()."""
    from fractions import Fraction

    def scenario(cls):
        policy = populated(cls)
        policy.target_t1_size = Fraction(1, 3)
        policy.touch([K(0), K(2), K(3), K(4), K(7), K(8), K(9)], CTX)
        policy.on_store_miss([K(1)], CTX)
        return keysnap(policy)

    got = scenario(policy_cls)
    assert got == scenario(VllmARC)
    assert got[4] == Fraction(7, 3)  # two b1 hits, each adding 1
    assert type(got[4]) is Fraction


INTS: list = []  # int() taken of a CountingFraction
CountingFraction = hostile(Fraction, __int__=lambda _: INTS.append(1))
NoInt = hostile(Fraction, __int__=ArithmeticError("no int() for this target"))


def _evict_outcome(policy, n):
    try:
        result = policy.evict(n, set())
    except ArithmeticError as exc:
        return ("raised", str(exc), keysnap(policy))
    return (result and [k for k, _ in result], keysnap(policy))


@pytest.mark.needs_vllm
def test_int_of_the_target_is_taken_at_each_step_of_evict(policy_cls):
    """The core took int(target_t1_size) in the setter and at each
    ghost hit. vLLM takes it at every step of evict's selection."""

    def run(cls):
        policy = with_ghosts(cls, capacity=8)
        for i in range(10, 16):
            policy.insert(K(i), ready(i), CTX)
        policy.target_t1_size = CountingFraction(5, 2)
        INTS.clear()
        result = _evict_outcome(policy, 5)
        return result, len(INTS)

    ours, oracle = run(policy_cls), run(VllmARC)
    assert ours == oracle
    assert oracle[1] == 5


@pytest.mark.needs_vllm
def test_a_target_without_int_is_stored_and_fails_in_evict(policy_cls):
    """The core's setter raised for a target whose __int__ fails;
    vLLM and the twin store it, and evict() raises, changing nothing."""

    def run(cls):
        policy = with_ghosts(cls)
        policy.target_t1_size = NoInt(3, 2)
        return type(policy.target_t1_size), _evict_outcome(policy, 1)

    got = run(policy_cls)
    assert got == run(VllmARC)
    assert got[1][:2] == ("raised", "no int() for this target")


@pytest.mark.needs_vllm
def test_a_ghost_hit_to_a_target_without_int_completes(policy_cls):
    """A ghost hit whose new target has no int() made the core's
    touch() raise after it had applied the keys before it."""

    NoIntAfterAdd = hostile(Fraction, __add__=lambda t, other: NoInt(Fraction.__add__(t, other)))

    def run(cls, target):
        policy = with_ghosts(cls)
        policy.target_t1_size = target
        policy.touch([K(4), K(0), K(3)], CTX)  # K(0): b1 hit; K(4), K(3) after it
        return keysnap(policy), _evict_outcome(policy, 1)

    got = run(policy_cls, NoIntAfterAdd(1, 2))
    assert got == run(VllmARC, NoIntAfterAdd(1, 2))
    assert type(got[0][4]) is NoInt and got[1][0] == "raised"
    assert got[0][1] == [K(3), K(4)]  # the keys around the hit were applied
    # a NoInt target itself: the hit's Fraction arithmetic makes a Fraction
    assert run(policy_cls, NoInt(1, 2)) == run(VllmARC, NoInt(1, 2))


@pytest.mark.parametrize(
    "target", [10**400, -(10**400), Fraction(10**400, 3)], ids=["huge", "-huge", "fraction"]
)
@pytest.mark.needs_vllm
def test_a_target_beyond_float_range_is_accepted_as_by_vllm(policy_cls, target):
    """Math.isfinite raised a bare OverflowError for 10**400."""

    def run(cls):
        policy = with_ghosts(cls)
        policy.target_t1_size = target
        return _evict_outcome(policy, 2)

    assert run(policy_cls) == run(VllmARC)


@pytest.mark.needs_vllm
def test_key_both_inserted_only_and_reused_is_inserted_only(policy_cls):
    """Insertion_only_keys wins over reused_keys, as in vLLM (a
    mutant that checked reused_keys first died only in the state machine)."""

    def scenario(cls):
        policy = populated(cls)  # t1 = [2, 4, 5], t2 = [3]
        both = {K(2), K(3)}
        policy.on_request_finished(((K(2), K(3), K(4)),), both, both | {K(4)}, CTX)
        return keysnap(policy)

    got = scenario(policy_cls)
    assert got == scenario(VllmARC)
    assert got[:2] == ([K(5), K(2)], [K(4), K(3)])


@pytest.mark.needs_vllm
def test_on_store_miss_ignores_resident_keys(policy_cls):
    """On_store_miss only looks at the ghosts (a mutant that looked
    resident keys up too died only in the state machine)."""

    def scenario(cls):
        policy = populated(cls)
        policy.on_store_miss([K(2), K(3), K(5), K(1)], CTX)
        return keysnap(policy)

    got = scenario(policy_cls)
    assert got == scenario(VllmARC)
    assert got[2] == [K(0), K(1)] and got[4] == 1


# --- the twins agree on hostile corner cases ------------------------------------


def _batch_touch_with_failing_first_key(policy):
    # touch() processes keys last to first; the first key's lookup fails.
    try:
        policy.touch([EqRaises(K(0)), K(4), K(5)], CTX)
    except ArithmeticError:
        pass
    return keysnap(policy)


def _request_finished_with_failing_container(policy):
    fails = hostile(set, __contains__=after(2, HostileError))()  # the third time
    try:
        policy.on_request_finished(((K(2), K(4), K(5)),), fails, {K(4), K(5)}, CTX)
    except HostileError:
        pass
    return keysnap(policy)


def _request_finished_unused_key_with_raising_eq(policy):
    # vLLM looks a key up only when it is in one of the two containers, so
    # the raising __eq__ of a key in neither must never run.
    try:
        policy.on_request_finished(((K(5), EqRaises(K(4))),), set(), {K(5)}, CTX)
    except ArithmeticError:
        return "raised"
    return keysnap(policy)


def _get_colliding_with_a_ghost(policy):
    # vLLM's get() searches t1 and t2 only; the compiled core's one table
    # holds the ghosts too, and must not compare with them.
    try:
        return policy.get(EqRaises(K(0)))
    except ArithmeticError:
        return "raised"


def _exhausted_iterator_after_change(policy):
    it = iter(policy.b1)
    assert [next(it), next(it)] == [K(0), K(1)]  # at the end, not past it
    policy.insert(K(80), ready(80), CTX)
    policy.evict(1, ())  # b1 changes
    try:
        return next(it, "exhausted")
    except RuntimeError as error:
        return str(error)


def _get_whose_eq_inserts(policy):
    try:
        policy.get(Key(K(4), eq=lambda *_: policy.insert(K(60), ready(60), CTX) or False))
    except RuntimeError as error:
        return str(error)
    return keysnap(policy)


def _init_again(policy):
    policy.__init__(1)
    policy._check_invariants()
    return keysnap(policy), policy.cache_capacity


FalsyChunk = hostile(ChunkStatus, __bool__=lambda _: False)


def _falsy_chunk_get(policy):
    chunk = FalsyChunk(70)
    policy.insert(K(70), chunk, CTX)
    return policy.get(K(70)) is chunk


def _touch_keeps_which_key_object(policy):
    copy = bytes(bytearray(K(4)))
    policy.touch([copy], CTX)
    return [k is copy for k in policy.t2]


@pytest.mark.compiled  # compares the core with its twin
@pytest.mark.parametrize(
    "scenario",
    [
        _request_finished_unused_key_with_raising_eq,
        _get_colliding_with_a_ghost,
        _exhausted_iterator_after_change,
        _init_again,
        _falsy_chunk_get,
        _touch_keeps_which_key_object,
    ],
)
def test_twins_agree_on_corner_cases(scenario):
    results = []
    for name in IMPLEMENTATIONS:
        policy = populated(load_policy_class(name))
        try:
            results.append(("ok", scenario(policy)))
        except Exception as error:  # the outcome is what is compared
            results.append((type(error), str(error)))
    assert results[0] == results[1]


@pytest.mark.core_only
def test_where_the_cores_rules_decide_a_corner_case(policy_cls):
    """A call that fails halfway has changed nothing (rule 11), and a read
    whose user code calls a mutator refuses it (rule 2). The twin, as
    vLLM's, applies the keys before the failing one, and lets the mutator
    through."""
    untouched = keysnap(populated(policy_cls))
    assert _batch_touch_with_failing_first_key(populated(policy_cls)) == untouched
    assert _request_finished_with_failing_container(populated(policy_cls)) == untouched
    assert _get_whose_eq_inserts(populated(policy_cls)) == MSG_REENTRANT.format("insert", "get")


@pytest.mark.needs_vllm
@pytest.mark.parametrize(
    "scenario",
    [
        _batch_touch_with_failing_first_key,
        _request_finished_with_failing_container,
        _get_whose_eq_inserts,
    ],
)
def test_the_twin_decides_those_corner_cases_as_vllm(scenario):
    assert scenario(populated(load_policy_class("python"))) == scenario(populated(VllmARC))


@pytest.mark.needs_vllm
@pytest.mark.parametrize("raises", ["none", "protected", "int"])
def test_evict_beyond_the_resident_count_scans_as_vllm(policy_cls, raises):
    """evict(n) with n above the resident count returned None at once; vLLM
    scans first, asking protected about each ready entry and taking
    int(target_t1_size) at each step, so what those raise is raised (and
    what they see is the same), then it returns None."""

    def run(cls):
        policy = populated(cls)  # 4 resident
        asked = []

        def int_of(_):
            asked.append("int")
            if raises == "int" and asked.count("int") == 3:
                raise ArithmeticError("int() refused")

        def contains(_, key):
            asked.append(key)
            if raises == "protected" and len(asked) == 4:
                raise HostileError("protected refused")
            return False

        policy.target_t1_size = hostile(Fraction, __int__=int_of)(3, 2)
        try:
            result = policy.evict(9, hostile(object, __contains__=contains)())
        except (HostileError, ArithmeticError) as exc:
            result = (type(exc).__name__, str(exc))
        return result, asked, keysnap(policy)[:5]

    ours, oracle = run(policy_cls), run(VllmARC)
    assert ours == oracle
    assert len(oracle[1]) > 3
