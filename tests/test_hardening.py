"""Defects found by the second and third hardening reviews (ASan, UBSan,
hostile input; round 3 is issue 14).

Each test failed on the core before its fix; they run on both
implementations. Crash reproductions run in a child process, so that a
segfault fails the test instead of killing pytest.
"""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import weakref

from fractions import Fraction

import pytest
from helpers import ChunkStatus, ReqContext, VllmARC, snapshot
from test_hostile import (
    DEL_LOG,
    EqRaises,
    HashRaises,
    K,
    CallbackKey,
    keysnap,
    populated,
    ready,
    unchanged,
)

from impls import IMPLEMENTATIONS, load_policy_class

from arc_cy import _common

CTX = ReqContext(req_id="hardening")
TESTS = os.path.dirname(os.path.abspath(__file__))


def run_child(impl: str, body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, {tests!r})
        from impls import load_policy_class
        cls = load_policy_class({impl!r})
        """
    ).format(tests=TESTS, impl=impl) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120
    )


# --- 1. a collection while touch() holds a list with NULL items --------------

GC_DURING_TOUCH = """
    import gc
    from fractions import Fraction

    def chunk(i):
        from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus
        c = ChunkStatus(i)
        c.ref_cnt = 0
        return c

    K = lambda i: b"key-%d" % i
    p = cls(4)
    for i in range(4):
        p.insert(K(i), chunk(i), None)
    assert len(p.evict(2, ())) == 2          # b1 = [0, 1]
    p.insert(K(4), chunk(4), None)
    p.target_t1_size = Fraction(1, 3)        # _adapt runs Python arithmetic
    copies = []

    def copy_7_item_lists(phase, info):
        if phase == "start":
            for o in gc.get_objects():
                if type(o) is list and len(o) == 7:
                    copies.append(o[:])

    gc.callbacks.append(copy_7_item_lists)
    gc.set_threshold(1)
    # 7 keys, processed last to first: K(0) is the ghost hit.
    p.touch([K(0), K(2), K(3), K(4), K(5), K(6), K(7)], None)
    gc.set_threshold(700)
    gc.callbacks.clear()
    p._check_invariants()
    assert p.target_t1_size == Fraction(4, 3), p.target_t1_size
    assert copies
    print("survived")
