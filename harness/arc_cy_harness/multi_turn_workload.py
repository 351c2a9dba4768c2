"""The conversation shape of vLLM's multi-turn benchmark, read from its
generator configuration (bench/data/generate_multi_turn.json, vLLM's
``benchmarks/multi_turn/generate_multi_turn.json``): ``bench/multi_turn.py``
drives vLLM's scheduler with these conversations, and
``tests/test_bench_workload.py`` checks them against the file.
"""

from __future__ import annotations

import json
import math
import os
import random
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "bench", "data", "generate_multi_turn.json")
BLOCK_SIZE = 16


def distribution(spec: dict[str, Any]) -> Any:
    """A sampler ``(rng, size) -> list[int]`` for one distribution of the
    generator file. Semantics as documented for vLLM's multi-turn generator:
    uniform over integers (bounds included), constant, and lognormal given
    its average (median = median_ratio x average, default ratio 0.85; each
    batch of samples is rescaled to that average) or its mean and sigma,
    clipped at ``max`` and rounded."""
    kind = spec.get("distribution")
    if kind == "constant":
        value = spec["value"]
        return lambda rng, size: [value] * size
    if kind == "uniform":
        lo, hi = spec["min"], spec["max"]
        if not (isinstance(lo, int) and isinstance(hi, int)) or not 0 < lo <= hi:
            raise ValueError(f"unsupported uniform distribution {spec}")
        return lambda rng, size: [rng.randint(lo, hi) for _ in range(size)]
    if kind == "lognormal":
        cap = spec.get("max")
        average = spec.get("average")
        if average is not None:
            ratio = spec.get("median_ratio") or 0.85
            if not 0 < ratio < 1:
                raise ValueError("median_ratio must be in (0, 1)")
            mu = math.log(average * ratio)
            sigma = math.sqrt(2 * math.log(1 / ratio))
        else:
            mu, sigma = spec["mean"], spec["sigma"]

        def sample(rng: random.Random, size: int) -> list[int]:
            xs = [rng.lognormvariate(mu, sigma) for _ in range(size)]
            if average is not None:
                scale = average / (sum(xs) / size)
                xs = [x * scale for x in xs]
            if cap:
                xs = [min(x, cap) for x in xs]
            return [int(round(x)) for x in xs]

        return sample
    raise ValueError(f"unknown distribution {kind!r} in {spec}")


def load_config(path: str = DATA) -> dict[str, Any]:
    with open(path) as f:
        cfg = json.load(f)
    if cfg.get("filetype") != "generate_conversations":
        raise ValueError(f"{path}: not a generate_conversations file")
    return cfg


VOCAB = 32000
_TOKENS = list(range(VOCAB))  # shared int objects for token ids


def conversations(
    cfg: dict[str, Any],
    n: int,
    seed: int,
    think: tuple[int, int],
) -> list[tuple[list[int], list[tuple[list[int], int, int]]]]:
    """``n`` conversations of the generator's shape, as
    ``(prefix tokens, [(user tokens, max_tokens, think steps), ...])``.

    As in vLLM's generator: ``num_turns`` counts messages (at least 2,
    rounded up to even; half are user turns); the first user turn carries
    the common prefix and the conversation's prefix, and its own input
    tokens count the common prefix; later turns have ``num_tokens`` input
    tokens; each turn is answered with ``prompt_output.num_tokens`` tokens."""
    pin, pout = cfg["prompt_input"], cfg["prompt_output"]
    rng = random.Random(seed)
    turns_d = distribution(pin["num_turns"])
    # One batch, as the lognormal's rescaling to its average is per batch.
    prefix_len = distribution(pin["prefix_num_tokens"])(rng, n)
    common_spec = pin.get("common_prefix_num_tokens", {"distribution": "constant", "value": 0})
    common_len = distribution(common_spec)(rng, 1)[0]
    in_d = distribution(pin["num_tokens"])
    out_d = distribution(pout["num_tokens"])
    crng = random.Random(f"{seed}/common")
    common = [_TOKENS[crng.randrange(1, VOCAB)] for _ in range(common_len)]
    out = []
    for i in range(n):
        # Stable per conversation: its turns do not depend on n; its
        # prefix's tokens neither (its length does, through the batch).
        r = random.Random(f"{seed}/{i}")
        pr = random.Random(f"{seed}/{i}/prefix")

        def toks(k: int, g: random.Random = r) -> list[int]:
            return [_TOKENS[g.randrange(1, VOCAB)] for _ in range(k)]

        msgs = max(2, turns_d(r, 1)[0])
        msgs += msgs % 2
        head = common + toks(prefix_len[i], pr)
        turns = []
        for t in range(msgs // 2):
            k = in_d(r, 1)[0]
            if t == 0:
                k = max(0, k - common_len)
            turns.append((toks(k), max(1, out_d(r, 1)[0]), r.randint(*think)))
        out.append((head, turns))
    return out


def conversation_chunks(convs: list[Any]) -> int:
    """Distinct chunks the conversations' full histories would fill (prompt
    and answers, at the upper answer length; the shared prefix counted once)."""
    total = 0
    for head, turns in convs:
        n = len(head) + sum(len(u) + m for u, m, _ in turns)
        total += n // BLOCK_SIZE
    return total
