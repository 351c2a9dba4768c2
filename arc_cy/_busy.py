"""The twin's busy protocol and argument checks, stated once
(docs/hardening.md, rule 2).

``protocol()`` is a class decorator, as ``dataclasses.dataclass`` is: for
each method it is given, it writes the text of a wrapper from one template
(``_TEMPLATE``), compiles it once under a file name of its own in this
package, registered with ``linecache`` (tracebacks and ``inspect.getsource``
show it), and puts the wrapper in the class in the method's place. The
method itself, the algorithm as vLLM's ``arc.py`` writes it, is what the
wrapper calls; it is left nowhere else. A wrapper has the method's name,
qualified name, docstring, defaults and annotations, and no ``__wrapped__``.

A wrapper, in order:

- ``before(self)``, where the method has one (``__init__``: the vLLM guard,
  and busy's dict for a policy made by ``object.__new__``): the busy dict;
- a token for the call, ``[name, slot]`` (``_Call``), a new list per call;
- inside the try whose finally gives busy back: busy taken in one atomic
  step (``dict.setdefault``), or ``_begin`` when another call runs (a
  mutator is refused, a read nests without it, a call nested in a
  releasing ``clear()`` or ``__init__`` of its thread takes the release's
  own slot);
- the argument checks, each ``arg = check(arg)``;
- for a release (``clear()``, ``__init__``): the token marked as releasing
  in this thread, with its own slot, before anything is released;
- the method. One that drops objects returns ``(result, released)``:
  ``released`` is held by the wrapper and so released after busy is given
  back (rule 6), and the method's own locals (the lists it read) are gone
  before it;
- busy given back: one ``del`` of the slot the call holds, after a check
  that makes no call (so neither a profile hook nor a signal handler,
  which CPython runs only at calls, function entries and backward jumps,
  can come between), in the finally and again in an outer finally (a
  trace hook that raised at the first one's line is unset by the second).

This is why the wrapper is text and not a decorator's closure: the
give-back must be written out in the wrapper's own finally, with no call
between its check and its ``del`` (a helper called there was a function
of three lines, in which a hook that raised left busy taken for good).
"""

from __future__ import annotations

import inspect
import linecache
import os
import types
from _thread import get_ident
from collections.abc import Callable
from typing import Any, TypeVar

from ._base import CachePolicy
from ._messages import MSG_REENTRANT

__all__ = ["Busy", "Method", "busy_slot", "idle", "protocol"]

# A running call's token, what busy holds: a list, a new object for every
# call (so only the call that took busy gives it back) and the cheapest one
# Python makes: [name, slot], slot being the dict whose "_busy" the call
# takes, the policy's own (its `_busy` slot) or, nested in a release, the
# release's own. While clear() or __init__ releases, two more items follow:
# its thread's ident and its own slot, for the calls that nest in it.
_Call = list[Any]


class Busy(CachePolicy):
    """Where the twin's busy lives: the call now running while it may run
    user code (hashing, protected.__contains__, req_context, a collection),
    a _Call under "_busy" in a dict of the policy's own, absent when none
    runs. That dict is a __slots__ member (a descriptor on this class), not
    an instance-dict key: reading busy never hashes or compares a key that
    user code put in the instance's __dict__ (a key whose hash was
    "_busy"'s once ran its __eq__ in the give-back's check,
    docs/hardening.md rule 2). Every policy gets its dict when it is made."""

    __slots__ = ("_busy",)
    _busy: dict[str, _Call]

    def __new__(cls, *args: Any, **kwargs: Any) -> Busy:
        self = super().__new__(cls)
        self._busy = _new_slot()
        return self


def _new_slot() -> dict[str, _Call]:
    """An empty busy dict that already has its table: taking busy stores
    into that table, never into a dict that has none. CPython 3.13.0 gets
    that first store wrong when its allocation fails (the faults fuzzer's
    nomem mode crashed, or saw an exception set under a result, on every
    seed); 3.11 and 3.12 do not."""
    slot: dict[str, _Call] = {"_busy": []}
    del slot["_busy"]
    return slot


# The slot itself: read and written past any subclass's attribute access,
# and only on the twin's policies (TypeError for any other object).
_BUSY_SLOT: Any = Busy.__dict__["_busy"]


def _begin(call: _Call, read: bool = False) -> None:
    """Take busy for call in its slot (call[1]), inside the try whose
    finally gives it back; while another call runs, in any thread, a
    mutator is refused and a read nests without it, unless that call is a
    clear() or __init__ releasing in this thread (a __del__ calls back):
    then call takes busy in the release's own slot, which it names in
    call[1] first. Each step is one store, and the finally gives back only
    what call holds, so a hook that raises between two steps leaves
    nothing taken. A function, not a method: a method called through the
    class on another object must not dispatch its release to that object
    (which may lack it, and leave busy taken)."""
    running = call[1].setdefault("_busy", call)  # one atomic step
    while running is not call:
        if len(running) > 2 and running[2] == get_ident():
            call[1] = running[3]
            running = call[1].setdefault("_busy", call)
        elif read:
            return
        else:
            raise RuntimeError(MSG_REENTRANT.format(call[0], _innermost(running)[0]))


def busy_slot(policy: Any) -> dict[str, _Call]:
    """The policy's busy dict, made if it has none (a policy made by
    object.__new__, or cleared by the collector): for __init__ and
    __setstate__. Another object is refused (TypeError), and left as it
    was."""
    try:
        return _BUSY_SLOT.__get__(policy)  # type: ignore[no-any-return]
    except AttributeError:
        slot = _new_slot()
        _BUSY_SLOT.__set__(policy, slot)
        return slot


