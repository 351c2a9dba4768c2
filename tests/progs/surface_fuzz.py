"""Surface fuzzer for arc_cy: a standalone program (tests/ and tests/progs/
on PYTHONPATH, as tests/childproc.py sets it).

    PYTHONPATH=tests/progs:tests python -P tests/progs/surface_fuzz.py \
        --mode reflect|threads|hooks [--profile ci|long] \
        [--seed N] [--phase top|in-call|both] [--last-call FILE]

Where tests/progs/hostile_fuzz.py attacks a policy's arguments, this one
attacks the compiled module's own surface: what Python code can reach
besides them. The compiled core alone: its memory safety is what its rules
are for (docs/hardening.md); the twin, vLLM's arc.py, is exposed as vLLM's
ARC is, and serves here as a reference only.

--mode reflect: enumerates every type that arc_cy._core.arc defines or hands
out (the module's types and module-level functions, then the type of every
iterator or view a call returns), user subclasses of each compiled policy
class (ARCCore and ARCCachePolicy, whose __init__, __setattr__ and __bool__
call super() or not, raise, or call into the policy) and user chunk types
(ChunkStatus subclasses whose __bool__ or __len__ answers true or false,
raises, or calls into the policy that holds the chunk), and every callable
attribute of each, as dir() lists them (dunders and Cython's generated
methods included; of a chunk type, what it defines: ctypes' from_address
makes objects over any memory). Each is called with hostile arguments
(wrong types, huge and negative ints, None, objects of the other types,
tuples made from what the object's own __reduce_ex__ returns, with their
ints changed), positionally or a quarter of the time by keyword (the
parameters' own names, the twin's for the compiled core's methods; a name
the callable does not take; a name a positional argument already fills),
on live objects and on half-built ones (T.__new__(T)), first every
callable on every kind of receiver, then at random. Then: the same
keyword calls with good values on the compiled policy and on the twin
(legal input: the same outcome and lists after); rounds that make and use a user
subclass's policy; rounds of get() on every resident key of a policy
whose chunks are hostile (rule 2: a t1 chunk is truth-tested in the call,
a falsy one gives None, a t2 chunk is returned untested). Then, with
--phase in-call, the same from inside a call: a key's __eq__, a
protected.__contains__ and a gc callback (gc.set_threshold(1)) find
objects with gc.get_referrers(policy) and gc.get_objects() and call their
methods. After every call from the top: the policies pass
_check_invariants() and none is left busy. User code that calls into
a policy (an override, a chunk's truth test) has a mutator refused while
that policy runs a call and accepted while it runs none, a read never
refused. Fails if a callable that the enumeration found was never called.

--mode threads: three threads drive one policy with
keys whose __hash__ and __eq__ are Python code, at sys.setswitchinterval(1e-6),
calling every mutator (clear() and __init__ again included) and read;
counts the calls that overlapped another thread's call. A quarter of the
keys and of the inserted chunks have a __del__ that calls into the policy
(a mutator, clear() and __init__ included, or a read) from whichever thread
releases them, once the call that dropped them has returned (rule 6): its
mutators are accepted, unless another thread's call refuses them.
Every exception must be one the rules document (re-entry or a thread
refused: the MSG_* texts of arc_cy._messages that speak of a call running
or of a thread; a list changed during iteration; KeyError from a view's
[], ValueError for a duplicate insert); afterwards _check_invariants()
passes and the policy works.

--mode hooks: sys.settrace and sys.setprofile hooks
and a SIGALRM handler (signal.setitimer, 100 us) that, at random lines and
events inside a call, raise HostileError or KeyboardInterrupt (a
BaseException, as a real SIGINT raises it), call a mutator (which must be
refused) or a read. The steps are every mutator and read, __init__ called
again on the live policy included. In three steps out of ten the hooks
also fire inside the finally clauses of arc_cy's Python code that the core
runs (and what they call); otherwise they skip them. Half the inserted keys are
the policy's own and have a __del__ (Python code: hooks fire in it, and
raise there too) that makes a call that changes nothing: run where a call
releases what it dropped (clear()'s and __init__'s included), once busy is
given back, its mutator is accepted (refused only where a collection
finalizes it inside a call).
After every step the policy must not be
busy, must pass _check_invariants(), must work (a mutator accepted; what
insert() puts in, get() and the t1 view find), and must equal a reference
(vLLM's ARCCachePolicy behind hostile_fuzz's Oracle adapter; the twin
without vLLM) that replays the step without hooks: unchanged if the step
raised, applied if it returned (or if the hook raised after the call had
finished). What Python cannot pass on (a hook's error in a __del__) must be
a hook's.

--mode all runs threads, hooks and reflect in one process (one import of
vLLM, most of a run's time under ASan).

Output: a line ``COVERAGE <run> {json}`` on stdout per run that passed
(``FAILED <run>`` for one that did not; its failures are on stderr), then
exit 0 if every run passed, else 1; a crash is a signal exit
(faulthandler prints the stack; --last-call FILE holds the call that was
running, for reflect mode).
"""

from __future__ import annotations

import argparse
import ast
import collections.abc
import contextlib
import gc
import inspect
import itertools
import json
import os
import random
import re
import signal
import sys
import threading
import time
import traceback
import weakref
from collections import Counter

from fuzz_start import seed_run

import arc_cy._core.arc as core_mod
import arc_cy._twin.arc as twin_mod
from arc_cy import _messages
from arc_cy._core import arguments, chunks, views
from arc_cy._messages import MSG_DUPLICATE, MSG_MUTATED
from arc_cy._policy import METHODS
from helpers import ChunkStatus, ReqContext, ready
from hostile import HostileError

CPolicy = core_mod.ARCCachePolicy
IMPLS = {"cython": CPolicy}
# The twin: the keyword calls' reference.
PyPolicy = twin_mod.ARCCachePolicy
# --exclude (triage only): reflect-mode features switched off, so that a run
# can get past a known crash: wrong-self, halfbuilt, restate.
EXCLUDE: set[str] = set()


def excluded(name: str) -> bool:
    return "halfbuilt" in EXCLUDE and name in ("__new__", "__class__")


# What a hook raises: HostileError, or KeyboardInterrupt (a BaseException, as
# a real SIGINT raises it): neither may leave a policy busy.
HOOK_ERRORS = (HostileError, KeyboardInterrupt)


COUNTS: Counter = Counter()
FAILURES: list[str] = []


def fail(msg: str) -> None:
    FAILURES.append(msg)  # (rebound per run by main)
    print(f"surface_fuzz: FAILED {msg}", file=sys.stderr, flush=True)


def _msg_pattern(template: str) -> re.Pattern:
    return re.compile(
        re.escape(template).replace(re.escape("{}"), ".+").replace(re.escape("{!r}"), ".+")
    )


# The RuntimeErrors the rules document for a call that meets another call
# (same thread or not): every MSG_* of _messages that names a running call or a
# thread, so that a rule added later is accepted without listing it here.
REFUSALS = [
    _msg_pattern(text)
    for name, text in vars(_messages).items()
    if name.startswith("MSG_") and isinstance(text, str) and ("running" in text or "thread" in text)
]


def is_refusal(exc: BaseException) -> bool:
    return type(exc) is RuntimeError and any(p.fullmatch(str(exc)) for p in REFUSALS)


class LastCall:
    """The call now running, written where a crash leaves it (one pwrite)."""

    fd: int | None = None

    @classmethod
    def open(cls, path: str | None) -> None:
        if path:
            cls.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    @classmethod
    def note(cls, text: str) -> None:
        if cls.fd is not None:
            os.pwrite(cls.fd, (text[:1000] + "\n").encode("utf-8", "replace").ljust(1024), 0)


# --- objects the fuzzer hands over ------------------------------------------


class Key:
    """Keeps the hash/eq contract; __hash__ and __eq__ are Python code, and
    act (see Act) while an action is armed."""

    def __init__(self, kid: int) -> None:
        self.kid = kid

    def __hash__(self) -> int:
        Act.point("hash")
        return hash(self.kid)

    def __eq__(self, other: object) -> bool:
        Act.point("eq")
        if not isinstance(other, Key):
            return NotImplemented
        return self.kid == other.kid

    def __repr__(self) -> str:
        return f"K{self.kid}"


class Protected(set):
    def __contains__(self, key: object) -> bool:
        Act.point("contains")
        return set.__contains__(self, key)


class Act:
    """The action that Key, Protected and the gc callback run while armed
    (one at a time, never inside another)."""

    fn = None
    running = False

    @classmethod
    def point(cls, where: str) -> None:
        fn = cls.fn
        if fn is None or cls.running:
            return
        cls.running = True
        try:
            COUNTS["act_" + where] += 1
            fn(where)
        finally:
            cls.running = False


def _gc_callback(phase: str, info: dict) -> None:
    if phase == "start":
        Act.point("gc")


