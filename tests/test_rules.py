"""The rules of docs/hardening.md ("Rules"), one section each, checked on
both implementations and, where vLLM's ARC has the behaviour, against it.

Each rule is checked against every method it applies to, not only against
the case a review found (issue 19 found items 1 to 10 on ed9b551; each
failed there). Crash reproductions run a program of tests/progs/ in a child
process. The hostile fuzzer (test_fuzz_hostile.py) generates the rest.
"""

from __future__ import annotations

import copy
import gc
from fractions import Fraction

import pytest
from childproc import run_json
from helpers import ChunkStatus, K, ReqContext, VllmARC, keysnap, ready, snapshot

from arc_cy import _common

CTX = ReqContext(req_id="rules")


def with_ghosts(cls, capacity=4):
    """t1 = [4, 5], t2 = [3], b1 = [0, 1, 2]."""
    policy = cls(capacity)
    for i in range(6):
        policy.insert(K(i), ready(i), CTX)
        if i == 3:
            policy.touch([K(3)], CTX)
            policy.evict(3, set())
    return policy


# --- No marker that a real value can equal -------------------------------------


def test_any_object_as_a_chunk_is_refused_alike():
    """Item 1 and ask 4: a None chunk passed the check when it was the first
    chunk (the 'no type yet' marker was type(None)) and crashed the core's
    evict. Every non-chunk is refused with arc_cy's message, the same in
    both, whether or not a real chunk came before."""
    got = run_json("any_chunk.py", "--no-vllm")
    assert got["cython"] == got["python"]
    for name, messages in got["python"].items():
        assert len(set(messages)) == 1, (name, messages)
        assert messages[0].startswith(
            ("chunk must be a ctypes structure", "chunk type Ready overrides is_ready")
        ), (name, messages)
    assert got["python"]["None"][0] == _common.MSG_CHUNK.format("NoneType")
    assert got["python"]["is_ready overridden"][0] == _common.MSG_CHUNK_READY.format("Ready")


# --- No pointer into the storage across an allocation, outside busy -----------


VIEW_CHANGES = ("remove", "clear", "__init__", "insert")


@pytest.mark.parametrize("source", ["hook", "cycle"])
@pytest.mark.parametrize("view", ["t1", "b1"])
def test_view_iterator_and_a_collection_that_changes_the_policy(view, source):
    """Item 2: the core's iterator took a node pointer, then made the pair,
    whose allocation may start a collection; a gc.callbacks hook or a
    garbage cycle's __del__ that called remove(), clear() or __init__ left
    it reading freed nodes. Both implementations must end alike: the items
    read so far, then MSG_MUTATED if the list changed."""
    got = run_json("view_iter_gc.py", "--no-vllm", view, source, *VIEW_CHANGES)
    for how in VIEW_CHANGES:
        assert got["cython"][how] == got["python"][how], how
        changed = not (view == "b1" and how in ("remove", "insert"))
        assert got["python"][how]["ending"] == (_common.MSG_MUTATED if changed else "end"), how


# --- Working storage is complete before any other code can see it --------------


TUPLE_READER_CALLS = ("evict", "touch", "on_store_miss", "on_request_finished")


def test_gc_hook_reading_young_tuples():
    """Item 3: the twin built its working storage with tuple(<generator>):
    a tracked tuple with NULL items while user code ran; a gc hook that
    read it crashed. Both implementations, and vLLM, survive alike."""
    got = run_json("tuple_reader_gc.py", *TUPLE_READER_CALLS)
    for call in TUPLE_READER_CALLS:
        assert got[call]["cython"] == got[call]["python"] == got[call]["vllm"], call


# --- Every call is busy before its first user code -----------------------------

REFUSALS: list[str] = []


def _try_insert(policy):
    try:
        policy.insert(K(900 + len(REFUSALS)), ready(900), CTX)
    except RuntimeError as exc:
        REFUSALS.append(str(exc))
    else:
        REFUSALS.append("allowed")


class Arm:
    policy = None

    @classmethod
    def fire(cls):
        if cls.policy is not None:
            policy, cls.policy = cls.policy, None  # once
            _try_insert(policy)


class CallingKey:
    def __init__(self, n):
        self.n = n

    def __hash__(self):
        Arm.fire()
        return hash(K(self.n))

    def __eq__(self, other):
        return other == K(self.n)


class CallingIndex:
    def __init__(self, n):
        self.n = n

    def __index__(self):
        Arm.fire()
        return self.n


class CallingSet(set):
    def __contains__(self, key):
        Arm.fire()
        return set.__contains__(self, key)


class CallingFraction(Fraction):
    def __float__(self):
        Arm.fire()
        return Fraction.__float__(self)


class CallingCtx:
    def get_offload_key_position(self, key):
        Arm.fire()
        return None


