"""Attack the module's own surface, not the policy's arguments: objects a
callback finds with gc.get_referrers, iterators built or re-stated from
Python, and a second thread. Usage: surface.py MODE IMPL [--no-vllm];
prints one JSON line of what happened (a crash fails the test instead).

Modes:
  referrers  from protected.__contains__ during evict(), re-state every
             object of arc_cy's types that refers to the policy (its
             __setstate__, with each int of its state made huge or small)
  iterators  build a view's iterator with __new__, re-state and pickle a
             live one, and step each
  nested     two threads' get()s nest; the first returns and clear()s while
             the second compares keys (a fixed interleaving, with events)
  threads    two threads drive one policy, with keys whose __eq__ and
             __hash__ are Python code, under sys.setswitchinterval(1e-6)
  overtaken  while clear() releases t1's key, its __del__ starts a thread
             whose evict() would wait inside protected.__contains__ on a
             t2 entry; clear() then goes on to t2 (a fixed interleaving)
"""

from __future__ import annotations

import gc
import json
import pickle
import sys
import threading
import time

from _child import K, policy_class, ready

mode, impl = sys.argv[1:3]
cls = policy_class(impl)


def ours(obj) -> bool:
    return type(obj).__module__.startswith("arc_cy") and not isinstance(obj, cls)


def outcome(fn):
    try:
        fn()
    except Exception as exc:
        return type(exc).__name__
    return "ok"


def restated(state, value):
    """state with every int (not bool) replaced by value, recursively."""
    if type(state) is int:
        return value
    if type(state) is tuple:
        return tuple(restated(s, value) for s in state)
    return state


def referrers():
    policy = cls(64)
    for i in range(40):
        policy.insert(K(i), ready(i), None)
    policy.touch([K(i) for i in range(20, 30)], None)
    found, tried = [], []

    class Protected(set):  # a set: ARC+ reads its keys first
        def __contains__(self, key):
            for obj in gc.get_referrers(policy):
                if not ours(obj):
                    continue
                found.append(type(obj).__name__)
                for reduce in ("__reduce_cython__", "__reduce_ex__", "__reduce__"):
                    try:
                        state = getattr(obj, reduce)(*((2,) if reduce == "__reduce_ex__" else ()))
                    except Exception:
                        continue
                    setstate = getattr(obj, "__setstate__", None) or getattr(
                        obj, "__setstate_cython__", None
                    )
                    if setstate is None:
                        continue
                    for value in (10**6, 3, -5):
                        tried.append(
                            outcome(lambda f=setstate, s=state[-1], v=value: f(restated(s, v)))
                        )
            return False

    result = policy.evict(30, Protected())
    policy._check_invariants()
    return {
        "found": sorted(set(found)),
        "tried": sorted(set(tried)),
        "evicted": [k.decode() for k, _ in result],
    }


def iterators():
    policy = cls(64)
    for i in range(6):
        policy.insert(K(i), ready(i), None)
    out = {}
    it = iter(policy.t1.items())
    tp = type(it)
    made = []

    def build():
        made.append(tp.__new__(tp))

    out["new"] = outcome(build)
    if made:
        out["new_next"] = outcome(lambda: next(made[0]))
    next(it)
    setstate = getattr(it, "__setstate__", None) or getattr(it, "__setstate_cython__", None)
    if setstate is None:
        out["setstate"] = "absent"
    else:
        core = policy
        states = [(core, False, 10**6, 0, 0), (core, False, 0, 0, 200)]
        out["setstate"] = sorted({outcome(lambda s=s: setstate(s)) for s in states})
    out["pickle"] = outcome(lambda: pickle.dumps(it))
    out["reduce_ex"] = outcome(lambda: it.__reduce_ex__(2))
    out["rest"] = [k.decode() for k, _ in it]
    policy._check_invariants()
    return out


class Slow:
    """A key with Python __hash__ and __eq__; all Slow keys share a hash, so
    every probe compares keys. hook runs inside __eq__."""

    hook = None

    def __init__(self, i):
        self.i = i

    def __hash__(self):
        return 7

    def __eq__(self, other):
        if Slow.hook is not None:
            Slow.hook(self, other)
        return isinstance(other, Slow) and other.i == self.i

    def __repr__(self):
        return f"Slow({self.i})"


