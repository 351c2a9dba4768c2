"""Faults fuzzer for arc_cy: objects the garbage collector has cleared, and
allocations that fail. A standalone program (tests/progs/ and tests/ on
PYTHONPATH, as tests/childproc.py sets them); vLLM is hidden (no oracle:
nothing here is vLLM's behaviour, and its import costs seconds).

    PYTHONPATH=tests/progs:tests python -P tests/progs/faults_fuzz.py \
        --mode cleared|nomem|all [--impl cython|plus|all] \
        [--profile ci|long] [--seed N]

--impl cython runs the compiled core (arc_cy._core.arc.ARCCachePolicy), plus
the compiled ARC+ (arc_cy._core.arc.ARCPlusCachePolicy, the same core with
arc_cy._policy.PLUS_DOC's rules), all (the default) both. The compiled classes
alone: their rules 11 and 13 are memory safety (docs/hardening.md); the
twins, vLLM's Python code, are exposed to a cleared object or a failed
allocation as vLLM's ARC is.

--mode cleared (docs/hardening.md rule 13): each round builds one or two
policies with entries and, around them, views (policy.t1 ...), items views
and list iterators (some advanced), keys (an int subclass: its hash is the
int's, which no clear can take away) and chunks (a ChunkStatus subclass),
lists and dicts, and finalizers, joined by random references into a graph
of random shape, nearly always with a cycle through each policy. The round
drops it and runs gc.collect(). While the collector finalizes the cycle,
the finalizers (and keys' and chunks' __del__) call random methods on
what they hold (intact objects, though their cycle's other finalizers may
have run), make Late objects that they put in the garbage lists, and may
rescue an object (resurrect it). A Late dies when the collector clears the
list that holds it, after it cleared some of the other objects: it finds
the round's policies, views and iterators with gc.get_objects() and calls
random methods on them, cleared or not, and may rescue one. Every call must
return or raise one of CLEARED_ALLOWED (AttributeError: a view, a key
whose instance dict or slots were cleared; StopIteration: a closed
generator; RuntimeError: an iterator of a core whose entries were dropped);
no crash. After the collection every rescued policy must not be busy and
must pass _check_invariants().

--mode nomem: each round drives one policy (and a shadow of the same
implementation, unarmed, with equal but distinct key objects and the same
chunks) with random calls, most of them made with
_testcapi.set_nomemory(start, stop) armed: the start-th allocation from
there fails, and with it the next stop - start - 1 (a single failure, a
burst, or, with stop 0, every one until the call returns). Every call must
return or raise MemoryError (or the call's own exception: ValueError for a
duplicate, KeyError for a missing view item); then, disarmed:

_check_invariants() passes; a call that raised left the state as it was
(rule 11), but for touch() and on_store_miss() failing in the target's
arithmetic at a ghost hit after earlier keys were applied (as a target
whose arithmetic raises: vLLM and arc_cy alike; the traceback names
_adapt, or a burst left no frame of the core in it; the entries only
moved: t1 to t2, to a list's end); a call that returned agrees with the
shadow (result and state).

It counts what the core's fallbacks reached: MemoryError per method;
inserts of a new key that failed where the table or the node array had to
grow; calls of more than 64 keys that failed (the working storage's
growth); clear() and __init__ made armed, which allocate nothing to
release and so return.

--impl plus gets every check the core gets (the shadow an unarmed ARC+),
and calls that reach ARC+'s paths: on_request_finished with keys in no
list (remembered in b1), never seen before, repeated, in neither of the
two sets, ghosts (moved to b2), and more of them than cache_capacity (b1
trimmed); evict with a protected set that holds new keys (an offer of
first-seen keys, which takes no t2 victim while b1's ghosts come back less
than b2's: refused, or admitted with t1's victims) and sometimes a ghost
(no longer first-seen); unarmed store misses of b2's ghosts (on both
sides), which tilt the ghosts' fates toward that guard. ARC+ has no
target_t1_size: where the core's runs set it, ARC+'s set _max_entries, and
its state holds its fates. In cleared mode the finalizers' calls do the
same, and a policy built for the round is marked by its fates (nonzero),
which only the collector's clear keeps while it empties the lists. In
nomem mode these two calls' arguments are made before the allocations fail
(the failures meet the core's own allocations), half of them fail at a
point drawn across the whole call, and one with keys to remember that
failed at a single allocation is often made again, failing one allocation
later (and so on, most times): when it returns, the failure before was
among its last allocations, the reserves made before its first change
(nomem_plus_near_end). It counts on_request_finished calls that failed
with keys to remember (nomem_plus_remember), with b1 to trim, where the
table or the node array had to grow for them, and evictions refused
(plus_evict_refused: a first-seen offer that returned None where enough
victims were there; plus_evict_guarded_admitted: one that took t1's
victims while the guard was on).

Output: a line ``COVERAGE <run> {json}`` on stdout per run that passed
(cleared-cython, cleared-plus, nomem-cython, nomem-plus); exit 1 if any
failed (its failures on stderr), a signal exit on a crash (faulthandler
prints the stack). The seed is printed first, on stderr: rerun with
--seed N (and --mode, --impl) to replay a run. ARC_CY_GC_STRESS=1 (the
test suite's GC-stress leg) runs the nomem rounds with gc.set_threshold(1):
a collection at nearly every allocation, the failing one's neighbours
included.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import itertools
import json
import os
import random
import sys
import time
from collections import Counter
from fractions import Fraction

sys.modules["vllm"] = None  # type: ignore[assignment]  # arc_cy's stand-ins: no oracle here

import _testcapi  # noqa: E402 -- after hiding vLLM

from fuzz_start import seed_run  # noqa: E402 -- after hiding vLLM

from arc_cy._core.arc import ARCCachePolicy as CPolicy  # noqa: E402 -- after hiding vLLM
from arc_cy._core.arc import ARCPlusCachePolicy as PlusPolicy  # noqa: E402 -- after hiding vLLM
from arc_cy._core.views import ListView  # noqa: E402 -- after hiding vLLM
from arc_cy._flags import env_flag  # noqa: E402 -- after hiding vLLM
from arc_cy._vllm import ChunkStatus  # noqa: E402 -- after hiding vLLM
from helpers import CTX, ready  # noqa: E402 -- after hiding vLLM

IMPLS = {"cython": CPolicy, "plus": PlusPolicy}
CORES = (CPolicy, PlusPolicy)  # the compiled policies: rule 11 holds
PROFILES = {
    # ci: 2 to 7 s per run on a 2-core machine (normal build; 3-5x under ASan)
    "ci": {"cleared": 10_000, "nomem": 3_000},
    "long": {"cleared": 50_000, "nomem": 30_000},
}


class Run:
    """The running run's counts and failures."""

    counts: Counter = Counter()
    failures: list = []
    impl = ""
    unraisable = False


