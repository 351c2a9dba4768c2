"""The text of every error arc_cy raises, written once: the compiled core's,
and the one the twins share with it (MSG_REENTRANT), which they cannot
word differently."""

MSG_NEGATIVE_N = "evict() needs n >= 0, got {!r}"
MSG_NEGATIVE_CAPACITY = "cache_capacity must be >= 0, got {!r}"
MSG_CAPACITY_MAX = (
    "cache_capacity must be at most {} (2**29 entries: t1 + t2, b1 and b2 "
    "each hold up to cache_capacity), got {!r}"
)
MSG_TARGET_TYPE = "target_t1_size must be a real number, got {!r}"
MSG_TARGET_FINITE = "target_t1_size must be finite, got {!r}"
MSG_DUPLICATE = "key {!r} is already cached (in {}); remove() it before insert()"
MSG_CHUNK = (
    "chunk must be a ctypes structure with a c_int32 'ref_cnt' field, "
    "like vLLM's ChunkStatus; got {}"
)
MSG_CHUNK_READY = (
    "chunk type {} overrides is_ready; arc_cy decides readiness as vLLM's "
    "ChunkStatus does (ref_cnt >= 0)"
)
MSG_CHUNK_SIZE = (
    "chunk of type {} has a {}-byte buffer, too small for its ref_cnt field at offset {}"
)
MSG_FULL = "ARC policy is full: it holds its limit of {} entries (t1, t2, b1 and b2)"
MSG_MAX_ENTRIES = "_max_entries must be between 0 and {}, got {!r}"
MSG_REENTRANT = "{}() called on the ARC policy while {}() is still running"
MSG_MUTATED = "ARC list changed during iteration"
MSG_ARC_NO_FATES = "ARC keeps no ghost fates: they are ARC+'s (arc_cy_plus)"
MSG_PLUS_NO_TARGET = (
    "ARC+ has no target_t1_size: it adapts no target (its ghosts' fates: b1_returned, "
    "b1_forgotten, b2_returned, b2_forgotten)"
)
# Python's own texts, which the compiled core's interface gives too.
MSG_NO_ACCESSOR = "property {!r} of {!r} object has no {}"
MSG_MISSING = "ARCCachePolicy.{}() missing {} required positional argument{}: {}"
MSG_NO_COPY = "{} (arc_cy's compiled core) cannot be copied or pickled; arc_cy._twin.{} can"
