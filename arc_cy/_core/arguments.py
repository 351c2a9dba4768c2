"""The compiled core's argument checks and limits (the twins, as vLLM's ARC,
check no argument)."""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any

from .._messages import (
    MSG_CAPACITY_MAX,
    MSG_MAX_ENTRIES,
    MSG_MISSING,
    MSG_NEGATIVE_CAPACITY,
    MSG_NEGATIVE_N,
    MSG_TARGET_FINITE,
    MSG_TARGET_TYPE,
)

# The most entries (resident and ghost, all four lists) one policy holds:
# the compiled core's node array is indexed by int32 and grows by doubling.
MAX_ENTRIES = 2**29
# The largest cache_capacity: t1 + t2 and each ghost list hold up to it.
MAX_CAPACITY = MAX_ENTRIES // 3

# The default of the compiled core's required arguments: a call without
# one raises Python's own TypeError (missing_arguments), as the twin's does.
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()


def check_max_entries(value: Any) -> int:
    n: int = operator.index(value)
    if not 0 <= n <= MAX_ENTRIES:
        raise ValueError(MSG_MAX_ENTRIES.format(MAX_ENTRIES, n))
    return n


def check_evict_n(value: Any) -> int:
    n: int = operator.index(value)
    if n < 0:
        raise ValueError(MSG_NEGATIVE_N.format(n))
    return n


def check_capacity(capacity: Any) -> int:
    if capacity is MISSING:
        raise missing_arguments("__init__", cache_capacity=capacity)
    n: int = operator.index(capacity)
    if n < 0:
        raise ValueError(MSG_NEGATIVE_CAPACITY.format(n))
    if n > MAX_CAPACITY:
        raise ValueError(MSG_CAPACITY_MAX.format(MAX_CAPACITY, n))
    return n


def missing_arguments(method: str, **args: Any) -> TypeError:
    """The TypeError Python raises for a call of ARCCachePolicy.<method>
    without the arguments args gives as MISSING."""
    names = [repr(name) for name, value in args.items() if value is MISSING]
    if len(names) > 2:
        listed = ", ".join(names[:-1]) + ", and " + names[-1]
    else:
        listed = " and ".join(names)
    return TypeError(MSG_MISSING.format(method, len(names), "s" * (len(names) > 1), listed))


def check_target(value: Any) -> Any:
    # Stored as given (int or float), as vLLM does, so arithmetic on it
    # produces the same types and values in both implementations.
    # int() of it is taken where vLLM takes it, in evict().
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(MSG_TARGET_TYPE.format(value))
    try:
        finite = math.isfinite(value)
    except OverflowError:  # beyond a float's range (10**400): finite
        finite = True
    if not finite:
        raise ValueError(MSG_TARGET_FINITE.format(value))
    return value