# A hostile chunk's holder, by the chunk's id: a weak reference (ARCCore
# itself takes none: the policy; an id reused by a later chunk names a
# policy all the same).
HOLDERS: dict[int, object] = {}


def _holder(c):
    ref = HOLDERS.get(id(c))
    return ref() if isinstance(ref, weakref.ref) else ref


def populated(policy_cls, capacity: int = 6, keys: int = 10, hostile_chunks: bool = False):
    """A policy with entries in t1, t2, b1 and b2 (some pinned); with
    hostile_chunks, some of its chunks are BoolChunk or LenChunk, which know
    it as their holder."""
    with User.quiet():
        p = policy_cls(capacity)
        for i in range(keys):
            ref = 1 if i % 5 == 4 else 0
            if hostile_chunks and i % 3:
                c = (BoolChunk if i % 3 == 1 else LenChunk)(0)
                c.ref_cnt = ref
                HOLDERS[id(c)] = p if type(p) is core_mod.ARCCore else weakref.ref(p)
            else:
                c = ready(0, ref)
            p.insert(Key(i), c, None)
            if len(p.t1) + len(p.t2) >= capacity:
                p.evict(1, set())
        p.touch([Key(i) for i in range(keys - 3, keys)], None)
    while len(HOLDERS) > 100:
        del HOLDERS[next(iter(HOLDERS))]
    return p


# --- user subclasses and chunks (reflect mode) ------------------------------


def busy_now(p) -> bool | None:
    """Whether p runs a call that a mutator must be refused by (True), runs
    none (False), or cannot tell (None)."""
    if isinstance(p, core_mod.ARCCore):
        try:
            p._check_invariants()  # asserts "not busy" before anything else
        except AssertionError as exc:
            return True if str(exc).endswith("did not finish") else None
        except Exception:
            return None
        return False
    return None


class User:
    """What the user subclasses' overrides and the hostile chunks do: drawn
    at each call (super() and truthy while quiet: the fuzzer building its
    objects). One calls into a policy at a time."""

    rng = random.Random(0)
    silent = 0
    calling = False  # an override or chunk is calling into a policy
    getting: object = None  # the policy whose get() the fuzzer is calling
    tested = 0  # hostile chunks' truth tests
    truth = True  # what the last one answered

    @classmethod
    @contextlib.contextmanager
    def quiet(cls):
        cls.silent += 1
        try:
            yield
        finally:
            cls.silent -= 1

    @classmethod
    def how(cls, what: str) -> str:
        """super (call super(), or for __bool__ return True), skip (do not,
        or return False), raise, call (call into the policy, then super)."""
        if cls.silent:
            return "super"
        how = cls.rng.choice(["super"] * 4 + ["skip", "skip", "raise", "raise", "call", "call"])
        if how == "call" and cls.calling:
            how = "super"
        COUNTS[f"user_{what}_{how}"] += 1
        return how

    @classmethod
    def call_into(cls, p, who: str, must_refuse: bool = False) -> None:
        """A mutator or a read on p, from user code that p's own call may be
        running (an override, a chunk's truth test): a mutator is refused
        while p runs a call (rule 2) and accepted while it runs none."""
        if cls.calling:
            return
        cls.calling = True
        try:
            busy = True if must_refuse else busy_now(p)
            rng = cls.rng
            name = rng.choice(["insert"] * 3 + ["evict"] * 2 + ["target", "get", "in", "clear"])
            mutator = name not in ("get", "in")
            try:
                if name == "insert":
                    p.insert(Key(rng.randrange(100, 10**6)), ready(0), None)
                elif name == "evict":
                    p.evict(1, set())
                elif name == "target":
                    # through the property (a user subclass's __setattr__ may drop it)
                    inspect.getattr_static(p, "target_t1_size").__set__(p, rng.choice([0, 1, 2.5]))
                elif name == "clear":
                    p.clear()
                elif name == "get":
                    p.get(Key(rng.randrange(10)))
                else:
                    Key(rng.randrange(10)) in p.t1  # noqa: B015 -- a read, for its effect
            except RuntimeError as exc:
                if not is_refusal(exc):
                    COUNTS["user_call_exc_RuntimeError"] += 1
                    return
                COUNTS["user_call_refused"] += 1
                if not mutator:
                    fail(f"{who}: a read {name}() was refused: {exc}")
                elif busy is False:
                    fail(f"{who}: {name}() refused while {type(p).__name__} ran no call: {exc}")
                return
            except Exception as exc:
                # (a policy the fuzzer half built or wrote raw, or another
                # object called as the method's self)
                COUNTS["user_call_exc_" + type(exc).__name__] += 1
                return
            if mutator and busy is True:
                fail(f"{who}: {name}() was accepted while {type(p).__name__} was running a call")
            COUNTS["user_call_accepted" if mutator else "user_call_read"] += 1
        finally:
            cls.calling = False


def _user_subclass(base: type, label: str) -> type:
    """A user subclass of a policy class whose __init__, __setattr__ and
    __bool__ do what User.how draws."""

    class UserPolicy(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args, **kwargs):
            how = User.how("init")
            if how == "raise":
                raise HostileError("__init__")
            if how == "call":
                User.call_into(self, f"{label}.__init__")
            if how != "skip":
                super().__init__(*args, **kwargs)

        def __setattr__(self, name, value):
            how = User.how("setattr")
            if how == "raise":
                raise HostileError(f"__setattr__ {name}")
            if how == "call":
                User.call_into(self, f"{label}.__setattr__({name!r})")
            if how != "skip":
                super().__setattr__(name, value)

        def __bool__(self):
            how = User.how("bool")
            if how == "raise":
                raise HostileError("__bool__")
            if how == "call":
                User.call_into(self, f"{label}.__bool__")
            return how != "skip"

    UserPolicy.__name__ = UserPolicy.__qualname__ = label
    return UserPolicy


USER_POLICIES = (
    _user_subclass(core_mod.ARCCore, "UserARCCore"),
    _user_subclass(CPolicy, "UserCompiledPolicy"),
)


def _chunk_truth(c, how: str):
    """A hostile chunk's __bool__ or __len__: true, false, raise, or call
    into its holder (a mutator is refused while the holder's get() that
    truth-tests it runs, rule 2)."""
    COUNTS[f"chunk_{how}"] += 1
    User.tested += 1
    User.truth = True
    if User.silent or User.calling:
        return True
    r = User.rng.random()
    if r < 0.25:
        return True
    if r < 0.45:
        COUNTS["chunk_falsy"] += 1
        User.truth = False
        return False
    if r < 0.6:
        COUNTS["chunk_raised"] += 1
        raise HostileError(f"chunk {how}")
    p = _holder(c)
    if p is None:
        return True
    COUNTS["chunk_call_into"] += 1
    if User.getting is p:
        COUNTS["chunk_in_get"] += 1
    User.call_into(p, f"a chunk's {how}", must_refuse=User.getting is p)
    return True


class BoolChunk(ChunkStatus):
    """A chunk whose __bool__ acts (get() truth-tests a t1 chunk)."""

    def __bool__(self):
        return _chunk_truth(self, "bool")


class LenChunk(ChunkStatus):
    """A chunk whose __len__ acts (bool() falls back to it)."""

    def __len__(self):
        return int(_chunk_truth(self, "len"))


# Of a chunk type only what it defines is the surface: ctypes' own methods
# (from_address with a hostile int) make objects over any memory.
USER_CHUNKS = {BoolChunk: ["__bool__"], LenChunk: ["__len__"]}


# --- reflect mode -----------------------------------------------------------

MODULES = (core_mod,)
_BIG = [2**31 - 1, 2**31, -(2**31), 2**63 - 1, 2**64, -(2**63), 10**6, 10**30]
HOSTILE_INTS = [-1, 0, 1, 2, 3, 4, 5, 255, *_BIG]
SCALARS = [
    None,
    *HOSTILE_INTS,
    1.5,
    -0.0,
    float("nan"),
    float("inf"),
    True,
    "",
    "x",
    "t1",
    "_busy",
    b"",
    b"k",
    (),
    [],
    {},
    set(),
    frozenset(),
    object(),
]
_PARAMS: dict = {}


def param_names(owner, name: str) -> list[str]:
    """The names a callable takes by keyword, as its signature gives them,
    else as the twin's method of that name does, or the views' source's
    (views._ListSource: the core's _list_* methods); the compiled core's
    methods have no signature, and take those names."""
    key = (owner, name)
    if key in _PARAMS:
        return _PARAMS[key]
    names: list[str] = []
    sources = (owner, PyPolicy, views._ListSource)
    for src in (getattr(o, name, None) for o in sources):
        try:
            sig = inspect.signature(src)
        except (TypeError, ValueError):
            continue
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        names = [q.name for q in sig.parameters.values() if q.kind in kinds]
        if names and names[0] in ("self", "cls"):  # (a function got from its class)
            names = names[1:]
        if names:
            break
    _PARAMS[key] = names
    return names


