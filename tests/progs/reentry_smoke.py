"""The riskiest re-entrant callbacks of tests/test_reentrancy.py, on both
implementations, in one child process: keys whose __del__ calls back,
protected containers that mutate the policy, keys whose __eq__ raises.
Prints "survived" if nothing crashed."""

import gc

from helpers import IMPLEMENTATIONS, K, load_policy_class
from hostile import (
    CALL_NAMES,
    DEL_ACTS,
    MUTATIONS,
    EqRaises,
    calls_with,
    drop_callback_key,
    hostile,
    populated,
)

for name in IMPLEMENTATIONS:
    cls = load_policy_class(name)
    for when in ("remove", "clear", "trim", "reinsert", "touch", "finished"):
        for act in DEL_ACTS:
            drop_callback_key(populated(cls), when, act)
    for mutation in MUTATIONS:
        p = populated(cls)
        meddling = hostile(object, __contains__=lambda _, k, m=mutation, p=p: MUTATIONS[m](p))
        try:
            p.evict(3, meddling())
        except Exception:
            pass
        p._check_invariants()
    for call in CALL_NAMES:
        try:
            calls_with(EqRaises(K(4)))[call](populated(cls))
        except Exception:
            pass
    gc.collect()
print("survived")