# Known defects and CPython limits the runs step around (--strict: none), each
# named where it is allowed; remove a defect's name once it is fixed.
KNOWN = {
    # CPython 3.11: a MemoryError propagating out of a Python frame is lost
    # when tearing the frame down cannot allocate the caller's frame object
    # (take_ownership's PyErr_Clear): the caller's eval loop raises
    # SystemError("error return without exception set"), its own wording
    # (a C function such as the core's methods returning NULL without an
    # exception gets "... returned NULL without setting an exception").
    # The round ends there.
    "cpython_lost_exception",
}
LOST = "error return without exception set"


def fail(msg: str) -> None:
    if len(Run.failures) < 50:
        Run.failures.append(msg)


# --- cleared: objects the collector cleared, used by finalizers --------------

# What a call on a cleared (or half-torn) object may raise. AttributeError:
# a view's or an items view's slot, cleared;
# StopIteration: a generator the collector closed; RuntimeError: an
# iterator whose core's entries were dropped (MSG_MUTATED), a mutator
# refused; TypeError, ValueError, KeyError: the calls' own (a duplicate, a
# missing item); MemoryError: MSG_FULL.
CLEARED_ALLOWED = (
    AttributeError,
    StopIteration,
    RuntimeError,
    TypeError,
    ValueError,
    KeyError,
    MemoryError,
    ZeroDivisionError,
)

REG: dict[int, str] = {}  # id -> kind of the round's policies, views, iterators
SURVIVORS: list = []  # what finalizers rescued
SURVIVOR_KEYS = itertools.count(99)  # the keys check_survivors() inserts
BUILT: dict[int, int] = {}  # a policy's id -> its entries when the round dropped it
MARK = 1.25  # every round's policies' target: what no call of a poke sets


# No finalizer here reads self.__dict__: on CPython 3.11 that can make the
# instance's dict object then, outside the garbage, referring into it, and
# the collector takes the whole cycle for resurrected (nothing is cleared).


class GKey(int):
    """A key: hash and eq are the int's (a cleared key still hashes). It
    may hold references (refs) and act when it dies (seed)."""

    def __del__(self):
        seed = getattr(self, "seed", None)
        if seed is not None:
            Run.counts["key_del"] += 1
            _late_pokes(seed, "key_del")


class GChunk(ChunkStatus):
    def __del__(self):
        seed = getattr(self, "seed", None)
        if seed is not None:
            Run.counts["chunk_del"] += 1
            _late_pokes(seed, "chunk_del")


class Fin:
    """A finalizer in the garbage: pokes what it holds, puts Lates in the
    garbage lists it holds, may rescue something."""

    def __init__(self, seed, rescue=0.03):
        self.seed = seed
        self.refs = []
        self.rescue = rescue  # a rescue revives all the garbage it reaches: rare

    def __del__(self):
        Run.counts["fin_run"] += 1
        r = random.Random(self.seed)
        refs = getattr(self, "refs", ())
        for _ in range(r.randint(1, 4)):
            if refs:
                _poke(r.choice(refs), r, "fin")
        for obj in refs:
            if type(obj) is list and r.random() < 0.7:
                obj.append(Late(r.randrange(2**32)))
                Run.counts["late_made"] += 1
        if refs and r.random() < getattr(self, "rescue", 0):
            SURVIVORS.append(r.choice(refs))
            Run.counts["rescued_by_fin"] += 1


class Late:
    """Made by a finalizer during the collection, so never finalized with
    the cycle: its __del__ runs when the collector clears the list that
    holds it."""

    def __init__(self, seed):
        self.seed = seed

    def __del__(self):
        Run.counts["late_run"] += 1
        _late_pokes(self.seed, "late")


def _late_pokes(seed, where):
    r = random.Random(seed)
    found = [o for o in gc.get_objects() if id(o) in REG and _kind(o) == REG[id(o)]]
    if not found:
        return
    Run.counts[where + "_found"] += 1
    for _ in range(r.randint(1, 4)):
        _poke(r.choice(found), r, where)
    if r.random() < 0.1:
        SURVIVORS.append(r.choice(found))
        Run.counts["rescued_by_" + where] += 1
    del found


def _kind(obj) -> str:
    tp = type(obj)
    if tp in CORES:
        return "policy"
    if tp is ListView:
        return "view"
    if tp.__name__ == "_Items":
        return "items"
    if tp.__name__ in ("_ListIter", "generator"):
        return "iter"
    return "other"


def _policy_call(p, r):
    k = GKey(r.randrange(8))
    name = r.choice(
        [
            "get",
            "insert",
            "insert",
            "remove",
            "touch",
            "on_store_miss",
            "on_request_finished",
            "evict",
            "clear",
            "__init__",
            "target",
            "views",
            "check",
            "capacity",
        ]
    )
    if name == "get":
        p.get(k)
    elif name == "insert":
        p.insert(k, ready(0, r.choice([0, 0, -1])), None)
    elif name == "remove":
        p.remove(k)
    elif name == "touch":
        p.touch([k, GKey(r.randrange(8))], None)
    elif name == "on_store_miss":
        p.on_store_miss([k], None)
    elif name == "on_request_finished":
        if type(p) is PlusPolicy and r.random() < 0.7:
            _plus_finished(p, r, k)
        else:
            p.on_request_finished(((k,),), set(), {k}, CTX)
    elif name == "evict":
        if type(p) is PlusPolicy and r.random() < 0.7:
            # an offer of keys: new ones (8 and up: never inserted, perhaps
            # remembered) and sometimes one of 0-7 (perhaps a ghost)
            prot = {GKey(r.randrange(8, 24)) for _ in range(r.randint(1, 3))}
            if r.random() < 0.3:
                prot.add(GKey(r.randrange(8)))
            Run.counts["plus_offer"] += 1
            p.evict(r.randint(1, 2), prot)
        else:
            p.evict(r.randint(1, 2), set())
    elif name == "clear":
        p.clear()
    elif name == "__init__":
        p.__init__(r.randint(0, 6))
    elif name == "target":
        if type(p) is PlusPolicy:  # no target: its other setter
            p._max_entries = p._max_entries
        else:
            p.target_t1_size = r.choice([0, 1.5, Fraction(5, 2)])
    elif name == "views":
        for v in (p.t1, p.t2, p.b1, p.b2):
            len(v)
            list(v.items())
            k in v  # noqa: B015 -- the read is the point
    elif name == "check":
        try:
            p._check_invariants()
        except AssertionError as exc:
            # called while a call of this policy runs (a finalizer that a
            # collection inside it runs): it says so, and checks nothing
            if "did not finish" not in str(exc):
                raise
            Run.counts["check_while_running"] += 1
    else:
        p.cache_capacity  # noqa: B018 -- the read is the point
        _adaptive(p)  # for what it runs, not its value
    return name


