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


PLUS_DOC = """ARC+: ARC's lists kept in recency order, with an admission that
    learns from ARC's ghosts when to refuse blocks asked for once, for
    vLLM's CPU KV offloading (0.31 and later: its manager's
    on_request_finished). Not vLLM's decisions: ``ARCCachePolicy`` is.

    Lists, each ordered from LRU to MRU:
        t1: resident chunks one request asked for.
        t2: resident chunks two or more requests asked for.
        b1, b2: ghost keys of t1's and t2's victims, and keys asked for
            and not kept (each at most cache_capacity, ARC's bound).
        b1_returned, b1_forgotten, b2_returned, b2_forgotten: the ghosts'
            fates, counted since the policy was made or cleared: asked for
            again (on_store_miss() or touch() found it), or trimmed.

    Steps:
        1. insert() puts a key found in b1 or b2 in t2 (its second
           request: the ARC paper's rule, Megiddo and Modha, FAST'03), any
           other key in t1.
        2. on_request_finished() takes the request's keys tail first, each
           once: a key it stored is refreshed in its list, a key it reused
           moves to t2's MRU end; a ghost (asked for and not kept) moves to
           b2's MRU end; a key in no list is remembered at b1's MRU end.
           b1 and b2 are then trimmed to cache_capacity.
        3. on_store_miss() and touch() count a ghost they find as returned
           and move it to its list's MRU end (touch() moves resident keys
           as ARC's does).
        4. evict(n, protected) takes the n least recently requested
           chunks of t1 and t2 together (ref_cnt == 0, not protected),
           t1's and t2's in the order their requests finished (vLLM lru's
           order). It refuses (returns None, nothing changes) an offer of
           first-seen keys (``protected``, which vLLM's manager fills with
           the offer's keys, holds keys in no list and none in b1 or b2)
           that would take a victim from t2 while b1's ghosts come back at
           a lower rate than b2's (returned / (returned + forgotten), 0
           before any fate): a block asked for once is not stored in place
           of one asked for twice while blocks asked for once are the ones
           that come back less. vLLM's manager then stores nothing of the
           offer (its connector counts an allocation failure); the keys'
           next request finds them in b1 (step 2), and stores them in t2.
    No constant is tuned to a pool size or a trace: the ghost bound is
    ARC's, and the refusal follows the ghosts' own counts.
    """
