"""Test helpers shared by several test modules (not fixtures)."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy as VllmARC
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

__all__ = [
    "K",
    "REPO",
    "keysnap",
    "ready",
    "ChunkStatus",
    "ReqContext",
    "VllmARC",
    "assert_same_state",
    "insert",
    "ORACLE_HOOKS",
    "KEY_POSITIONS",
    "build_requirement",
    "pyproject",
    "manager_state",
    "snapshot",
]


def snapshot(policy: Any) -> tuple:
    """Everything observable about an ARC policy's state, in order.

    Chunks are compared by identity: the same ChunkStatus objects must sit
    at the same places.
    """
    return (
        [(k, id(v)) for k, v in policy.t1.items()],
        [(k, id(v)) for k, v in policy.t2.items()],
        list(policy.b1.keys()),
        list(policy.b2.keys()),
        policy.target_t1_size,
        type(policy.target_t1_size),
    )


def keysnap(policy: Any) -> tuple:
    """snapshot() without chunk identities (to compare different policies)."""
    s = snapshot(policy)
    return ([k for k, _ in s[0]], [k for k, _ in s[1]], *s[2:])


def ready(chunk_id: int) -> ChunkStatus:
    """A stored chunk that nothing is reading (ref_cnt 0)."""
    chunk = ChunkStatus(chunk_id)
    chunk.ref_cnt = 0
    return chunk


def K(i: int) -> bytes:
    """Key number i."""
    return b"key-%d" % i


def assert_same_state(oracle: Any, *policies: Any) -> None:
    expected = snapshot(oracle)
    for policy in policies:
        assert snapshot(policy) == expected, type(policy).__module__
        policy._check_invariants()


def manager_state(manager: Any) -> tuple:
    """The policy state of a CPUOffloadingManager, comparable across managers.

    Managers allocate their own ChunkStatus objects, so chunks are compared
    by chunk_id and ref_cnt instead of identity.
    """
    policy = manager._policy
    return (
        [(k, c.chunk_id, c.ref_cnt) for k, c in policy.t1.items()],
        [(k, c.chunk_id, c.ref_cnt) for k, c in policy.t2.items()],
        list(policy.b1),
        list(policy.b2),
        policy.target_t1_size,
    )


REPO = Path(__file__).resolve().parents[1]
"""The source tree (a checkout or an unpacked sdist) the tests came from."""


def pyproject() -> dict[str, Any]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def build_requirement(name: str) -> Requirement:
    """The [build-system] requirement on ``name``."""
    for text in pyproject()["build-system"]["requires"]:
        req = Requirement(text)
        if req.name.lower() == name.lower():
            return req
    raise LookupError(name)


# vLLM 0.32's CachePolicy.insert takes no req_context; 0.33 added it.
INSERT_TAKES_CONTEXT = "req_context" in inspect.signature(VllmARC.insert).parameters


# The hooks the installed vLLM's ARC has: 0.30 has none of these, 0.31 and
# 0.32 lack on_request_access. A test calls only these on every policy, as the
# release's own manager would.
ORACLE_HOOKS = frozenset(
    name
    for name in ("on_store_miss", "on_request_access", "on_request_finished")
    if hasattr(VllmARC, name)
)
# Token positions on the request context came with on_request_finished (0.31).
KEY_POSITIONS = hasattr(ReqContext, "set_offload_key_position")


def insert(policy: Any, key: Any, chunk: Any, req_context: Any) -> None:
    """policy.insert, called as the installed vLLM's manager calls it."""
    if INSERT_TAKES_CONTEXT:
        policy.insert(key, chunk, req_context)
    else:
        policy.insert(key, chunk)
