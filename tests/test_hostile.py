"""Hostile inputs: raising hashes and comparisons, meddling callbacks,
keys that call back from __del__, bad arguments.

Whatever user code does, the policy must not crash, must keep its lists
consistent (_check_invariants), must leave its state unchanged when a call
fails, and both implementations must fail the same way (same exception
type and message).  The corner cases at the end were disagreements
between the twins (or with vLLM) until the core was fixed; they now pin
the agreed behaviour down.
"""

from __future__ import annotations

import ctypes
import gc
import math
import subprocess
import sys
import textwrap

import pytest
from helpers import ChunkStatus, K, ReqContext, VllmARC, keysnap, ready, snapshot

from impls import IMPLEMENTATIONS, load_policy_class

CTX = ReqContext(req_id="hostile")


def populated(cls):
    """t1 = [2, 4, 5], t2 = [3], b1 = [0, 1]; capacity 3."""
    policy = cls(3)
    for i in range(6):
        policy.insert(K(i), ready(i), CTX)
        if i == 2:
            policy.evict(2, ())
    policy.touch([K(3)], CTX)
    assert keysnap(policy)[:4] == (
        [K(2), K(4), K(5)],
        [K(3)],
        [K(0), K(1)],
        [],
    )
    return policy


def unchanged(policy, call, exc_type):
    """call(policy) raises exc_type and changes nothing; returns the error."""
    before = snapshot(policy)
    with pytest.raises(exc_type) as info:
        call(policy)
    assert snapshot(policy) == before
    policy._check_invariants()
    return info.value


# --- bad arguments: same exception, same message, nothing changed ------------


def _set_target(value):
    def call(p):
        p.target_t1_size = value

    return call


class Bitfield(ctypes.Structure):
    _fields_ = [("ref_cnt", ctypes.c_int32, 8)]


class Wide(ctypes.Structure):
    _fields_ = [("ref_cnt", ctypes.c_int64)]


class BigEndian(ctypes.BigEndianStructure):
    _fields_ = [("ref_cnt", ctypes.c_int32), ("chunk_id", ctypes.c_int64)]


