"""The hostile kit that the tests and the fuzzers (tests/progs/*_fuzz.py)
share: one error, keys and other objects whose dunders misbehave as a case
asks (made, not written out dunder by dunder), the calls that hash a key or
mutate the policy, and the small populated policies the cases start from.

    act(how, obj, *args)   a hook: None nothing; an exception (instance or
                           class) raised; a callable called with the object
                           and the dunder's arguments: what it returns, unless
                           None, is the dunder's result (a wrong type too)
    Key(ident, hash_as, hash=, eq=, delete=)
                           equal to a Key of its ident and to the ident itself
                           (Key(K(4)) stands for K(4)), hashing as hash_as
                           (the ident unless given); hooks per key
    hostile(base, **hooks) a subclass of base (a container, chunk, Fraction,
                           Index, context...) whose named methods run a hook
                           first, base's method giving the result on None
    after(n, how)          a hook that does nothing n times, then how
    try_insert(policy, log) a hook's call back: insert(), refused or not
    hooked(name, plain, hook_of)
                           the method that the others are made of: runs
                           hook_of(self, name), then plain on None
"""

from __future__ import annotations

import gc
import itertools

from helpers import CTX, K, keysnap, ready, snapshot

# --- the kit ---------------------------------------------------------------------


class HostileError(Exception):
    """The one exception hostile objects raise (tests and fuzzers)."""


def act(how, *args):
    if how is None:
        return None
    if isinstance(how, BaseException) or (isinstance(how, type) and issubclass(how, BaseException)):
        raise how
    return how(*args)


def after(n, how):
    calls = itertools.count()
    return lambda *args: act(how, *args) if next(calls) >= n else None


def _nothing(*args):
    return None


def hooked(name, plain, hook_of):
    def dunder(self, *args):
        got = act(hook_of(self, name), self, *args)
        return plain(self, *args) if got is None else got

    dunder.__name__ = name
    return dunder


def hostile(base, name=None, **hooks):
    namespace = {
        attr: hooked(attr, getattr(base, attr, _nothing), lambda _, a: hooks[a]) for attr in hooks
    }
    namespace.setdefault("__hash__", base.__hash__)  # a class defining __eq__ loses it
    return type(base)(name or f"Hostile{base.__name__}", (base,), namespace)


_SAME = object()


class Key:
    def __init__(self, ident, hash_as=_SAME, *, hash=None, eq=None, delete=None):
        self.ident = ident
        self.hash_as = ident if hash_as is _SAME else hash_as
        self.hooks = {"__hash__": hash, "__eq__": eq, "__del__": delete}

    def __repr__(self):
        return f"Key({self.ident!r})"


for _name, _plain in {
    "__hash__": lambda k: hash(k.hash_as),
    "__eq__": lambda k, other: k.ident == (other.ident if isinstance(other, Key) else other),
    "__del__": _nothing,
}.items():
    setattr(Key, _name, hooked(_name, _plain, lambda k, n: k.__dict__.get("hooks", {}).get(n)))


class Index:
    """An integer through __index__ alone (operator.index() takes an int
    subclass as it is, never calling its __index__)."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


def try_insert(policy, log):
    """What a hook that calls back does: tries insert(), and logs arc_cy's
    refusal (its message) or "allowed"."""
    try:
        policy.insert(K(900 + len(log)), ready(900), CTX)
    except RuntimeError as exc:
        log.append(str(exc))
    else:
        log.append("allowed")


# --- policies the cases start from -------------------------------------------------


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
    import pytest  # here: the fuzzers' children import the kit without pytest

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

EQ_ERROR = ArithmeticError("eq")  # one error, shared by every key that EqRaises makes


def EqRaises(like, exc=EQ_ERROR):
    """Collides with `like`'s hash; comparing with it raises exc."""
    return Key(like, eq=exc)


def hashing(key):
    """A protected container whose lookups hash and compare key (an empty
    set to iterate: ARC+'s evict() reads its keys first)."""
    return hostile(set, __contains__=lambda _, other: other in {key})()


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
        "evict-protected": lambda p: p.evict(2, hashing(key)),
    }


CALL_NAMES = list(calls_with(None))


# --- callbacks that raise or mutate the policy ---------------------------------


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
    rule the compiled core keeps alone: tests/conftest.py), and setting the
    target arc_only (ARC+ has none: setting it raises AttributeError)."""
    import pytest

    def marks(n):
        return [pytest.mark.core_only] * (n in core) + [pytest.mark.arc_only] * (
            n == "target_t1_size"
        )

    return [pytest.param(n, marks=marks(n)) for n in names]


# MUTATIONS as test parameters: setting the target is a mutating call of the
# core's alone (the twin's target_t1_size is vLLM's plain attribute).
MUTATION_PARAMS = core_only_params(MUTATIONS, {"target_t1_size"})


# --- keys whose __del__ calls back into the policy -----------------------------

DEL_LOG: list[str] = []


def logged(policy, call):
    """A __del__ hook: call(policy), the outcome in DEL_LOG."""

    def hook(key):
        try:
            call(policy)
            DEL_LOG.append("ok")
        except RuntimeError as error:
            DEL_LOG.append(f"RuntimeError: {error}")

    return hook


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
    key = Key("cb", delete=logged(policy, DEL_ACTS[act]))
    policy.insert(key, ready(40), CTX)
    del key
    if when == "remove":
        policy.remove(Key("cb"))
    elif when == "clear":
        policy.clear()
    elif when == "trim":
        # evict it into b1, then push it out of b1 (capacity 3)
        assert [k for k, _ in policy.evict(1, {K(2), K(3), K(4), K(5)})] == [Key("cb")]
        for i in (10, 11, 12):
            policy.insert(K(i), ready(i), CTX)
        policy.evict(3, {K(3)})
    elif when == "reinsert":
        # evict it into b1, then insert an equal key: the ghost is forgotten
        assert [k for k, _ in policy.evict(1, {K(2), K(3), K(4), K(5)})] == [Key("cb")]
        policy.insert(Key("cb"), ready(41), CTX)
    elif when == "touch":
        # t1 -> t2 under the caller's (equal) key object
        policy.touch([Key("cb")], CTX)
    elif when == "finished":
        equal = Key("cb")
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
