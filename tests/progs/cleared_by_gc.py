"""Objects the garbage collector has cleared, used by a finalizer later in
the same collection: a policy and an iterator over its t1, both held only
by a garbage list. The collector clears them (tp_clear) before the list;
clearing the list then releases an object that a finalizer made during
the collection, so its __del__ runs then, finds the two cleared objects
with gc.get_objects() and uses them. Prints, as JSON, what it found and
what each use gave.

    PYTHONPATH=tests/progs:tests python -P tests/progs/cleared_by_gc.py cython|python
    (tests/childproc.py sets that path)
"""

import gc
import json
import sys

from _child import K, policy_class, ready

cls = policy_class(sys.argv[1])
found = {}


def outcome(fn):
    try:
        return ["returned", repr(fn())]
    except Exception as exc:  # what it raises is the answer
        return ["raised", type(exc).__name__, str(exc)]


class Late:
    """Made by a finalizer while the collection runs, so it was never
    finalized: its __del__ runs when the garbage list lets go of it, after
    the policy and the iterator were cleared."""

    def __del__(self):
        by_id = {id(obj): obj for obj in gc.get_objects()}
        policy, it = by_id.get(found["policy_id"]), by_id.get(found["iter_id"])
        found["seen"] = [policy is not None, it is not None]
        if it is not None:
            found["iter refers to its policy"] = any(r is policy for r in gc.get_referents(it))
            found["next"] = outcome(lambda: next(it))
        if policy is not None:
            found["cache_capacity"] = outcome(lambda: policy.cache_capacity)
            found["target_t1_size"] = outcome(lambda: policy.target_t1_size)
            found["get"] = outcome(lambda: policy.get(K(1)))
            found["insert"] = outcome(lambda: policy.insert(K(50), ready(50), None))
            found["evict"] = outcome(lambda: len(policy.evict(1, set())))
            found["t1"] = outcome(lambda: [k.decode() for k in policy.t1])
            found["check"] = outcome(policy._check_invariants)


class Adder:
    """A garbage object whose finalizer puts a Late in the garbage list."""

    def __init__(self, garbage):
        self.garbage = garbage

    def __del__(self):
        self.garbage.append(Late())


gc.disable()
policy = cls(8)
for i in range(4):
    policy.insert(K(i), ready(i), None)
garbage = [policy]
garbage.append(garbage)  # a cycle only the list's own clear breaks
garbage.append(Adder(garbage))
# A full collection clears generation 0, then 1 (gc_list_merge order): the
# iterator, made now, comes first, then the policy and the list, older.
gc.collect(0)
it = iter(policy.t1.items())
next(it)
garbage.insert(0, it)
found["policy_id"], found["iter_id"] = id(policy), id(it)
del policy, it, garbage
gc.collect()
gc.enable()
assert "seen" in found, "the late finalizer never ran"
del found["policy_id"], found["iter_id"]
print(json.dumps(found))
