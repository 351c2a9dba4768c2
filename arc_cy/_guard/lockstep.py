"""The claim itself, run: vLLM's own ``ARCCachePolicy`` and arc_cy's given
the same seeded, manager-shaped calls (each a store's misses, evictions
and inserts, completed and failed stores, pins, finished requests,
removals, clears), every result and the four lists' order and
``target_t1_size`` compared after each call."""

from __future__ import annotations

import inspect
import random
import reprlib
from typing import Any


class _Context(dict[bytes, int]):
    """A request context as a policy reads it: token positions by key."""

    get_offload_key_position = dict.get


def _state(policy: Any) -> tuple[Any, ...]:
    return (*(list(getattr(policy, n)) for n in ("t1", "t2", "b1", "b2")), policy.target_t1_size)


def _answer(policy: Any, method: str, args: tuple[Any, ...]) -> object:
    try:
        result = getattr(policy, method)(*args)
    except Exception as exc:
        return f"raises {type(exc).__name__}"
    if method == "evict" and result is not None:
        return [(k, c.chunk_id) for k, c in result]
    return result


def first_difference(
    theirs: Any, ours: Any, chunk_cls: Any, *, seed: int = 0, steps: int = 3000
) -> str | None:
    """The first call after which arc_cy's policy differs from vLLM's, as
    ``call N, method(args): vLLM ..., arc_cy ...``; None if none does."""
    rng = random.Random(seed)
    has = {m for m in ("touch", "on_store_miss", "on_request_finished") if hasattr(theirs, m)}
    with_context = "req_context" in inspect.signature(theirs.insert).parameters
    capacity = 8
    keys = [f"key{i:02d}".encode() for i in range(4 * capacity)]
    policies = [theirs(capacity), ours(capacity)]
    chunks: dict[bytes, Any] = {}
    made = 0
    for step in range(steps):
        ctx = _Context({k: rng.randrange(64) for k in rng.sample(keys, 6)})
        op = rng.random()
        calls: list[tuple[str, tuple[Any, ...]]] = []
        for k, c in list(chunks.items()):  # stores in flight complete, or fail
            if c.ref_cnt < 0 and rng.random() < 0.5:
                c.ref_cnt = 0 if rng.random() < 0.9 else -1
                calls.append(("mark_evictable", (k,)) if c.ref_cnt == 0 else ("remove", (k,)))
        if op < 0.35:  # a store: misses seen, room made, chunks inserted
            batch = [k for k in rng.sample(keys, rng.randint(1, 4)) if k not in chunks]
            miss = "on_store_miss" if "on_store_miss" in has else "touch"
            calls.append((miss, (batch, ctx)))
            if len(chunks) + len(batch) > capacity:
                calls.append(("evict", (len(chunks) + len(batch) - capacity, set(batch))))
            for k in batch:
                made += 1
                calls.append(("insert", (k, chunk_cls(made), ctx)[: 3 if with_context else 2]))
        elif op < 0.55 and chunks:  # a load starts or ends
            k = rng.choice(list(chunks))
            if chunks[k].ref_cnt >= 0:
                chunks[k].ref_cnt ^= 1
                calls.append(
                    ("mark_non_evictable" if chunks[k].ref_cnt else "mark_evictable", (k,))
                )
        elif op < 0.8:  # a request finishes (before 0.31: its keys touched)
            group = tuple(dict.fromkeys(rng.sample([*chunks, *keys[:8]], rng.randint(1, 6))))
            reused = {k for k in group if k in chunks and chunks[k].ref_cnt >= 0}
            inserted = {k for k in group if k in chunks and k not in reused}
            if "on_request_finished" in has:
                calls.append(("on_request_finished", ((group,), inserted, reused, ctx)))
            if "touch" in has:
                calls.append(("touch", ([k for k in group if k in chunks], ctx)))
        elif op < 0.95:
            calls.append(("evict", (rng.randint(1, 3), set(rng.sample(keys, 2)))))
        elif op < 0.99:
            calls.append(("get", (rng.choice(keys),)))
        else:
            calls.append(("clear", ()))
        for method, args in calls:
            answers = [_answer(p, method, args) for p in policies]
            if method == "insert":
                chunks[args[0]] = args[1]
            elif method == "remove":
                chunks.pop(args[0], None)
            elif method == "clear":
                chunks.clear()
            elif method == "evict" and isinstance(answers[0], list):
                for k, _ in answers[0]:
                    del chunks[k]
            if answers[0] != answers[1]:
                return _said(step, method, args, "answered", answers)
            states = [_state(p) for p in policies]
            if states[0] != states[1]:
                return _said(step, method, args, "left t1, t2, b1, b2, target_t1_size", states)
            if method == "evict" and answers[0] is None:
                break  # the store fails: nothing inserted
    return None


def _said(step: int, method: str, args: tuple[Any, ...], what: str, pair: list[Any]) -> str:
    r = reprlib.Repr()
    r.maxlist = r.maxset = r.maxtuple = r.maxdict = 6
    call = f"call {step + 1}, {method}({', '.join(map(r.repr, args))})"
    return f"{call}, {what} {r.repr(pair[0])} in vLLM, {r.repr(pair[1])} in arc_cy"