def idle(policy: Any) -> dict[str, _Call]:
    """_check_invariants()'s first step, before it takes busy: no call
    holds it (one that did would be a call a hook left busy)."""
    slot: dict[str, _Call] = policy._busy
    running = slot.get("_busy")
    assert running is None, f"{running[0]}() did not finish"
    return slot


def _innermost(running: _Call) -> _Call:
    """The call running in running's release, if one nests there, and so
    on: the call whose name a refusal gives, as the core's busy does."""
    while len(running) > 2:
        # one step: another thread's call may give back between a test
        # and a read (rule 10)
        inner = running[3].get("_busy")
        if inner is None:
            break
        running = inner
    return running


class Method:
    """How a method runs under busy: ``read`` (takes busy only when it is
    free, never refused; its token is named get(), as the core names every
    read in a refusal), ``releases`` (clear() and __init__: keeps busy
    while it releases what it drops, rule 6), ``drops`` (returns
    ``(result, released)``), ``before`` (run first, outside busy; returns
    the busy dict), and ``checks``, each argument's check, in order."""

    def __init__(
        self,
        *,
        read: bool = False,
        releases: bool = False,
        drops: bool = False,
        before: Callable[[Any], dict[str, _Call]] | None = None,
        **checks: Callable[[Any], Any],
    ) -> None:
        self.read, self.releases, self.drops = read, releases, drops
        self.before, self.checks = before, checks


# The one text of every wrapper. The give-back lines are written out twice
# and must stay as they are: a check that makes no call, then one `del`.
_TEMPLATE = """\
def {name}({params}):
    call = ["{token}", {slot}]
    try:
        try:
            if call[1].setdefault("_busy", call) is not call:
                _begin(call, {read})
{checks}{body}
        finally:
            if "_busy" in call[1] and call[1]["_busy"] is call:
                del call[1]["_busy"]
    finally:
        if "_busy" in call[1] and call[1]["_busy"] is call:
            del call[1]["_busy"]
"""
_RELEASES = "            call += (_get_ident(), _new_slot())  # from here it only releases\n"
_CALL = "            return _method({args})"
_DROPS = "            result, released = _method({args})\n            return result"

_T = TypeVar("_T", bound=type)


def protocol(**methods: Method) -> Callable[[_T], _T]:
    """Class decorator: each named method (a property's setter, for a
    property) replaced by its wrapper, generated from _TEMPLATE."""

    def wrap(cls: _T) -> _T:
        filename = os.path.join(
            os.path.dirname(__file__), f"<busy protocol of {cls.__module__}.{cls.__qualname__}>"
        )
        texts, spaces = [], {}
        line = 1
        for name, how in methods.items():
            attr = cls.__dict__[name]
            method = attr.fset if isinstance(attr, property) else attr
            text, space = _wrapper_text(name, method, how)
            texts.append(text)
            spaces[name] = (space, line)
            line += text.count("\n") + 1
        source = "\n".join(texts)
        GENERATED[filename] = source
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        code = compile(source, filename, "exec")
        for const in code.co_consts:
            if not hasattr(const, "co_name"):
                continue
            name = const.co_name
            space, first = spaces[name]
            assert const.co_firstlineno == first, (name, const.co_firstlineno, first)
            attr = cls.__dict__[name]
            method = attr.fset if isinstance(attr, property) else attr
            qualname = f"{cls.__qualname__}.{name}"
            fn = types.FunctionType(const.replace(co_qualname=qualname), space, name)
            fn.__qualname__ = qualname
            fn.__module__ = method.__module__
            fn.__doc__ = method.__doc__
            fn.__defaults__ = method.__defaults__
            fn.__kwdefaults__ = method.__kwdefaults__
            fn.__annotations__ = dict(method.__annotations__)
            if isinstance(attr, property):
                fn = property(attr.fget, fn, attr.fdel, attr.__doc__)
                fn.__set_name__(cls, name)  # its name, in Python's own messages
            setattr(cls, name, fn)
        return cls

    return wrap


# file name -> text of every wrapper generated (linecache holds them too,
# until something clears it): for the tests that read the wrappers' lines
GENERATED: dict[str, str] = {}


def _wrapper_text(name: str, method: Any, how: Method) -> tuple[str, dict[str, Any]]:
    """The wrapper's text and the globals it runs with."""
    params, args = [], []
    for p in inspect.signature(method).parameters.values():
        if p.kind is p.POSITIONAL_OR_KEYWORD:
            params.append(p.name)
            args.append(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            params.append("*" + p.name)
            args.append("*" + p.name)
        else:  # not needed by the twin: keep the template simple
            raise TypeError(f"{name}: parameter {p} is not supported")
    unknown = set(how.checks) - set(params)
    assert not unknown, (name, unknown)
    space: dict[str, Any] = {
        "__name__": method.__module__,
        "__builtins__": __builtins__,
        "_begin": _begin,
        "_get_ident": get_ident,
        "_method": method,
        "_new_slot": _new_slot,
    }
    checks = ""
    for arg, check in how.checks.items():
        space[f"_check_{arg}"] = check
        checks += f"            {arg} = _check_{arg}({arg})\n"
    if how.releases:
        checks += _RELEASES
    slot = "self._busy"
    if how.before is not None:
        space["_before"] = how.before
        slot = "_before(self)"
    body = (_DROPS if how.drops else _CALL).format(args=", ".join(args))
    text = _TEMPLATE.format(
        name=name,
        token="get" if how.read else name,
        params=", ".join(params),
        slot=slot,
        read=how.read,
        checks=checks,
        body=body,
    )
    return text, space
