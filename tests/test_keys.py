"""The key contract: keys are hashable and keep Python's hash/eq contract;
their __hash__ and __eq__ may raise, collide or break the contract.

A key whose __hash__ or __eq__ raises makes the call raise that very
exception; in the core the call then has changed nothing, as in the twin
where the key is the first a call looks up (the core looks every key up
before its first change, its rule 11: core_only; the twin, as vLLM's,
looks each up as it applies it). Keys that share a hash (or whose hashes
fold to the same 32 bits in the core's table) are told apart by equality.
Keys that break the contract (non-transitive or asymmetric equality) get
no crash and a consistent state from the core, not vLLM's decisions
(core_only). evict() never compares keys in the compiled core: a
documented divergence from vLLM and the twin.
"""

from __future__ import annotations

import pytest

from helpers import CTX, K, VllmARC, ready
from hostile import CALL_NAMES, EQ_ERROR, EqRaises, Key, act, calls_with, populated, unchanged

pytestmark = [pytest.mark.gc_stress, pytest.mark.both_policies]

# --- keys whose __hash__ or __eq__ raise ----------------------------------------


@pytest.mark.parametrize("exc", [TypeError("no hash"), ZeroDivisionError("zd")])
@pytest.mark.parametrize("call", CALL_NAMES)
def test_raising_hash(policy_cls, call, exc):
    policy = populated(policy_cls)
    error = unchanged(policy, calls_with(Key("bad", hash=exc))[call], type(exc))
    assert error is exc


# Which stored key the raising key collides with, per call.
COLLIDES_WITH = {"evict-protected": K(2), "b1-getitem": K(0)}


@pytest.mark.parametrize("call", CALL_NAMES)
def test_raising_eq_on_hash_collision(policy_cls, call):
    policy = populated(policy_cls)
    like = COLLIDES_WITH.get(call, K(4))
    if call.startswith(("on_store_miss", "touch")):
        like = K(0)  # a ghost: the lookup must compare with it
    error = unchanged(policy, calls_with(EqRaises(like))[call], ArithmeticError)
    assert error is EQ_ERROR


def test_raising_eq_of_stored_key(policy_cls):
    """The stored key's __eq__ raises when another key collides with it."""
    policy = policy_cls(4)
    stored = EqRaises(K(7))
    policy.insert(stored, ready(1), CTX)
    policy.insert(K(8), ready(2), CTX)
    for call in ("insert", "get", "remove", "touch", "t1-contains"):
        unchanged(policy, calls_with(K(7))[call], ArithmeticError)
    # the identical object is found without comparing
    assert policy.get(stored).chunk_id == 1
    policy.touch([stored], CTX)
    assert list(policy.t2) == [stored]
    policy.remove(stored)
    assert list(policy.t1) == [K(8)]
    policy._check_invariants()


@pytest.mark.core_only
def test_request_finished_looks_up_before_changing(policy_cls):
    """Tail first, K(5) would move to t2 before the raising key's lookup;
    every lookup comes first, so nothing changes."""
    policy = populated(policy_cls)
    key = EqRaises(K(4))

    def call(p):
        return p.on_request_finished(((key, K(5)),), set(), {key, K(5)}, CTX)

    assert unchanged(policy, call, ArithmeticError) is EQ_ERROR


@pytest.mark.core_only
@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: [K(9)], id="unhashable"),
        pytest.param(lambda: Key("bad", hash=ZeroDivisionError), id="raising-hash"),
        pytest.param(lambda: EqRaises(K(1)), id="raising-eq"),
    ],
)
def test_on_store_miss_bad_key_first_changes_nothing(policy_cls, bad):
    """on_store_miss walks keys last to first: here the bad key is first
    and a ghost hit follows it (a mutant that dropped on_store_miss's
    look-up pass survived every test that put the bad key last)."""
    key = bad()
    unchanged(populated(policy_cls), lambda p: p.on_store_miss([key, K(1), K(0)], CTX), Exception)


# --- keys that share a hash -----------------------------------------------------


def test_folded_hash_collision(policy_cls):
    # 1 and 2**32 are different hashes (a dict never compares such keys);
    # they fold to the same 32 bits, which the compiled core's table slots
    # hold, so it must check the full hash before comparing.
    policy = policy_cls(3)
    policy.insert(Key("a", 1, eq=lambda *_: True), ready(0), CTX)
    policy.insert(Key("b", 1 << 32, eq=lambda *_: True), ready(1), CTX)
    assert [k.ident for k in policy.t1] == ["a", "b"]
    policy._check_invariants()


def SameHash(name):
    """Distinct keys (equal by name) that all share one hash."""
    return Key(name, 777)


def test_keys_sharing_a_hash_are_found_in_every_list(policy_cls):
    """The core settles a look-up at the first node of a hash only when no
    other node has it; keys sharing a hash take the list-by-list path."""
    policy = policy_cls(4)
    chunks = {n: ready(i) for i, n in enumerate("abcde")}
    for n in "abcd":
        policy.insert(SameHash(n), chunks[n], CTX)
        policy._check_invariants()
    policy.touch([SameHash("b")], CTX)  # t1 = [a, c, d], t2 = [b]
    assert [k for k, _ in policy.evict(1, ())] == [SameHash("a")]  # b1 = [a]
    policy.remove(SameHash("c"))
    policy._check_invariants()
    assert policy.get(SameHash("b")) is chunks["b"]
    assert policy.get(SameHash("d")) is chunks["d"]
    assert policy.get(SameHash("a")) is None and SameHash("a") in policy.b1
    assert policy.get(SameHash("c")) is None and SameHash("c") not in policy.b1
    policy.insert(SameHash("a"), chunks["e"], CTX)  # the ghost comes back
    policy.insert(SameHash("c"), chunks["c"], CTX)
    assert [policy.get(SameHash(n)) for n in "abcd"] == [chunks[n] for n in "ebcd"]
    assert len(policy.t1) + len(policy.t2) == 4 and list(policy.b1) == []
    policy._check_invariants()