"""


def test_gc_during_touch_sees_no_null_items(impl):
    proc = run_child(impl, GC_DURING_TOUCH)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.strip() == "survived"


# --- 2. ref_cnt is read through the chunk's current type and bounds ---------


class Big(ctypes.Structure):
    # 44 bytes: the buffer lives on the heap, not inside the object.
    _fields_ = [("pad", ctypes.c_char * 40), ("ref_cnt", ctypes.c_int32)]


class Small(ctypes.Structure):
    _fields_ = [("ref_cnt", ctypes.c_int32), ("pad", ctypes.c_char * 20)]


def _shrunk_chunk_evict(cls, resize):
    policy = cls(4)
    chunk = Big()
    chunk.ref_cnt = 0                  # offset 40: evictable for Big
    ctypes.memset(ctypes.addressof(chunk), 1, 4)  # offset 0, for Small: pinned
    policy.insert(K(1), chunk, CTX)
    chunk.__class__ = Small
    if resize:
        ctypes.resize(chunk, ctypes.sizeof(Small))
    assert ctypes.sizeof(chunk) == (24 if resize else 44)
    return policy.evict(1, ()), snapshot(policy)


@pytest.mark.parametrize("resize", [False, True], ids=["class", "class+resize"])
def test_ref_cnt_follows_the_chunks_current_type(policy_cls, resize):
    """vLLM reads chunk.ref_cnt through the chunk's type at that moment;
    the core read the offset it cached at insert(), past a shrunk buffer."""
    result, _ = _shrunk_chunk_evict(policy_cls, resize)
    assert result is None  # pinned, read at Small's offset
    oracle, _ = _shrunk_chunk_evict(VllmARC, resize)
    assert oracle is None


def test_ref_cnt_outside_the_buffer_is_refused(policy_cls):
    """A class whose ref_cnt lies past the instance's buffer (a smaller
    chunk given a larger class): a clear error, nothing changes."""
    policy = policy_cls(4)
    chunk = Small()
    policy.insert(K(1), chunk, CTX)
    policy.insert(K(2), ready(2), CTX)
    chunk.__class__ = Big
    before = snapshot(policy)
    for call in (lambda: policy.evict(1, ()), lambda: policy.touch([K(1)], CTX)):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == _common.MSG_CHUNK_SIZE.format("Big", 24, 40)
        assert snapshot(policy) == before
    policy._check_invariants()
    chunk.__class__ = Small
    chunk.ref_cnt = 0
    assert [k for k, _ in policy.evict(2, ())] == [K(1), K(2)]


# --- 3. a packed ref_cnt (misaligned; UBSan checks the load) -----------------


class Packed(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("flag", ctypes.c_char), ("ref_cnt", ctypes.c_int32)]


def test_packed_ref_cnt(policy_cls):
    policy = policy_cls(4)
    a, b = Packed(b"a", 1), Packed(b"b", 0)
    assert Packed.ref_cnt.offset == 1
    policy.insert(K(1), a, CTX)
    policy.insert(K(2), b, CTX)
    assert policy.evict(1, ()) == [(K(2), b)]
    assert policy.evict(1, ()) is None
    a.ref_cnt = 0
    assert policy.evict(1, ()) == [(K(1), a)]


# --- 4. keys whose __eq__ is not transitive: see test_rules.py ("the key
# contract"): arc_cy promises no crash and a consistent state for them.


# --- 5. a replaced key is released after the call, in both twins -------------

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
    key = CallbackKey("cb", policy, REPLACE_ACTS[act])
    policy.insert(key, ready(40), CTX)
    del key
    equal = CallbackKey("cb")
    if how == "insert-over-ghost":
        assert [k for k, _ in policy.evict(1, {K(2)})] == [equal]
        policy.insert(equal, ready(41), CTX)
    elif how == "touch":
        policy.touch([equal], CTX)
    elif how == "on_request_finished":
        policy.on_request_finished(((equal,),), set(), {equal}, CTX)
    policy._check_invariants()
    state = [[getattr(k, "name", k) for k in lst] for lst in snapshot(policy)[:4]]
    return state, list(DEL_LOG)


@pytest.mark.parametrize("act", REPLACE_ACTS)
@pytest.mark.parametrize("how", ["insert-over-ghost", "touch", "on_request_finished"])
def test_replaced_key_is_released_after_the_call(policy_cls, how, act):
    state, log = _replace_key(policy_cls, how, act)
    assert log == ["ok"], log  # the policy was no longer busy


# --- 6. chunk types are not kept alive ----------------------------------------


def test_chunk_types_are_freed(policy_cls):
    refs = []
    policy = policy_cls(8)
    for i in range(50):
        tp = type(f"Chunk{i}", (ctypes.Structure,), {"_fields_": [("ref_cnt", ctypes.c_int32)]})
        refs.append(weakref.ref(tp))
        chunk = tp()
        policy.insert(K(i), chunk, CTX)
        assert policy.evict(1, ())[0][1] is chunk
        del tp, chunk
    del policy
    gc.collect()
    assert [r for r in refs if r() is not None] == []


# --- 7. the largest number of entries, ghosts included -----------------------


def test_entry_limit(policy_cls):
    assert _common.MAX_ENTRIES == 2**29
    policy = policy_cls(10)
    assert policy._max_entries == _common.MAX_ENTRIES
    policy._max_entries = 4
    for i in range(4):
        policy.insert(K(i), ready(i), CTX)
    assert len(policy.evict(2, ())) == 2  # b1 = [0, 1]: ghosts count
    before = snapshot(policy)
    with pytest.raises(MemoryError) as info:
        policy.insert(K(9), ready(9), CTX)
    assert str(info.value) == _common.MSG_FULL.format(4)
    assert snapshot(policy) == before
    policy.insert(K(0), ready(10), CTX)  # a ghost's entry is reused
    policy.remove(K(2))
    policy.insert(K(9), ready(9), CTX)
    policy._check_invariants()
    with pytest.raises(ValueError):
        policy._max_entries = _common.MAX_ENTRIES + 1


class SameHash:
    """Distinct keys (equal by name) that all share one hash."""

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return 777

    def __eq__(self, other):
        return isinstance(other, SameHash) and other.name == self.name

    def __repr__(self):
        return f"SameHash({self.name!r})"


def test_keys_sharing_a_hash_are_found_in_every_list(policy_cls):
    """The core settles a look-up at the first node of a hash only when no
    other node has it; keys sharing a hash take the list-by-list path."""
    policy = policy_cls(4)
    chunks = {n: ready(i) for i, n in enumerate("abcde")}
    for n in "abcd":
        policy.insert(SameHash(n), chunks[n], CTX)
        policy._check_invariants()
    policy.touch([SameHash("b")], CTX)  # t1 = [a, c, d], t2 = [b]
    assert [k for k, _ in policy.evict(1, ())] == [SameHash("a")]  # b1 = [a]
    policy.remove(SameHash("c"))
    policy._check_invariants()
    assert policy.get(SameHash("b")) is chunks["b"]
    assert policy.get(SameHash("d")) is chunks["d"]
    assert policy.get(SameHash("a")) is None and SameHash("a") in policy.b1
    assert policy.get(SameHash("c")) is None and SameHash("c") not in policy.b1
    policy.insert(SameHash("a"), chunks["e"], CTX)  # the ghost comes back
    policy.insert(SameHash("c"), chunks["c"], CTX)
    assert (list(policy.t1), list(policy.t2), list(policy.b1)) == (
        [SameHash("d"), SameHash("a"), SameHash("c")],
        [SameHash("b")],
        [],
    )
    policy._check_invariants()


# =============================================================================
# Round 3 (issue 14): no working storage that Python code can reach, and the
# twins agree on the last hostile cases. Each test failed before its fix
# (items 11-13 killed a surviving mutant instead; see their docstrings).
# =============================================================================

# --- 1. key callbacks that find a call's working lists -----------------------

# Runs in a child: first vLLM's ARC with nothing armed (the oracle), then the
# implementation under test with the callback armed. Neither twin keeps a
# working list that the callback could find, so both must reach vLLM's state.
REACH_PRELUDE = """
    import gc
    from fractions import Fraction
    from helpers import ChunkStatus, ReqContext, VllmARC

    HOW = {how!r}
    ARMED = set()
    CALL = []   # the key objects the call is given

    def clear_lists_holding(*objs):
        for obj in objs:
            for r in gc.get_referrers(obj):
                if type(r) is list and r is not CALL:
                    r.clear()

    class Key:
        def __init__(self, n):
            self.n = n
        def __hash__(self):
            if "hash" in ARMED:
                clear_lists_holding(self)
            return hash(self.n)
        def __eq__(self, other):
            if "eq" in ARMED:
                clear_lists_holding(self, other)
            return isinstance(other, Key) and other.n == self.n

    class Target(Fraction):
        # A ghost hit's arithmetic: runs in the middle of touch's changes.
        def __add__(self, other):
            if "target" in ARMED:
                clear_lists_holding(*CALL)
            return Fraction.__add__(self, other)

    def ready(i):
        c = ChunkStatus(i)
        c.ref_cnt = 0
        return c

    def populated(cls, capacity=3):
        # t1 = [2, 4, 5], t2 = [3], b1 = [0, 1]
        p = cls(capacity)
        for i in range(6):
            p.insert(Key(i), ready(i), None)
            if i == 2:
                p.evict(2, ())
        p.touch([Key(3)], None)
        p.target_t1_size = Target(1, 3)
        return p

    def state(p):
        return ([k.n for k in p.t1], [k.n for k in p.t2], [k.n for k in p.b1],
                [k.n for k in p.b2], p.target_t1_size)

    def run(cls, armed, call):
        p = populated(cls)
        ARMED.update(armed)
        try:
            call(p)
        finally:
            ARMED.clear()
        return p, state(p)