def _adaptive(p):
    """What adapts in p: ARC's target, or ARC+'s ghost fates."""
    if type(p) is PlusPolicy:
        return (p.b1_returned, p.b1_forgotten, p.b2_returned, p.b2_forgotten)
    return p.target_t1_size


def _marked(p) -> bool:
    """Whether p still bears its round's mark: ARC's target MARK, ARC+'s
    fates (nonzero). clear() and __init__ reset both; the collector's
    clear keeps both."""
    if type(p) is PlusPolicy:
        return any(_adaptive(p))
    return p.target_t1_size == MARK


def _plus_finished(p, r, k) -> None:
    """ARC+'s on_request_finished with keys to remember: k and keys of 0-23
    (8 and up never inserted), some repeated, often more of them than the
    capacity (0-6: b1 is trimmed), in one or two groups, each in the
    inserted set, the reused one, or neither."""
    keys = [k] + [GKey(r.randrange(24)) for _ in range(r.randint(0, 9))]
    keys += r.choices(keys, k=r.randint(0, 3))  # repeated (equal, or the same object)
    r.shuffle(keys)
    cut = r.randint(0, len(keys))
    groups = (keys[:cut], keys[cut:]) if r.random() < 0.5 else (keys,)
    inserted, reused = set(), set()
    for key in keys:
        roll = r.random()
        if roll < 0.35:
            inserted.add(key)
        elif roll < 0.7:
            reused.add(key)
    Run.counts["plus_finished"] += 1
    p.on_request_finished(groups, inserted, reused, CTX)


def _poke(obj, r, where):
    """One random use of obj; what it raises must be allowed."""
    kind = _kind(obj)
    what = kind
    try:
        if kind == "policy":
            if (
                type(obj) in CORES
                and BUILT.get(id(obj))
                and _marked(obj)
                and not any(obj._list_len(w) for w in range(4))
            ):
                # entries gone, the mark still there: the collector's clear
                # emptied it (clear() and __init__ reset the target and the
                # fates, remove() and evict() leave ghosts)
                Run.counts[f"poke_{where}_cleared_core"] += 1
            what = "policy." + _policy_call(obj, r)
        elif kind == "view":
            op = r.choice(["len", "iter", "in", "getitem", "items"])
            what = "view." + op
            if op == "len":
                len(obj)
            elif op == "iter":
                list(obj)
            elif op == "in":
                GKey(r.randrange(8)) in obj  # noqa: B015 -- for what it runs, not its value
            elif op == "getitem":
                obj[GKey(r.randrange(8))]
            else:
                list(obj.items())
        elif kind == "items":
            what = "items.iter"
            list(obj)
        elif kind == "iter":
            what = "iter.next"
            next(obj)
        elif isinstance(obj, GKey):
            what = "key.hash"
            hash(obj)
        else:
            return
        Run.counts[f"poke_{where}_ok"] += 1
    except CLEARED_ALLOWED as exc:
        Run.counts[f"poke_{where}_raised"] += 1
        Run.counts["exc_" + type(exc).__name__] += 1
        if where in ("late", "key_del", "chunk_del") and kind in ("policy", "view", "iter"):
            Run.counts[f"late_{kind}_{type(exc).__name__}"] += 1
    except BaseException as exc:  # every other exception is a finding
        fail(f"{Run.impl}: {what} from {where}: {exc!r}")
    Run.counts["pokes"] += 1
    if where in ("late", "key_del", "chunk_del"):
        Run.counts[f"late_poke_{kind}"] += 1


