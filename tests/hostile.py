"""Hostile objects and policy states that several test modules share:
keys whose __hash__ or __eq__ raise or collide, keys whose __del__ calls
back into the policy, protected containers, the calls that hash a key or
mutate the policy, and the small populated policies the cases start from.
"""

from __future__ import annotations

import gc

import pytest

from helpers import CTX, K, keysnap, ready, snapshot


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


def with_ghosts(cls, capacity=4):
    """t1 = [4, 5], t2 = [3], b1 = [0, 1, 2]."""
    policy = cls(capacity)
    for i in range(6):
        policy.insert(K(i), ready(i), CTX)
        if i == 3:
            policy.touch([K(3)], CTX)
            policy.evict(3, set())
    return policy


def unchanged(policy, call, exc_type):
    """call(policy) raises exc_type and changes nothing; returns the error."""
    before = snapshot(policy)
    with pytest.raises(exc_type) as info:
        call(policy)
    assert snapshot(policy) == before
    policy._check_invariants()
    return info.value


def set_target(value):
    def call(p):
        p.target_t1_size = value

    return call


# --- keys whose __hash__ or __eq__ raise --------------------------------------


class HashRaises:
    def __init__(self, exc):
        self.exc = exc

    def __hash__(self):
        raise self.exc

    def __eq__(self, other):
        return self is other


EQ_ERROR = ArithmeticError("eq")  # EqRaises's default: one error shared by every key


class EqRaises:
    """Collides with another key's hash; comparing with it raises."""

    def __init__(self, like, exc=EQ_ERROR):
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


def calls_with(key):
    """Every entry point that hashes (and looks up) a user key."""
    return {
        "insert": lambda p: p.insert(key, ready(9), CTX),
        "get": lambda p: p.get(key),
        "remove": lambda p: p.remove(key),
        "touch": lambda p: p.touch([key], CTX),
        "touch-batch-last": lambda p: p.touch([K(4), K(0), key], CTX),
        "on_store_miss": lambda p: p.on_store_miss([key], CTX),
        "on_store_miss-batch-last": lambda p: p.on_store_miss([K(1), K(0), key], CTX),
        "on_request_finished": lambda p: p.on_request_finished(((key,),), set(), {key}, CTX),
        "on_request_finished-reused": lambda p: p.on_request_finished(
            ((K(4), K(5), key),), {K(4)}, {K(5)}, CTX
        ),
        "t1-contains": lambda p: key in p.t1,
        "b1-getitem": lambda p: p.b1[key],
        "evict-protected": lambda p: p.evict(2, Hashing(key)),
    }


CALL_NAMES = list(calls_with(None))


# --- callbacks that raise or mutate the policy ---------------------------------


class Boom(Exception):
    pass


MUTATIONS = {
    "insert": lambda p: p.insert(K(99), ready(99), CTX),
    "remove": lambda p: p.remove(K(4)),
    "clear": lambda p: p.clear(),
    "evict": lambda p: p.evict(1, ()),
    "evict(0)": lambda p: p.evict(0, ()),
    "target_t1_size": set_target(1),
    "touch": lambda p: p.touch([K(4)], CTX),
    "on_store_miss": lambda p: p.on_store_miss([K(0)], CTX),
    "on_request_finished": lambda p: p.on_request_finished(((K(4),),), set(), {K(4)}, CTX),
    "__init__": lambda p: p.__init__(3),
}


def core_only_params(names, core):
    """names as test parameters, those in core marked core_only (a case of a
    rule the compiled core keeps alone: tests/conftest.py)."""
    return [pytest.param(n, marks=pytest.mark.core_only) if n in core else n for n in names]


# MUTATIONS as test parameters: setting the target is a mutating call of the
# core's alone (the twin's target_t1_size is vLLM's plain attribute).
MUTATION_PARAMS = core_only_params(MUTATIONS, {"target_t1_size"})


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


def drop_callback_key(policy, when, act):
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
        assert [k for k, _ in policy.evict(1, {K(2), K(4), K(5)})] == [CallbackKey("cb")]
        for i in (10, 11, 12):
            policy.insert(K(i), ready(i), CTX)
        policy.evict(3, {K(3)})
    elif when == "reinsert":
        # evict it into b1, then insert an equal key: the ghost is forgotten
        assert [k for k, _ in policy.evict(1, {K(2), K(4), K(5)})] == [CallbackKey("cb")]
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