def _calling_keys():
    Arm.fire()
    yield K(4)


def _set_target(p):
    p.target_t1_size = CallingFraction(1, 2)


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
    "target_t1_size": ("target_t1_size", _set_target),
    "__init__": ("__init__", lambda p: p.__init__(CallingIndex(4))),
}


@pytest.mark.parametrize("how", BUSY_CALLS)
def test_every_call_is_busy_before_its_first_user_code(policy_cls, how):
    """Items 4 and 5 of round 3 and item 5 here (the twin ran n.__index__
    before it was busy), checked for every method: the first user code a
    call runs already finds it busy, in both implementations."""
    running, call = BUSY_CALLS[how]
    REFUSALS.clear()
    policy = with_ghosts(policy_cls)
    Arm.policy = policy
    try:
        call(policy)
    finally:
        Arm.policy = None
    assert REFUSALS == [_common.MSG_REENTRANT.format("insert", running)], REFUSALS
    policy._check_invariants()


# --- Derived values are taken where vLLM takes them ----------------------------


class CountingFraction(Fraction):
    ints = 0

    def __int__(self):
        CountingFraction.ints += 1
        return Fraction.__int__(self)


class NoInt(Fraction):
    def __int__(self):
        raise ArithmeticError("no int() for this target")


def _evict_outcome(policy, n):
    try:
        result = policy.evict(n, set())
    except ArithmeticError as exc:
        return ("raised", str(exc), keysnap(policy))
    return (result and [k for k, _ in result], keysnap(policy))


def test_int_of_the_target_is_taken_at_each_step_of_evict(policy_cls):
    """Item 4: the core took int(target_t1_size) in the setter and at each
    ghost hit. vLLM takes it at every step of evict's selection."""

    def run(cls):
        policy = with_ghosts(cls, capacity=8)
        for i in range(10, 16):
            policy.insert(K(i), ready(i), CTX)
        policy.target_t1_size = CountingFraction(5, 2)
        CountingFraction.ints = 0
        result = _evict_outcome(policy, 5)
        return result, CountingFraction.ints

    ours, oracle = run(policy_cls), run(VllmARC)
    assert ours == oracle
    assert oracle[1] == 5


def test_a_target_without_int_is_stored_and_fails_in_evict(policy_cls):
    """Item 4: the core's setter raised for a target whose __int__ fails;
    vLLM and the twin store it, and evict() raises, changing nothing."""

    def run(cls):
        policy = with_ghosts(cls)
        policy.target_t1_size = NoInt(3, 2)
        return type(policy.target_t1_size), _evict_outcome(policy, 1)

    got = run(policy_cls)
    assert got == run(VllmARC)
    assert got[1][:2] == ("raised", "no int() for this target")


def test_a_ghost_hit_to_a_target_without_int_completes(policy_cls):
    """Item 4: a ghost hit whose new target has no int() made the core's
    touch() raise after it had applied the keys before it."""

    class NoIntAfterAdd(Fraction):
        def __add__(self, other):
            return NoInt(Fraction.__add__(self, other))

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
def test_a_target_beyond_float_range_is_accepted_as_by_vllm(policy_cls, target):
    """Item 10: math.isfinite raised a bare OverflowError for 10**400."""

    def run(cls):
        policy = with_ghosts(cls)
        policy.target_t1_size = target
        return _evict_outcome(policy, 2)

    assert run(policy_cls) == run(VllmARC)
    policy = policy_cls(4)
    with pytest.raises(ValueError, match="finite"):
        policy.target_t1_size = float("inf")


# --- A copy is not running anything --------------------------------------------


def test_a_copy_made_during_a_call_is_not_busy(policy_cls):
    """Item 7: the twin's __getstate__ copied busy, so a copy made from a
    callback refused every mutator for ever. The core refuses copies."""
    copies = []

    class Copying(set):
        def __contains__(self, key):
            if not copies:
                try:
                    copies.append(copy.deepcopy(policy))
                except TypeError as exc:
                    copies.append(exc)
            return False

    policy = with_ghosts(policy_cls)
    assert len(policy.evict(1, Copying())) == 1
    (made,) = copies
    if policy_cls.__module__.endswith("_arc_c"):
        assert str(made) == _common.MSG_NO_COPY.format("ARCCachePolicy")
        return
    made.insert(K(60), ready(60), CTX)
    assert made.evict(1, set()) is not None
    made._check_invariants()
    assert K(60) not in policy.t1


# --- What a list drops is released in vLLM's order -----------------------------

DELS: list[str] = []


class LoggedKey:
    act = None

    def __init__(self, n):
        self.n = n

    def __hash__(self):
        return hash(self.n)

    def __eq__(self, other):
        return isinstance(other, LoggedKey) and other.n == self.n

    def __del__(self):
        DELS.append(f"k{self.n}")
        if LoggedKey.act is not None:
            LoggedKey.act(self.n)


