"""A collection while touch() holds a list of the caller's 7 keys: a
target that is a Fraction makes _adapt run Python arithmetic, which
allocates, and gc.set_threshold(1) starts a collection there; a
gc.callbacks hook copies every 7-item list it finds (a NULL item would
crash it). Prints "survived".

    PYTHONPATH=tests/progs:tests python -P tests/progs/gc_during_touch.py cython|python
    (tests/childproc.py sets that path)
"""

import gc
import sys
from fractions import Fraction

from _child import K, policy_class, ready

cls = policy_class(sys.argv[1])
p = cls(4)
for i in range(4):
    p.insert(K(i), ready(i), None)
assert len(p.evict(2, ())) == 2  # b1 = [0, 1]
p.insert(K(4), ready(4), None)
p.target_t1_size = Fraction(1, 3)  # _adapt runs Python arithmetic
copies = []


def copy_7_item_lists(phase, info):
    if phase == "start":
        for o in gc.get_objects():
            if type(o) is list and len(o) == 7:
                copies.append(o[:])


gc.callbacks.append(copy_7_item_lists)
gc.set_threshold(1)
# 7 keys, processed last to first: K(0) is the ghost hit.
p.touch([K(0), K(2), K(3), K(4), K(5), K(6), K(7)], None)
gc.set_threshold(700)
gc.callbacks.clear()
p._check_invariants()
assert p.target_t1_size == Fraction(4, 3), p.target_t1_size
assert copies
print("survived")
