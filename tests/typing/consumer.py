"""A small program that uses arc_cy as a typed library would be used.

tests/test_typing.py runs ``mypy --strict`` on it: a type checker must see
usable types whether or not vLLM is installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

import arc_cy
from arc_cy import ARCCachePolicy, ChunkStatus
from arc_cy._core.arc import ARCCachePolicy as CompiledARC
from arc_cy._twin.arc import ARCCachePolicy as PureARC


def fill(policy: ARCCachePolicy | CompiledARC | PureARC, n: int) -> list[bytes]:
    keys = [i.to_bytes(4, "big") for i in range(n)]
    for i, key in enumerate(keys):
        chunk = ChunkStatus(i)
        policy.insert(key, chunk, None)
        chunk.ref_cnt = 0
    return keys


def victims(policy: ARCCachePolicy | CompiledARC, n: int) -> list[int]:
    evicted = policy.evict(n, frozenset())
    if evicted is None:
        return []
    return [chunk.chunk_id for _key, chunk in evicted]


def resident(view: Mapping[object, ChunkStatus]) -> int:
    return sum(1 for chunk in view.values() if chunk.is_ready)


def main() -> None:
    policy = arc_cy.ARCCachePolicy(cache_capacity=4)
    fill(policy, 4)
    chunk_ids: list[int] = victims(policy, 2)
    policy.target_t1_size = Fraction(1, 3)  # any real number, as in vLLM
    target: float = float(policy.target_t1_size)
    ghosts: list[object] = list(policy.b1)
    ready: int = resident(policy.t1)
    implementation: str = arc_cy.IMPLEMENTATION
    supported: str = arc_cy.SUPPORTED_VLLM
    compiled = CompiledARC(8)
    fill(compiled, 2)
    print(chunk_ids, target, ghosts, ready, implementation, supported, victims(compiled, 1))


if __name__ == "__main__":
    main()
