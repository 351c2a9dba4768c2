"""Behaviour of one policy object, on both implementations."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest
from helpers import ChunkStatus, ReqContext

CTX = ReqContext(req_id="r")


def ready(i: int, ref_cnt: int = 0) -> ChunkStatus:
    chunk = ChunkStatus(i)
    chunk.ref_cnt = ref_cnt
    return chunk


def filled(policy_cls, capacity: int, t1=(), t2=(), pinned=()) -> tuple:
    """A policy with keys b"t1-*" in t1 and b"t2-*" in t2, LRU first."""
    policy = policy_cls(capacity)
    chunks = {}
    for name in [*t2, *t1]:
        chunks[name] = ready(len(chunks), 1 if name in pinned else 0)
        policy.insert(name, chunks[name], CTX)
    policy.touch(list(reversed(t2)), CTX)  # reversed: touch walks tail first
    assert list(policy.t1) == list(t1) and list(policy.t2) == list(t2)
    return policy, chunks


def test_views_are_read_only_ordered_mappings(policy_cls):
    policy, chunks = filled(policy_cls, 10, t1=[b"a", b"b"], t2=[b"c"])
    t1 = policy.t1
    assert len(t1) == 2 and b"a" in t1 and b"c" not in t1
    assert list(t1.keys()) == [b"a", b"b"]
    assert list(t1.items()) == [(b"a", chunks[b"a"]), (b"b", chunks[b"b"])]
    assert t1[b"a"] is chunks[b"a"]
    assert t1.get(b"zz") is None
    with pytest.raises(KeyError):
        t1[b"c"]
    with pytest.raises(TypeError):
        t1[b"x"] = chunks[b"a"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        policy.t1 = {}
    assert policy.evict(1, set()) == [(b"a", chunks[b"a"])]
    assert list(policy.b1.items()) == [(b"a", None)]
    assert policy.b1[b"a"] is None and b"a" not in policy.t1


def test_get_insert_remove(policy_cls):
    policy = policy_cls(4)
    chunk = ChunkStatus(0)
    assert policy.get(b"k") is None
    policy.insert(b"k", chunk, CTX)
    assert policy.get(b"k") is chunk
    policy.remove(b"k")
    policy.remove(b"k")  # absent: nothing happens
    assert policy.get(b"k") is None and len(policy.t1) == 0


def test_touch_pending_chunk_stays_in_t1(policy_cls):
    policy = policy_cls(4)
    policy.insert(b"a", ChunkStatus(0), CTX)  # ref_cnt -1: being stored
    policy.insert(b"b", ChunkStatus(1), CTX)
    policy.touch([b"a"], CTX)
    assert list(policy.t1) == [b"b", b"a"] and len(policy.t2) == 0
    policy.t1[b"a"].ref_cnt = 0
    policy.touch([b"a"], CTX)
    assert list(policy.t2) == [b"a"]


def test_ghost_hits_adapt_the_target(policy_cls):
    policy, _ = filled(policy_cls, 3, t1=[b"a", b"b"], t2=[b"c"])
    policy.evict(2, set())  # target 0: t1 first
    assert list(policy.b1) == [b"a", b"b"]
    policy.on_store_miss([b"a"], CTX)
    assert policy.target_t1_size == 1 and list(policy.b1) == [b"b", b"a"]
    policy.target_t1_size = 3
    policy.on_store_miss([b"b"], CTX)
    assert policy.target_t1_size == 3 and type(policy.target_t1_size) is int


def test_batch_crosses_t1_t2_and_back(policy_cls):
    policy, _ = filled(
        policy_cls, 8, t1=[b"1", b"2", b"3", b"4"], t2=[b"x", b"y"]
    )
    policy.target_t1_size = 3
    got = [k for k, _ in policy.evict(5, set())]
    # t1 (4 >= 3), t1 (3 >= 3), then t2 twice (2 < 3), then t2 is empty: t1
    assert got == [b"1", b"2", b"x", b"y", b"3"]
    assert list(policy.b1) == [b"1", b"2", b"3"] and list(policy.b2) == [b"x", b"y"]


def test_pinned_and_protected_at_the_lru_ends(policy_cls):
    policy, chunks = filled(
        policy_cls, 8, t1=[b"p", b"q", b"r"], t2=[b"s", b"t"], pinned=[b"p", b"s"]
    )
    got = [k for k, _ in policy.evict(2, {b"q"})]
    assert got == [b"r", b"t"]  # p pinned, q protected; then t1 is spent
    assert list(policy.t1) == [b"p", b"q"] and list(policy.t2) == [b"s"]


def test_exhausted_scan_fails_atomically(policy_cls):
    policy, chunks = filled(policy_cls, 8, t1=[b"a", b"b"], t2=[b"c"], pinned=[b"c"])
    before = (list(policy.t1.items()), list(policy.t2), list(policy.b1))
    assert policy.evict(3, set()) is None
    assert policy.evict(2, {b"a"}) is None
    assert (list(policy.t1.items()), list(policy.t2), list(policy.b1)) == before
    assert policy.evict(0, set()) == []
    assert policy.evict(99, set()) is None


class CountingContainer:
    def __init__(self, keys=()):
        self.keys = set(keys)
        self.asked: list = []

    def __contains__(self, key):
        self.asked.append(key)
        return key in self.keys


def test_each_entry_is_examined_at_most_once_per_call(policy_cls):
    n = 200
    t1 = [b"a%d" % i for i in range(n)]
    t2 = [b"b%d" % i for i in range(n)]
    policy, _ = filled(policy_cls, 1000, t1=t1, t2=t2)
    # alternate t1/t2 preference: target equal to the t1 size
    policy.target_t1_size = n
    protected = CountingContainer(t1[::3] + t2[::2])
    before = getattr(policy, "_scan_visits", None)
    got = policy.evict(150, protected)
    assert got is not None and len(got) == 150
    assert len(protected.asked) == len(set(protected.asked))
    if before is not None:  # the compiled core counts every entry it visits
        visits = policy._scan_visits - before
        assert visits <= 2 * n and visits == len(protected.asked)


@pytest.mark.parametrize(
    "make",
    [list, tuple, frozenset, dict.fromkeys, CountingContainer],
    ids=["list", "tuple", "frozenset", "dict", "custom"],
)
def test_any_container_works_as_protected(policy_cls, make):
    policy, _ = filled(policy_cls, 8, t1=[b"a", b"b", b"c"])
    assert [k for k, _ in policy.evict(2, make([b"a"]))] == [b"b", b"c"]


def test_set_subclass_contains_is_honoured(policy_cls):
    class Everything(set):
        def __contains__(self, key):
            return True

    policy, _ = filled(policy_cls, 8, t1=[b"a"])
    assert policy.evict(1, Everything()) is None


def test_ghost_lists_are_trimmed_to_capacity(policy_cls):
    policy = policy_cls(2)
    for i in range(6):
        policy.insert(b"%d" % i, ready(i), CTX)
    assert [k for k, _ in policy.evict(4, set())] == [b"0", b"1", b"2", b"3"]
    assert list(policy.b1) == [b"2", b"3"]
    policy.insert(b"2", ready(9), CTX)  # a ghost comes back into t1
    assert list(policy.b1) == [b"3"] and list(policy.t1) == [b"4", b"5", b"2"]


def test_clear_resets_everything(policy_cls):
    policy, _ = filled(policy_cls, 4, t1=[b"a", b"b"], t2=[b"c"])
    policy.evict(1, set())
    policy.target_t1_size = 2
    policy.clear()
    assert [len(v) for v in (policy.t1, policy.t2, policy.b1, policy.b2)] == [0] * 4
    assert policy.target_t1_size == 0.0 and type(policy.target_t1_size) is float
    policy.insert(b"a", ready(0), CTX)
    policy._check_invariants()


class BigEndianChunk(ctypes.BigEndianStructure):
    _fields_ = [("ref_cnt", ctypes.c_int32)]


class OffsetChunk(ctypes.Structure):
    _fields_ = [("pad", ctypes.c_int64), ("ref_cnt", ctypes.c_int32)]


class FarChunk(ctypes.Structure):
    # ref_cnt past 64 KiB: any offset within the buffer is read, as vLLM does
    _fields_ = [("pad", ctypes.c_char * 70000), ("ref_cnt", ctypes.c_int32)]


@pytest.mark.parametrize("chunk_type", [OffsetChunk, FarChunk])
def test_chunk_with_ref_cnt_at_an_offset(policy_cls, chunk_type):
    policy = policy_cls(4)
    a, b = chunk_type(ref_cnt=0), chunk_type(ref_cnt=1)
    policy.insert(b"a", a, CTX)
    policy.insert(b"b", b, CTX)
    assert policy.evict(1, set()) == [(b"a", a)]
    assert policy.evict(1, set()) is None  # b is pinned: read at its offset
    b.ref_cnt = 0
    assert policy.evict(1, set()) == [(b"b", b)]


STAND_IN_LAYOUT = """
import builtins, ctypes, json, sys
real_import = builtins.__import__
def no_vllm(name, *args, **kwargs):
    if name == "vllm" or name.startswith("vllm."):
        raise ImportError("vLLM hidden")
    return real_import(name, *args, **kwargs)