def _build(cls, r: random.Random) -> None:
    """The round's graph; everything in it is garbage once this returns
    (what no cycle holds dies then, by reference counting)."""
    nodes: list = []  # everything the round makes
    holders: list = []  # what can hold references: (object, its refs list or None: a dict)
    cyclic: list = []  # per policy, the keys and chunks with refs that it stores
    for _ in range(r.choice([1, 1, 2])):
        p = cls(r.randint(0, 6))
        own = []
        for i in r.sample(range(8), r.randint(0, 6)):
            k, c = GKey(i), GChunk(0)
            c.ref_cnt = r.choice([0, 0, 0, -1, 1])
            for obj in (k, c):
                if r.random() < 0.3:
                    obj.refs = []
                    holders.append((obj, obj.refs))
                    own.append(obj)
                if r.random() < 0.2:
                    obj.seed = r.randrange(2**32)
            try:
                p.insert(k, c, None)
            except (ValueError, MemoryError):
                pass
            nodes += (k, c)
        keys = [k for k, _ in p.t1.items()]
        if keys and r.random() < 0.6:
            p.touch(r.sample(keys, r.randint(1, len(keys))), None)
        if p.cache_capacity and r.random() < 0.6:
            p.evict(1, set())
        if type(p) is PlusPolicy:
            # its mark: a fate, its ghosts returned (where it has ghosts)
            p.on_store_miss([*p.b1.keys(), *p.b2.keys()], None)
        else:
            p.target_t1_size = MARK
        REG[id(p)] = "policy"
        BUILT[id(p)] = sum(p._list_len(w) for w in range(4))
        nodes.append(p)
        cyclic.append((p, own))
        for v in (p.t1, p.t2, p.b1, p.b2):
            if r.random() < 0.4:
                REG[id(v)] = "view"
                nodes.append(v)
            if r.random() < 0.25:
                it = iter(v.items()) if r.random() < 0.6 else iter(v)
                for _ in range(r.randint(0, 2)):
                    try:
                        next(it)
                    except StopIteration:
                        break
                REG[id(it)] = "iter"
                nodes.append(it)
            if r.random() < 0.15:
                items = v.items()
                REG[id(items)] = "items"
                nodes.append(items)
    lists = []
    for _ in range(r.randint(1, 4)):
        lst: list = []
        nodes.append(lst)
        holders.append((lst, lst))
        lists.append(lst)
    for _ in range(r.randint(0, 2)):
        d: dict = {}
        nodes.append(d)
        holders.append((d, None))
    for _ in range(r.randint(1, 4)):
        f = Fin(r.randrange(2**32))
        nodes.append(f)
        holders.append((f, f.refs))
    # random references, then (nearly always) a cycle through each policy:
    # policy -> a key or chunk it stores -> a list -> policy, or a list
    # that holds the policy and itself
    for holder, refs in holders:
        for _ in range(r.randint(0, 4)):
            target = r.choice(nodes)
            if refs is None:
                holder[len(holder)] = target
            else:
                refs.append(target)
    for p, own in cyclic:
        if r.random() < 0.9:
            lst = r.choice(lists)
            lst.append(p)
            if own and r.random() < 0.7:
                r.choice(own).refs.append(lst)
                Run.counts["cycle_through_entry"] += 1
            else:
                lst.append(lst)
            if r.random() < 0.6:
                # cleared_by_gc.py's shape: a finalizer in the list puts a
                # Late there, which dies when the list is cleared, after the
                # policy (made first) was, while the list still holds it
                f = Fin(r.randrange(2**32), rescue=0)
                f.refs.append(lst)
                lst.append(f)
    Run.counts["graph_nodes"] += len(nodes)
    Run.counts["graph_policies"] += len(cyclic)


def cleared_round(cls, r: random.Random) -> None:
    REG.clear()
    BUILT.clear()
    SURVIVORS.clear()
    gc.disable()
    try:
        _build(cls, r)
        gc.collect()
        Run.counts["collections"] += 1
    finally:
        gc.enable()
    check_survivors()


def check_survivors() -> None:
    seen = set()
    while SURVIVORS:
        obj = SURVIVORS.pop()
        if id(obj) in seen:  # rescued twice
            del obj
            continue
        seen.add(id(obj))
        kind = _kind(obj)
        Run.counts["survivor_" + kind] += 1
        if kind == "policy":
            try:
                obj._check_invariants()
                Run.counts["survivor_policy_checked"] += 1
                # a key no policy holds: a policy rescued again in a later
                # round (a cycle kept it) holds the earlier check's
                obj.insert(GKey(next(SURVIVOR_KEYS)), ready(0), None)
                lens = [obj._list_len(w) for w in range(4)] if type(obj) in CORES else None
                try:
                    obj.evict(1, set())
                except AttributeError:
                    # A Fraction target (a poke's, held by the policy alone)
                    # that the collector cleared (its slots) before a Late
                    # rescued the policy: int() of it raises AttributeError,
                    # the target's own (as vLLM's int(target_t1_size) would),
                    # and a core's evict() changed nothing.
                    target = obj.target_t1_size
                    if type(target) is not Fraction or hasattr(target, "_numerator"):
                        raise
                    if lens is not None and lens != [obj._list_len(w) for w in range(4)]:
                        raise
                    Run.counts["survivor_target_cleared"] += 1
                obj._check_invariants()
            except BaseException as exc:
                fail(f"{Run.impl}: a rescued policy: {exc!r}")
        elif kind in ("view", "items", "iter"):
            _poke(obj, random.Random(len(SURVIVORS)), "survivor")
        del obj


def cleared_mode(cls, rounds: int, seed: int) -> None:
    r = random.Random(seed)
    for _ in range(rounds):
        s = r.randrange(2**32)
        if TRACE:
            print(f"cleared round {s}", file=sys.stderr, flush=True)
        try:
            cleared_round(cls, random.Random(s))
        except BaseException as exc:
            fail(f"{Run.impl}: round {s}: {exc!r}")
        if Run.failures:
            fail(f"(round seed {s})")
            return
        Run.counts["rounds"] += 1


# --- nomem: allocations that fail --------------------------------------------


class PKey(int):
    """A key of one policy (the shadow has its own, equal ones)."""


def _unraisable(hook_args) -> None:
    # A __del__ (or a generator's close) that met the failing allocation
    # itself: counted (after the call), not printed. No allocation here.
    Run.unraisable = True


class Side:
    """A policy and the type of its keys: a new key object each time (the
    policy's lists are what holds one, so a release frees it)."""

    def __init__(self, cls, cap, key_type):
        self.p = cls(cap)
        self.key = key_type

    def state(self) -> tuple:
        p = self.p
        lists = tuple(
            tuple((int(k), id(c)) for k, c in view.items()) for view in (p.t1, p.t2, p.b1, p.b2)
        )
        t = _adaptive(p)
        return lists, p.cache_capacity, type(t).__name__, t, p._max_entries


MIN_TABLE_BITS = 3  # the core's (arc_cy/_core/arc.pyx): a table of 8 slots at first


