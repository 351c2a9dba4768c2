"""The way out of a call (docs/hardening.md, rule 2, the core's): a trace or
profile hook that raises at any event of arc_cy's Python code that the core
runs (the chunk check, arc_cy's argument checks) leaves the policy neither
busy nor split, also in a call that a __del__ makes while clear() or
__init__ releases; and a call's user code, a chunk's truth test included,
runs while the call is busy. The twin, vLLM's code, is exposed to hooks as vLLM's is:
a hook that raises in it may cut a call short anywhere (core_only).
"""

from __future__ import annotations

import contextlib
import sys

import pytest

from arc_cy import _messages
from helpers import ARC_CY_DIR, CTX, ChunkStatus, K, keysnap, oracle, ready
from hostile import (
    HostileError,
    Index,
    Key,
    core_only_params,
    hostile,
    populated,
    set_target,
    try_insert,
)

# The hook tests run every call once per event: hundreds of runs, which
# GC stress (a collection at every allocation) would stretch to hours and
# which test hooks, not collections. The others are hostile-input tests.
gc_stress = pytest.mark.gc_stress
pytestmark = [pytest.mark.core_only, pytest.mark.both_policies]

CALLS = {
    "insert": lambda p: p.insert(K(70), ready(70), CTX),
    "insert-over-ghost": lambda p: p.insert(K(0), ready(70), CTX),
    # the calls that fail: the way out from an exception
    "insert-duplicate": lambda p: p.insert(K(4), ready(70), CTX),
    "evict-bad-n": lambda p: p.evict(-1, set()),
    "touch-bad-keys": lambda p: p.touch(None, CTX),
    "remove": lambda p: p.remove(K(4)),
    "touch": lambda p: p.touch([K(4), K(0), K(3)], CTX),
    "on_store_miss": lambda p: p.on_store_miss([K(0), K(1)], CTX),
    "on_request_finished": lambda p: p.on_request_finished([[K(4), K(2)]], {K(2)}, {K(4)}, CTX),
    "evict": lambda p: p.evict(2, set()),
    "target_t1_size": set_target(2),
    "_max_entries": lambda p: setattr(p, "_max_entries", 50),
    "get": lambda p: p.get(K(4)),
    "t1[key]": lambda p: p.t1[K(4)],
    "key in b1": lambda p: K(0) in p.b1,
    "__init__": lambda p: p.__init__(3),
    "clear": lambda p: p.clear(),
    "_check_invariants": lambda p: p._check_invariants(),
}


class Hook:
    """A sys.settrace or sys.setprofile hook that counts the events of
    arc_cy's own frames and raises HostileError at the one numbered `at` (never,
    if None). CPython unsets a hook that raises."""

    def __init__(self, kind, at=None):
        self.kind, self.at, self.seen, self.raised_at = kind, at, 0, None

    def __call__(self, frame, event, arg):
        if frame.f_code.co_filename.startswith(ARC_CY_DIR):
            if self.seen == self.at:
                self.raised_at = f"{event} {frame.f_code.co_name}:{frame.f_lineno}"
                raise HostileError(self.raised_at)
            self.seen += 1
        return self

    def run(self, fn):
        # A HostileError raised where Python cannot pass it on (a generator closed
        # as its call's frame goes, a __del__) is expected; nothing else.
        lost = []
        unraisable, sys.unraisablehook = sys.unraisablehook, lost.append
        install = sys.settrace if self.kind == "trace" else sys.setprofile
        install(self)
        try:
            fn()
        except (HostileError, ValueError, TypeError):  # a hook's, or the call's own error
            pass
        finally:
            install(None)
            sys.unraisablehook = unraisable
        assert all(type(info.exc_value) is HostileError for info in lost), lost


def each_event(kind, make, call):
    """Run call(make()) once per event of arc_cy's code that it sees, with
    a hook that raises there; yield (where it raised, the policy)."""
    counter = Hook(kind)
    policy = make()
    counter.run(lambda: call(policy))
    for at in range(counter.seen):
        policy = make()
        hook = Hook(kind, at)
        hook.run(lambda: call(policy))  # noqa: B023 -- run at once, in this iteration
        yield hook.raised_at, policy


def assert_free_and_whole(policy, where):
    """Not busy, the lists one set (what insert() puts in, get() and the
    view find), and every mutator, __init__ included, accepted;
    _check_invariants() after __init__ again."""
    try:
        if hasattr(policy, "target_t1_size"):  # ARC's alone
            policy.target_t1_size = policy.target_t1_size
        chunk = ready(99)
        policy.insert(K(99), chunk, CTX)
        assert policy.get(K(99)) is chunk
        assert K(99) in policy.t1 and policy.t1[K(99)] is chunk
        policy.remove(K(99))
        assert policy.get(K(99)) is None and K(99) not in policy.t1
        policy.__init__(3)
        policy.insert(K(1), ready(1), CTX)
        assert list(policy.t1) == [K(1)]
        policy._check_invariants()
    except (AssertionError, RuntimeError) as exc:
        raise AssertionError(f"after a hook raised at {where}: {exc!r}") from exc