"""

REACH_CALLS = {
    # (what is armed, the call); CALL holds fresh key objects equal to stored ones
    "touch": ({"hash"}, "p.touch(CALL, None)", [0, 2, 3, 4, 5, 7]),
    "on_store_miss": ({"hash"}, "p.on_store_miss(CALL, None)", [0, 1, 7, 2]),
    "on_request_finished": (
        {"eq"},
        "p.on_request_finished((tuple(CALL),), {Key(4)}, {Key(2), Key(3), Key(5)}, ReqContext(req_id='r'))",
        [2, 3, 4, 5, 6],
    ),
    # touch's second pass: the ghost hit (processed first) runs Target.__add__
    "touch-after-ghost-hit": ({"target"}, "p.touch(CALL, None)", [2, 3, 4, 5, 0]),
}


@pytest.mark.parametrize("how", REACH_CALLS)
def test_key_callbacks_cannot_reach_the_working_storage(impl, how):
    """Item 1: touch, on_store_miss and on_request_finished copied the keys
    into a list the core read unchecked while key callbacks ran; a callback
    that found it with gc.get_referrers and cleared it crashed the core."""
    armed, call, ns = REACH_CALLS[how]
    body = textwrap.dedent(REACH_PRELUDE).format(how=how) + textwrap.dedent(
        f"""
        def call(p):
            {call}

        CALL[:] = [Key(n) for n in {ns!r}]
        _, oracle = run(VllmARC, set(), call)
        CALL[:] = [Key(n) for n in {ns!r}]
        p, got = run(cls, {armed!r}, call)
        assert got == oracle, (got, oracle)
        p._check_invariants()
        print("as vLLM:", got)
        """
    )
    proc = run_child(impl, body)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.startswith("as vLLM:"), proc.stdout


# --- 2. a gc.callbacks hook that empties the working lists ---------------------

EMPTYING_HOOK = """
    import gc

    ARMED_LENGTHS = set()

    def working(o):
        # the shapes of the working lists a call used to keep: n Nones (trash,
        # results to fill), (key, chunk) pairs, (key, chunk, from_t1) triples,
        # keys
        return all(
            x is None or type(x) is Key or type(x) is tuple and x and type(x[0]) is Key
            for x in o
        )

    COLLECTIONS = [0]   # collections started while armed (on 3.12+, for the
                        # compiled evict: just after it returned)
    EMPTIED_LISTS = []  # (list, its items when the hook emptied it)

    def emptying_hook(phase, info):
        if phase != "start" or not ARMED_LENGTHS:
            return
        COLLECTIONS[0] += 1
        for o in gc.get_objects():
            if type(o) is list and o is not CALL and len(o) in ARMED_LENGTHS and working(o):
                EMPTIED_LISTS.append((o, tuple(o)))
                o.clear()

    def run_hooked(cls, call, lengths):
        p = populated(cls, capacity=8)
        for i in range(8, 14):
            p.insert(Key(i), ready(i), None)
        ARMED_LENGTHS.update(lengths)
        # empty the 2-tuple free list: making a pair must allocate (and may
        # start a collection)
        pairs = [(i, -i) for i in range(5000)]
        gc.callbacks.append(emptying_hook)
        gc.set_threshold(1)
        COLLECTIONS[0] = 0
        try:
            result = call(p)
        finally:
            ARMED_LENGTHS.clear()
            gc.set_threshold(700)
            gc.callbacks.remove(emptying_hook)
        # From CPython 3.12 on, a collection starts only at the interpreter's
        # next eval-breaker check: for the compiled evict, that is just after
        # it returns, when the list it returned is the caller's. Compare what
        # that list held when the hook emptied it.
        for o, items in EMPTIED_LISTS:
            if o is result:
                result = list(items)
        EMPTIED_LISTS.clear()
        if lengths:
            assert COLLECTIONS[0] > 0, "no collection started while armed"
        return p, (state(p), result and [(k.n, c.chunk_id) for k, c in result])