class Shape:
    """The core's table and node array, as far as the calls let them be
    known: whether an insert of a new key makes the table or the node array
    grow."""

    def __init__(self):
        self.bits = MIN_TABLE_BITS
        self.hw = 0  # nodes used (high-water mark)
        self.cap = 0  # nodes allocated

    def grows(self, used: int) -> tuple[bool, bool]:
        table = (used + 1) * 10 > (1 << self.bits) * 7
        nodes = used >= self.hw and self.hw == self.cap
        return table, nodes

    def inserted(self, used_before: int) -> None:
        table, nodes = self.grows(used_before)
        if table:
            self.bits += 1
        if used_before >= self.hw:
            if nodes:
                self.cap = max(64, 2 * self.cap)
            self.hw += 1

    def reserve_grows(self, used: int, m: int) -> tuple[bool, bool]:
        """Whether ARC+'s on_request_finished, remembering m keys, grows the
        table (table_reserve_n) and the node array (nodes_reserve: past the
        high-water mark, free nodes or not)."""
        if not m:
            return False, False
        return (used + m) * 10 > (1 << self.bits) * 7, self.hw + m > self.cap

    def reserved(self, used: int, m: int) -> None:
        """m keys remembered (used entries before): the reserves, then
        node_new, free nodes first."""
        table, nodes = self.reserve_grows(used, m)
        if table:
            while (used + m) * 10 > (1 << self.bits) * 7:
                self.bits += 1
        if nodes:
            self.cap = max(64, 2 * self.cap, self.hw + m)
        self.hw += max(0, m - (self.hw - used))

    def emptied(self) -> None:
        self.__init__()


def _armed(fn, start: int, stop: int):
    _testcapi.set_nomemory(start, stop)
    try:
        return fn()
    finally:
        _testcapi.remove_mem_hooks()


def _prepared(prepare):
    """fn(side) of a call whose arguments prepare(side) makes before the
    allocations fail (fn.prepare: ARC+'s calls, so that the failures meet
    the core's own allocations, not the keys' and the sets' making)."""

    def fn(side):
        return prepare(side)()

    fn.prepare = prepare
    return fn


def _in_adapt(tb_names, start, stop) -> bool:
    """Whether a call failed in _adapt (a ghost hit's target arithmetic):
    its traceback names it (Cython names the frame by its qualified name,
    arc_cy._core.arc.ARCCore._adapt), or a burst (stop 0: every allocation)
    left no frame of the core in the traceback (adding one failed too)."""
    if any(n.rpartition(".")[2] == "_adapt" for n in tb_names):
        return True
    burst = stop == 0 or stop - start > 1
    return burst and not any(n.startswith("arc_cy.") for n in tb_names)


def _moves_only(before, after) -> bool:
    """Whether touch() or on_store_miss(), cut short, only moved entries
    as their earlier keys do: the same entries in t1 and t2 together, in
    b1 and in b2, t2's still in t2 (the target may have moved)."""
    (t1, t2, b1, b2), (u1, u2, c1, c2) = before[0], after[0]
    return (
        set(t1 + t2) == set(u1 + u2)
        and set(t2) <= set(u2)
        and set(b1) == set(c1)
        and set(b2) == set(c2)
        and before[1] == after[1]
        and before[4] == after[4]
    )


def _norm(value):
    if isinstance(value, list):
        return [(int(k), id(c)) for k, c in value]
    if isinstance(value, ChunkStatus):
        return id(value)
    return value