builtins.__import__ = no_vllm
from arc_cy import _common
assert not _common.HAVE_VLLM
cs = _common.ChunkStatus
c = cs(7)
print(json.dumps({
    "fields": [(f[0], ctypes.sizeof(f[1]), getattr(cs, f[0]).offset) for f in cs._fields_],
    "size": ctypes.sizeof(cs),
    "align": ctypes.alignment(cs),
    "init": [c.ref_cnt, c.chunk_id, c.is_ready],
}))
"""


def layout(cs) -> dict:
    c = cs(7)
    return {
        "fields": [[f[0], ctypes.sizeof(f[1]), getattr(cs, f[0]).offset] for f in cs._fields_],
        "size": ctypes.sizeof(cs),
        "align": ctypes.alignment(cs),
        "init": [c.ref_cnt, c.chunk_id, c.is_ready],
    }


def test_chunk_stand_in_matches_vllm_layout():
    """Without vLLM, _common defines its own ChunkStatus: same fields,
    sizes, offsets and initial values as vLLM's."""
    import json

    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus as Vllm

    from arc_cy import _common

    assert _common.ChunkStatus is Vllm  # vLLM is installed here
    proc = subprocess.run(
        [sys.executable, "-P", "-c", STAND_IN_LAYOUT], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == layout(Vllm)


@pytest.mark.parametrize(
    "call,exc",
    [
        (lambda p: p.evict(-1, set()), ValueError),
        (lambda p: p.evict(1.0, set()), TypeError),
        (lambda p: p.evict("1", set()), TypeError),
        (lambda p: p.insert(b"b", ready(5), CTX), ValueError),
        (lambda p: p.insert(b"c", ready(5), CTX), ValueError),
        (lambda p: p.insert(b"z", object(), CTX), TypeError),
        (lambda p: p.insert(b"z", BigEndianChunk(0), CTX), TypeError),
        (lambda p: p.insert(b"z", ctypes.c_int32(0), CTX), TypeError),
        (lambda p: p.insert([1], ready(5), CTX), TypeError),
        (lambda p: p.get([1]), TypeError),
        (lambda p: p.touch([b"a", [1]], CTX), TypeError),
        (lambda p: p.on_store_miss([b"b1", {}], CTX), TypeError),
        (lambda p: p.remove({}), TypeError),
        (lambda p: setattr(p, "target_t1_size", "1"), TypeError),
        (lambda p: setattr(p, "target_t1_size", float("nan")), ValueError),
        (lambda p: setattr(p, "target_t1_size", float("inf")), ValueError),
        (lambda p: setattr(p, "target_t1_size", True), TypeError),
    ],
)
def test_bad_input_raises_and_changes_nothing(impl, policy_cls, call, exc):
    from helpers import snapshot

    from impls import load_policy_class

    def run(cls):
        policy, _ = filled(cls, 4, t1=[b"a", b"b"], t2=[b"c"])
        policy.evict(1, set())
        before = snapshot(policy)
        with pytest.raises(exc) as info:
            call(policy)
        assert snapshot(policy) == before
        policy._check_invariants()
        return str(info.value)

    # the twins say the same thing
    assert run(policy_cls) == run(load_policy_class("python"))


@pytest.mark.parametrize("capacity,exc", [(-1, ValueError), (2.0, TypeError), ("3", TypeError)])
def test_bad_capacity(policy_cls, capacity, exc):
    with pytest.raises(exc):
        policy_cls(capacity)


def test_capacity_is_read_only(policy_cls):
    policy = policy_cls(3)
    assert policy.cache_capacity == 3
    with pytest.raises(AttributeError):
        policy.cache_capacity = 5


def test_reentrant_mutation_from_protected_is_refused(policy_cls):
    policy, _ = filled(policy_cls, 4, t1=[b"a", b"b"])

    class Meddler:
        def __contains__(self, key):
            policy.insert(b"new", ready(9), CTX)
            return False

    before = (list(policy.t1), list(policy.b1))
    with pytest.raises(RuntimeError, match="insert"):
        policy.evict(1, Meddler())
    assert (list(policy.t1), list(policy.b1)) == before
    policy._check_invariants()


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-P", "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )


@pytest.mark.parametrize(
    "value,expected",
    [("", "cython"), ("0", "cython"), ("1", "python"), ("yes", "python")],
)
def test_no_extensions_variable(value, expected):
    proc = run_python(
        "import arc_cy; print(arc_cy.IMPLEMENTATION, arc_cy.ARCCachePolicy.__module__)",
        ARC_CY_NO_EXTENSIONS=value,
    )
    assert proc.returncode == 0, proc.stderr
    module = {"cython": "arc_cy._arc_c", "python": "arc_cy._arc_py"}[expected]
    assert proc.stdout.split() == [expected, module]


def test_missing_extension_warns_and_falls_back():
    code = (
        "import sys, warnings\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'arc_cy._arc_c':\n"
        "            raise ImportError('blocked for the test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import arc_cy\n"
        "print(arc_cy.IMPLEMENTATION)\n"
        "print([str(w.message) for w in caught if w.category is RuntimeWarning])\n"
    )
    proc = run_python(code, ARC_CY_NO_EXTENSIONS="")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "python"
    assert "compiled core is not available" in lines[1]


def test_ghost_hit_deltas_use_the_ratio_of_ghost_sizes(policy_cls):
    # b1 = [a, b], b2 = [c, d, e]: a b1 hit adds 3/2, a b2 hit takes 2/3 -> 1
    policy, _ = filled(policy_cls, 5, t1=[b"a", b"b"], t2=[b"c", b"d", b"e"])
    policy.target_t1_size = 2
    # t1 while its virtual size >= 2, then t2, then the fallback to t1
    assert [k for k, _ in policy.evict(5, set())] == [b"a", b"c", b"d", b"e", b"b"]
    assert list(policy.b1) == [b"a", b"b"] and list(policy.b2) == [b"c", b"d", b"e"]
    policy.on_store_miss([b"a"], CTX)
    assert policy.target_t1_size == 3.5
    policy.touch([b"c"], CTX)
    assert policy.target_t1_size == 2.5
    policy.touch([b"d", b"a"], CTX)  # tail first: a (+1.5), then d (-1)
    assert policy.target_t1_size == 3.0