# Keyword names a call may be given that it does not take: other methods'
# parameters, the receiver's, busy's slot, and junk.
KW_NAMES = [
    "key",
    "chunk",
    "keys",
    "n",
    "protected",
    "req_context",
    "cache_capacity",
    "which",
    "value",
    "self",
    "cls",
    "_busy",
    "kye",
    "__class__",
    "args",
    "kwargs",
]


# The twins' modules: not the surface (the keyword calls make twins, which
# a callback may find through gc).
TWINS = ("arc_cy._twin.arc", "arc_cy._twin.plus")


def _owner_name(owner) -> str:
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    return owner.__name__  # a module


class Surface:
    """The enumerated types and callables, the objects seen of each type,
    and what was called."""

    def __init__(self) -> None:
        self.owners: dict = {}  # type or module -> sorted callable names
        self.instances: dict = {}  # type -> recent live objects
        self.halfbuilt: dict = {}  # type -> objects made by T.__new__(T)
        self.called: Counter = Counter()
        self.handed_out: set = set()  # types of the iterators and views calls returned
        self.queue: list = []
        for mod in MODULES:
            names = []
            for name, value in sorted(vars(mod).items()):
                if isinstance(value, type):
                    if value.__module__.startswith("arc_cy"):
                        self.add_type(value)
                elif callable(value) and getattr(value, "__module__", None) == mod.__name__:
                    names.append(name)
            self.owners[mod] = names
            self.queue.append(mod)

    def add_type(self, tp: type, names: list[str] | None = None) -> bool:
        if tp in self.owners:
            return False
        if names is None:
            names = []
            for name in dir(tp):
                try:
                    value = getattr(tp, name)
                except Exception:
                    continue
                if callable(value):
                    names.append(name)
        self.owners[tp] = names
        self.instances[tp] = []
        self.queue.append(tp)
        COUNTS["types_found"] += 1
        return True

    def belongs(self, obj) -> bool:
        """Whether obj is part of the surface: of a type arc_cy defines, or of
        a type whose objects a call on the surface handed out (the iterators
        and views over a policy's lists). Any other object found through gc
        is CPython's, made in passing, and may be half-built: 3.11's
        enumerate, seen before its iterator is set, crashes on next()
        (docs/hardening.md, "Checks"). Not a weak proxy: it forwards
        isinstance() to its object (the object itself is found as well) and
        raises ReferenceError once that dies."""
        tp = type(obj)
        if tp in weakref.ProxyTypes or tp.__module__ in TWINS:
            return False
        return tp in self.owners or tp.__module__.startswith("arc_cy") or tp in self.handed_out

    def hand_out(self, result) -> None:
        """A call on the surface returned result: an iterator or view is the
        surface from now on, and so is its type."""
        if isinstance(result, (collections.abc.Iterator, collections.abc.MappingView)):
            if type(result) not in weakref.ProxyTypes:
                self.handed_out.add(type(result))

    def note(self, obj) -> None:
        if not self.belongs(obj):
            return
        tp = type(obj)
        self.add_type(tp)
        seen = self.instances[tp]
        if not any(o is obj for o in seen):
            seen.append(obj)
            if len(seen) > 6:
                del seen[0]

    def all_objects(self) -> list:
        out = []
        for objs in self.instances.values():
            out.extend(objs)
        for objs in self.halfbuilt.values():
            out.extend(objs)
        return out

    def found(self) -> set:
        return {(_owner_name(o), n) for o, names in self.owners.items() for n in names}


def _tuples_in(value, depth: int = 0):
    if isinstance(value, tuple):
        yield value
    if depth < 3 and isinstance(value, (tuple, list)):
        for item in value:
            yield from _tuples_in(item, depth + 1)


def states_of(obj) -> list:
    """Tuples that look like obj's pickled state: what its own
    __reduce_ex__ gives (Cython's generated pickling included)."""
    out = []
    for how in ("__reduce_ex__", "__reduce_cython__", "__reduce__"):
        fn = getattr(obj, how, None)
        if fn is None:
            continue
        try:
            reduced = fn(2) if how == "__reduce_ex__" else fn()
        except Exception:
            continue
        out.extend(t for t in _tuples_in(reduced) if t)
    return out


def mutate_state(rng: random.Random, state: tuple, pool: list) -> tuple:
    """state with some ints made hostile and some objects swapped."""
    out = []
    for item in state:
        r = rng.random()
        if isinstance(item, int) and not isinstance(item, bool) and r < 0.7:
            out.append(rng.choice(HOSTILE_INTS))
        elif r < 0.15 and pool:
            out.append(rng.choice(pool))
        else:
            out.append(item)
    if rng.random() < 0.1:
        out.append(rng.choice(SCALARS))
    return tuple(out)