"""

EMPTIED = {
    # evict: the result list was made first and filled with tuples (each
    # allocation may start a collection)
    "evict": ("p.evict(5, ())", [], {5}),
    # touch: the trash list, swapped into after a Fraction's arithmetic
    "touch": ("p.touch(CALL, None)", [2, 3, 4, 5, 8, 9, 0], {7}),
}


@pytest.mark.parametrize("how", EMPTIED)
def test_gc_hook_cannot_empty_the_working_storage(impl, how):
    """Item 2: [None] * n hid NULL items, but the core still wrote into its
    working lists unchecked after points where a collection can run; a
    gc.callbacks hook that emptied them crashed the core (the twin raised
    IndexError halfway through touch, leaving it partly changed)."""
    call, ns, lengths = EMPTIED[how]
    body = (
        textwrap.dedent(REACH_PRELUDE).format(how=how)
        + textwrap.dedent(EMPTYING_HOOK)
        + textwrap.dedent(
            f"""
            def call(p):
                return {call}

            CALL[:] = [Key(n) for n in {ns!r}]
            _, oracle = run_hooked(VllmARC, call, set())
            CALL[:] = [Key(n) for n in {ns!r}]
            p, got = run_hooked(cls, call, {lengths!r})
            assert got == oracle, (got, oracle)
            p._check_invariants()
            print("as vLLM:", got)
            """
        )
    )
    proc = run_child(impl, body)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout.startswith("as vLLM:"), proc.stdout


# --- 3, 4. the twin runs no user code without being busy -----------------------

MUTATION_LOG: list[str] = []


def _try_insert(policy, i):
    try:
        policy.insert(K(900 + i), ready(900 + i), CTX)
    except RuntimeError as error:
        assert "is still running" in str(error)
        MUTATION_LOG.append("refused")
    else:
        MUTATION_LOG.append("allowed")


class InsertingKey:
    """Keys sharing one hash, equal by name; comparing them tries insert()."""

    policy = None

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return 4242

    def __eq__(self, other):
        if InsertingKey.policy is not None:
            _try_insert(InsertingKey.policy, len(MUTATION_LOG))
        return isinstance(other, InsertingKey) and other.name == self.name

    def __repr__(self):
        return self.name


def _compare_while_busy(cls, call):
    MUTATION_LOG.clear()
    InsertingKey.policy = None
    policy = cls(4)
    for name in "XYZ":
        policy.insert(InsertingKey(name), ready(ord(name)), CTX)
    InsertingKey.policy = policy
    try:
        result = call(policy)
    finally:
        InsertingKey.policy = None
    policy._check_invariants()
    return keysnap(policy), result and [k.name for k, _ in result], list(MUTATION_LOG)


COMPARING_CALLS = {
    "evict": lambda p: p.evict(3, ()),
    "remove": lambda p: p.remove(InsertingKey("Y")),
}


@pytest.mark.parametrize("how", COMPARING_CALLS)
def test_key_eq_cannot_mutate_in_evict_or_remove(policy_cls, how):
    """Item 3: the twin cleared busy before evict's apply phase and before
    remove's pop, which compare keys sharing a hash: an insert() from such
    an __eq__ succeeded there."""
    call = COMPARING_CALLS[how]
    state, result, log = _compare_while_busy(policy_cls, call)
    assert "allowed" not in log, log
    # the refused callbacks change nothing: the state is the one reached
    # without them
    quiet = VllmARC(4)
    for name in "XYZ":
        quiet.insert(InsertingKey(name), ready(ord(name)), CTX)
    expected = call(quiet)
    assert (state, result) == (keysnap(quiet), expected and [k.name for k, _ in expected])
    if policy_cls.__module__.endswith("_arc_py") or how == "remove":
        assert log  # the comparisons did run (the core's evict never compares)


class CallingFraction(Fraction):
    def __float__(self):
        _try_insert(CallingFraction.policy, 0)
        return Fraction.__float__(self)


def test_target_setter_runs_user_code_while_busy(policy_cls):
    """Item 4: the twin's setter ran the value's __float__ (math.isfinite)
    without being busy."""
    MUTATION_LOG.clear()
    policy = populated(policy_cls)
    CallingFraction.policy = policy
    before = keysnap(policy)
    policy.target_t1_size = CallingFraction(5, 2)
    assert MUTATION_LOG == ["refused"]
    assert keysnap(policy)[:4] == before[:4]
    assert policy.target_t1_size == Fraction(5, 2)


# (The chunk-type check of item 4 no longer reads _fields_, whose names
# were the user code it ran: test_rules.py checks every method's first user
# code for busy.)


# --- 5. ref_cnt is the field attribute access resolves --------------------------


class BitfieldInSubclass(ChunkStatus):
    _fields_ = [("ref_cnt", ctypes.c_int32, 4)]


class PropertyInSubclass(ChunkStatus):
    @property
    def ref_cnt(self):
        return 0


class CustomGetattribute(ChunkStatus):
    def __getattribute__(self, name):
        return object.__getattribute__(self, name)


class RedeclaredInSubclass(ChunkStatus):
    # a plain c_int32 again, after the base's fields: this one is read
    _fields_ = [("ref_cnt", ctypes.c_int32)]


@pytest.mark.parametrize(
    "tp", [BitfieldInSubclass, PropertyInSubclass, CustomGetattribute], ids=lambda t: t.__name__
)
def test_ref_cnt_shadowed_in_a_subclass_is_refused(tp):
    """Item 5: validation skipped the subclass's bitfield and accepted the
    base's plain field, but recorded the bitfield's offset; the core then
    read 4 raw bytes where vLLM reads the bitfield's value."""
    chunk = tp.__new__(tp)
    errors = []
    for name in IMPLEMENTATIONS:
        policy = populated(load_policy_class(name))
        error = unchanged(policy, lambda p: p.insert(K(9), chunk, CTX), TypeError)
        errors.append(str(error))
    assert errors == [_common.MSG_CHUNK.format(tp.__qualname__)] * 2


