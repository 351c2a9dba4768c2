"""Callbacks that look for a call's working storage, on one implementation,
with vLLM's ARC (run first, with nothing armed) as the oracle:

    PYTHONPATH=tests python -P tests/progs/working_storage.py cython|python reach HOW
        key callbacks (__hash__, __eq__, a target's __add__) that find every
        list holding the call's keys (gc.get_referrers) and clear it;
        HOW: touch, on_store_miss, on_request_finished, touch-after-ghost-hit
    PYTHONPATH=tests python -P tests/progs/working_storage.py cython|python emptied HOW
        a gc.callbacks hook (gc.set_threshold(1)) that empties every list
        shaped like working storage; HOW: evict, touch

Neither implementation keeps working storage that such code can reach, so
both must reach vLLM's state (and result). Prints "as vLLM: <state>".
"""

import gc
import sys
from fractions import Fraction

import hostile
from helpers import ReqContext, adapts, load_policy_class, oracle, ready

impl, mode, how = sys.argv[1:]

cls = load_policy_class(impl)

ARMED = set()
CALL = []  # the key objects the call is given


def clear_lists_holding(*objs):
    for obj in objs:
        for r in gc.get_referrers(obj):
            if type(r) is list and r is not CALL:
                r.clear()


def clearing(what):
    """A hook that, while `what` is armed, clears every list holding the
    objects it is given (the key, and the one it is compared with)."""
    return lambda *objs: clear_lists_holding(*objs) if what in ARMED else None


def Key(n):
    return hostile.Key(n, hash=clearing("hash"), eq=clearing("eq"))


# A ghost hit's arithmetic: runs in the middle of touch's changes.
Target = hostile.hostile(Fraction, __add__=lambda *_: clearing("target")(*CALL))


def populated(cls, capacity=3):
    # t1 = [2, 4, 5], t2 = [3], b1 = [0, 1]
    p = cls(capacity)
    for i in range(6):
        p.insert(Key(i), ready(i), None)
        if i == 2:
            p.evict(2, ())
    p.touch([Key(3)], None)
    if hasattr(p, "target_t1_size"):  # ARC's alone
        p.target_t1_size = Target(1, 3)
    return p


def state(p):
    return (
        [k.ident for k in p.t1],
        [k.ident for k in p.t2],
        [k.ident for k in p.b1],
        [k.ident for k in p.b2],
        adapts(p)[0],
    )


def run(cls, armed, call):
    p = populated(cls)
    ARMED.update(armed)
    try:
        call(p)
    finally:
        ARMED.clear()
    return p, state(p)


ARMED_LENGTHS = set()


def working(o):
    # the shapes a call's working storage would have as Python lists: n
    # Nones (trash, results to fill), (key, chunk) pairs, (key, chunk,
    # from_t1) triples, keys
    return all(
        x is None or type(x) is hostile.Key or type(x) is tuple and x and type(x[0]) is hostile.Key
        for x in o
    )


COLLECTIONS = [0]  # collections started while armed (on 3.12+, for the
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
    pairs = [(i, -i) for i in range(5000)]  # noqa: F841 -- held, or they refill the free list
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
    return p, (state(p), result and [(k.ident, c.chunk_id) for k, c in result])


# (what is armed, the call, the key numbers of CALL): fresh key objects
# equal to stored ones
REACH_CALLS = {
    "touch": ({"hash"}, lambda p: p.touch(CALL, None), [0, 2, 3, 4, 5, 7]),
    "on_store_miss": ({"hash"}, lambda p: p.on_store_miss(CALL, None), [0, 1, 7, 2]),
    "on_request_finished": (
        {"eq"},
        lambda p: p.on_request_finished(
            (tuple(CALL),), {Key(4)}, {Key(2), Key(3), Key(5)}, ReqContext(req_id="r")
        ),
        [2, 3, 4, 5, 6],
    ),
    # touch's second pass: the ghost hit (processed first) runs Target.__add__
    "touch-after-ghost-hit": ({"target"}, lambda p: p.touch(CALL, None), [2, 3, 4, 5, 0]),
}

# (the call, the key numbers of CALL, the lengths of the lists to empty)
EMPTIED = {
    # evict: the result list was made first and filled with tuples (each
    # allocation may start a collection)
    "evict": (lambda p: p.evict(5, ()), [], {5}),
    # touch: the trash list, swapped into after a Fraction's arithmetic
    "touch": (lambda p: p.touch(CALL, None), [2, 3, 4, 5, 8, 9, 0], {7}),
}

if mode == "reach":
    armed, call, ns = REACH_CALLS[how]
    CALL[:] = [Key(n) for n in ns]
    _, expected = run(oracle(cls), set(), call)
    CALL[:] = [Key(n) for n in ns]
    p, got = run(cls, armed, call)
else:
    call, ns, lengths = EMPTIED[how]
    CALL[:] = [Key(n) for n in ns]
    _, expected = run_hooked(oracle(cls), call, set())
    CALL[:] = [Key(n) for n in ns]
    p, got = run_hooked(cls, call, lengths)
assert got == expected, (got, expected)
p._check_invariants()
print("as vLLM:", got)
