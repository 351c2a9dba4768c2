"""bench/multi_turn.py reads vLLM's multi-turn generator configuration
(bench/data/generate_multi_turn.json) and builds conversations of its shape.
No policy is involved here; the scheduler runs are in the bench itself."""

from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import multi_turn  # noqa: E402


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