# --- keys that break the hash/eq contract: no crash, a consistent state ---------


CROSSED: list = []  # comparisons of two different keys that said equal (one hash)


def non_transitive(key, other):
    """X and Y are unequal, Z equals both."""
    if key.ident != other.ident and "Z" in (key.ident, other.ident):
        return CROSSED.append(key) or True


def asymmetric(key, other):
    """A equals every key of its hash; nothing else equals A."""
    if key.ident == "A" != other.ident:
        return CROSSED.append(key) or True


def _checked(policy, *calls):
    for call in calls:
        try:
            call(policy)
        except ValueError:  # a duplicate, as arc_cy sees it
            pass
        policy._check_invariants()


CONTRACT_BREAKING = {
    # touch / on_request_finished apply the node found at look-up time
    "touch": lambda X, Y, Z: [
        lambda p: p.insert(X, ready(1), CTX),
        lambda p: p.insert(Y, ready(2), CTX),
        lambda p: p.touch([Z, X, Z], CTX),
        lambda p: p.on_request_finished(((Z, Y, X),), set(), {Z, X}, CTX),
    ],
    # which of several equal entries a list yields
    "get and remove": lambda X, Y, Z: [
        lambda p: p.insert(X, ready(1), CTX),
        lambda p: p.touch([X], CTX),
        lambda p: p.insert(Y, ready(2), CTX),
        lambda p: p.get(Z),
        lambda p: p.remove(Z),
        lambda p: p.remove(Z),
    ],
    # insert over two ghosts that a key equals
    "insert over ghosts": lambda X, Y, Z: [
        lambda p: p.insert(X, ready(1), CTX),
        lambda p: p.insert(Y, ready(2), CTX),
        lambda p: p.evict(2, set()),
        lambda p: p.insert(Z, ready(3), CTX),
        lambda p: p.evict(1, set()),
        lambda p: p.insert(X, ready(4), CTX),
        lambda p: p.insert(Y, ready(5), CTX),
    ],
}


@pytest.mark.core_only
@pytest.mark.parametrize("eq", [non_transitive, asymmetric], ids=["non-transitive", "asymmetric"])
@pytest.mark.parametrize("case", CONTRACT_BREAKING)
def test_keys_that_break_the_contract_keep_the_policy_consistent(policy_cls, case, eq):
    """The three contract-breaking cases: arc_cy promises no
    crash and a consistent state, not vLLM's decisions."""
    names = ("A", "Y", "X") if eq is asymmetric else ("X", "Y", "Z")
    policy = policy_cls(2)
    CROSSED.clear()
    _checked(policy, *CONTRACT_BREAKING[case](*(Key(n, 12345, eq=eq) for n in names)))
    assert CROSSED  # the broken equality was reached


# --- evict() never compares keys in the core (documented divergence) ------------


ARMED: list = []


def _evict_with_raising_eq(cls):
    policy = cls(4)
    for n in range(2):
        policy.insert(Key(n, 31337, eq=lambda *_: act(EQ_ERROR) if ARMED else None), ready(n), CTX)
    ARMED.append(True)
    try:
        outcome = "ok", [k.ident for k, _ in policy.evict(2, ())]
    except ArithmeticError:
        outcome = "raised", None
    finally:
        ARMED.clear()
    return outcome, [[k.ident for k in getattr(policy, name)] for name in ("t1", "b1")]


@pytest.mark.needs_vllm
def test_documented_divergence_evict_never_compares_keys(policy_cls):
    """Documented: vLLM's evict() looks each scanned key up again
    (OrderedDict's items() iterator), which runs __eq__ between keys that
    share a hash; the compiled core walks its lists and never calls __eq__
    in evict(). A raising __eq__ makes vLLM and the twin raise and change
    nothing, while the core evicts."""
    unchanged_state = (("raised", None), [[0, 1], []])
    assert _evict_with_raising_eq(VllmARC) == unchanged_state
    got = _evict_with_raising_eq(policy_cls)
    if policy_cls.__module__.startswith("arc_cy._core."):
        assert got == (("ok", [0, 1]), [[], [0, 1]])
    else:
        assert got == unchanged_state


@pytest.mark.core_only
@pytest.mark.parametrize("where", ["t1", "b1"])
def test_the_invariant_check_finds_a_key_whose_hash_changed(policy_cls, where):
    """The core records each key's hash in its node (the table never
    rehashes); _check_invariants asserts each key still hashes to it, in a
    resident list and in a ghost list alike. The twin, as vLLM's dicts,
    keeps no hash to compare."""
    policy = policy_cls(4)
    key = Key(1)  # breaks the contract when its hash changes
    policy.insert(key, ready(1), CTX)
    policy.insert(K(2), ready(2), CTX)
    if where == "b1":
        assert policy.evict(1, set())[0][0] is key  # t1's LRU end
    assert key in getattr(policy, where)
    policy._check_invariants()
    key.hash_as = 2
    with pytest.raises(AssertionError, match=f"in {where}: its key's hash changed"):
        policy._check_invariants()
