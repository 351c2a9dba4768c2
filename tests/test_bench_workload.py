"""What the benchmarks rely on. bench/multi_turn.py reads vLLM's multi-turn
generator configuration (bench/data/generate_multi_turn.json) and builds
conversations of its shape (arc_cy_harness.multi_turn_workload): no policy is
involved here; the scheduler runs are in the bench itself. bench/evict.py
reads the compiled core's node size from the core (_NODE_SIZE)."""

from __future__ import annotations

import ctypes
import json
import random
import statistics
import sys
import tracemalloc
from pathlib import Path

import pytest

from arc_cy_harness import multi_turn_workload as multi_turn

pytestmark = pytest.mark.repo

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_the_file_is_vllms_configuration() -> None:
    cfg = json.loads((BENCH / "data" / "generate_multi_turn.json").read_text())
    assert cfg == multi_turn.load_config()
    assert cfg["num_conversations"] == 24
    pin = cfg["prompt_input"]
    assert pin["num_turns"] == {"distribution": "uniform", "min": 12, "max": 18}
    assert pin["prefix_num_tokens"] == {"distribution": "lognormal", "average": 1000, "max": 5000}


def test_conversations_follow_the_file() -> None:
    cfg = multi_turn.load_config()
    convs = multi_turn.conversations(cfg, 480, seed=3, think=(0, 0))
    assert len(convs) == 480
    common = convs[0][0][:500]
    prefixes = []
    for head, turns in convs:
        assert head[:500] == common  # the common prefix, shared
        prefixes.append(len(head) - 500)
        assert 6 <= len(turns) <= 9  # 12 to 18 messages, half of them user turns
        first, *later = turns
        assert first[0] == []  # turn 0's 120-160 tokens are the common prefix's
        assert all(120 <= len(user) <= 160 for user, _, _ in later)
        assert all(80 <= m <= 120 and t == 0 for _, m, t in turns)
    assert max(prefixes) <= 5000
    # Lognormal rescaled to average 1000, then clipped at 5000.
    assert 900 <= statistics.mean(prefixes) <= 1000.5
    assert statistics.median(prefixes) < statistics.mean(prefixes)
    # Turns are stable per conversation, whatever the number of conversations.
    again = multi_turn.conversations(cfg, 24, seed=3, think=(0, 0))
    assert [c[1] for c in again] == [c[1] for c in convs[:24]]


def test_distributions() -> None:
    rng = random.Random(0)
    assert multi_turn.distribution({"distribution": "constant", "value": 7})(rng, 3) == [7, 7, 7]
    u = multi_turn.distribution({"distribution": "uniform", "min": 2, "max": 4})(rng, 2000)
    assert set(u) == {2, 3, 4}
    ln = multi_turn.distribution({"distribution": "lognormal", "average": 50})(rng, 5000)
    assert statistics.mean(ln) == pytest.approx(50, abs=0.5)
    with pytest.raises(ValueError, match="unknown distribution"):
        multi_turn.distribution({"distribution": "zipf", "alpha": 2})


class _Chunk(ctypes.Structure):
    # What the core needs of a chunk (vLLM's ChunkStatus has these fields).
    _fields_ = [("chunk_id", ctypes.c_int64), ("ref_cnt", ctypes.c_int32)]


@pytest.mark.compiled
def test_the_core_exposes_its_node_size() -> None:
    from arc_cy._core import arc as core

    size = core._NODE_SIZE
    assert type(size) is int and size > 0
    if sys.maxsize > 2**32:
        assert size == 40  # two pointers, a hash, two links, a tag and a stamp
    # The core keeps its nodes in one array (PyMem, so tracemalloc sees it,
    # charged to the line that calls the core), 64 nodes at first, doubled
    # as the entries grow: its largest block is the node array.
    keys = [b"node-%d" % i for i in range(129)]
    chunks = [_Chunk(i, 0) for i in range(129)]
    policy = core.ARCCachePolicy(1000)
    largest = {}
    tracemalloc.start()
    try:
        for i in range(129):
            policy.insert(keys[i], chunks[i], None)
            if i + 1 in (1, 64, 65, 128, 129):
                snap = tracemalloc.take_snapshot().filter_traces(
                    [tracemalloc.Filter(True, __file__)]
                )
                largest[i + 1] = max(t.size for t in snap.traces)
    finally:
        tracemalloc.stop()
    assert largest == {
        1: 64 * size,
        64: 64 * size,
        65: 128 * size,
        128: 128 * size,
        129: 256 * size,
    }