class NomemRound:
    def __init__(self, cls, r: random.Random):
        self.cls = cls
        self.r = r
        big = r.random() < 0.35
        cap = r.randint(40, 160) if big else r.randint(0, 8)
        self.universe = cap * 2 + 4
        self.a = Side(cls, cap, PKey)  # armed
        self.s = Side(cls, cap, PKey)  # shadow
        self.chunks = [ready(0, ref) for ref in (0, 0, 0, 0, -1, 1)]
        self.shape = Shape()
        self.plus = cls is PlusPolicy
        self.ref_cnt = {id(c): c.ref_cnt for c in self.chunks}
        self.fresh = self.universe  # keys never used before: the table grows
        self.replay = None  # a call to make again, failing one allocation later
        if self.plus and cap and r.random() < 0.5:
            self.seed_fates()

    def rand_keys(self, n):
        return [self.r.randrange(self.universe) for _ in range(n)]

    def op(self):
        """A random call: (name, fn(side) -> result, ints of the keys it names)."""
        r = self.r
        p = self.a.p
        n1, n2, nb1, nb2 = (p._list_len(w) for w in range(4))
        name = r.choice(
            [
                "insert",
                "insert",
                "insert",
                "insert_fresh",
                "insert_fresh",
                "insert_ghost",
                "remove",
                "touch",
                "touch",
                "on_store_miss",
                "on_request_finished",
                "evict",
                "evict",
                "clear",
                "__init__",
                "target",
                "get",
                "read",
            ]
        )
        many = r.random() < 0.15  # more keys than the working storage's first 64
        nkeys = r.randint(65, 150) if many else r.randint(1, 6)
        if name == "insert":
            i = r.randrange(self.universe)
            c = r.choice(self.chunks)
            return name, (lambda side: side.p.insert(side.key(i), c, None)), (i,)
        if name == "insert_fresh":
            i = self.fresh
            self.fresh += 1
            c = r.choice(self.chunks)
            return "insert", (lambda side: side.p.insert(side.key(i), c, None)), (i,)
        if name == "insert_ghost":
            ghosts = [int(k) for k in p.b1] + [int(k) for k in p.b2]
            if not ghosts:
                return self.op()
            i = r.choice(ghosts)
            c = r.choice(self.chunks)
            return name, (lambda side: side.p.insert(side.key(i), c, None)), (i,)
        if name == "remove":
            i = r.randrange(self.universe)
            return name, (lambda side: side.p.remove(side.key(i))), (i,)
        if name in ("touch", "on_store_miss"):
            ks = self.rand_keys(nkeys)
            meth = name
            name = name + ("_many" if many else "")
            return (
                name,
                (lambda side: getattr(side.p, meth)([side.key(i) for i in ks], None)),
                ks,
            )
        if name == "on_request_finished" and self.plus:
            return self.plus_finished(nkeys)
        if name == "on_request_finished":
            ks = self.rand_keys(nkeys)
            reused = set(r.sample(ks, len(ks) // 2))
            name = name + ("_many" if many else "")
            return (
                name,
                (
                    lambda side: side.p.on_request_finished(
                        ([side.key(i) for i in ks],),
                        {side.key(i) for i in ks if i not in reused},
                        {side.key(i) for i in reused},
                        CTX,
                    )
                ),
                ks,
            )
        if name == "evict":
            n = r.randint(1, max(1, n1 + n2 + 1))
            if self.plus:
                pin = n1 and n2 and r.random() < 0.3  # t1 pinned, t2 has victims
                if pin:
                    n = r.randint(1, n2)
                elif r.random() < 0.5:
                    n = r.randint(1, max(1, (n1 + n2) // 3))  # fewer than the victims
                prot = self.plus_offer(pin)
            else:
                prot = self.rand_keys(r.randint(0, 3))
            self.evict_n = n
            if self.plus:

                def prepare(side):
                    keys = {side.key(i) for i in prot}
                    return lambda: side.p.evict(n, keys)

                return name, _prepared(prepare), prot
            return name, (lambda side: side.p.evict(n, {side.key(i) for i in prot})), prot
        if name == "clear":
            return name, (lambda side: side.p.clear()), ()
        if name == "__init__":
            cap = r.choice([p.cache_capacity, r.randint(0, 8), r.randint(40, 160)])
            return name, (lambda side: side.p.__init__(cap)), ()
        if name == "target" and self.plus:  # no target: its other setter

            def set_limit(side):
                side.p._max_entries = side.p._max_entries

            return "max_entries", set_limit, ()
        if name == "target":
            t = r.choice([0, 2, 1.5, 7.25, Fraction(7, 3), 10**20])

            def set_target(side):
                side.p.target_t1_size = t

            return name, set_target, ()
        if name == "get":
            i = r.randrange(self.universe)
            return name, (lambda side: side.p.get(side.key(i))), (i,)
        i = r.randrange(self.universe)
        which = r.randrange(4)

        def read(side):
            view = (side.p.t1, side.p.t2, side.p.b1, side.p.b2)[which]
            return (len(view), side.key(i) in view, [int(k) for k, _ in view.items()])

        return "read", read, (i,)

    def seed_fates(self):
        """ARC+, unarmed, on both sides: ghost fates where b1's come back
        less than b2's (b1: cache_capacity forgotten; b2: one ghost
        returned 8 times), made with keys never used before, then the
        lists emptied (each ghost inserted and removed: no fate). The
        table and the node array grow as these calls make them (Shape)."""
        cap = self.a.p.cache_capacity
        first, forgotten = self.fresh_keys(cap), self.fresh_keys(cap)
        (one,) = self.fresh_keys(1)
        a = self.a.p
        for side in (self.a, self.s):
            p, key = side.p, side.key
            shape = side is self.a

            def used():
                return sum(a._list_len(w) for w in range(4))

            for i in first:
                if shape:
                    self.shape.inserted(used())
                p.insert(key(i), self.chunks[0], None)
            p.evict(cap, set())
            if shape:
                self.shape.reserved(used(), cap)
            p.on_request_finished(([key(i) for i in forgotten],), set(), set(), CTX)
            if shape:
                self.shape.inserted(used())
            p.insert(key(one), self.chunks[0], None)
            p.on_request_finished(([key(one)],), set(), {key(one)}, CTX)
            p.evict(1, set())
            p.on_store_miss([key(one)] * 8, None)
            for k in [*p.b1.keys(), *p.b2.keys()]:
                p.insert(k, self.chunks[0], None)
                p.remove(k)
        assert not any(a._list_len(w) for w in range(4)), "not emptied"
        assert _adaptive(a) == (0, cap, 8, 0), _adaptive(a)
        Run.counts["plus_seeded"] += 1

    def fresh_keys(self, n):
        """n keys never used before (in no list)."""
        self.fresh += n
        return list(range(self.fresh - n, self.fresh))

    def plus_finished(self, nkeys):
        """ARC+'s on_request_finished: keys in no list (remembered in b1),
        some never seen (the table and the node array grow), repeated,
        often more of them than cache_capacity (b1 is trimmed), in one or
        two groups, each in the inserted set, the reused one, or neither."""
        r = self.r
        cap = self.a.p.cache_capacity
        if r.random() < 0.25:
            nkeys = min(cap + r.randint(1, 12), 200)  # more than the capacity
        fresh = r.choice([0, 0, 0.2, 0.5, 1])
        ks = [
            self.fresh_keys(1)[0] if r.random() < fresh else r.randrange(self.universe)
            for _ in range(nkeys)
        ]
        if r.random() < 0.4:
            ks += r.choices(ks, k=r.randint(1, 4))  # repeated
            r.shuffle(ks)
        cut = r.randint(0, len(ks))
        split = r.random() < 0.3
        inserted, reused = set(), set()
        for i in set(ks):
            roll = r.random()
            if roll < 0.35:
                inserted.add(i)
            elif roll < 0.7:
                reused.add(i)
        name = "on_request_finished" + ("_many" if len(ks) > 64 else "")

        def prepare(side):
            keys = [side.key(i) for i in ks]
            groups = (keys[:cut], keys[cut:]) if split else (keys,)
            ins = {side.key(i) for i in inserted}
            reu = {side.key(i) for i in reused}
            return lambda: side.p.on_request_finished(groups, ins, reu, CTX)

        return name, _prepared(prepare), ks

    def plus_offer(self, pin):
        """ARC+'s evict's protected: often new keys (an offer of first-seen
        keys), sometimes a ghost (then it is none), t1's keys (pin: all of
        them, so that a t1 victim due finds none) and keys of the
        universe."""
        r = self.r
        p = self.a.p
        prot = [] if pin else self.rand_keys(r.choice([0, 0, 1, 2]))
        if pin or r.random() < 0.7:
            prot += self.fresh_keys(r.randint(1, 3))
        if pin or r.random() < 0.2:
            t1 = [int(k) for k in p.t1]
            if not pin:
                t1 = r.sample(t1, min(len(t1), r.randint(1, 4)))
            prot += t1
        if r.random() < 0.25:
            ghosts = [int(k) for k in p.b1] + [int(k) for k in p.b2]
            if ghosts:
                prot.append(r.choice(ghosts))
        return prot

    def plus_before(self, base, ks, before, used):
        """What ARC+'s call will meet, from the state before it: for
        on_request_finished, the keys to remember, whether b1 is trimmed,
        whether the reserves grow; for evict, whether protected is an offer
        of first-seen keys, and how many victims there are."""
        lists = [{i for i, _ in entries} for entries in before[0]]
        anywhere = set().union(*lists)
        if base == "on_request_finished":
            unknown = [i for i in ks if i not in anywhere]
            m = len(set(unknown))
            asked_b1 = len(set(ks) & lists[2])
            return {
                "m": m,
                "to_b2": len(set(ks) & (lists[2] | lists[3])),
                "trim": len(lists[2]) - asked_b1 + m > before[1],
                "repeat": m < len(unknown),  # a key to remember, repeated
                "grows": self.shape.reserve_grows(used, m),
            }
        if base == "evict":
            prot = set(ks)
            first_seen = bool(prot - anywhere) and not prot & (lists[2] | lists[3])
            victims = sum(
                1
                for entries in before[0][:2]
                for i, c in entries
                if self.ref_cnt[c] == 0 and i not in prot
            )
            t2 = {i for i, _ in before[0][1]}
            back1, gone1, back2, gone2 = before[3]

            def rate(back, gone):
                return back / (back + gone) if back + gone else 0.0

            guarded = first_seen and rate(back1, gone1) < rate(back2, gone2)
            return {"first_seen": first_seen, "victims": victims, "guarded": guarded, "t2": t2}
        return None

    def count_plus(self, base, plus, prefix, armed, result=None, after=None):
        """Count what ARC+'s call met: a call that failed (prefix
        nomem_plus_), or one that returned (plus_: its result, the state
        after it; armed: set_nomemory was)."""
        c = Run.counts
        ok = after is not None
        if base == "on_request_finished" and plus["m"]:
            c[prefix + "remember"] += 1
            if plus["trim"]:
                c[prefix + "trim"] += 1
            if plus["repeat"]:
                c[prefix + "remember_repeated"] += 1
            if plus["grows"][0]:
                c[prefix + "table_grows"] += 1
            if plus["grows"][1]:
                c[prefix + "nodes_grow"] += 1
            if ok:
                c["plus_remembered_keys"] += plus["m"]
                c["plus_ghosts_to_b2"] += plus["to_b2"]
                if armed:
                    c["ok_armed_plus_remember"] += 1
        elif base == "evict" and plus["first_seen"]:
            c[prefix + "first_seen"] += 1
            if plus["guarded"]:
                c[prefix + "guarded"] += 1
            if ok and result is None and plus["victims"] >= self.evict_n:
                # enough victims, as ARC would have evicted: refused, which
                # only the guard does
                if not plus["guarded"]:
                    fail(f"{Run.impl}: an unguarded first-seen offer refused")
                c["plus_evict_refused"] += 1
                if armed:
                    c["ok_armed_plus_evict_refused"] += 1
            elif ok and result is not None and plus["guarded"]:
                # admitted under the guard: its victims all t1's
                if any(i in plus["t2"] for i, _ in result):
                    fail(f"{Run.impl}: a guarded first-seen offer took t2's victims {result}")
                c["plus_evict_guarded_admitted"] += 1

    def fill(self):
        """Unarmed inserts until t1 + t2 hold the capacity (or a few)."""
        p = self.a.p
        want = min(p.cache_capacity, 200)
        for i in range(self.universe):
            if sum(p._list_len(w) for w in (0, 1)) >= want:
                break
            if i in p.t1 or i in p.t2:
                continue
            c = self.r.choice(self.chunks)
            used = sum(p._list_len(w) for w in range(4))
            for side in (self.a, self.s):
                side.p.insert(side.key(i), c, None)
            if i not in p.b1 and i not in p.b2:
                self.shape.inserted(used)

    def step(self) -> bool:
        """One call; False ends the round (a call cut short)."""
        r = self.r
        c = Run.counts
        replay, self.replay = self.replay, None
        if replay:
            name, fn, ks, start = replay
        else:
            if r.random() < 0.1:
                self.fill()
            if self.plus and r.random() < 0.3:
                # unarmed, as fill(): b2's ghosts asked for again (each
                # several times), so that b1's come back less than b2's
                # and first-seen offers are kept from t2 (ARC+ step 4)
                b2 = [int(k) for k in self.a.p.b2]
                if b2:
                    ask = r.choices(b2, k=r.randint(1, 4)) * 8
                    for side in (self.a, self.s):
                        side.p.on_store_miss([side.key(i) for i in ask], None)
                    Run.counts["plus_b2_asked"] += 1
            name, fn, ks = self.op()
        base = name.split("_many")[0]
        a, s = self.a, self.s
        p = a.p
        used = sum(p._list_len(w) for w in range(4))
        ghost = ks and any(i in p.b1 or i in p.b2 for i in ks)
        new_key = base == "insert" and not (ks[0] in p.t1 or ks[0] in p.t2 or ghost)
        grows = self.shape.grows(used) if new_key else (False, False)
        dup = base == "insert" and (ks[0] in p.t1 or ks[0] in p.t2)
        before = a.state()
        plus = self.plus and self.plus_before(base, ks, before, used)
        if replay:
            armed, stop = True, start + 1
        else:
            armed = r.random() < 0.8
            start = stop = None
        if armed and not replay:
            roll = r.random()
            start = min(int(r.expovariate(0.25)), 80)
            if hasattr(fn, "prepare") and r.random() < 0.5:
                # ARC+'s calls: the failure anywhere in the call, its last
                # allocations (the reserves) included
                start = r.randint(0, 12 + len(ks) // 2)
            stop = start + (1 if roll < 0.7 else r.randint(2, 6))
            if roll < 0.15:
                # every allocation fails until the call returns (Python code
                # could not run so: CPython 3.11 never finishes unwinding to
                # a finally handler past offset 256 when no int can be made)
                stop = 0
        try:
            if armed:
                prepare = getattr(fn, "prepare", None)
                call = prepare(a) if prepare else (lambda: fn(a))
                result = ("ok", _norm(_armed(call, start, stop)))
            else:
                result = ("ok", _norm(fn(a)))
        except BaseException as exc:
            result = ("raised", exc)
        c["calls"] += 1
        if armed:
            c["calls_armed"] += 1
        if Run.unraisable:
            Run.unraisable = False
            c["del_unraisable"] += 1
        raised = result[0] == "raised"
        if raised:
            exc = result[1]
            tb_names = []
            tb = exc.__traceback__
            while tb is not None:
                tb_names.append(tb.tb_frame.f_code.co_name)
                tb = tb.tb_next
            exc.__traceback__ = None
            # the call's own exception: a duplicate's ValueError
            natural = dup and type(exc) is ValueError and "already cached" in str(exc)
            if (
                armed
                and type(exc) is SystemError
                and str(exc) == LOST
                and "cpython_lost_exception" in KNOWN
            ):
                c["cpython_lost_exception"] += 1
                return False
            if not (natural or (armed and type(exc) is MemoryError)):
                fail(
                    f"{Run.impl}: {name} raised {exc!r} (armed {armed}, start {start}, stop {stop})"
                )
                return False
            if (
                isinstance(exc, MemoryError)
                and plus
                and plus.get("m")
                and stop == start + 1
                and r.random() < (0.8 if replay else 0.5)
            ):
                # the same call again, failing at the next allocation (and
                # so on): when it returns, the last failure was among its
                # last allocations (the reserves)
                self.replay = (name, fn, ks, start + 1)
                c["nomem_plus_replay"] += 1
            if isinstance(exc, MemoryError) and not natural:
                c["nomem_" + base] += 1
                if name.endswith("_many"):
                    c["nomem_many_keys"] += 1
                if grows[0]:
                    c["nomem_insert_table_grows"] += 1
                if grows[1]:
                    c["nomem_insert_nodes_grow"] += 1
                if plus:
                    self.count_plus(base, plus, "nomem_plus_", armed)
            del exc
            result = ("raised",)
        elif armed:
            c["ok_armed_" + base] += 1
            if replay:
                # the failure one allocation earlier was among the call's
                # last (ARC+'s reserves: scratch, table, nodes, work)
                c["nomem_plus_near_end"] += 1
                if plus["grows"][0] or plus["grows"][1]:
                    c["nomem_plus_near_end_grows"] += 1
            if grows[0] or grows[1]:
                c["ok_armed_insert_grows"] += 1
        # the checks, disarmed
        after = a.state()
        if raised:
            if after == before:
                c["failed_unchanged"] += 1
            elif (
                base in ("touch", "on_store_miss")
                and _in_adapt(tb_names, start, stop)
                and _moves_only(before, after)
            ):
                c["core_cut_short_in_adapt"] += 1  # a target's arithmetic: vLLM's as well
                p._check_invariants()
                return False
            else:
                fail(f"{Run.impl}: {name} raised and changed the state: {before} -> {after}")
                return False
            try:
                p._check_invariants()
            except AssertionError as exc:
                fail(f"{Run.impl}: after a failed {name}: {exc}")
                return False
            return True
        try:
            p._check_invariants()
        except AssertionError as exc:
            fail(f"{Run.impl}: after {name}: {exc}")
            return False
        shadow = ("ok", _norm(fn(s)))
        if shadow != result:
            fail(f"{Run.impl}: {name} returned {result}, the shadow {shadow}")
            return False
        if after != s.state():
            fail(f"{Run.impl}: {name}: the state {after}, the shadow's {s.state()}")
            return False
        c["agreed"] += 1
        if plus:
            self.count_plus(base, plus, "plus_", armed, result[1], after)
            if base == "on_request_finished":
                self.shape.reserved(used, plus["m"])
        if self.plus and base == "insert_ghost" and ks[0] in p.t2:
            c["plus_ghost_t2"] += 1  # ARC+ rule 1
        if new_key:
            self.shape.inserted(used)
        if base in ("clear", "__init__"):
            self.shape.emptied()
        return True


def nomem_mode(cls, rounds: int, seed: int) -> None:
    r = random.Random(seed)
    stress = env_flag("ARC_CY_GC_STRESS")
    old_hook = sys.unraisablehook
    sys.unraisablehook = _unraisable
    threshold = gc.get_threshold()
    if stress:
        gc.set_threshold(1)
    try:
        for _ in range(rounds):
            s = r.randrange(2**32)
            if TRACE:
                print(f"nomem round {s}", file=sys.stderr, flush=True)
            rnd = NomemRound(cls, random.Random(s))
            try:
                for _ in range(rnd.r.randint(10, 40)):
                    if not rnd.step():
                        break
            except BaseException as exc:
                fail(f"{Run.impl}: round {s}: {exc!r}")
            if Run.failures:
                fail(f"(round seed {s})")
                return
            Run.counts["rounds"] += 1
    finally:
        sys.unraisablehook = old_hook
        gc.set_threshold(*threshold)


MODES = {"cleared": cleared_mode, "nomem": nomem_mode}
TRACE = False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=[*MODES, "all"], required=True)
    ap.add_argument("--impl", choices=[*IMPLS, "all"], default="all")
    ap.add_argument("--profile", choices=list(PROFILES), default="ci")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--trace", action="store_true", help="print each round's seed (stderr)")
    ap.add_argument("--strict", action="store_true", help="step around no known failure")
    ap.add_argument(
        "--watchdog", type=float, default=600, help="seconds a run may take before it is a hang"
    )
    args = ap.parse_args(argv)
    global TRACE
    TRACE = args.trace
    if args.strict:
        KNOWN.clear()
    seed = seed_run("faults_fuzz", args, 7)
    modes = list(MODES) if args.mode == "all" else [args.mode]
    impls = list(IMPLS) if args.impl == "all" else [args.impl]
    gc.collect()
    gc.freeze()  # what the imports made: gc.get_objects() sees the rounds' objects only
    failed = False
    for mode in modes:
        for impl in impls:
            Run.counts = Counter()
            Run.failures = []
            Run.impl = impl
            start = time.monotonic()
            rounds = args.rounds or PROFILES[args.profile][mode]
            # a hang (a loop that never ends) prints every stack and exits
            faulthandler.dump_traceback_later(args.watchdog, exit=True)
            MODES[mode](IMPLS[impl], rounds, seed)
            faulthandler.cancel_dump_traceback_later()
            name = f"{mode}-{impl}"
            if Run.failures:
                failed = True
                print(f"faults_fuzz: {name} FAILED (seed {seed}):", file=sys.stderr)
                for msg in Run.failures:
                    print("  " + msg, file=sys.stderr)
                continue
            counts = dict(sorted(Run.counts.items()))
            counts["seconds"] = round(time.monotonic() - start, 1)
            counts["seed"] = seed
            print(f"COVERAGE {name} " + json.dumps(counts), flush=True)
    sys.stderr.flush()
    # Skip interpreter teardown: objects whose __del__ acts die there.
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()
