"""A gc.callbacks hook that reads every item of every young tuple (and
list), armed while user code that allocates runs inside a call: the
caller's key iterable, protected.__contains__, the containers of
on_request_finished. A tuple made half full and tracked would crash it.
Prints the calls' results."""

import gc
import json
import sys

from _child import IMPLEMENTATIONS, K, policy_class, ready

READS = [0]


def hook(phase, info):
    if phase != "start":
        return
    for generation in (0, 1):
        for o in gc.get_objects(generation=generation):
            if type(o) in (tuple, list):
                for item in o:
                    type(item)
                READS[0] += 1


class Allocating(set):
    def __contains__(self, key):
        [[] for _ in range(3)]  # allocations: a collection may start here
        return set.__contains__(self, key)


def keys(ns):
    for n in ns:
        [[] for _ in range(3)]
        yield K(n)


class Ctx:
    def get_offload_key_position(self, key):
        [[] for _ in range(3)]
        return None


def run(impl, call):
    policy = policy_class(impl)(16)
    for i in range(12):
        policy.insert(K(i), ready(i), None)
    policy.evict(3, set())  # b1 = [0, 1, 2]
    calls = {
        "evict": lambda: policy.evict(4, Allocating({K(4)})),
        "touch": lambda: policy.touch(keys([0, 5, 6, 7]), None),
        "on_store_miss": lambda: policy.on_store_miss(keys([1, 2, 8]), None),
        "on_request_finished": lambda: policy.on_request_finished(
            ((K(5), K(6), K(9)),), Allocating({K(9)}), Allocating({K(5), K(6)}), Ctx()
        ),
    }
    READS[0] = 0
    gc.callbacks.append(hook)
    gc.set_threshold(1)
    try:
        result = calls[call]()
    finally:
        gc.set_threshold(700)
        gc.callbacks.remove(hook)
    if impl != "vllm":
        policy._check_invariants()
    assert READS[0] > 0, "the hook never ran"
    return {
        "result": result and [k.decode() for k, _ in result],
        "state": [[k.decode() for k in v] for v in (policy.t1, policy.t2, policy.b1, policy.b2)],
    }


print(
    json.dumps(
        {
            call: {impl: run(impl, call) for impl in (*IMPLEMENTATIONS, "vllm")}
            for call in sys.argv[1:]
        }
    )
)