def test_ref_cnt_redeclared_in_a_subclass_is_read_there(policy_cls):
    def scenario(cls):
        policy = cls(4)
        chunks = [RedeclaredInSubclass(i) for i in range(3)]
        for i, chunk in enumerate(chunks):
            chunk.ref_cnt = 0 if i != 1 else -1
            ChunkStatus.ref_cnt.__set__(chunk, 7)  # the base's field: not read
            policy.insert(K(i), chunk, CTX)
        policy.touch([K(0), K(1)], CTX)
        return keysnap(policy), [k for k, _ in policy.evict(2, ())]

    assert RedeclaredInSubclass.ref_cnt.offset != ChunkStatus.ref_cnt.offset
    assert scenario(policy_cls) == scenario(VllmARC)


# --- 6, 8. clear() and __init__ again release in vLLM's order ------------------

RELEASE_LOG: list = []


class ReleasingKey:
    """Equal by name; when freed, records the list sizes it sees and sets
    target_t1_size to 3."""

    def __init__(self, name, policy=None):
        self.name = name
        self.policy = policy

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return isinstance(other, ReleasingKey) and other.name == self.name

    def __del__(self):
        p = self.policy
        if p is not None:
            RELEASE_LOG.append(
                (self.name, len(p.t1), len(p.t2), len(p.b1), len(p.b2), p.target_t1_size)
            )
            p.target_t1_size = 3


