"""Re-entrancy: user code that a call runs (a key's __hash__, __eq__ or
__del__, a protected container's __contains__, a target's arithmetic, n's
__index__, a key iterable, a request context) and that calls back into
the policy.

Every mutating call refuses a mutator that its user code calls, with
arc_cy's RuntimeError (MSG_REENTRANT), and the refused call changes
nothing, while reads work as in vLLM: in both implementations. The rest is
the core's busy protocol (core_only, docs/hardening.md rules 2, 6 and 10):
reads, the target setter and __init__'s capacity are busy too; what a call
replaces or drops is released after it returns, so a __del__ that mutates
finds the policy free; another thread's mutator is refused. The riskiest
callbacks run again in a child process, so that a crash fails a test
instead of killing pytest.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from arc_cy import _messages
from childproc import run_json, run_prog
from helpers import (
    ARC_CY_DIR,
    CTX,
    K,
    keysnap,
    oracle,
    ready,
    snapshot,
    twin,
)
from hostile import (
    DEL_ACTS,
    DEL_LOG,
    MUTATION_PARAMS,
    MUTATIONS,
    WHENS,
    HostileError,
    Index,
    Key,
    calls_with,
    core_only_params,
    drop_callback_key,
    hostile,
    logged,
    populated,
    set_target,
    try_insert,
    unchanged,
    with_ghosts,
)

pytestmark = [pytest.mark.gc_stress, pytest.mark.both_policies]

# --- every call is busy before its first user code ------------------------------


REFUSALS: list[str] = []


class Arm:
    policy = None

    @classmethod
    def fire(cls):
        if cls.policy is not None:
            policy, cls.policy = cls.policy, None  # once
            try_insert(policy, REFUSALS)


def _fire(*_):
    Arm.fire()


def _calling_keys():
    Arm.fire()
    yield K(4)


def CallingKey(n):
    return Key(K(n), hash=_fire)


CallingIndex = hostile(Index, __index__=_fire)
CallingSet = hostile(set, __contains__=_fire)
CallingCtx = hostile(object, get_offload_key_position=_fire)


def _set_calling_target(p):
    p.target_t1_size = hostile(Fraction, __float__=_fire)(1, 2)


BUSY_CALLS = {
    # method, what runs user code first
    "insert": ("insert", lambda p: p.insert(CallingKey(50), ready(50), CTX)),
    "remove": ("remove", lambda p: p.remove(CallingKey(4))),
    "get": ("get", lambda p: p.get(CallingKey(4))),
    "view contains": ("get", lambda p: CallingKey(4) in p.t1),
    "touch": ("touch", lambda p: p.touch(_calling_keys(), CTX)),
    "on_store_miss": ("on_store_miss", lambda p: p.on_store_miss(_calling_keys(), CTX)),
    "on_request_finished ctx": (
        "on_request_finished",
        lambda p: p.on_request_finished(((K(4), K(5)),), set(), {K(4)}, CallingCtx()),
    ),
    "on_request_finished sets": (
        "on_request_finished",
        lambda p: p.on_request_finished(((K(4),),), CallingSet(), {K(4)}, CTX),
    ),
    "evict n": ("evict", lambda p: p.evict(CallingIndex(1), set())),
    "evict protected": ("evict", lambda p: p.evict(1, CallingSet())),
    "target_t1_size": ("target_t1_size", _set_calling_target),
    "__init__": ("__init__", lambda p: p.__init__(CallingIndex(4))),
}
# The core's alone: its reads are busy, and its setter and __init__ check
# their values (the twin's run no user code there, as vLLM's).
CORE_BUSY = ("get", "view contains", "target_t1_size", "__init__")


@pytest.mark.parametrize("how", core_only_params(BUSY_CALLS, CORE_BUSY))
def test_every_call_is_busy_before_its_first_user_code(policy_cls, how):
    """For every mutating method: the first user code a call runs already
    finds it busy (the twin once ran n.__index__ before it was busy)."""
    running, call = BUSY_CALLS[how]
    REFUSALS.clear()
    policy = with_ghosts(policy_cls)
    Arm.policy = policy
    try:
        call(policy)
    finally:
        Arm.policy = None
    assert REFUSALS == [_messages.MSG_REENTRANT.format("insert", running)], REFUSALS
    policy._check_invariants()


# --- busy is read where user code's keys are not (rule 2) -----------------------


COLLIDING: list = []


def collider(name, how, policy, log):
    """A key user code puts in the policy's instance __dict__, whose hash is
    that of a name the policy reads (busy's, a list's, a value's): while
    COLLIDING, its __eq__ logs, then raises, calls a mutator of the policy
    (once), or only records that it ran."""
    inside = []

    def eq(key, other):
        if not COLLIDING:
            return key is other
        log.append(name)
        if how == "raise":
            raise HostileError(f"collider({name!r}).__eq__")
        if how == "mutate" and not inside:
            inside.append(True)  # once: a mutator that compares it again
            try:
                policy.remove(K(12345))  # absent: harmless, unless busy
            except RuntimeError as exc:
                if isinstance(exc, RecursionError):
                    raise
            finally:
                inside.clear()
        return False

    return Key(name, eq=eq)


COLLIDER_CALLS = {
    "get": lambda p: p.get(K(4)),
    "insert": lambda p: p.insert(K(50), ready(50), CTX),
    "remove": lambda p: p.remove(K(4)),
    "touch": lambda p: p.touch([K(4), K(0)], CTX),
    "on_store_miss": lambda p: p.on_store_miss([K(0), K(9)], CTX),
    "on_request_access": lambda p: p.on_request_access([K(4)], CTX),
    "on_request_finished": lambda p: p.on_request_finished(((K(4), K(5)),), set(), {K(4)}, CTX),
    "evict": lambda p: p.evict(1, set()),
    "mark_evictable": lambda p: p.mark_evictable(K(4)),
    "clear": lambda p: p.clear(),
    "__init__": lambda p: p.__init__(4),
    "target_t1_size": set_target(1),
    "_max_entries": lambda p: setattr(p, "_max_entries", 100),
    "_check_invariants": lambda p: p._check_invariants(),
    "view contains": lambda p: K(4) in p.t1,
    "view getitem": lambda p: p.t1[K(4)],
    "view iteration": lambda p: list(p.t2.items()),
    "view len": lambda p: len(p.b1),
    "cache_capacity": lambda p: p.cache_capacity,
}


@pytest.mark.core_only  # where the core's busy lives (rule 2)
@pytest.mark.parametrize("how", ["raise", "mutate", "record"])
def test_keys_in_the_instance_dict_never_touch_busy(policy_cls, how):
    """Whatever keys user code puts in the policy's __dict__, with the hash
    of any name the policy reads, every method of both implementations
    reads busy without calling them, and leaves the policy free: the
    twin's give-back once checked busy in the instance dict, so a key whose
    hash was "_busy"'s ran its __eq__ there, and one that raised left the
    twin busy for good (MSG_REENTRANT at every later mutator)."""
    names = ["_busy", *vars(with_ghosts(twin(policy_cls)))]
    for name in names:
        for label, call in COLLIDER_CALLS.items():
            policy = with_ghosts(policy_cls)
            if label == "target_t1_size" and not hasattr(policy, label):
                continue  # ARC's alone
            log: list[str] = []
            policy.__dict__[collider(name, how, policy, log)] = 1
            COLLIDING.append(True)
            try:
                call(policy)
            except HostileError:
                pass  # a lookup of a value's name: the call fails as vLLM's would
            finally:
                COLLIDING.clear()
            for key in [k for k in policy.__dict__ if type(k) is Key]:
                del policy.__dict__[key]
            if name == "_busy":
                assert log == [], f"{label}: busy's check ran a key's __eq__"
            # not busy: a mutator goes through, and the lists are whole
            policy.insert(K(77), ready(77), CTX)
            assert policy.get(K(77)) is not None, label
            policy._check_invariants()


@pytest.mark.core_only  # the core's release (rule 6)
@pytest.mark.parametrize("outer", ["clear", "__init__"])
@pytest.mark.parametrize("how", core_only_params(BUSY_CALLS, ()))
def test_a_call_nested_in_a_release_is_busy_before_its_first_user_code(policy_cls, how, outer):
    """Every method, run by a key's __del__ while clear() or __init__ again
    releases what it took out (rule 6; the __del__ puts K(4) back in the
    emptied policy first, for evict() to scan): its own first user code
    already finds it busy, so a mutator there is refused naming it, not the
    release."""
    running, call = BUSY_CALLS[how]
    REFUSALS.clear()
    policy = with_ghosts(policy_cls)
    policy.insert(Key("released", delete=lambda _: nested()), ready(60), CTX)

    def nested():
        policy.insert(K(4), ready(4), CTX)
        Arm.policy = policy
        try:
            call(policy)
        except Exception as exc:  # a __del__'s error would go unseen
            REFUSALS.append(f"raised {exc!r}")
        finally:
            Arm.policy = None

    policy.clear() if outer == "clear" else policy.__init__(4)
    assert REFUSALS == [_messages.MSG_REENTRANT.format("insert", running)], REFUSALS
    policy._check_invariants()


# --- protected containers and keys that mutate or read --------------------------


@pytest.mark.parametrize("mutation", MUTATION_PARAMS)
def test_protected_that_mutates_the_policy(policy_cls, mutation):
    policy = populated(policy_cls)
    seen = []

    def meddle(*_):
        try:
            MUTATIONS[mutation](policy)
        except RuntimeError as error:
            seen.append(str(error))
            raise
        seen.append("allowed")
        return False

    name = mutation.split("(")[0]
    meddling = hostile(set, __contains__=meddle)()
    error = unchanged(policy, lambda p: p.evict(2, meddling), RuntimeError)
    assert str(error) == (f"{name}() called on the ARC policy while evict() is still running")
    assert seen == [str(error)]
    # and the policy still works
    assert [k for k, _ in policy.evict(2, ())] == [K(2), K(4)]
    policy._check_invariants()


@pytest.mark.parametrize(
    "mutation",
    ["insert", "touch", "clear", *core_only_params(["target_t1_size"], {"target_t1_size"})],
)
def test_mutation_from_key_eq_is_refused(policy_cls, mutation):
    """A key's __eq__ runs inside a mutating call; it may not mutate."""
    policy = populated(policy_cls)
    for call, like in [
        ("insert", K(4)),
        ("touch", K(4)),
        ("remove", K(3)),
        ("on_store_miss", K(0)),  # it only looks at the ghosts
        ("on_request_finished", K(4)),
    ]:
        key = Key(like, eq=lambda *_: MUTATIONS[mutation](policy) or False)
        unchanged(policy, calls_with(key)[call], RuntimeError)


@pytest.mark.needs_vllm
def test_protected_that_reads_works_like_vllm(policy_cls):

    def scenario(cls):
        policy = populated(cls)
        log = []

        class Reader(set):
            def __contains__(self, key):
                chunk = policy.get(key)
                log.append(
                    (
                        key,
                        chunk is not None and chunk.chunk_id,
                        len(policy.t1),
                        list(policy.b1),
                        [k for k, _ in policy.t2.items()],
                        key in policy.t1,
                    )
                )
                return key == K(4)

        result = policy.evict(2, Reader())
        policy.get(K(5))
        return [k for k, _ in result], log, keysnap(policy)

    assert scenario(policy_cls) == scenario(oracle(policy_cls))


MUTATION_LOG: list[str] = []


INSERTING: list = []  # the policy that comparing keys try insert() on


def _inserting_eq(key, other):
    if INSERTING:
        try_insert(INSERTING[0], MUTATION_LOG)


def InsertingKey(name):
    """Keys sharing one hash, equal by name; comparing them tries insert()."""
    return Key(name, 4242, eq=_inserting_eq)


def _compare_while_busy(cls, call):
    MUTATION_LOG.clear()
    policy = cls(4)
    for name in "XYZ":
        policy.insert(InsertingKey(name), ready(ord(name)), CTX)
    INSERTING.append(policy)
    try:
        result = call(policy)
    finally:
        INSERTING.clear()
    policy._check_invariants()
    return keysnap(policy), result and [k.ident for k, _ in result], list(MUTATION_LOG)


COMPARING_CALLS = {
    "evict": lambda p: p.evict(3, ()),
    "remove": lambda p: p.remove(InsertingKey("Y")),
}


@pytest.mark.needs_vllm
@pytest.mark.parametrize("how", COMPARING_CALLS)
def test_key_eq_cannot_mutate_in_evict_or_remove(policy_cls, how):
    """The twin cleared busy before evict's apply phase and before
    remove's pop, which compare keys sharing a hash: an insert() from such
    an __eq__ succeeded there."""
    call = COMPARING_CALLS[how]
    state, result, log = _compare_while_busy(policy_cls, call)
    assert set(log) <= {_messages.MSG_REENTRANT.format("insert", how)}, log
    # the refused callbacks change nothing: the state is the one reached
    # without them
    quiet = oracle(policy_cls)(4)
    for name in "XYZ":
        quiet.insert(InsertingKey(name), ready(ord(name)), CTX)
    expected = call(quiet)
    assert (state, result) == (keysnap(quiet), expected and [k.ident for k, _ in expected])
    if policy_cls.__module__.startswith("arc_cy._twin.") or how == "remove":
        assert log  # the comparisons did run (the core's evict never compares)


@pytest.mark.core_only  # the twin's target is vLLM's attribute
@pytest.mark.arc_only  # ARC+ has no target
def test_target_setter_runs_user_code_while_busy(policy_cls):
    """The twin's setter ran the value's __float__ (math.isfinite)
    without being busy."""
    MUTATION_LOG.clear()
    policy = populated(policy_cls)
    before = keysnap(policy)
    inserting = hostile(Fraction, __float__=lambda _: try_insert(policy, MUTATION_LOG))
    policy.target_t1_size = inserting(5, 2)
    assert MUTATION_LOG == [_messages.MSG_REENTRANT.format("insert", "target_t1_size")]
    assert keysnap(policy)[:4] == before[:4]
    assert policy.target_t1_size == Fraction(5, 2)


# --- keys whose __del__ calls back: released after the call ---------------------


@pytest.mark.core_only  # the core releases after the call (rule 6)
@pytest.mark.parametrize("act", DEL_ACTS)
@pytest.mark.parametrize("when", WHENS)
def test_key_del_calls_back(policy_cls, when, act):
    """No crash, consistent lists, and the callback ran once, the policy
    free."""
    state, log = drop_callback_key(populated(policy_cls), when, act)
    assert log == ["ok"], log


REPLACE_ACTS = {
    "insert": lambda p: p.insert(K(50), ready(50), CTX),
    "evict": lambda p: p.evict(1, ()),
    "touch": lambda p: p.touch([K(2)], CTX),
    "get": lambda p: p.get(K(2)),
}


def _replace_key(cls, how, act):
    DEL_LOG.clear()
    policy = cls(3)
    policy.insert(K(2), ready(2), CTX)
    key = Key("cb", delete=logged(policy, REPLACE_ACTS[act]))
    policy.insert(key, ready(40), CTX)
    del key
    equal = Key("cb")
    if how == "insert-over-ghost":
        assert [k for k, _ in policy.evict(1, {K(2)})] == [equal]
        policy.insert(equal, ready(41), CTX)
    elif how == "touch":
        policy.touch([equal], CTX)
    elif how == "on_request_finished":
        policy.on_request_finished(((equal,),), set(), {equal}, CTX)
    policy._check_invariants()
    state = [[getattr(k, "ident", k) for k in lst] for lst in snapshot(policy)[:4]]
    return state, list(DEL_LOG)


@pytest.mark.core_only  # the core releases after the call (rule 6)
@pytest.mark.parametrize("act", REPLACE_ACTS)
@pytest.mark.parametrize("how", ["insert-over-ghost", "touch", "on_request_finished"])
def test_replaced_key_is_released_after_the_call(policy_cls, how, act):
    state, log = _replace_key(policy_cls, how, act)
    assert log == ["ok"], log  # the policy was no longer busy


# --- crash smoke in a child process ---------------------------------------------


def test_no_crash_in_a_child_process():
    """The riskiest callbacks again, in a child (tests/progs/reentry_smoke.py):
    a segfault is a failure here rather than a dead test run."""
    proc = run_prog("reentry_smoke.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("survived")


# --- calls from another thread: the core's rule 10 ---------------------------------


@pytest.mark.core_only
def test_nested_reads_in_two_threads_leave_the_policy_usable(impl):
    """Thread A's get() compares keys while thread B's get() starts (it
    nests), returns, and clear()s while B is still comparing. B's probe
    starts again on the emptied table, never reading a freed one, and B's
    return gives busy back to A's call, which gives it back in turn: the
    policy is not left busy."""
    out = run_json("surface.py", "nested", impl, "--no-vllm")
    assert out == {"a": True, "b": [True], "t1": [1]}


@pytest.mark.core_only
def test_two_threads_driving_one_policy(impl):
    """Two reader threads and a writer, keys whose __hash__ and __eq__ are
    Python code (one shared hash: every probe compares), switching every
    microsecond: no crash, no error but the refusals, calls overlapped,
    and the policy ends consistent and not busy."""
    out = run_json("surface.py", "threads", impl, "--no-vllm", timeout=600)
    assert out["other"] == [], out["other"][:5]
    assert out["overlapped"] > 1000, out  # 4,400 here (3.11, a busy 2-core machine)
    assert out["reader_calls"] >= 2000, out


@pytest.mark.core_only
def test_clear_is_not_overtaken_while_it_releases(impl):
    """clear() once released each list with busy clear: a thread that a
    released key's __del__ started could begin evict() between t1 and t2,
    and clear() then emptied t2 under its scan (the twin's evict raised
    KeyError; the core's read a freed node). Now every list is empty
    before anything is released: that thread's evict() finds nothing to
    scan."""
    out = run_json("surface.py", "overtaken", impl, "--no-vllm")
    assert out["other"] == ["None"], out
    assert not out["scanned"] and out["lists"] == [0, 0, 0, 0], out


# --- busy is set inside the try that clears it -------------------------------------


def test_a_failed_call_on_a_policy_made_by_new_leaves_it_usable(policy_cls):
    """The twin set busy one statement before the try that clears it: an
    insert() on a policy made by __new__ failed there and left every
    mutator refused, __init__ included."""
    policy = policy_cls.__new__(policy_cls)
    try:
        policy.insert(K(1), ready(1), CTX)
    except (AttributeError, MemoryError):
        pass
    policy.__init__(4)
    policy.insert(K(1), ready(1), CTX)
    assert list(policy.t1) == [K(1)]
    policy._check_invariants()


TRACED_CALLS = {
    "insert": lambda p: p.insert(K(70), ready(70), CTX),
    "remove": lambda p: p.remove(K(4)),
    "touch": lambda p: p.touch([K(4), K(0)], CTX),
    "on_store_miss": lambda p: p.on_store_miss([K(0)], CTX),
    "on_request_finished": lambda p: p.on_request_finished([[K(4)]], set(), {K(4)}, CTX),
    "evict": lambda p: p.evict(1, set()),
    "target_t1_size": set_target(2),
    "get": lambda p: p.get(K(4)),
    "t1[key]": lambda p: p.t1[K(4)],
    "__init__": lambda p: p.__init__(3),
    "clear": lambda p: p.clear(),
}


@pytest.mark.core_only  # no hook can leave the core busy (rule 2)
@pytest.mark.parametrize("call", core_only_params(TRACED_CALLS, ()))
def test_a_trace_hook_raising_once_busy_is_set(policy_cls, call):
    """A sys.settrace hook raises at the first line event it sees while the
    policy is busy (the next line after busy was set, in the twin; a line
    of arc_cy's Python code the core calls): the call fails, and the policy
    is not left busy."""
    import sys

    policy = populated(policy_cls)
    raised = []

    def busy():
        try:
            policy.remove(K(12345))  # absent: harmless, unless busy
        except RuntimeError:
            return True
        return False

    def trace(frame, event, arg):
        if (
            event == "line"
            and not raised
            and frame.f_code.co_filename.startswith(ARC_CY_DIR)
            and busy()
        ):
            raised.append(frame.f_code.co_name)
            raise HostileError("traced")
        return trace

    sys.settrace(trace)
    try:
        TRACED_CALLS[call](policy)
    except HostileError:
        pass
    finally:
        sys.settrace(None)
    policy.__init__(3)  # refused if busy was left set
    policy.insert(K(1), ready(1), CTX)
    policy._check_invariants()
