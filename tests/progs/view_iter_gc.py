"""Iterate a view while a collection, started by the pair the iterator
makes, changes the policy: from a gc.callbacks hook or from the __del__ of
a garbage cycle, in the implementation named first on the command line.
Prints what the view held before, what the iteration gave and how it
ended."""

import gc
import json
import sys

from _child import K, policy_class, ready

impl, view, source, *hows = sys.argv[1:]
ARMED = False
fired = []


def trial(how):
    policy = policy_class(impl)(64)
    for i in range(40):
        policy.insert(K(i), ready(i), None)
    policy.evict(8, set())  # b1 = [0..7]
    policy.touch([K(20), K(21)], None)
    acts = {
        "remove": lambda: policy.remove(K(30)),
        "clear": policy.clear,
        "__init__": lambda: policy.__init__(64),
        "insert": lambda: policy.insert(K(99), ready(99), None),
    }

    def act():
        if not fired:
            fired.append(how)
            acts[how]()

    def hook(phase, info):
        if phase == "start" and ARMED:
            act()

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            if ARMED:
                act()

    global ARMED
    fired.clear()
    if source == "hook":
        gc.callbacks.append(hook)
    got, ending = [], "end"
    before = [key.decode() for key in getattr(policy, view)]
    it = iter(getattr(policy, view).items())
    for _ in range(3):  # a few steps first, then the trap
        got.append(next(it)[0].decode())
    # empty the 2-tuple free list: each pair the iterator makes must
    # allocate (and so may start a collection)
    pairs = [(i, -i) for i in range(5000)]
    gc.disable()  # the garbage cycles wait for the iterator's allocation
    if source == "cycle":
        for _ in range(50):
            Cycle()
    ARMED = True
    gc.set_threshold(1)
    gc.enable()
    try:
        for key, _ in it:
            got.append(key.decode())
    except RuntimeError as exc:
        ending = str(exc)
    gc.set_threshold(700)
    ARMED = False
    if source == "hook":
        gc.callbacks.remove(hook)
    del pairs
    gc.collect()
    policy._check_invariants()
    assert fired, "the trap never fired"
    return {"before": before, "got": got, "ending": ending}


print(json.dumps({how: trial(how) for how in hows}))