def _release_scenario(cls, reset):
    RELEASE_LOG.clear()
    policy = cls(4)
    for name in ("t1-a", "b1", "t2", "t1-b", "t1-c"):
        policy.insert(ReleasingKey(name, policy), ready(len(RELEASE_LOG)), CTX)
    policy.touch([ReleasingKey("t2", policy)], CTX)  # stored under this key object
    assert [k.name for k, _ in policy.evict(1, ())] == ["t1-a"]
    assert [k.name for k, _ in policy.evict(1, {ReleasingKey("t1-b")})] == ["b1"]
    policy.target_t1_size = 1.5
    RELEASE_LOG.clear()
    reset(policy)
    state = keysnap(policy)
    names = [[k.name for k in lst] for lst in state[:4]]
    return names, state[4:], list(RELEASE_LOG)


def test_clear_releases_lists_in_turn_then_resets_the_target(policy_cls):
    """Item 6: the core reset target_t1_size before releasing the keys (and
    released them all at once), so a released key's __del__ that set the
    target left 3 where vLLM and the twin end with 0.0."""
    got = _release_scenario(policy_cls, lambda p: p.clear())
    assert got == _release_scenario(VllmARC, lambda p: p.clear())
    assert got[1] == (0.0, float)
    assert [entry[0] for entry in got[2]] == ["t1-b", "t1-c", "t2", "t1-a", "b1"]


def test_init_again_resets_like_vllms_init(policy_cls):
    """Item 8: __init__ again sets the capacity and target first, then
    empties the lists (vLLM replaces them in turn); both twins now also
    reset _max_entries, which vLLM's class does not have."""
    got = _release_scenario(policy_cls, lambda p: p.__init__(6))
    assert got == _release_scenario(VllmARC, lambda p: p.__init__(6))
    assert got[1] == (3, int)  # set by a __del__ after the target was reset
    policy = populated(policy_cls)
    policy._max_entries = 10
    policy.__init__(7)
    assert (policy._max_entries, policy.cache_capacity) == (_common.MAX_ENTRIES, 7)
    policy._check_invariants()


def test_init_again_with_bad_capacity_changes_nothing(policy_cls):
    policy = populated(policy_cls)
    policy._max_entries = 50
    for bad, exc in ((-1, ValueError), ("3", TypeError), (None, TypeError)):
        unchanged(policy, lambda p: p.__init__(bad), exc)
        assert (policy._max_entries, policy.cache_capacity) == (50, 3)


# --- 7. a move that changes nothing is not a change -----------------------------


def _iterator_after(cls, view, act):
    policy = cls(6)
    for i in range(6):
        policy.insert(K(i), ready(i), CTX)
    assert len(policy.evict(2, ())) == 2  # b1 = [0, 1], t1 = [2, 3, 4, 5]
    policy.touch([K(3), K(4)], CTX)  # t1 = [2, 5], t2 = [4, 3]
    policy.insert(K(6), ChunkStatus(6), CTX)  # pending: t1 = [2, 5, 6]
    it = iter(getattr(policy, view))
    first = next(it)
    act(policy)
    try:
        return "continues", [first, *it]
    except RuntimeError:
        return "raised", None


NO_OP_MOVES = {
    "touch t2's MRU": ("t2", lambda p: p.touch([K(3)], CTX)),
    "reused t2's MRU": ("t2", lambda p: p.on_request_finished(((K(3),),), set(), {K(3)}, CTX)),
    "inserted-only t1's MRU": (
        "t1",
        lambda p: p.on_request_finished(((K(6),),), {K(6)}, set(), CTX),
    ),
    "ghost hit at b1's MRU": ("b1", lambda p: p.on_store_miss([K(1)], CTX)),
    # vLLM pops the pending chunk and stores it again: a change
    "touch a pending t1 MRU": ("t1", lambda p: p.touch([K(6)], CTX)),
    "touch t2's LRU": ("t2", lambda p: p.touch([K(4)], CTX)),
}