class Reflector:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.surface = Surface()
        self.policies: list = []  # (impl, policy) the fuzzer checks
        self.keys = [Key(i) for i in range(8)]
        self.done = 0  # owners of surface.queue the systematic pass went through
        # the user's subclasses and chunk types: receivers like arc_cy's own
        for tp in USER_POLICIES:
            self.surface.add_type(tp)
        for tp, names in USER_CHUNKS.items():
            self.surface.add_type(tp, list(names))
        self.new_zoo()

    # --- objects ----------------------------------------------------------

    def new_zoo(self) -> None:
        s = self.surface
        self.policies = []
        for cls in (CPolicy, core_mod.ARCCore, *USER_POLICIES):
            p = populated(cls, hostile_chunks=True)
            self.policies.append(p)
            s.note(p)
            for _, c in p.t1.items():
                s.note(c)  # the hostile chunks, their holder p
            for which in ("t1", "t2", "b1", "b2"):
                view = getattr(p, which)
                for obj in (
                    view,
                    view.items(),
                    view.keys(),
                    view.values(),
                    iter(view),
                    iter(view.items()),
                ):
                    s.note(obj)
        for tp in list(s.owners):
            if isinstance(tp, type):
                self.half_build(tp)

    def half_build(self, tp: type):
        if "halfbuilt" in EXCLUDE:
            return None
        try:
            obj = tp.__new__(tp)
        except Exception:
            COUNTS["new_refused"] += 1
            return None
        COUNTS["half_built"] += 1
        objs = self.surface.halfbuilt.setdefault(tp, [])
        objs.append(obj)
        if len(objs) > 3:
            del objs[0]
        return obj

    def hostile(self, owner, name: str):
        """One hostile argument."""
        rng = self.rng
        r = rng.random()
        pool = self.surface.all_objects()
        if r < 0.3:
            return rng.choice(SCALARS)
        if r < 0.5 and pool:
            return rng.choice(pool)
        if r < 0.6:
            if rng.random() < 0.7:
                return rng.choice(self.keys)
            c = rng.choice([ChunkStatus, BoolChunk, LenChunk])(0)
            c.ref_cnt = rng.choice([-1, 0, 1])
            return c
        if r < 0.7:
            return rng.choice([t for t in self.surface.owners if isinstance(t, type)] + [int])
        if r < 0.85 and pool:
            states = states_of(rng.choice(pool))
            if states:
                return mutate_state(rng, rng.choice(states), pool)
        return tuple(rng.choice(SCALARS + pool) for _ in range(rng.randrange(1, 6)))

    def args_for(self, owner, name: str, receiver):
        rng = self.rng
        if "restate" not in EXCLUDE and "setstate" in name and rng.random() < 0.7:
            states = states_of(receiver) if receiver is not None else []
            if states:
                return (mutate_state(rng, rng.choice(states), self.surface.all_objects()),)
        n = rng.choice([0, 1, 1, 2, 2, 3, 4])
        args = [self.hostile(owner, name) for _ in range(n)]
        if name == "__new__":
            # the class comes first: this one, another of the surface, or junk
            classes = [t for t in self.surface.owners if isinstance(t, type)]
            args.insert(0, owner if rng.random() < 0.6 else rng.choice(classes + [int, None]))
        return tuple(args)

    def receivers(self, owner) -> list:
        if not isinstance(owner, type):
            return [None]
        return list(self.surface.instances.get(owner, [])) + list(
            self.surface.halfbuilt.get(owner, [])
        )

    # --- calls ----------------------------------------------------------------

    def good_value(self, param: str):
        """A value of the kind the parameter named param takes (a policy's,
        a view's, a module function's)."""
        rng = self.rng
        keys = self.keys
        if param == "key":
            return rng.choice(keys)
        if param == "chunk":
            c = rng.choice([ChunkStatus, BoolChunk, LenChunk])(0)
            return c
        if param in ("keys", "key_groups"):
            ks = rng.sample(keys, rng.randrange(0, 4))
            return [ks] if param == "key_groups" else ks
        if param in ("insertion_only_keys", "reused_keys"):
            return set(rng.sample(keys, rng.randrange(0, 3)))
        if param == "protected":
            return Protected(rng.sample(keys, rng.randrange(0, 3)))
        if param in ("n", "which", "cache_capacity", "value"):
            return rng.choice([0, 1, 2, 3] if param == "which" else [0, 1, 2, 3, 6])
        if param == "req_context":
            return rng.choice([None, ReqContext(req_id="kw")])
        return self.hostile(None, param)

    def keywords(self, owner, name: str, args: tuple) -> tuple[tuple, dict, str]:
        """args and keywords for a call by keyword: the parameters' own
        names (some given positionally first), a name the callable does not
        take, or a name a positional argument already fills."""
        rng = self.rng
        names = param_names(owner, name)
        kind = rng.choice(["right", "right", "wrong", "dup"] if names else ["wrong"])
        if kind == "wrong":
            taken = set(names)
            wrong = rng.choice([n for n in KW_NAMES if n not in taken])
            kwargs = {wrong: self.hostile(owner, name)}
            if names and rng.random() < 0.5:
                kwargs[names[-1]] = self.good_value(names[-1])
                args = args[: len(names) - 1]
            return args, kwargs, kind
        good = rng.random() < 0.7
        vals = [self.good_value(n) if good else self.hostile(owner, name) for n in names]
        if kind == "right":
            i = rng.randrange(len(names))  # at least one by keyword
            kwargs = {
                n: v for n, v in zip(names[i:], vals[i:]) if n == names[i] or rng.random() < 0.8
            }
            return tuple(vals[:i]), kwargs, kind
        i = rng.randrange(1, len(names) + 1)  # "dup": positional, then again by keyword
        j = rng.randrange(i)
        return tuple(vals[:i]), {names[j]: vals[j]}, kind

    def call(self, owner, name: str, receiver, where: str = "top") -> None:
        s = self.surface
        args = self.args_for(owner, name, receiver)
        kwargs: dict = {}
        kw = ""
        if name not in ("__new__", "__class__") and self.rng.random() < 0.25:
            args, kwargs, kw = self.keywords(owner, name, args)
        getting = None
        if receiver is None:
            target = owner
            fn = getattr(owner, name, None)
        elif "wrong-self" not in EXCLUDE and self.rng.random() < 0.1 and isinstance(owner, type):
            # through the type, on a receiver of another type
            fn = getattr(owner, name, None)
            others = s.all_objects()
            args = (self.rng.choice(others) if others else None, *args)
            target = owner
        else:
            target = receiver
            fn = getattr(receiver, name, None)
        if fn is None:
            COUNTS["attr_gone"] += 1
            return
        if excluded(name):
            return
        label = f"{_owner_name(owner)}.{name}"
        s.called[(_owner_name(owner), name)] += 1
        COUNTS["calls"] += 1
        COUNTS[f"calls_{where}"] += 1
        if kw:
            COUNTS["calls_kw"] += 1
            COUNTS[f"calls_kw_{kw}"] += 1
        if (
            name == "get"
            and target is receiver
            and isinstance(target, core_mod.ARCCore)
            and User.getting is None
        ):
            getting = target  # its t1 chunk's truth test runs in the call
        LastCall.note(
            f"{where}: {label} on {_safe_repr(target)} args {_safe_repr(args)} "
            f"keywords {_safe_repr(kwargs)}"
        )
        if getting is not None:
            User.getting = getting
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            COUNTS["exc_" + type(exc).__name__] += 1
            return
        except BaseException as exc:
            fail(f"{label}{_safe_repr(args)} {_safe_repr(kwargs)} raised {exc!r}")
            return
        finally:
            if getting is not None:
                User.getting = None
        COUNTS["returned"] += 1
        if kw:
            COUNTS[f"calls_kw_{kw}_returned"] += 1
        s.hand_out(result)
        s.note(result)
        if s.belongs(result) and isinstance(result, collections.abc.Iterator):
            # an iterator is half its surface until next() runs on it
            if where == "top":
                LastCall.note(
                    f"next() on what {label} returned, called on "
                    f"{_safe_repr(target)} with {_safe_repr(args)}"
                )
            for _ in range(3):
                try:
                    next(result)
                except Exception:
                    break

    def check(self, label: str, objs=None) -> None:
        """After a call from the top: every policy seen (or of objs)
        consistent, none busy."""
        for p in self.surface.all_objects() if objs is None else objs:
            if isinstance(p, core_mod.ARCCore):
                try:
                    p._check_invariants()
                except AssertionError as exc:
                    fail(f"after {label}: compiled {type(p).__name__} {id(p):#x}: {exc}")
                except Exception as exc:
                    # user code in the check (a key's hash) may fail; busy may not remain
                    COUNTS["check_exc_" + type(exc).__name__] += 1

    # --- phases ---------------------------------------------------------------

    def systematic(self) -> None:
        """Every callable of every owner, on every kind of receiver, a few
        times; owners found meanwhile join the queue."""
        s = self.surface
        while self.done < len(s.queue):
            owner = s.queue[self.done]
            self.done += 1
            for name in list(s.owners[owner]):
                for receiver in self.receivers(owner) or [None]:
                    for _ in range(2):
                        self.call(owner, name, receiver)
                        self.check(f"{_owner_name(owner)}.{name}")
            if FAILURES:
                return

    def random_calls(self, count: int) -> None:
        s = self.surface
        for i in range(count):
            owner = self.rng.choice(list(s.owners))
            names = s.owners[owner]
            if not names:
                continue
            receivers = self.receivers(owner) or [None]
            name = self.rng.choice(names)
            self.call(owner, name, self.rng.choice(receivers))
            self.check(f"{_owner_name(owner)}.{name}")
            if i % 200 == 199:
                self.new_zoo()  # live policies again: the calls wear them out
            if FAILURES:
                return

    def user_rounds(self, count: int) -> None:
        """A user subclass's policy made and used: its __init__,
        __setattr__ and __bool__ act. After each call: not busy, and
        consistent."""
        rng = self.rng
        for _ in range(count):
            cls = rng.choice(USER_POLICIES)
            LastCall.note(f"user round: {cls.__name__}")
            try:
                p = cls(rng.choice([0, 3, 6]))
            except Exception as exc:
                COUNTS["user_round_exc_" + type(exc).__name__] += 1
                continue
            COUNTS["user_rounds"] += 1
            self.surface.note(p)
            for _ in range(6):
                op = rng.choice(
                    ["insert", "bool"] * 3 + ["touch", "evict", "target", "init", "clear", "get"]
                )
                try:
                    if op == "insert":
                        p.insert(Key(rng.randrange(12)), ready(0, rng.choice([0, 0, 1])), None)
                    elif op == "touch":
                        p.touch([Key(rng.randrange(12)) for _ in range(2)], None)
                    elif op == "evict":
                        p.evict(1, Protected([Key(0)]))
                    elif op == "target":
                        p.target_t1_size = rng.choice([0, 1, 2.5])
                    elif op == "init":
                        p.__init__(rng.choice([3, 6]))
                    elif op == "bool":
                        bool(p)
                    elif op == "clear":
                        p.clear()
                    else:
                        p.get(Key(rng.randrange(12)))
                    COUNTS["user_round_ok"] += 1
                except Exception as exc:
                    COUNTS["user_round_exc_" + type(exc).__name__] += 1
                self.check(f"{cls.__name__}: {op}", [p])

    def truth_rounds(self, count: int) -> None:
        """get() on every resident key of a policy whose chunks are
        BoolChunk and LenChunk (rule 2): a t1 chunk is truth-tested in the
        call, while the policy is busy (a mutator from the test is refused,
        User.call_into), and a falsy one gives None; a t2 chunk is returned
        untested."""
        rng = self.rng
        for _ in range(count):
            cls = rng.choice([CPolicy, core_mod.ARCCore, *USER_POLICIES])
            p = populated(cls, hostile_chunks=True)
            with User.quiet():
                entries = [(k, c, "t1") for k, c in p.t1.items()]
                entries += [(k, c, "t2") for k, c in p.t2.items()]
            for k, c, where in entries:
                if not isinstance(c, (BoolChunk, LenChunk)):
                    continue
                LastCall.note(f"truth round: {cls.__name__}.get({k!r}) in {where}")
                tested = User.tested
                User.getting = p
                try:
                    got = ("ok", p.get(k))
                except Exception as exc:
                    got = ("raised", exc)
                finally:
                    User.getting = None
                COUNTS[f"truth_{where}"] += 1
                if where == "t2":
                    if User.tested != tested:
                        fail(f"{cls.__name__}.get(): the t2 chunk of {k!r} was truth-tested")
                    elif got != ("ok", c):
                        fail(f"{cls.__name__}.get(): the t2 chunk of {k!r} gave {got!r}")
                elif User.tested == tested:
                    fail(f"{cls.__name__}.get(): the t1 chunk of {k!r} was not truth-tested")
                elif got[0] == "raised":
                    if not isinstance(got[1], HostileError):
                        COUNTS["truth_exc_" + type(got[1]).__name__] += 1
                elif got[1] is not (c if User.truth else None):
                    fail(
                        f"{cls.__name__}.get(): the t1 chunk of {k!r} tested "
                        f"{User.truth}, and get() gave {got[1]!r}"
                    )
                self.check(f"truth round {cls.__name__}", [p])

    def keywords_agree(self, count: int) -> None:
        """The same call by keyword, with good values, on the compiled
        policy and on the twin, each populated alike: the same outcome (an
        exception's type) and the same lists after (the core parses its
        keywords with its own code)."""
        rng = self.rng
        for _ in range(count):
            name = rng.choice(KW_METHODS)
            names = param_names(PyPolicy, name)
            vals = [self.good_value(n) for n in names]
            if name == "insert":
                # a new key: a resident one the core refuses, and the twin,
                # as vLLM's ARC, stores twice
                vals[names.index("key")] = Key(rng.randrange(100, 10**6))
            i = rng.randrange(len(names) + 1)
            kwargs = {n: v for n, v in zip(names[i:], vals[i:]) if rng.random() < 0.9}
            args = tuple(vals[:i])
            LastCall.note(f"keywords: {name} args {_safe_repr(args)} keywords {_safe_repr(kwargs)}")
            seen = []
            with User.quiet():
                for cls in (CPolicy, PyPolicy):
                    p = populated(cls)
                    try:
                        out = ("ok", _plain(getattr(p, name)(*args, **kwargs)))
                    except Exception as exc:
                        out = ("raised", type(exc).__name__)
                    seen.append((out, kid_state(p)))
            COUNTS["kw_compared"] += 1
            COUNTS[f"kw_compared_{seen[0][0][0]}"] += 1
            if seen[0] != seen[1]:
                fail(
                    f"{name}(*{_safe_repr(args)}, **{_safe_repr(kwargs)}): compiled "
                    f"{seen[0]}, twin {seen[1]}"
                )
                return

    def in_call_action(self, policy):
        def act(where: str) -> None:
            objs = [o for o in gc.get_referrers(policy) if self.surface.belongs(o)]
            young = [o for o in gc.get_objects(generation=0) if self.surface.belongs(o)]
            COUNTS["in_call_found"] += len(objs) + len(young)
            for obj in objs + young:
                if not isinstance(obj, core_mod.ARCCore):
                    COUNTS["in_call_found_" + type(obj).__name__] += 1
            candidates = objs + young
            for _ in range(3):
                if not candidates:
                    return
                obj = self.rng.choice(candidates)
                self.surface.note(obj)
                names = self.surface.owners.get(type(obj), [])
                if not names:
                    continue
                restate = [n for n in names if "setstate" in n]
                if restate and self.rng.random() < 0.5:
                    name = self.rng.choice(restate)
                else:
                    name = self.rng.choice(names)
                self.call(type(obj), name, obj, where="in_call")

        return act

    def in_call_round(self, i: int) -> None:
        rng = self.rng
        impl = rng.choice([CPolicy, CPolicy, *USER_POLICIES])
        p = populated(impl, hostile_chunks=True)
        self.surface.note(p)
        fresh = [Key(k) for k in range(10)]
        how = rng.choice(["evict", "evict", "get", "touch", "insert", "items", "in"])
        threshold = rng.random() < 0.4
        Act.fn = self.in_call_action(p)
        old = gc.get_threshold()
        if threshold:
            gc.set_threshold(1)
        LastCall.note(f"in-call round {i}: {impl.__module__} {how} threshold={threshold}")
        try:
            if how == "evict":
                resident = len(p.t1) + len(p.t2)
                p.evict(rng.randrange(1, resident + 1), Protected(fresh[:2]))
            elif how == "get":
                with User.quiet():
                    t1 = list(p.t1)
                k = rng.choice(t1) if t1 and rng.random() < 0.7 else rng.choice(fresh)
                User.getting = p  # a t1 chunk's truth test runs in the call
                try:
                    p.get(k)
                finally:
                    User.getting = None
            elif how == "touch":
                p.touch(rng.sample(fresh, 4), None)
            elif how == "insert":
                p.insert(Key(100 + i), ready(0), None)
            elif how == "items":
                for _ in p.t1.items():
                    Act.point("between_steps")
            else:
                rng.choice(fresh) in p.t2  # noqa: B015 -- the read a callback runs inside
        except Exception as exc:
            COUNTS["in_call_exc_" + type(exc).__name__] += 1
        finally:
            Act.fn = None
            if threshold:
                gc.set_threshold(*old)
        COUNTS["in_call_rounds"] += 1
        self.check(f"in-call round {how}")
        try:
            p._check_invariants()
        except AssertionError as exc:
            fail(f"in-call round {how} on {type(p).__module__}: {exc}")
        except Exception as exc:
            COUNTS["check_exc_" + type(exc).__name__] += 1


