"""The policy's interface, in one home: its methods, from which the tests',
the fuzzers', the harness's and the benchmarks' lists derive, and its
docstrings, which both implementations read (the compiled core imports
nothing from the twin). The vLLM releases the docstring names come from
the table of verified code (``arc_cy._guard.verified``)."""

from __future__ import annotations

from ._guard import releases

METHODS = (
    "get",
    "insert",
    "remove",
    "touch",
    "on_store_miss",
    "on_request_access",
    "on_request_finished",
    "evict",
    "clear",
    "mark_evictable",
    "mark_non_evictable",
)
"""What vLLM's manager calls on a policy: the methods of vLLM's
``CachePolicy`` in every verified release (0.30 to 0.33 have ``touch``,
0.34 does not; 0.31 added ``on_store_miss`` and ``on_request_finished``,
0.33 ``on_request_access``), in 0.33's order (the one release with all).
Both implementations define each (tests/test_one_home.py)."""

HOOKS = tuple(name for name in METHODS if name.startswith("on_"))
"""The request hooks, which a release's ``CachePolicy`` may lack."""


def _release_range() -> str:
    """The oldest and the newest release the table verifies, as 'A to B'."""
    newest_first = releases()
    if len(newest_first) == 1:
        return newest_first[0]
    return f"{newest_first[-1]} to {newest_first[0]}"


POLICY_DOC = f"""ARC (Adaptive Replacement Cache) policy for vLLM's CPU KV offloading,
    making exactly the decisions of vLLM's ``ARCCachePolicy`` in the releases
    whose code arc_cy verified ({_release_range()}, ``arc_cy._guard.verified``).

    Lists, each ordered from LRU to MRU:
        t1: resident chunks seen once (or not yet ready).
        t2: resident chunks a request reused (or touched when ready).
        b1, b2: ghost keys recently evicted from t1 and t2.
        target_t1_size: the adaptive target for t1's size.

    Algorithm:
        1. insert() puts a new chunk at t1's MRU end and forgets its ghost.
        2. touch() moves a ready t1 chunk to t2 (a pending one to t1's MRU
           end) and a t2 chunk to t2's MRU end; on_request_finished() does
           the same for the chunks a request reused, and only refreshes
           the recency of those it inserted.
        3. A key found in b1 raises target_t1_size by max(1, len(b2) /
           len(b1)), capped at cache_capacity; one found in b2 lowers it by
           max(1, len(b1) / len(b2)), floored at 0 (touch(), on_store_miss()).
        4. evict(n, protected) picks n victims, chunks with ref_cnt == 0 not
           in ``protected``: for each it prefers t1 while t1's virtual size
           (its size less the victims taken from it so far) is at least
           int(target_t1_size), else t2, and falls back to t1 when t2 has
           none left. One walk of t1 and of t2, from their LRU ends. Either
           all n are found, moved to b1/b2 and returned as (key, chunk)
           pairs, and both ghost lists are trimmed to cache_capacity; or it
           returns None and nothing changes.
    """


PLUS_DOC = """ARC+: vLLM's ARC with three rules that make it hit more on KV-cache
    traffic, for vLLM's CPU KV offloading (0.31 and later: its manager's
    on_request_finished). Not vLLM's decisions: ``ARCCachePolicy`` is.

    Lists and steps are ARCCachePolicy's (t1, t2, b1, b2, target_t1_size),
    but for:
        1. insert() puts a key found in b1 or b2 in t2, not t1: a ghost is
           a key an earlier request asked for, and this second request
           makes it frequent (the ARC paper's rule, Megiddo and Modha,
           FAST'03).
        2. on_request_finished() remembers, at b1's MRU end (tail first),
           each key of the request that is in no list: asked for and not
           kept (its store refused or failed). b1 is then trimmed to
           cache_capacity.
        3. evict(n, protected) refuses (returns None, nothing changes) an
           offer of first-seen keys: ``protected`` (vLLM's manager protects
           the offer's keys) holds keys in no list, the keys being stored,
           and none in b1 or b2. It refuses such an offer when
           int(target_t1_size) is 0 (t1 has shown no value), and when a
           victim is due from t1 but t1 has none left (t2 would give up a
           frequent chunk for keys asked once). vLLM's manager then stores
           nothing of the offer (its connector counts an allocation
           failure); the keys' next request finds them in b1 (rule 2).
    What adapts is ARC's own target_t1_size: b1 hits raise it (recency
    pays, and first-seen keys are admitted), b2 hits lower it. No constant
    is tuned to a pool size or a trace.
    """