@pytest.mark.parametrize("case", NO_OP_MOVES)
def test_iterator_survives_moves_that_change_nothing(policy_cls, case):
    """Item 7: the core counted moving an entry to the end it already sits
    at as a change; OrderedDict's move_to_end does not."""
    view, act = NO_OP_MOVES[case]
    got = _iterator_after(policy_cls, view, act)
    assert got == _iterator_after(VllmARC, view, act)
    assert got[0] == ("raised" if case.startswith(("touch a pending", "touch t2's LRU")) else "continues")


# --- 9. chunk types are held weakly --------------------------------------------


@pytest.mark.parametrize("how", ["remove", "evict", "clear"])
def test_last_chunk_type_is_not_kept_alive(policy_cls, how):
    """Item 9: both implementations kept a strong reference to the last
    chunk type they saw; a type made at run time (here with a 10 MB class
    attribute) lived as long as the policy."""
    policy = policy_cls(4)
    policy.insert(K(1), ready(1), CTX)
    tp = type("Runtime", (ctypes.Structure,), {
        "_fields_": [("ref_cnt", ctypes.c_int32)], "payload": bytes(10 * 2**20),
    })
    ref = weakref.ref(tp)
    policy.insert(K(2), tp(), CTX)
    policy.touch([K(2)], CTX)
    del tp
    if how == "remove":
        policy.remove(K(2))
    elif how == "evict":
        assert [k for k, _ in policy.evict(2, ())] == [K(1), K(2)]
    else:
        policy.clear()
    gc.collect()
    assert ref() is None
    # and the policy still reads chunks of other types
    policy.insert(K(3), ready(3), CTX)
    everything = policy.evict(len(policy.t1) + len(policy.t2), ())
    assert K(3) in [k for k, _ in everything]
    policy._check_invariants()


def _chunk_type(name, fields):
    return type(name, (ctypes.Structure,), {"_fields_": fields})


# AddressSanitizer keeps freed memory in quarantine: no address comes back.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


def test_a_chunk_type_made_at_a_freed_types_address_is_checked_again(policy_cls):
    """With the type held weakly, a new type may be made where the cached
    one was, and a resident chunk given that type: its ref_cnt offset must
    be looked up, not taken from the cache."""
    for attempt in range(200):
        policy = policy_cls(4)
        old = _chunk_type("Old", [("ref_cnt", ctypes.c_int32), ("pad", ctypes.c_char * 12)])
        old_id = id(old)
        chunk = old()
        policy.insert(K(1), chunk, CTX)  # the cache: Old, ref_cnt at 0
        chunk.__class__ = Small  # no read: the cache still says Old
        del old
        gc.collect()
        # CPython 3.13 may hand the freed block out only after other blocks
        # of its size: keep making types (all alive) until one lands there.
        made = []
        for _ in range(64):
            new = _chunk_type("New", [("pad", ctypes.c_char * 8), ("ref_cnt", ctypes.c_int32)])
            made.append(new)
            if id(new) == old_id:
                break
        if id(new) == old_id:
            break
    else:
        # the same check, at another address
        assert UNDER_ASAN, "no type was made at a freed type's address in 200 attempts"
    chunk.__class__ = new
    ctypes.memset(ctypes.addressof(chunk), 0, 16)
    ctypes.memset(ctypes.addressof(chunk), 1, 4)  # at Old's offset: pinned
    assert chunk.ref_cnt == 0  # at New's offset: evictable
    assert policy.evict(1, ()) == [(K(1), chunk)]


# --- 10. the documented divergence, and copy/pickle -----------------------------


class EqRaisesWhenArmed:
    armed = False

    def __init__(self, n):
        self.n = n

    def __hash__(self):
        return 31337

    def __eq__(self, other):
        if EqRaisesWhenArmed.armed:
            raise ArithmeticError("eq")
        return isinstance(other, EqRaisesWhenArmed) and other.n == self.n


def _evict_with_raising_eq(cls):
    policy = cls(4)
    for n in range(2):
        policy.insert(EqRaisesWhenArmed(n), ready(n), CTX)
    EqRaisesWhenArmed.armed = True
    try:
        outcome = "ok", [k.n for k, _ in policy.evict(2, ())]
    except ArithmeticError:
        outcome = "raised", None
    finally:
        EqRaisesWhenArmed.armed = False
    return outcome, [[k.n for k in getattr(policy, name)] for name in ("t1", "b1")]