# The policies' methods the keyword comparison calls.
KW_METHODS = [name for name in METHODS if name != "clear"] + ["__init__"]  # clear takes none


def _plain(value):
    """value with keys as their ids and chunks as their ref_cnt (the two
    policies hold chunks of their own), iterators read out."""
    if isinstance(value, Key):
        return ("key", value.kid)
    if isinstance(value, ChunkStatus):
        return ("chunk", value.ref_cnt)
    if isinstance(value, collections.abc.Iterator):
        value = list(itertools.islice(value, 50))
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def kid_state(p) -> tuple:
    return (
        [(k.kid, c.ref_cnt) for k, c in p.t1.items()],
        [(k.kid, c.ref_cnt) for k, c in p.t2.items()],
        [k.kid for k in p.b1],
        [k.kid for k in p.b2],
        p.target_t1_size,
        p.cache_capacity,
    )


def _safe_repr(obj) -> str:
    try:
        text = repr(obj)
    except Exception:
        text = f"<{type(obj).__name__}>"
    return text[:300]


def run_reflect(args, rng: random.Random) -> None:
    User.rng = random.Random(rng.randrange(2**32))
    rf = Reflector(rng)
    rounds, randoms = {"ci": (250, 1000), "long": (20000, 100000)}[args.profile]
    gc.callbacks.append(_gc_callback)
    if args.phase in ("top", "both"):
        rf.systematic()
        if not FAILURES:
            rf.random_calls(randoms)
        if not FAILURES:
            rf.keywords_agree(randoms // 5)
        if not FAILURES:
            rf.user_rounds(randoms // 10)
        if not FAILURES:
            rf.truth_rounds(randoms // 10)
    if args.phase in ("in-call", "both") and not FAILURES:
        for i in range(rounds):
            rf.in_call_round(i)
            if FAILURES:
                break
    gc.callbacks.remove(_gc_callback)

    def found_called() -> tuple[set, set]:
        found = {(o, n) for o, n in rf.surface.found() if not excluded(n)}
        return found, {k for k, v in rf.surface.called.items() if v}

    found, called = found_called()
    # The types found since, until a sweep finds no new one (each sweep's
    # calls may hand out a type not seen before: which ones depends on
    # hash order and on when the collector runs).
    for _ in range(8):
        if args.phase == "in-call" or FAILURES or found <= called:
            break
        rf.systematic()
        found, called = found_called()
    COUNTS["types"] = sum(isinstance(o, type) for o in rf.surface.owners)
    COUNTS["callables_found"] = len(found)
    COUNTS["callables_called"] = len(found & called)
    missing = sorted(found - called)
    if missing and args.phase != "in-call" and not FAILURES:
        fail(f"callables never called: {missing}")


# --- threads mode -----------------------------------------------------------


_HASHES = itertools.count()


class SlowKey(Key):
    """A Key whose __hash__ and __eq__ run a few bytecodes more: room for
    the interpreter to switch threads inside them. Every 16th hash also
    gives the GIL away (sleep(0)), so that another thread surely runs while
    a call is in the key's code: its mutators are refused however the
    switch interval happens to fall."""

    def __hash__(self) -> int:
        x = 0
        for _ in range(3):
            x += 1
        if next(_HASHES) % 16 == 0:
            time.sleep(0)
        return hash(self.kid)

    def __eq__(self, other: object) -> bool:
        x = 0
        for _ in range(3):
            x += 1
        if not isinstance(other, Key):
            return NotImplemented
        return self.kid == other.kid


class Dels:
    """What the threads' keys' and chunks' __del__ methods call: a mutator
    or a read on the policy, from whichever thread releases them, while
    the other threads call. It runs once the call that dropped it gave
    busy back (rule 6), so its mutators are refused only by another
    thread's call (rule 10). Its exceptions are those expected_thread_error
    allows."""

    policy = None
    impl = ""
    universe = 120
    capacity = 40
    errors: list[str] = []
    # per thread: depth (of __del__ calls), releasing (a clear() or __init__
    # runs: counted), collecting (a collection runs: it finalizes garbage
    # cycles in whatever call allocated)
    local = threading.local()
    rng = random.Random(0)

    @classmethod
    def run(cls, what: str) -> None:
        p = cls.policy
        if p is None:
            return
        tl = cls.local
        depth = getattr(tl, "depth", 0)
        if depth >= 2:  # (a __del__ released by a __del__'s clear() does nothing)
            COUNTS["del_deep"] += 1
            return
        op = cls.rng.choice(DEL_OPS)
        releasing = getattr(tl, "releasing", 0) and not getattr(tl, "collecting", False)
        tl.depth = depth + 1
        COUNTS[f"del_{what}"] += 1
        try:
            thread_op(p, op, cls.rng, cls.universe, plain=True)
        except BaseException as exc:
            if expected_thread_error(exc, op):
                COUNTS["del_refused" if is_refusal(exc) else "del_exc_" + type(exc).__name__] += 1
            elif len(cls.errors) < 20:
                cls.errors.append(f"{op} from a {what}'s __del__: {type(exc).__name__}: {exc}")
        else:
            if op in DEL_MUTATORS:
                COUNTS["del_mutator_accepted"] += 1
                if releasing:
                    COUNTS["del_accepted_in_release"] += 1
            else:
                COUNTS["del_read"] += 1
        finally:
            tl.depth = depth


def _threads_gc(phase: str, info: dict) -> None:
    Dels.local.collecting = phase == "start"


class SlowDelKey(SlowKey):
    """A SlowKey whose __del__ calls the policy (Dels)."""

    def __del__(self) -> None:
        Dels.run("key")


class DelChunk(ChunkStatus):
    """A chunk whose __del__ calls the policy (Dels)."""

    def __del__(self) -> None:
        Dels.run("chunk")


DEL_MUTATORS = ("insert", "remove", "touch", "evict", "clear", "__init__", "target")
DEL_OPS = (
    ["insert"] * 3
    + ["remove", "touch", "evict", "target", "clear", "__init__"]
    + ["get"] * 3
    + ["in", "getitem", "iter"]
)


class Overlaps:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: set[int] = set()

    def enter(self, tid: int) -> None:
        with self.lock:
            if self.active:
                COUNTS["overlaps"] += 1
            self.active.add(tid)

    def leave(self, tid: int) -> None:
        with self.lock:
            self.active.discard(tid)


THREAD_OPS = (
    ["insert"] * 6
    + ["get"] * 6
    + ["in"] * 3
    + ["getitem"] * 2
    + ["touch"] * 3
    + ["iter"] * 2
    + ["evict"] * 2
    + ["remove"] * 2
    + ["store_miss"]
    + ["clear"] * 2
    + ["__init__"]
    + ["finished"]
    + ["target"]
)


def thread_op(p, op: str, rng: random.Random, universe: int, plain: bool = False):
    """One call; unless plain, some keys and chunks are SlowDelKey and
    DelChunk, whose __del__ calls the policy."""
    if plain or rng.random() >= 0.25:
        k = SlowKey(rng.randrange(universe))
    else:
        k = SlowDelKey(rng.randrange(universe))
    if op == "insert":
        if plain or rng.random() >= 0.25:
            c = ready(0, rng.choice([0, 0, 1]))
        else:
            c = DelChunk(0)
            c.ref_cnt = rng.choice([0, 0, 1])
        return p.insert(k, c, None)
    if op in ("clear", "__init__"):
        # its release runs the __del__ of what it drops, in this thread
        tl = Dels.local
        tl.releasing = getattr(tl, "releasing", 0) + 1
        try:
            return p.clear() if op == "clear" else p.__init__(Dels.capacity)
        finally:
            tl.releasing -= 1
    if op == "get":
        return p.get(k)
    if op == "in":
        return k in getattr(p, rng.choice(["t1", "t2", "b1", "b2"]))
    if op == "getitem":
        return getattr(p, rng.choice(["t1", "t2"]))[k]
    if op == "touch":
        return p.touch([SlowKey(rng.randrange(universe)) for _ in range(3)], None)
    if op == "iter":
        return list(getattr(p, rng.choice(["t1", "t2", "b1", "b2"])).items())
    if op == "evict":
        return p.evict(rng.choice([1, 1, 2]), {k})
    if op == "remove":
        return p.remove(k)
    if op == "store_miss":
        return p.on_store_miss([k, SlowKey(rng.randrange(universe))], None)
    if op == "finished":
        return p.on_request_finished(((k,),), set(), {k}, ReqContext(req_id="t"))
    return setattr(p, "target_t1_size", rng.randrange(4))


def expected_thread_error(exc: BaseException, op: str) -> bool:
    if is_refusal(exc):
        return True
    if type(exc) is RuntimeError and str(exc) == MSG_MUTATED:
        return op == "iter"
    if type(exc) is KeyError:
        return op == "getitem"
    if type(exc) is ValueError:
        return op == "insert" and _msg_pattern(MSG_DUPLICATE).fullmatch(str(exc)) is not None
    return False


def run_threads(args, rng: random.Random) -> None:
    cls = IMPLS[args.impl]
    steps = {"ci": 30000, "long": 1000000}[args.profile]
    nthreads = 3
    # more entries than a node array's first 64 and a few table sizes: the
    # storage moves when the lists fill again after clear()
    universe = 120
    p = cls(Dels.capacity)
    ov = Overlaps()
    errors: list[str] = []
    Dels.policy, Dels.impl, Dels.errors = p, args.impl, []
    Dels.rng = random.Random(rng.randrange(2**32))

    def worker(tid: int, seed: int) -> None:
        r = random.Random(seed)
        for _ in range(steps):
            op = r.choice(THREAD_OPS)
            ov.enter(tid)
            try:
                thread_op(p, op, r, universe)
                COUNTS["calls_ok"] += 1
            except BaseException as exc:
                if expected_thread_error(exc, op):
                    COUNTS["refused" if is_refusal(exc) else "exc_" + type(exc).__name__] += 1
                elif len(errors) < 20:
                    errors.append(f"{op}: {type(exc).__name__}: {exc}")
            finally:
                ov.leave(tid)
            COUNTS["calls"] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    gc.callbacks.append(_threads_gc)
    threads = [
        threading.Thread(target=worker, args=(t, rng.randrange(2**32))) for t in range(nthreads)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
        gc.callbacks.remove(_threads_gc)
    try:
        p._check_invariants()
        p.insert(SlowKey(10**6), ready(0), None)
        p.evict(1, set())
        p.clear()  # (its release runs the __del__ of the keys left: accepted)
        p._check_invariants()
        p.insert(SlowKey(10**6), ready(0), None)
        p._check_invariants()
    except Exception as exc:
        fail(f"{args.impl}: after the threads, the policy fails: {exc!r}")
    finally:
        Dels.policy = None
    for e in errors:
        fail(f"{args.impl}: undocumented exception from a thread: {e}")
    for e in Dels.errors:
        fail(f"{args.impl}: {e}")


# --- hooks mode -------------------------------------------------------------


def _finally_lines(path: str) -> set[int]:
    """Lines of the finally clauses of the file at path."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    lines: set[int] = set()
    for node in ast.walk(tree):
        for stmt in getattr(node, "finalbody", []):
            lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


# arc_cy's Python code that runs in the core's calls, by the file names its
# code objects carry
IMPL_PATHS = frozenset(m.__file__ for m in (arguments, chunks, views))
FINALLY = {path: _finally_lines(path) for path in IMPL_PATHS}


class DelKey(Key):
    """A Key whose __del__ is Python code that calls the policy back: the
    call that releases it runs it once busy is given back (rule 6). Hooks
    fire in it."""

    def __del__(self) -> None:
        Hooks.del_point()


KEY_CODE = {Key.__hash__.__code__, Key.__eq__.__code__}
DEL_CODE = {DelKey.__del__.__code__}
USER_CODE = KEY_CODE | DEL_CODE | {Protected.__contains__.__code__}


def in_finally(frame) -> bool:
    """Whether arc_cy's Python code is running a finally clause, in frame or
    a caller (a call it makes there, or a C function it calls)."""
    while frame is not None:
        lines = FINALLY.get(frame.f_code.co_filename)
        if lines is not None and frame.f_lineno in lines:
            return True
        frame = frame.f_back
    return False


class Hooks:
    """The trace, profile and signal hooks, and what they do in a call."""

    policy = None
    impl = ""
    mutating = False  # the call running is a mutator (re-entered mutators must be refused)
    on = False
    in_action = False
    in_del = False  # a DelKey's __del__ is calling back
    collecting = 0  # a collection runs (it may finalize a DelKey in any call)
    finally_ok = False  # this step's hooks may raise in arc_cy's finally clauses
    raised_at = ""  # where the step's last hook raised
    rng = random.Random(0)

    @classmethod
    def where(cls, frame) -> str | None:
        """ "user" (the caller's objects), "impl" (arc_cy's Python code) or
        None (the fuzzer: hooks leave it alone)."""
        if frame is None:
            return None
        code = frame.f_code
        if code in USER_CODE:
            return "user"
        return "impl" if code.co_filename in IMPL_PATHS else None

    @classmethod
    def fire(cls, frame, source: str, prob: float) -> None:
        if not cls.on or cls.in_action:
            return
        where = cls.where(frame)
        if where is None:
            return
        COUNTS[f"{source}_events"] += 1
        fin = in_finally(frame)
        if fin and not cls.finally_ok:
            return
        # (a finally clause is a few lines: hooks fire there more often)
        if cls.rng.random() >= (4 * prob if fin else prob):
            return
        cls.in_action = True
        try:
            COUNTS[f"{source}_fired"] += 1
            if fin:
                COUNTS["fired_in_finally"] += 1
            if HookRun.running in ("__init__", "clear"):
                COUNTS[f"fired_in_{HookRun.running.strip('_')}"] += 1
            r = cls.rng.random()
            if r < 0.5:
                COUNTS["hook_raised"] += 1
                if fin:
                    COUNTS["raised_in_finally"] += 1
                code = frame.f_code
                cls.raised_at = (
                    f"{source} hook in {code.co_name} "
                    f"({os.path.basename(code.co_filename)}:{frame.f_lineno})"
                )
                if cls.rng.random() < 0.3:
                    # a BaseException, as a real SIGINT raises it
                    COUNTS["hook_raised_interrupt"] += 1
                    raise KeyboardInterrupt("hook")
                raise HostileError("hook")
            # (in a DelKey's __del__ itself no call runs: a mutator would be
            # accepted, and change the state the reference is compared with)
            if r < 0.75 and cls.mutating and where == "user" and frame.f_code not in DEL_CODE:
                cls.reenter_mutator()
            else:
                cls.reenter_read()
        finally:
            cls.in_action = False

    @classmethod
    def del_point(cls) -> None:
        """A DelKey's __del__: a call that changes nothing (a mutator or a
        read), which hooks may cut short. A policy releases what it drops
        once busy is given back: the mutator is accepted."""
        p = cls.policy
        if not cls.on or cls.in_action or cls.in_del or p is None:
            return
        cls.in_del = True
        saved = cls.raised_at
        # refused: what the collector finalizes (a DelKey in a garbage cycle
        # of frames and exceptions) runs in whatever call allocated
        may_refuse = cls.collecting
        cls.raised_at = ""
        COUNTS["del_calls"] += 1
        name = cls.rng.choice(["evict", "remove", "touch", "store_miss", "target", "get", "in"])
        absent = Key(10**6)
        try:
            if name == "evict":
                p.evict(0, set())
            elif name == "remove":
                p.remove(absent)
            elif name == "touch":
                p.touch([absent], None)
            elif name == "store_miss":
                p.on_store_miss([absent], None)
            elif name == "target":
                p.target_t1_size = p.target_t1_size
            elif name == "get":
                p.get(absent)
            else:
                absent in p.b1  # noqa: B015 -- a read, for its effect on the policy
        except RuntimeError as exc:
            if is_refusal(exc) and name not in ("get", "in"):
                COUNTS["del_refused_in_gc" if cls.collecting else "del_refused"] += 1
                if not may_refuse:
                    fail(f"hooks: {name}() from a key's __del__ was refused: {exc}")
            elif not cls.raised_at:
                fail(f"hooks: {name}() from a key's __del__ failed with {exc!r}")
        except HOOK_ERRORS:
            COUNTS["del_call_hook_raised"] += 1
        except Exception as exc:
            if not cls.raised_at:  # (a hook raised in a key's code: KeyError)
                fail(f"hooks: {name}() from a key's __del__ failed with {exc!r}")
        else:
            COUNTS["del_read" if name in ("get", "in") else "del_accepted"] += 1
            if HookRun.running in ("__init__", "clear"):
                COUNTS["del_in_release"] += 1
        finally:
            cls.in_del = False
            cls.raised_at = saved

    @classmethod
    def reenter_mutator(cls) -> None:
        p = cls.policy
        name = cls.rng.choice(["insert", "evict", "clear", "touch", "__init__"])
        try:
            if name == "insert":
                p.insert(Key(999), ready(0), None)
            elif name == "evict":
                p.evict(1, set())
            elif name == "clear":
                p.clear()
            elif name == "touch":
                p.touch([Key(0)], None)
            else:
                p.__init__(p.cache_capacity)
        except RuntimeError as exc:
            if is_refusal(exc):
                COUNTS["reentry_refused"] += 1
                return
            fail(f"hooks: re-entered {name}() failed with {exc!r}, not a refusal")
        except Exception as exc:
            fail(f"hooks: re-entered {name}() failed with {exc!r}, not a refusal")
        else:
            fail(f"hooks: re-entered {name}() was accepted while a call runs")

    @classmethod
    def reenter_read(cls) -> None:
        p = cls.policy
        try:
            p.get(Key(cls.rng.randrange(12)))
            Key(cls.rng.randrange(12)) in p.t1  # noqa: B015 -- a read, for its effect on the policy
            COUNTS["reentry_read"] += 1
        except RuntimeError as exc:
            if is_refusal(exc):
                COUNTS["reentry_read_refused"] += 1
            else:
                fail(f"hooks: re-entered read failed with {exc!r}")
        except Exception as exc:
            fail(f"hooks: re-entered read failed with {exc!r}")


def _trace(frame, event, arg):
    if Hooks.where(frame) is None:
        return None
    Hooks.fire(frame, "trace", 0.04)
    return _trace_local


def _trace_local(frame, event, arg):
    Hooks.fire(frame, "trace", 0.04)
    return _trace_local


def _profile(frame, event, arg):
    Hooks.fire(frame, "profile", 0.04)


def _alarm(signum, frame):
    # (a handler runs inside a handler too: the next one waits instead)
    if not Hooks.in_action:
        Hooks.fire(frame, "signal", 0.5)


def _hooks_gc(phase: str, info: dict) -> None:
    Hooks.collecting += 1 if phase == "start" else -1


def _unraisable(info) -> None:
    exc = info.exc_value
    if isinstance(exc, HOOK_ERRORS):
        COUNTS["unraisable_" + type(exc).__name__] += 1
    else:
        fail(f"hooks: {exc!r} raised where Python cannot pass it on ({info.object!r})")


def state(p) -> tuple:
    lists = p._v if hasattr(p, "_v") else p
    return (
        [(k.kid, id(c)) for k, c in lists.t1.items()],
        [(k.kid, id(c)) for k, c in lists.t2.items()],
        [k.kid for k in lists.b1],
        [k.kid for k in lists.b2],
        lists.target_t1_size,
        lists.cache_capacity,  # (__init__ again may change only it)
    )


def outcome_of(value) -> tuple:
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return ("ok", [(k.kid, id(c)) for k, c in value])
    if isinstance(value, ChunkStatus):
        return ("ok", id(value))
    return ("ok", value)


class HookRun:
    CAPACITY = 6
    UNIVERSE = 12
    running = ""  # the step's call while it runs on the policy under test

    def __init__(self, impl: str, rng: random.Random) -> None:
        self.rng = rng
        self.cls = IMPLS[impl]
        from hostile_fuzz import Oracle  # vLLM's ARC (or the twin) with arc_cy's divergences

        self.ref_cls = Oracle
        self.impl = impl
        Hooks.impl = impl
        self.start_over()

    def start_over(self) -> None:
        self.p = self.cls(self.CAPACITY)
        self.ref = self.ref_cls(self.CAPACITY)
        Hooks.policy = self.p

    def op(self):
        """(name, mutating, fn): one call, made the same way on both."""
        rng = self.rng
        u = self.UNIVERSE

        def keys(n):
            return [Key(rng.randrange(u)) for _ in range(n)]

        resident = len(self.p.t1) + len(self.p.t2)
        kind = rng.choice(
            ["insert"] * 5
            + ["touch"] * 3
            + ["evict"] * 3
            + [
                "store_miss",
                "store_miss",
                "finished",
                "remove",
                "target",
                "clear",
                "__init__",
                "get",
                "in",
                "getitem",
                "iter",
            ]
        )
        if kind == "insert":
            kid, c = rng.randrange(u), ready(0, rng.choice([0, 0, 0, -1, 1]))
            if resident >= self.p.cache_capacity:
                return self.evict_op(1)
            if rng.random() < 0.5:
                # a key of each policy's own, which it alone holds: released
                # (its __del__ run) when the policy drops it
                return kind, True, lambda p: p.insert(DelKey(kid), c, None)
            k = Key(kid)
            return kind, True, lambda p: p.insert(k, c, None)
        if kind == "touch":
            ks = keys(rng.randrange(1, 4))
            return kind, True, lambda p: p.touch(list(ks), None)
        if kind == "evict":
            return self.evict_op(rng.randrange(0, resident + 1))
        if kind == "store_miss":
            ks = keys(rng.randrange(1, 4))
            return kind, True, lambda p: p.on_store_miss(list(ks), None)
        if kind == "finished":
            ks = keys(3)
            ins, reu = {ks[0]}, {ks[1], ks[2]}
            ctx = ReqContext(req_id="h")
            return kind, True, lambda p: p.on_request_finished((tuple(ks),), ins, reu, ctx)
        if kind == "remove":
            k = Key(rng.randrange(u))
            return kind, True, lambda p: p.remove(k)
        if kind == "target":
            t = rng.choice([0, 1, 2, 3, 1.5, 4.0])
            return kind, True, lambda p: setattr(p, "target_t1_size", t)
        if kind == "clear":
            if rng.random() < 0.7:
                return self.evict_op(1)
            return kind, True, lambda p: p.clear()
        if kind == "__init__":
            # called again on a live policy: its release runs key's __del__
            cap = rng.choice([self.CAPACITY] * 3 + [4, 8])
            return kind, True, lambda p: p.__init__(cap)
        k = Key(rng.randrange(u))
        if kind == "get":
            return kind, False, lambda p: p.get(k)
        if kind == "in":
            return kind, False, lambda p: k in p.b1
        if kind == "getitem":
            return kind, False, lambda p: p.t1[k]
        return kind, False, lambda p: [x.kid for x in p.t2]

    def evict_op(self, n: int):
        prot = Protected(Key(self.rng.randrange(self.UNIVERSE)) for _ in range(2))
        return "evict", True, lambda p: p.evict(n, prot)

    def call_hooked(self, name: str, fn, use: str):
        Hooks.raised_at = ""
        Hooks.on = True
        HookRun.running = name
        if use == "trace":
            sys.settrace(_trace)
        elif use == "profile":
            sys.setprofile(_profile)
        try:
            return ("ok", fn(self.p))
        except BaseException as exc:  # KeyboardInterrupt too
            return ("raised", exc)
        finally:
            Hooks.on = False
            HookRun.running = ""
            sys.settrace(None)
            sys.setprofile(None)

    def works(self) -> str | None:
        """Why the policy does not work after a step (None: it does). Not
        busy, one set of lists (what insert() puts in, get() and the view
        find; the twin once kept two t1s), and mutators accepted. Changes
        nothing: the key is one no step uses."""
        p = self.p
        k, c = Key(-1), ready(0)
        try:
            p.evict(0, set())
            p.insert(k, c, None)
            if p.get(k) is not c or k not in p.t1 or p.t1[k] is not c:
                return "insert() put the key where get() or t1 does not find it"
            p.remove(k)
            if p.get(k) is not None or k in p.t1:
                return "remove() left the key where get() or t1 finds it"
        except BaseException as exc:
            return f"a mutator failed: {exc!r}"
        return None

    def step(self) -> None:
        name, mutating, fn = self.op()
        Hooks.mutating = mutating
        use = self.rng.choice(["trace", "profile", "signal"])
        Hooks.finally_ok = self.rng.random() < 0.3
        before = state(self.ref)
        got = self.call_hooked(name, fn, use)
        COUNTS["steps"] += 1
        COUNTS[f"steps_{use}"] += 1
        COUNTS[f"steps_{name}"] += 1
        if Hooks.finally_ok:
            COUNTS["steps_finally"] += 1
        try:
            self.p._check_invariants()
        except BaseException as exc:
            fail(
                f"{self.impl}: after {name} ({use}, {got[0]}, raised by the "
                f"{Hooks.raised_at or '?'}): {exc!r}"
            )
            return
        now = state(self.p)
        broken = self.works()
        if broken:
            fail(
                f"{self.impl}: after {name} ({use}, {got[0]}, raised by the "
                f"{Hooks.raised_at or '?'}): {broken}"
            )
            return
        COUNTS["works_after"] += 1
        hooked = got[0] == "raised" and isinstance(got[1], HOOK_ERRORS)
        if hooked and isinstance(got[1], KeyboardInterrupt):
            COUNTS["step_interrupted"] += 1
        if hooked:
            if now == before:
                COUNTS["raised_unchanged"] += 1
                return
        try:
            want = ("ok", fn(self.ref))
        except Exception as exc:
            want = ("raised", exc)
        if hooked:
            if now == state(self.ref):
                COUNTS["raised_after_done"] += 1
                return
            fail(
                f"{self.impl}: {name} raised {got[1]!r} from a {use} hook and changed the "
                f"state: before {before}, after {now}"
            )
            return
        if got[0] == "ok":
            COUNTS["calls_ok"] += 1
            g, w = outcome_of(got[1]), (outcome_of(want[1]) if want[0] == "ok" else want)
        else:
            g = ("raised", type(got[1]).__name__, str(got[1]))
            w = ("raised", type(want[1]).__name__, str(want[1])) if want[0] == "raised" else want
        if g != w:
            where = ""
            if got[0] == "raised":
                where = "\n" + "".join(traceback.format_exception(got[1], limit=-8))
            fail(f"{self.impl}: {name} ({use}): got {g}, the reference {w}{where}")
        elif now != state(self.ref):
            fail(f"{self.impl}: {name} ({use}): state {now}, the reference {state(self.ref)}")
        else:
            COUNTS["compared"] += 1


def run_hooks(args, rng: random.Random) -> None:
    steps = {"ci": 5000, "long": 200000}[args.profile]
    Hooks.rng = random.Random(rng.randrange(2**32))
    run = HookRun(args.impl, rng)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, 1e-4, 1e-4)
    # What Python cannot pass on (a hook's error in a __del__ or in a
    # generator closed as its frame goes) is counted; anything else fails.
    unraisable, sys.unraisablehook = sys.unraisablehook, _unraisable
    gc.callbacks.append(_hooks_gc)
    try:
        for _ in range(steps):
            run.step()
            if FAILURES:
                break
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        sys.unraisablehook = unraisable
        gc.callbacks.remove(_hooks_gc)
        Hooks.policy = None
    try:
        run.p.insert(Key(10**6), ready(0), None)
        run.p.evict(1, set())
        run.p._check_invariants()
    except Exception as exc:
        fail(f"{args.impl}: after the hooks, the policy fails: {exc!r}")


RUNNERS = {"reflect": run_reflect, "threads": run_threads, "hooks": run_hooks}
# --mode all: every mode in one process (one import of vLLM, which is most
# of a run under ASan); the threads and hooks first, on a clean interpreter.
ALL = [("threads", "cython"), ("hooks", "cython"), ("reflect", "cython")]


def main(argv=None) -> int:
    global COUNTS, FAILURES
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=[*RUNNERS, "all"], required=True)
    ap.add_argument("--impl", choices=list(IMPLS), default="cython")
    ap.add_argument("--profile", choices=["ci", "long"], default="ci")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--phase", choices=["top", "in-call", "both"], default="both")
    ap.add_argument("--last-call", default=None)
    ap.add_argument("--exclude", default="")
    args = ap.parse_args(argv)
    EXCLUDE.update(x for x in args.exclude.split(",") if x)
    seed = seed_run("surface_fuzz", args, 25)
    LastCall.open(args.last_call)
    gc.collect()
    gc.freeze()  # what the imports made: collections stay cheap
    runs = ALL if args.mode == "all" else [(args.mode, args.impl)]
    failed = []
    for mode, impl in runs:
        COUNTS, FAILURES = Counter(), []
        args.impl = impl
        name = f"{mode}-{impl}" if mode != "reflect" else mode
        print(f"surface_fuzz: {name}", file=sys.stderr, flush=True)
        start, cpu = time.monotonic(), time.process_time()
        RUNNERS[mode](args, random.Random(f"{seed}-{name}"))
        counts = dict(sorted(COUNTS.items()))
        counts["seconds"] = round(time.monotonic() - start, 1)
        counts["cpu_seconds"] = round(time.process_time() - cpu, 1)
        counts["seed"] = seed
        if EXCLUDE:
            counts["excluded"] = sorted(EXCLUDE)
        if FAILURES:
            print(f"FAILED {name}", flush=True)
        else:
            # one line per run: a crash in a later run leaves this one's
            print(f"COVERAGE {name} " + json.dumps(counts), flush=True)
        failed += [f"{name}: {f}" for f in FAILURES]
    if failed:
        print(
            f"surface_fuzz: FAILED ({len(failed)} failures, seed {seed})",
            file=sys.stderr,
            flush=True,
        )
    sys.stderr.flush()
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()
