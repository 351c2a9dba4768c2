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
from hostile import (
    CALL_NAMES,
    EqRaises,
    HashRaises,
    calls_with,
    populated,
    unchanged,
)

pytestmark = pytest.mark.gc_stress

# --- keys whose __hash__ or __eq__ raise ----------------------------------------


@pytest.mark.parametrize("exc", [TypeError("no hash"), ZeroDivisionError("zd")])
@pytest.mark.parametrize("call", CALL_NAMES)
def test_raising_hash(policy_cls, call, exc):
    policy = populated(policy_cls)
    key = HashRaises(exc)
    error = unchanged(policy, calls_with(key)[call], type(exc))
    assert error is exc


# Which stored key the raising key collides with, per call.
COLLIDES_WITH = {"evict-protected": K(2), "b1-getitem": K(0)}


@pytest.mark.parametrize("call", CALL_NAMES)
def test_raising_eq_on_hash_collision(policy_cls, call):
    policy = populated(policy_cls)
    like = COLLIDES_WITH.get(call, K(4))
    if call.startswith(("on_store_miss", "touch")):
        like = K(0)  # a ghost: the lookup must compare with it
    key = EqRaises(like)
    error = unchanged(policy, calls_with(key)[call], ArithmeticError)
    assert error is key.exc


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

    assert unchanged(policy, call, ArithmeticError) is key.exc


@pytest.mark.core_only
@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: [K(9)], id="unhashable"),
        pytest.param(lambda: HashRaises(ZeroDivisionError("zd")), id="raising-hash"),
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


class AlwaysEqual:
    def __init__(self, h, name):
        self.h, self.name = h, name

    def __hash__(self):
        return self.h

    def __eq__(self, other):
        return True

    def __repr__(self):
        return self.name


def test_folded_hash_collision(policy_cls):
    # 1 and 2**32 are different hashes (a dict never compares such keys);
    # they fold to the same 32 bits, which the compiled core's table slots
    # hold, so it must check the full hash before comparing.
    policy = policy_cls(3)
    policy.insert(AlwaysEqual(1, "a"), ready(0), CTX)
    policy.insert(AlwaysEqual(1 << 32, "b"), ready(1), CTX)
    assert [k.name for k in policy.t1] == ["a", "b"]
    policy._check_invariants()


class SameHash:
    """Distinct keys (equal by name) that all share one hash."""

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return 777

    def __eq__(self, other):
        return isinstance(other, SameHash) and other.name == self.name

    def __repr__(self):
        return f"SameHash({self.name!r})"


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
    assert (list(policy.t1), list(policy.t2), list(policy.b1)) == (
        [SameHash("d"), SameHash("a"), SameHash("c")],
        [SameHash("b")],
        [],
    )
    policy._check_invariants()


# --- keys that break the hash/eq contract: no crash, a consistent state ---------


class NT:
    """X and Y are unequal, Z equals both (not transitive); one hash."""

    crossed = 0  # comparisons of two different names that said equal

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return 12345

    def __eq__(self, other):
        if not isinstance(other, NT):
            return False
        if self.name != other.name and "Z" in (self.name, other.name):
            NT.crossed += 1
            return True
        return self.name == other.name

    def __repr__(self):
        return self.name


class Asym(NT):
    """A equals everything of its hash; nothing else equals A."""

    __hash__ = NT.__hash__

    def __eq__(self, other):
        if self.name == "A" and getattr(other, "name", "A") != "A":
            NT.crossed += 1
            return True
        return isinstance(other, NT) and other.name == self.name


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
@pytest.mark.parametrize("keys", [NT, Asym], ids=["non-transitive", "asymmetric"])
@pytest.mark.parametrize("case", CONTRACT_BREAKING)
def test_keys_that_break_the_contract_keep_the_policy_consistent(policy_cls, case, keys):
    """The three contract-breaking cases: arc_cy promises no
    crash and a consistent state, not vLLM's decisions."""
    names = ("A", "Y", "X") if keys is Asym else ("X", "Y", "Z")
    policy = policy_cls(2)
    NT.crossed = 0
    _checked(policy, *CONTRACT_BREAKING[case](*(keys(n) for n in names)))
    assert NT.crossed > 0  # the broken equality was reached


# --- evict() never compares keys in the core (documented divergence) ------------


class EqRaisesWhenArmed:
    armed = False

    def __init__(self, n):
        self.n = n

    def __hash__(self):
        return 31337

    def __eq__(self, other):
        if EqRaisesWhenArmed.armed:
            raise ArithmeticError("eq")
        return isinstance(other, EqRaisesWhenArmed) and other.n == self.n


def _evict_with_raising_eq(cls):
    policy = cls(4)
    for n in range(2):
        policy.insert(EqRaisesWhenArmed(n), ready(n), CTX)
    EqRaisesWhenArmed.armed = True
    try:
        outcome = "ok", [k.n for k, _ in policy.evict(2, ())]
    except ArithmeticError:
        outcome = "raised", None
    finally:
        EqRaisesWhenArmed.armed = False
    return outcome, [[k.n for k in getattr(policy, name)] for name in ("t1", "b1")]


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


class _Rehashing:
    """A key whose hash changes after it is stored: it breaks the contract."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __hash__(self) -> int:
        return hash(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Rehashing) and other.value == self.value


@pytest.mark.core_only
@pytest.mark.parametrize("where", ["t1", "b1"])
def test_the_invariant_check_finds_a_key_whose_hash_changed(policy_cls, where):
    """The core records each key's hash in its node (the table never
    rehashes); _check_invariants asserts each key still hashes to it, in a
    resident list and in a ghost list alike. The twin, as vLLM's dicts,
    keeps no hash to compare."""
    policy = policy_cls(4)
    key = _Rehashing(1)
    policy.insert(key, ready(1), CTX)
    policy.insert(K(2), ready(2), CTX)
    if where == "b1":
        assert policy.evict(1, set())[0][0] is key  # t1's LRU end
    assert key in getattr(policy, where)
    policy._check_invariants()
    key.value = 2
    with pytest.raises(AssertionError, match=f"in {where}: its key's hash changed"):
        policy._check_invariants()