@pytest.mark.parametrize("kind", ["trace", "profile"])
@pytest.mark.parametrize("call", core_only_params(CALLS, ()))
def test_a_hook_raising_at_any_event_leaves_the_policy_free_and_whole(policy_cls, call, kind):
    """Each event of arc_cy's Python code in turn. (When the twin kept the
    core's protocol, its __init__ once rebound its list tuple and then, a
    line later, the t1 attribute: a hook raising between the two left
    insert() and get() on two different t1s.)"""
    for where, policy in each_event(kind, lambda: populated(policy_cls), CALLS[call]):
        assert_free_and_whole(policy, where)


ARMED: list = []


def _released(policy, nested):
    """A key whose __del__, while ARMED, runs nested on policy (what that
    raises, a HostileError or a refusal, is dropped here, not reported
    to the unraisable hook)."""

    def hook(key):
        if ARMED:
            with contextlib.suppress(Exception):
                nested(policy)

    return Key(object(), 1234, delete=hook)


NESTED = ["insert", "evict", "touch", "get", "clear", "__init__"]


@pytest.mark.parametrize("kind", ["trace", "profile"])
@pytest.mark.parametrize("outer", ["clear", "__init__"])
@pytest.mark.parametrize("nested", NESTED)
def test_a_hook_raising_in_a_call_nested_in_a_release(policy_cls, nested, outer, kind):
    """clear() or __init__ again releases t1's key, whose __del__ calls in
    (rule 6). A hook that raised while that call gave busy back, when it
    nested in the release, left it holding busy: the clear() never gave
    busy back."""

    def make():
        policy = populated(policy_cls)
        policy.insert(_released(policy, CALLS[nested]), ready(60), CTX)
        return policy

    def call(policy):
        ARMED.append(True)
        try:
            CALLS[outer](policy)
        finally:
            ARMED.clear()

    for where, policy in each_event(kind, make, call):
        assert_free_and_whole(policy, where)


# --- the truth test of get() runs under busy -------------------------------------


LOG: list[str] = []


GETTING: list = []  # the policy whose get() tests an InsertingChunk
# A chunk whose truth test tries insert() and says False; one that only says False.
InsertingChunk = hostile(ChunkStatus, __bool__=lambda _: try_insert(GETTING[0], LOG) or False)
QuietChunk = hostile(ChunkStatus, __bool__=lambda _: False)


def _falsy_get(cls, chunk_cls, where):
    """get() of a falsy chunk in t1 or t2: what it returned ("None" or
    "the chunk"), the lists, and what the chunk's __bool__ logged."""
    LOG.clear()
    policy = populated(cls)
    chunk = chunk_cls(77)
    chunk.ref_cnt = 0  # ready: touch() moves it to t2
    policy.insert(K(77), chunk, CTX)
    if where == "t2":
        policy.touch([K(77)], CTX)
    GETTING.append(policy)
    try:
        got = policy.get(K(77))
    finally:
        GETTING.clear()
    assert (K(77) in policy.t2) == (where == "t2")
    return "the chunk" if got is chunk else repr(got), keysnap(policy), list(LOG)


@pytest.mark.needs_vllm
@gc_stress
@pytest.mark.parametrize("where", ["t1", "t2"])
def test_a_chunks_truth_test_runs_while_get_is_busy(policy_cls, where):
    """vLLM's get() is `t1.get(key) or t2.get(key)`: a t1 chunk's __bool__
    is user code of the call, and a falsy one gives None. The core tested
    it after giving busy back, so a __bool__ that called insert() was let
    through, and it tested a t2 chunk too, which vLLM's `or` returns
    untested (the core gave None for a falsy one). It refuses the insert
    from a t1 chunk's test and ends as vLLM does with a chunk that only
    says False (vLLM, and the twin, let the insert through: a documented
    divergence); a t2 chunk is returned untested."""
    got = _falsy_get(policy_cls, InsertingChunk, where)
    if where == "t1":
        assert got[2] == [_messages.MSG_REENTRANT.format("insert", "get")]
        assert got[:2] == _falsy_get(oracle(policy_cls), QuietChunk, where)[:2]
        assert got[0] == "None"
    else:
        assert got == _falsy_get(oracle(policy_cls), InsertingChunk, where)
        assert got[0] == "the chunk" and got[2] == []


@gc_stress
def test_the_entry_limits_check_runs_while_its_setter_is_busy(policy_cls):
    """_max_entries's setter (arc_cy's own, for tests) ran the value's
    __index__ without being busy, in both: an insert() from it was let
    through."""
    LOG.clear()
    policy = populated(policy_cls)
    before = keysnap(policy)
    policy._max_entries = hostile(Index, __index__=lambda _: try_insert(policy, LOG))(50)
    assert LOG == [_messages.MSG_REENTRANT.format("insert", "_max_entries")]
    assert keysnap(policy) == before and policy._max_entries == 50
    policy._check_invariants()
