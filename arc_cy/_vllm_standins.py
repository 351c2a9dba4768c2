"""vLLM's ChunkStatus, CachePolicy and order_request_keys, for use without vLLM.

arc_cy uses vLLM's own objects when vLLM imports; these stand in when it does
not, and are what type checkers see either way (``ChunkStatus`` has vLLM's
memory layout, so the two are interchangeable for arc_cy).
"""

from __future__ import annotations

import ctypes
from collections.abc import Hashable, Sequence
from typing import Any, Protocol


class ChunkStatus(ctypes.Structure):
    """Stand-in for vLLM's ChunkStatus with the same memory layout.

    ref_cnt is the number of transfers reading the chunk; -1 means the
    chunk is still being written. chunk_id is the CPU buffer slot.
    """

    _fields_ = [("ref_cnt", ctypes.c_int32), ("chunk_id", ctypes.c_int64)]
    ref_cnt: int
    chunk_id: int

    def __init__(self, chunk_id: int) -> None:
        super().__init__()
        self.ref_cnt = -1
        self.chunk_id = chunk_id

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


class CachePolicy:
    """Stand-in for vLLM's CachePolicy base class."""

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity


class RequestContext(Protocol):
    """What order_request_keys needs of vLLM's ReqContext."""

    def get_offload_key_position(self, key: Any) -> int | None: ...


def order_request_keys(
    key_groups: Sequence[Sequence[Hashable]], req_context: RequestContext
) -> list[Hashable]:
    """One head-to-tail order across all KV cache groups (as vLLM's)."""
    keys = [key for group in key_groups for key in group]
    positions = {
        key: position
        for key in keys
        if (position := req_context.get_offload_key_position(key)) is not None
    }
    if len(positions) == len(keys):
        keys.sort(key=positions.__getitem__)
    return keys