BAD_CALLS = {
    "evict(-1)": (lambda p: p.evict(-1, ()), ValueError),
    "evict(1.5)": (lambda p: p.evict(1.5, ()), TypeError),
    "evict('2')": (lambda p: p.evict("2", ()), TypeError),
    "evict(None)": (lambda p: p.evict(None, set()), TypeError),
    "evict(protected=None)": (lambda p: p.evict(1, None), TypeError),
    "insert(object chunk)": (lambda p: p.insert(K(9), object(), CTX), TypeError),
    "insert(None chunk)": (lambda p: p.insert(K(9), None, CTX), TypeError),
    "insert(ChunkStatus type)": (lambda p: p.insert(K(9), ChunkStatus, CTX), TypeError),
    "insert(bitfield ref_cnt)": (lambda p: p.insert(K(9), Bitfield(), CTX), TypeError),
    "insert(int64 ref_cnt)": (lambda p: p.insert(K(9), Wide(), CTX), TypeError),
    "insert(big-endian)": (lambda p: p.insert(K(9), BigEndian(), CTX), TypeError),
    "insert(unhashable)": (lambda p: p.insert([K(9)], ready(9), CTX), TypeError),
    "insert(duplicate t1)": (lambda p: p.insert(K(4), ready(9), CTX), ValueError),
    "insert(duplicate t2)": (
        lambda p: p.insert(bytes(bytearray(K(3))), ready(9), CTX),
        ValueError,
    ),
    "get(unhashable)": (lambda p: p.get({}), TypeError),
    "remove(unhashable)": (lambda p: p.remove([1]), TypeError),
    "touch(unhashable)": (lambda p: p.touch([K(4), [1]], CTX), TypeError),
    "touch(None)": (lambda p: p.touch(None, CTX), TypeError),
    "on_store_miss(unhashable)": (lambda p: p.on_store_miss([K(0), {}], CTX), TypeError),
    "on_request_finished(unhashable)": (
        lambda p: p.on_request_finished(((K(4), [1]),), set(), {K(4)}, CTX),
        TypeError,
    ),
    "t1[unhashable]": (lambda p: p.t1[[1]], TypeError),
    "t1[missing]": (lambda p: p.t1[K(0)], KeyError),
    "target 'x'": (_set_target("x"), TypeError),
    "target None": (_set_target(None), TypeError),
    "target True": (_set_target(True), TypeError),
    "target 1j": (_set_target(1j), TypeError),
    "target nan": (_set_target(math.nan), ValueError),
    "target inf": (_set_target(math.inf), ValueError),
    "target -inf": (_set_target(-math.inf), ValueError),
    "capacity -1": (lambda p: type(p)(-1), ValueError),
    "capacity 1.5": (lambda p: type(p)(1.5), TypeError),
    "capacity '3'": (lambda p: type(p)("3"), TypeError),
    "capacity None": (lambda p: type(p)(None), TypeError),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_bad_arguments_fail_alike(case):
    call, exc_type = BAD_CALLS[case]
    errors = []
    for name in IMPLEMENTATIONS:
        policy = populated(load_policy_class(name))
        error = unchanged(policy, call, exc_type)
        errors.append((type(error), str(error)))
    assert errors[0] == errors[1]


# --- keys whose __hash__ or __eq__ raise --------------------------------------


class HashRaises:
    def __init__(self, exc):
        self.exc = exc

    def __hash__(self):
        raise self.exc

    def __eq__(self, other):
        return self is other


class EqRaises:
    """Collides with another key's hash; comparing with it raises."""

    def __init__(self, like, exc=ArithmeticError("eq")):
        self.hash = hash(like)
        self.exc = exc

    def __hash__(self):
        return self.hash

    def __eq__(self, other):
        raise self.exc


class Hashing:
    """A protected container whose lookups hash and compare its key."""

    def __init__(self, key):
        self.key = key

    def __contains__(self, other):
        return other in {self.key}


def _calls_with(key):
    """Every entry point that hashes (and looks up) a user key."""
    return {
        "insert": lambda p: p.insert(key, ready(9), CTX),
        "get": lambda p: p.get(key),
        "remove": lambda p: p.remove(key),
        "touch": lambda p: p.touch([key], CTX),
        "touch-batch-last": lambda p: p.touch([K(4), K(0), key], CTX),
        "on_store_miss": lambda p: p.on_store_miss([key], CTX),
        "on_store_miss-batch-last": lambda p: p.on_store_miss([K(1), K(0), key], CTX),
        "on_request_finished": lambda p: p.on_request_finished(
            ((key,),), set(), {key}, CTX
        ),
        "on_request_finished-reused": lambda p: p.on_request_finished(
            ((K(4), K(5), key),), {K(4)}, {K(5)}, CTX
        ),
        "t1-contains": lambda p: key in p.t1,
        "b1-getitem": lambda p: p.b1[key],
        "evict-protected": lambda p: p.evict(2, Hashing(key)),
    }


CALL_NAMES = list(_calls_with(None))


@pytest.mark.parametrize("exc", [TypeError("no hash"), ZeroDivisionError("zd")])
@pytest.mark.parametrize("call", CALL_NAMES)
def test_raising_hash(policy_cls, call, exc):
    policy = populated(policy_cls)
    key = HashRaises(exc)
    error = unchanged(policy, _calls_with(key)[call], type(exc))
    assert error is exc


# Which stored key the raising key collides with, per call.
COLLIDES_WITH = {"evict-protected": K(2), "b1-getitem": K(0)}


@pytest.mark.parametrize("call", CALL_NAMES)
def test_raising_eq_on_hash_collision(policy_cls, call):
    policy = populated(policy_cls)
    like = COLLIDES_WITH.get(call, K(4))
    if call.startswith(("on_store_miss", "touch")):
        like = K(0)  # a ghost: the lookup must compare with it
    key = EqRaises(like)
    error = unchanged(policy, _calls_with(key)[call], ArithmeticError)
    assert error is key.exc


def test_raising_eq_of_stored_key(policy_cls):
    """The stored key's __eq__ raises when another key collides with it."""
    policy = policy_cls(4)
    stored = EqRaises(K(7))
    policy.insert(stored, ready(1), CTX)
    policy.insert(K(8), ready(2), CTX)
    for call in ("insert", "get", "remove", "touch", "t1-contains"):
        unchanged(policy, _calls_with(K(7))[call], ArithmeticError)
    # the identical object is found without comparing
    assert policy.get(stored).chunk_id == 1
    policy.touch([stored], CTX)
    assert list(policy.t2) == [stored]
    policy.remove(stored)
    assert list(policy.t1) == [K(8)]
    policy._check_invariants()


# --- protected containers that raise, meddle or read --------------------------


class Boom(Exception):
    pass


@pytest.mark.parametrize("after", [0, 1, 2, 3])
def test_protected_raising(policy_cls, after):
    policy = populated(policy_cls)

    class Raising:
        calls = 0

        def __contains__(self, key):
            Raising.calls += 1
            if Raising.calls > after:
                raise Boom(key)
            return False

    unchanged(policy, lambda p: p.evict(4, Raising()), Boom)


MUTATIONS = {
    "insert": lambda p: p.insert(K(99), ready(99), CTX),
    "remove": lambda p: p.remove(K(4)),
    "clear": lambda p: p.clear(),
    "evict": lambda p: p.evict(1, ()),
    "evict(0)": lambda p: p.evict(0, ()),
    "target_t1_size": _set_target(1),
    "touch": lambda p: p.touch([K(4)], CTX),
    "on_store_miss": lambda p: p.on_store_miss([K(0)], CTX),
    "on_request_finished": lambda p: p.on_request_finished(
        ((K(4),),), set(), {K(4)}, CTX
    ),
    "__init__": lambda p: p.__init__(3),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_protected_that_mutates_the_policy(policy_cls, mutation):
    policy = populated(policy_cls)
    seen = []

    class Meddling:
        def __contains__(self, key):
            try:
                MUTATIONS[mutation](policy)
            except RuntimeError as error:
                seen.append(str(error))
                raise
            seen.append("allowed")
            return False

    name = mutation.split("(")[0]
    error = unchanged(policy, lambda p: p.evict(2, Meddling()), RuntimeError)
    assert str(error) == (
        f"{name}() called on the ARC policy while evict() is still running"
    )
    assert seen == [str(error)]
    # and the policy still works
    assert [k for k, _ in policy.evict(2, ())] == [K(2), K(4)]
    policy._check_invariants()


@pytest.mark.parametrize("mutation", ["insert", "touch", "clear", "target_t1_size"])
def test_mutation_from_key_eq_is_refused(policy_cls, mutation):
    """A key's __eq__ runs inside a mutating call; it may not mutate."""
    policy = populated(policy_cls)

    class Meddler:
        def __init__(self, like):
            self.like = like

        def __hash__(self):
            return hash(self.like)

        def __eq__(self, other):
            MUTATIONS[mutation](policy)
            return False

    for call, like in [
        ("insert", K(4)),
        ("touch", K(4)),
        ("remove", K(3)),
        ("on_store_miss", K(0)),  # it only looks at the ghosts
        ("on_request_finished", K(4)),
    ]:
        unchanged(policy, _calls_with(Meddler(like))[call], RuntimeError)


def test_protected_that_reads_works_like_vllm(policy_cls):
    def scenario(cls):
        policy = populated(cls)
        log = []

        class Reader:
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

    assert scenario(policy_cls) == scenario(VllmARC)


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


# --- keys whose __del__ calls back into the policy -----------------------------

DEL_LOG: list[str] = []


class CallbackKey:
    """Equal by name; when the last reference goes, calls act(policy)."""

    def __init__(self, name, policy=None, act=None):
        self.name = name
        self.policy = policy
        self.act = act

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return isinstance(other, CallbackKey) and other.name == self.name

    def __repr__(self):
        return f"CallbackKey({self.name!r})"

    def __del__(self):
        if self.act is None:
            return
        try:
            self.act(self.policy)
            DEL_LOG.append("ok")
        except RuntimeError as error:
            DEL_LOG.append(f"RuntimeError: {error}")


DEL_ACTS = {
    "insert": lambda p: p.insert(K(50), ready(50), CTX),
    "clear": lambda p: p.clear(),
    "evict": lambda p: p.evict(1, ()),
    "remove": lambda p: p.remove(K(4)),
    "touch": lambda p: p.touch([K(4), K(0)], CTX),
    "get": lambda p: p.get(K(4)),
    "iterate": lambda p: list(p.b1.items()),
}


def _drop_callback_key(policy, when, act):
    DEL_LOG.clear()
    key = CallbackKey("cb", policy, DEL_ACTS[act])
    policy.insert(key, ready(40), CTX)
    del key
    if when == "remove":
        policy.remove(CallbackKey("cb"))
    elif when == "clear":
        policy.clear()
    elif when == "trim":
        # evict it into b1, then push it out of b1 (capacity 3)
        assert [k for k, _ in policy.evict(1, {K(2), K(4), K(5)})] == [
            CallbackKey("cb")
        ]
        for i in (10, 11, 12):
            policy.insert(K(i), ready(i), CTX)
        policy.evict(3, {K(3)})
    elif when == "reinsert":
        # evict it into b1, then insert an equal key: the ghost is forgotten
        assert [k for k, _ in policy.evict(1, {K(2), K(4), K(5)})] == [
            CallbackKey("cb")
        ]
        policy.insert(CallbackKey("cb"), ready(41), CTX)
    elif when == "touch":
        # t1 -> t2 under the caller's (equal) key object
        policy.touch([CallbackKey("cb")], CTX)
    elif when == "finished":
        equal = CallbackKey("cb")
        policy.on_request_finished(((equal,),), set(), {equal}, CTX)
    elif when == "delete":
        # The key refers to the policy: a reference cycle, which the
        # garbage collector breaks (both twins show it their entries).
        del policy
        gc.collect()
        return None, list(DEL_LOG)
    policy._check_invariants()
    return keysnap(policy), list(DEL_LOG)


WHENS = ["remove", "clear", "trim", "reinsert", "touch", "finished", "delete"]


@pytest.mark.parametrize("act", DEL_ACTS)
@pytest.mark.parametrize("when", WHENS)
def test_key_del_calls_back(policy_cls, when, act):
    """No crash, consistent lists, and the callback ran once."""
    state, log = _drop_callback_key(populated(policy_cls), when, act)
    assert log == ["ok"], log


@pytest.mark.parametrize(
    ("when", "act"),
    [(w, a) for w in WHENS if w != "delete" for a in DEL_ACTS],
)
def test_key_del_calls_back_alike(when, act):
    results = [
        _drop_callback_key(populated(load_policy_class(name)), when, act)
        for name in IMPLEMENTATIONS
    ]
    assert results[0] == results[1]


# --- views while the policy changes --------------------------------------------


@pytest.mark.parametrize("mutation", MUTATIONS)
@pytest.mark.parametrize("view", ["t1", "b1"])
def test_iterating_a_view_while_the_policy_changes(policy_cls, view, mutation):
    policy = populated(policy_cls)
    it = iter(getattr(policy, view).items())
    first = next(it)
    before = keysnap(policy)
    MUTATIONS[mutation](policy)
    if getattr(policy, view) and keysnap(policy)[view == "b1" and 2 or 0] == before[
        view == "b1" and 2 or 0
    ]:
        # this list did not change: the iterator goes on
        rest = list(it)
        assert [first, *rest] == list(getattr(policy, view).items())
    else:
        with pytest.raises(RuntimeError, match="ARC list changed during iteration"):
            next(it)
    policy._check_invariants()


def test_iterating_a_view_after_clear(policy_cls):
    policy = populated(policy_cls)
    its = [iter(policy.t1), iter(policy.t1.values()), iter(policy.b1.items())]
    for it in its:
        next(it)
    policy.clear()
    for it in its:
        with pytest.raises(RuntimeError, match="ARC list changed during iteration"):
            next(it)
    assert (len(policy.t1), list(policy.b1)) == (0, [])


# --- disagreements found (see the module docstring) ----------------------------


class AlwaysEqual:
    def __init__(self, h, name):
        self.h, self.name = h, name

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        return True

    def __repr__(self):
        return self.name


def test_folded_hash_collision(policy_cls):
    # 1 and 2**32 are different hashes (a dict never compares such keys);
    # they fold to the same 32 bits, which the compiled core's table slots
    # hold, so it must check the full hash before comparing.
    policy = policy_cls(3)
    policy.insert(AlwaysEqual(1, "a"), ready(0), CTX)
    policy.insert(AlwaysEqual(1 << 32, "b"), ready(1), CTX)
    assert [k.name for k in policy.t1] == ["a", "b"]
    policy._check_invariants()


def test_request_finished_looks_up_before_changing(policy_cls):
    """Tail first, K(5) would move to t2 before the raising key's lookup;
    every lookup comes first, so nothing changes."""
    policy = populated(policy_cls)
    key = EqRaises(K(4))
    call = lambda p: p.on_request_finished(((key, K(5)),), set(), {key, K(5)}, CTX)  # noqa: E731
    assert unchanged(policy, call, ArithmeticError) is key.exc


def _batch_touch_with_failing_first_key(policy):
    # touch() processes keys last to first; the first key's lookup fails.
    try:
        policy.touch([EqRaises(K(0)), K(4), K(5)], CTX)
    except ArithmeticError:
        pass
    return keysnap(policy)


def _request_finished_with_failing_container(policy):
    class Fails:
        calls = 0

        def __contains__(self, key):
            Fails.calls += 1
            if Fails.calls == 3:
                raise Boom
            return False

    try:
        policy.on_request_finished(((K(2), K(4), K(5)),), Fails(), {K(4), K(5)}, CTX)
    except Boom:
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
    class Inserts:
        def __hash__(self):
            return hash(K(4))

        def __eq__(self, other):
            policy.insert(K(60), ready(60), CTX)
            return False

    try:
        policy.get(Inserts())
    except RuntimeError as error:
        return str(error)
    return keysnap(policy)


def _init_again(policy):
    policy.__init__(1)
    policy._check_invariants()
    return keysnap(policy), policy.cache_capacity


def _huge_capacity(policy):
    return type(policy)(2**63).cache_capacity


class FalsyChunk(ChunkStatus):
    def __bool__(self):
        return False


def _falsy_chunk_get(policy):
    chunk = FalsyChunk(70)
    policy.insert(K(70), chunk, CTX)
    return policy.get(K(70)) is chunk


def _touch_keeps_which_key_object(policy):
    copy = bytes(bytearray(K(4)))
    policy.touch([copy], CTX)
    return [k is copy for k in policy.t2]


@pytest.mark.parametrize(
    "scenario",
    [
        _batch_touch_with_failing_first_key,
        _request_finished_with_failing_container,
        _request_finished_unused_key_with_raising_eq,
        _get_colliding_with_a_ghost,
        _exhausted_iterator_after_change,
        _get_whose_eq_inserts,
        _init_again,
        _huge_capacity,
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


# --- crash smoke in a child process ---------------------------------------------

SMOKE = textwrap.dedent(
    """
    import gc, sys
    sys.path.insert(0, {tests!r})
    import test_hostile as h
    for name in h.IMPLEMENTATIONS:
        cls = h.load_policy_class(name)
        for when in ("remove", "clear", "trim", "reinsert", "touch", "finished"):
            for act in h.DEL_ACTS:
                h._drop_callback_key(h.populated(cls), when, act)
        for mutation in h.MUTATIONS:
            p = h.populated(cls)
            class M:
                def __contains__(self, key, m=mutation, p=p):
                    h.MUTATIONS[m](p)
            try:
                p.evict(3, M())
            except Exception:
                pass
            p._check_invariants()
        for call in h.CALL_NAMES:
            try:
                h._calls_with(h.EqRaises(h.K(4)))[call](h.populated(cls))
            except Exception:
                pass
        gc.collect()
    print("survived")
    """
)


def test_no_crash_in_a_child_process():
    """The riskiest callbacks again, in a child: a segfault is a failure
    here rather than a dead test run."""
    import os

    tests = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run(
        [sys.executable, "-P", "-c", SMOKE.format(tests=tests)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("survived")


def test_reference_cycle_through_a_key_is_collected(policy_cls):
    """A key (or chunk) that refers back to its policy forms a cycle that
    the garbage collector must be able to break."""
    import weakref

    policy = policy_cls(4)
    policy.insert(CallbackKey("cycle", policy), ready(1), CTX)
    ref = weakref.ref(policy)
    del policy
    gc.collect()
    assert ref() is None


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
