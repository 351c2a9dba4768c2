"""Calls every method and property of every type the compiled module
defines (and of the view iterators its policies hand out) on objects of
other types: an `object()`, a list, a policy of the twin. None may crash.
A method of a type the module defines must refuse the object with
TypeError (a method descriptor checks its object's type). Methods of the
shared Python helpers (ListView) are plain functions, which Python lets
take any object. Prints JSON: the calls made, by where the method is
defined and outcome, after checking the policies are intact.

Usage: python -P wrong_self.py cython [--no-vllm]
"""

from __future__ import annotations

import collections
import importlib
import json
import sys

from _child import K, policy_class, ready

impl = sys.argv[1]
module = importlib.import_module(policy_class(impl).__module__)
other = policy_class("python")(4)
policy = policy_class(impl)(4)
policy.insert(K(1), ready(1))
own = [module]
types = {
    v for m in own for v in vars(m).values() if isinstance(v, type) and v.__module__ == m.__name__
}
types |= {type(iter(policy.t1)), type(iter(policy.t1.items())), type(policy.t1)}
receivers = [object(), [], other]
outcomes: collections.Counter[str] = collections.Counter()
for cls in sorted(types, key=lambda t: t.__qualname__):
    where = "own" if cls.__module__ in {m.__name__ for m in own} else "shared"
    for name, attr in vars(cls).items():
        if name in ("__new__", "__init_subclass__", "__subclasshook__", "__class_getitem__"):
            continue  # class-level: they take the class, not an instance
        if isinstance(attr, (staticmethod, classmethod)):
            continue
        calls = []
        if hasattr(attr, "__set__"):  # properties and getset descriptors
            calls = [
                lambda r, a=attr, c=cls: a.__get__(r, c),
                lambda r, a=attr: a.__set__(r, 1),
                lambda r, a=attr: a.__delete__(r) if hasattr(a, "__delete__") else a(r),
            ]
        elif callable(attr):
            calls = [
                lambda r, a=attr: a(r),
                lambda r, a=attr: a(r, K(1)),
                lambda r, a=attr: a(r, 1, set()),
            ]
        for receiver in receivers:
            if isinstance(receiver, cls):
                continue
            for call in calls:
                try:
                    call(receiver)
                    outcomes[f"{where} returned"] += 1
                except (TypeError, AttributeError) as e:
                    outcomes[f"{where} {type(e).__name__}"] += 1
policy._check_invariants()
other._check_invariants()
assert policy.get(K(1)) is not None
other.insert(K(2), ready(2))  # the twin is not left running a call
print(json.dumps({"types": len(types), **outcomes}))
