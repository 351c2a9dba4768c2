"""A multi-turn chat workload for ``offload_stub.SchedulerHarness``.

Conversations share system prompts and grow by their earlier turns; some
turns are aborted (some while their prefix loads from the CPU cache), and a
small GPU KV cache makes the scheduler preempt. Everything random is drawn
up front from a seed, so two harnesses driven by equal workloads take the
same steps. The end-to-end tests use ``WorkloadConfig``'s draws;
``bench/multi_turn.py`` passes conversations of vLLM's multi-turn shape.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from arc_cy_harness.offload_stub import VOCAB_SIZE, SchedulerHarness


@dataclass
class WorkloadConfig:
    """A multi-turn chat workload; everything random is drawn up front from
    ``seed``, so it does not depend on how the run goes."""

    seed: int = 0
    num_conversations: int = 24
    num_system_prompts: int = 3
    system_prompt_len: tuple[int, int] = (48, 112)
    turns: tuple[int, int] = (2, 5)
    user_len: tuple[int, int] = (16, 64)
    output_len: tuple[int, int] = (6, 24)
    # steps between conversation starts, and the pause after each reply
    arrival_gap: int = 3
    think_steps: tuple[int, int] = (0, 12)
    # probability that a turn is aborted, and when (steps after submission)
    abort_prob: float = 0.1
    abort_after: tuple[int, int] = (0, 6)
    # probability that a turn is aborted as soon as it is seen waiting for
    # a load from the CPU cache (if it ever does)
    abort_on_load_prob: float = 0.0
    # a conversation ends before a turn whose prompt plus reply would exceed
    # this many tokens (keep it below the GPU KV cache, or the turn can never
    # be scheduled)
    max_request_len: int = 1 << 30


@dataclass
class _Turn:
    user: list[int]
    max_tokens: int
    think: int
    abort_after: int | None
    abort_on_load: bool


@dataclass
class _Conversation:
    index: int
    system: list[int]
    turns: list[_Turn]
    start_step: int
    history: list[int] = field(default_factory=list)
    next_turn: int = 0
    ready_step: int = 0
    active: Any = None  # the Request of the turn in flight
    abort_step: int | None = None
    abort_on_load: bool = False
    done: bool = False


@dataclass
class RunStats:
    steps: int = 0
    requests: int = 0
    finished: int = 0
    aborted: int = 0
    aborted_while_loading: int = 0
    preempted: int = 0
    load_jobs: int = 0
    store_jobs: int = 0


class ChatWorkload:
    """Drives a ``SchedulerHarness`` with multi-turn conversations that share
    system prompts and grow by their earlier turns; some turns are aborted,
    and a small GPU KV cache makes the scheduler preempt."""

    def __init__(
        self,
        config: WorkloadConfig,
        prefix: str = "c",
        *,
        conversations: list[tuple[list[int], list[tuple[list[int], int, int]]]] | None = None,
        max_live: int | None = None,
    ) -> None:
        """``conversations``, if given, replaces the conversations drawn from
        ``config``: one ``(prefix tokens, [(user tokens, max_tokens, think
        steps), ...])`` per conversation, started ``config.arrival_gap``
        steps apart, never aborted. ``max_live`` caps the conversations in
        progress (a closed loop of that many clients): a conversation due to
        start waits for a free client."""
        rng = random.Random(config.seed)
        self.max_live = max_live

        def tokens(bounds: tuple[int, int]) -> list[int]:
            return [rng.randrange(1, VOCAB_SIZE) for _ in range(rng.randint(*bounds))]

        self.conversations: list[_Conversation] = []
        for i, (head, spec) in enumerate(conversations or ()):
            # The token lists are shared, never mutated: several workloads
            # can run the same conversations.
            turns = [_Turn(u, m, t, None, False) for u, m, t in spec]
            start = i * config.arrival_gap
            self.conversations.append(_Conversation(i, head, turns, start, ready_step=start))
        systems = [tokens(config.system_prompt_len) for _ in range(config.num_system_prompts)]
        for i in range(0 if conversations is not None else config.num_conversations):
            system = systems[rng.randrange(len(systems))]
            turns = [
                _Turn(
                    user=tokens(config.user_len),
                    max_tokens=rng.randint(*config.output_len),
                    think=rng.randint(*config.think_steps),
                    abort_after=(
                        rng.randint(*config.abort_after)
                        if rng.random() < config.abort_prob
                        else None
                    ),
                    abort_on_load=rng.random() < config.abort_on_load_prob,
                )
                for _ in range(rng.randint(*config.turns))
            ]
            start = i * config.arrival_gap + rng.randint(0, config.arrival_gap)
            self.conversations.append(_Conversation(i, system, turns, start, ready_step=start))
        self.max_request_len = config.max_request_len
        self.prefix = prefix
        self.step_index = 0
        self.stats = RunStats()
        # Not yet started, by start step; started and not done, by index.
        self._pending = sorted(self.conversations, key=lambda c: (c.start_step, c.index))
        self._pending.reverse()
        self._live: list[_Conversation] = []

    def done(self) -> bool:
        return not self._pending and not self._live

    def _submit(self, harness: SchedulerHarness, conv: _Conversation) -> None:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        turn = conv.turns[conv.next_turn]
        prompt = conv.system + conv.history + turn.user
        request = Request(
            request_id=f"{self.prefix}{conv.index}-t{conv.next_turn}",
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(max_tokens=turn.max_tokens, ignore_eos=True),
            pooling_params=None,
            block_hasher=harness.block_hasher,
        )
        harness.scheduler.add_request(request)
        conv.active = request
        conv.abort_step = None if turn.abort_after is None else self.step_index + turn.abort_after
        conv.abort_on_load = turn.abort_on_load
        self.stats.requests += 1

    def step(self, harness: SchedulerHarness) -> None:
        """Submit due turns, abort due requests, run one scheduler step, and
        advance conversations whose turn finished."""
        from vllm.v1.request import RequestStatus

        stats = self.stats
        pending, live = self._pending, self._live
        if pending and pending[-1].start_step <= self.step_index:
            cap = self.max_live
            while (
                pending
                and pending[-1].start_step <= self.step_index
                and (cap is None or len(live) < cap)
            ):
                live.append(pending.pop())
            live.sort(key=lambda c: c.index)
        for conv in live:
            if conv.done:
                continue
            if conv.active is None and conv.ready_step <= self.step_index:
                turn = conv.turns[conv.next_turn]
                length = len(conv.system) + len(conv.history) + len(turn.user)
                if length + turn.max_tokens > self.max_request_len:
                    conv.done = True
                    continue
                self._submit(harness, conv)
            request = conv.active
            if request is None or request.is_finished():
                continue
            loading = request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            if (conv.abort_on_load and loading) or (
                conv.abort_step is not None and conv.abort_step <= self.step_index
            ):
                stats.aborted_while_loading += loading
                harness.scheduler.finish_requests(
                    request.request_id, RequestStatus.FINISHED_ABORTED
                )
                conv.abort_step = None
                conv.abort_on_load = False

        harness.step()
        self.step_index += 1

        for conv in live:
            request = conv.active
            if request is None or not request.is_finished():
                continue
            conv.active = None
            if request.status == RequestStatus.FINISHED_ABORTED:
                stats.aborted += 1
                conv.done = True
                continue
            stats.finished += 1
            turn = conv.turns[conv.next_turn]
            conv.history += turn.user + list(request.output_token_ids)
            conv.next_turn += 1
            conv.ready_step = self.step_index + turn.think
            conv.done = conv.next_turn == len(conv.turns)
        if any(conv.done for conv in live):
            live[:] = [conv for conv in live if not conv.done]

    def run(self, harness: SchedulerHarness, max_steps: int = 20_000) -> RunStats:
        """Step until every conversation is over and the scheduler and the
        connector are idle."""
        while not self.done() or harness.scheduler.has_requests():
            if self.step_index >= max_steps:
                raise RuntimeError(f"workload still running after {max_steps} steps")
            self.step(harness)
        stats = self.stats
        stats.steps = self.step_index
        stats.preempted = harness.num_preempted
        stats.load_jobs = harness.num_load_jobs
        stats.store_jobs = harness.num_store_jobs
        return stats