class LoggedChunk(ChunkStatus):
    def __del__(self):
        DELS.append(f"c{self.chunk_id}")


def _released(cls, how, acting):
    policy = cls(10)
    for i in range(6):
        chunk = LoggedChunk(i)
        chunk.ref_cnt = 0
        policy.insert(LoggedKey(i), chunk, CTX)
    del chunk
    policy.touch([LoggedKey(0)], CTX)  # t1 -> t2: a new entry of t2
    policy.touch([LoggedKey(3)], CTX)
    policy.on_request_finished(((LoggedKey(1),),), {LoggedKey(1)}, set(), CTX)  # move_to_end
    policy.evict(2, set())  # b1 = [2, 4]
    gc.collect()
    DELS.clear()
    if acting:
        # a released key inserts a new one: where it lands shows the order
        LoggedKey.act = lambda n: policy.insert(f"new{n}", ready(100 + n), CTX) if n < 6 else None
    try:
        policy.__init__(10) if how == "__init__" else policy.clear()
    finally:
        LoggedKey.act = None
    state = [[getattr(k, "n", k) for k in view] for view in (policy.t1, policy.t2, policy.b1, policy.b2)]
    return list(DELS), state


@pytest.mark.parametrize("acting", [False, True], ids=["logged", "acting"])
@pytest.mark.parametrize("how", ["__init__", "clear"])
def test_release_order_is_vllms(policy_cls, how, acting):
    """Item 9: __init__ again released each list in list order (LRU first)
    where vLLM, replacing each OrderedDict, releases its entries in
    insertion order; clear() releases the values in insertion order, then
    the keys in list order. A __del__ that acts sees what vLLM's sees."""
    assert _released(policy_cls, how, acting) == _released(VllmARC, how, acting)


# --- Keys that break the hash/eq contract: no crash, a consistent state --------


class NT:
    """X and Y are unequal, Z equals both (not transitive); one hash."""

    crossed = 0  # comparisons of two different names that said equal

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return 12345

    def __eq__(self, other):
        if not isinstance(other, NT):
            return False
        if self.name != other.name and "Z" in (self.name, other.name):
            NT.crossed += 1
            return True
        return self.name == other.name

    def __repr__(self):
        return self.name


class Asym(NT):
    """A equals everything of its hash; nothing else equals A."""

    __hash__ = NT.__hash__

    def __eq__(self, other):
        if self.name == "A" and getattr(other, "name", "A") != "A":
            NT.crossed += 1
            return True
        return isinstance(other, NT) and other.name == self.name


def _checked(policy, *calls):
    for call in calls:
        try:
            call(policy)
        except ValueError:  # a duplicate, as arc_cy sees it
            pass
        policy._check_invariants()


CONTRACT_BREAKING = {
    # touch / on_request_finished apply the node found at look-up time
    "touch": lambda X, Y, Z: [
        lambda p: p.insert(X, ready(1), CTX),
        lambda p: p.insert(Y, ready(2), CTX),
        lambda p: p.touch([Z, X, Z], CTX),
        lambda p: p.on_request_finished(((Z, Y, X),), set(), {Z, X}, CTX),
    ],
    # which of several equal entries a list yields
    "get and remove": lambda X, Y, Z: [
        lambda p: p.insert(X, ready(1), CTX),
        lambda p: p.touch([X], CTX),
        lambda p: p.insert(Y, ready(2), CTX),
        lambda p: p.get(Z),
        lambda p: p.remove(Z),
        lambda p: p.remove(Z),
    ],
    # insert over two ghosts that a key equals
    "insert over ghosts": lambda X, Y, Z: [
        lambda p: p.insert(X, ready(1), CTX),
        lambda p: p.insert(Y, ready(2), CTX),
        lambda p: p.evict(2, set()),
        lambda p: p.insert(Z, ready(3), CTX),
        lambda p: p.evict(1, set()),
        lambda p: p.insert(X, ready(4), CTX),
        lambda p: p.insert(Y, ready(5), CTX),
    ],
}


@pytest.mark.parametrize("keys", [NT, Asym], ids=["non-transitive", "asymmetric"])
@pytest.mark.parametrize("case", CONTRACT_BREAKING)
def test_keys_that_break_the_contract_keep_the_policy_consistent(policy_cls, case, keys):
    """The three contract-breaking cases of issue 19: arc_cy promises no
    crash and a consistent state, not vLLM's decisions."""
    names = ("A", "Y", "X") if keys is Asym else ("X", "Y", "Z")
    policy = policy_cls(2)
    NT.crossed = 0
    _checked(policy, *CONTRACT_BREAKING[case](*(keys(n) for n in names)))
    assert NT.crossed > 0  # the broken equality was reached