def test_documented_divergence_evict_never_compares_keys(policy_cls):
    """Item 10, documented: vLLM's evict() looks each scanned key up again
    (OrderedDict's items() iterator), which runs __eq__ between keys that
    share a hash; the compiled core walks its lists and never calls __eq__
    in evict(). A raising __eq__ makes vLLM and the twin raise and change
    nothing, while the core evicts."""
    unchanged_state = (("raised", None), [[0, 1], []])
    assert _evict_with_raising_eq(VllmARC) == unchanged_state
    got = _evict_with_raising_eq(policy_cls)
    if policy_cls.__module__.endswith("_arc_c"):
        assert got == (("ok", [0, 1]), [[], [0, 1]])
    else:
        assert got == unchanged_state


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_copy_and_pickle(policy_cls, how):
    """Item 10, documented: the compiled core refuses to be copied or
    pickled (a clear TypeError); vLLM's class and the twin copy."""
    import copy
    import pickle

    do = {
        "copy": copy.copy,
        "deepcopy": copy.deepcopy,
        "pickle": lambda p: pickle.loads(pickle.dumps(p)),
    }[how]
    policy = populated(policy_cls)
    if policy_cls.__module__.endswith("_arc_c"):
        with pytest.raises(TypeError) as info:
            do(policy)
        assert str(info.value) == _common.MSG_NO_COPY.format("ARCCachePolicy")
    else:
        twin = do(policy)
        assert keysnap(twin)[:4] == keysnap(policy)[:4]
    do(populated(VllmARC))  # vLLM's copies


# --- 11. on_store_miss: a failure changes nothing, whatever the key order -------


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: [K(9)], id="unhashable"),
        pytest.param(lambda: HashRaises(ZeroDivisionError("zd")), id="raising-hash"),
        pytest.param(lambda: EqRaises(K(1)), id="raising-eq"),
    ],
)
def test_on_store_miss_bad_key_first_changes_nothing(bad):
    """Item 11 (a mutant that dropped on_store_miss's look-up pass survived:
    every test put the bad key last, and on_store_miss walks keys last to
    first). Here the bad key is first and a ghost hit follows it."""
    errors = []
    for name in IMPLEMENTATIONS:
        policy = populated(load_policy_class(name))
        key = bad()
        error = unchanged(policy, lambda p: p.on_store_miss([key, K(1), K(0)], CTX), Exception)
        errors.append((type(error), str(error)))
    assert errors[0] == errors[1]


# --- 12. evict(n) for n beyond what is held ------------------------------------


@pytest.mark.parametrize("n", [10**30, 2**40, 5])
def test_evict_more_than_held_returns_none(policy_cls, n):
    """Item 12 (a mutant without the core's early exit survived): n above
    the resident count is None at once, with no scratch sized by n."""
    policy = populated(policy_cls)  # 4 resident
    assert unchanged_result(policy, lambda p: p.evict(n, set())) is None
    assert populated(VllmARC).evict(n, set()) is None


def unchanged_result(policy, call):
    before = snapshot(policy)
    result = call(policy)
    assert snapshot(policy) == before
    policy._check_invariants()
    return result


# --- 13. rules only the state machine reached ------------------------------------


def test_key_both_inserted_only_and_reused_is_inserted_only(policy_cls):
    """Item 13: insertion_only_keys wins over reused_keys, as in vLLM (a
    mutant that checked reused_keys first died only in the state machine)."""

    def scenario(cls):
        policy = populated(cls)  # t1 = [2, 4, 5], t2 = [3]
        both = {K(2), K(3)}
        policy.on_request_finished(((K(2), K(3), K(4)),), both, both | {K(4)}, CTX)
        return keysnap(policy)

    got = scenario(policy_cls)
    assert got == scenario(VllmARC)
    assert got[:2] == ([K(5), K(2)], [K(4), K(3)])


def test_on_store_miss_ignores_resident_keys(policy_cls):
    """Item 13: on_store_miss only looks at the ghosts (a mutant that looked
    resident keys up too died only in the state machine)."""

    def scenario(cls):
        policy = populated(cls)
        policy.on_store_miss([K(2), K(3), K(5), K(1)], CTX)
        return keysnap(policy)

    got = scenario(policy_cls)
    assert got == scenario(VllmARC)
    assert got[2] == [K(0), K(1)] and got[4] == 1