def nested():
    policy = cls(64)
    for i in range(8):
        policy.insert(Slow(i), ready(i), None)
    a_in_eq, b_in_eq, cleared = threading.Event(), threading.Event(), threading.Event()
    b_got = []

    def hook(stored, probe):
        name = threading.current_thread().name
        if name == "A" and probe.i == 100 and not a_in_eq.is_set():
            a_in_eq.set()
            assert b_in_eq.wait(10)
        elif name == "B" and probe.i == 200 and not b_in_eq.is_set():
            b_in_eq.set()
            assert cleared.wait(10)

    def b():
        assert a_in_eq.wait(10)
        b_got.append(policy.get(Slow(200)))

    Slow.hook = hook
    threading.current_thread().name = "A"
    tb = threading.Thread(target=b, name="B")
    tb.start()
    got_a = policy.get(Slow(100))  # returns once B is comparing
    policy.clear()  # refused if B's get() left the policy busy
    cleared.set()
    tb.join()
    Slow.hook = None
    policy.insert(Slow(1), ready(1), None)
    policy._check_invariants()
    return {"a": got_a is None, "b": [got is None for got in b_got], "t1": [k.i for k in policy.t1]}


class Yielding(Slow):
    """A Slow key whose every 32nd hash gives the GIL away (sleep(0)): the
    other threads surely run while a call is in its code, however busy the
    machine (a switch interval alone needs the waiting thread on a CPU)."""

    hashes = 0

    def __hash__(self):
        Yielding.hashes += 1
        if Yielding.hashes % 32 == 0:
            time.sleep(0)
        return 7


def threads():
    sys.setswitchinterval(1e-6)
    policy = cls(32)
    stats = {
        "calls": 0,
        "reader_calls": 0,
        "overlapped": 0,
        "refused": 0,
        "duplicate": 0,
        "other": [],
    }
    inside = [0]  # calls running now, across both threads
    stop = threading.Event()

    def call(fn, *args):
        inside[0] += 1
        if inside[0] > 1:
            stats["overlapped"] += 1
        try:
            return fn(*args)
        except RuntimeError:
            stats["refused"] += 1
        except ValueError:  # insert() of a key already cached
            stats["duplicate"] += 1
        except Exception as exc:
            stats["other"].append(repr(exc))
        finally:
            inside[0] -= 1
            stats["calls"] += 1

    def reader():
        while not stop.is_set():
            for i in range(12):
                call(policy.get, Yielding(i))
                call(policy.t1.__contains__, Yielding(i))
                call(policy.t2.get, Yielding(i))
                stats["reader_calls"] += 3

    def writer():
        # 100 rounds, and on until the readers made 2000 calls meanwhile
        # (on a busy machine they may get little time), or 60 s
        deadline = time.monotonic() + 60
        round_ = 0
        while round_ < 100 or (stats["reader_calls"] < 2000 and time.monotonic() < deadline):
            round_ += 1
            for i in range(12):
                call(policy.insert, Yielding(i), ready(i), None)
            call(policy.touch, [Yielding(i) for i in range(0, 12, 3)], None)
            call(policy.evict, 4, set())
            call(policy.remove, Yielding(round_ % 12))
            if round_ % 5 == 0:
                call(policy.clear)
        stop.set()

    Slow.hook = None
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    writer()
    for t in readers:
        t.join()
    policy._check_invariants()
    policy.insert(Yielding(99), ready(99), None)  # not left busy
    return stats


class Gate(set):
    """protected for the other thread's evict() (a set: ARC+ reads its keys
    first): its first question waits until clear() has returned (or 10 s)."""

    def __init__(self):
        super().__init__()
        self.asked = threading.Event()
        self.go = threading.Event()

    def __contains__(self, key):
        self.asked.set()
        self.go.wait(10)
        return False


def overtaken():
    policy = cls(8)
    gate = Gate()
    other = []

    def evict():
        try:
            other.append(repr(policy.evict(1, gate)))
        except RuntimeError as exc:
            other.append(str(exc))

    thread = threading.Thread(target=evict)

    class Starter:
        def __del__(self):
            # here the other thread's evict() starts, and would scan t2
            # (were it still there) while this one is held up
            thread.start()
            while thread.is_alive() and not gate.asked.is_set():
                thread.join(0.001)

    policy.insert(Starter(), ready(0), None)
    policy.insert(K(1), ready(1), None)
    policy.touch([K(1)], None)  # t1 = [Starter], t2 = [K(1)]
    policy.clear()
    gate.go.set()
    thread.join()
    policy._check_invariants()
    return {
        "scanned": gate.asked.is_set(),
        "other": other,
        "lists": [len(v) for v in (policy.t1, policy.t2, policy.b1, policy.b2)],
    }


print(
    json.dumps(
        {
            "referrers": referrers,
            "iterators": iterators,
            "nested": nested,
            "threads": threads,
            "overtaken": overtaken,
        }[mode]()
    )
)
