"""Test helpers shared by several test modules (not fixtures).

They import without vLLM: ChunkStatus is arc_cy's (vLLM's own class when
vLLM is installed, else arc_cy's stand-in of the same layout) and
ReqContext is vLLM's or, without vLLM, the stand-in below. Without vLLM,
VllmARC (vLLM's ARCCachePolicy, the oracle) is a class that refuses to be
made, and ORACLE_HOOKS is not there: a test that uses them is marked
``needs_vllm``.
"""

from __future__ import annotations

import ctypes
import importlib
import inspect
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from arc_cy import _vllm
from arc_cy._flags import env_flag
from arc_cy._messages import MSG_NO_COPY
from arc_cy._policy import HOOKS
from arc_cy._vllm import ChunkStatus


@dataclass
class StandInReqContext:
    """Stand-in for vLLM's ReqContext (vllm/v1/kv_offload/base.py), used
    without vLLM: what arc_cy and the tests use of it."""

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    _offload_key_positions: dict[Any, int] = field(default_factory=dict, repr=False, init=False)

    def set_offload_key_position(self, key: Any, end_token: int) -> None:
        self._offload_key_positions[key] = end_token

    def get_offload_key_position(self, key: Any) -> int | None:
        return self._offload_key_positions.get(key)


if _vllm.HAVE_VLLM:
    from vllm.v1.kv_offload.base import ReqContext
else:
    ReqContext = StandInReqContext  # type: ignore[misc]


HAVE_VLLM = bool(_vllm.HAVE_VLLM)

__all__ = [
    "CHOSEN",
    "CTX",
    "HAVE_VLLM",
    "ALL_IMPLEMENTATIONS",
    "IMPLEMENTATIONS",
    "PLUS_IMPLEMENTATIONS",
    "adapts",
    "is_plus",
    "oracle",
    "twin",
    "PURE",
    "PURE_ENV",
    "K",
    "MODULES",
    "REPO",
    "keysnap",
    "plus_snap",
    "ready",
    "ChunkStatus",
    "ReqContext",
    "VllmARC",
    "assert_same_state",
    "filled",
    "insert",
    "load_policy_class",
    "load_plus_class",
    "PLUS_MODULES",
    "ORACLE_HOOKS",
    "ORACLE_TOUCHES",
    "reuse",
    "REGISTERED",
    "ghost_hits",
    "KEY_POSITIONS",
    "build_requirement",
    "pyproject",
    "manager_state",
    "snapshot",
]


def snapshot(policy: Any) -> tuple:
    """Everything observable about an ARC policy's state, in order: its
    lists, and what adapts (ARC's target and its type, or ARC+'s ghost
    fates, arc_cy._policy.PLUS_DOC).

    Chunks are compared by identity: the same ChunkStatus objects must sit
    at the same places.
    """
    return (
        [(k, id(v)) for k, v in policy.t1.items()],
        [(k, id(v)) for k, v in policy.t2.items()],
        list(policy.b1.keys()),
        list(policy.b2.keys()),
        *adapts(policy),
    )


def adapts(policy: Any) -> tuple:
    """What adapts in a policy, and its type: ARC's target_t1_size, or
    ARC+'s ghost fates (arc_cy._policy.PLUS_DOC)."""
    if hasattr(policy, "b1_returned"):  # ARC+
        return (plus_snap(policy)[4], tuple)
    return (policy.target_t1_size, type(policy.target_t1_size))


def plus_snap(policy: Any) -> tuple:
    """Everything that decides ARC+'s next calls (arc_cy._policy.PLUS_DOC),
    chunks left out: its lists' keys in order and its ghosts' fates. The
    recency order across t1 and t2 is not in it: each implementation keeps
    its own stamps, and the evictions compared show it."""
    return (
        list(policy.t1.keys()),
        list(policy.t2.keys()),
        list(policy.b1.keys()),
        list(policy.b2.keys()),
        (policy.b1_returned, policy.b1_forgotten, policy.b2_returned, policy.b2_forgotten),
    )


def keysnap(policy: Any) -> tuple:
    """snapshot() without chunk identities (to compare different policies)."""
    s = snapshot(policy)
    return ([k for k, _ in s[0]], [k for k, _ in s[1]], *s[2:])


def ready(chunk_id: int, ref_cnt: int = 0) -> ChunkStatus:
    """A stored chunk that nothing is reading (ref_cnt 0), or ref_cnt
    readers."""
    chunk = ChunkStatus(chunk_id)
    chunk.ref_cnt = ref_cnt
    return chunk


_POINTER = ctypes.sizeof(ctypes.c_void_p)


def has_null_item(obj: list | tuple) -> bool:
    """Whether a list or tuple holds a NULL item: CPython's own code tracks
    some before filling them, and reading one crashes CPython, whoever
    reads it (docs/hardening.md, "Checks"). Looks at the item pointers,
    never at an item."""
    n = len(obj)
    if n == 0:
        return False
    if isinstance(obj, tuple):  # the items follow the header
        items = id(obj) + tuple.__basicsize__
    else:  # PyListObject: PyObject_VAR_HEAD, then ob_item
        items = ctypes.c_void_p.from_address(id(obj) + 3 * _POINTER).value
        if items is None:
            return True
    return None in list((ctypes.c_void_p * n).from_address(items))


def K(i: int) -> bytes:
    """Key number i."""
    return b"key-%d" % i


def filled(policy_cls: type, capacity: int, t1=(), t2=(), pinned=()) -> tuple:
    """A policy with the keys t1 in t1 and t2 in t2, LRU first (the keys in
    pinned have a reader), and its chunks by key."""
    policy = policy_cls(capacity)
    chunks = {}
    for name in [*t2, *t1]:
        chunks[name] = ready(len(chunks), 1 if name in pinned else 0)
        policy.insert(name, chunks[name], CTX)
    policy.touch(list(reversed(t2)), CTX)  # reversed: touch walks tail first
    assert list(policy.t1) == list(t1) and list(policy.t2) == list(t2)
    return policy, chunks


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


# tests/run.sh sets it: every skip is a failure (tests/conftest.py).
REQUIRE_ALL_ENV = "ARC_CY_TESTS_REQUIRE_ALL"

# ARC_CY_NO_EXTENSIONS: the switch that builds arc_cy without its core
# (setup.py) and makes arc_cy choose the twin (arc_cy/__init__.py). Set
# under the test command, the suite tests such a pure build: the twin alone,
# the compiled-only tests deselected (tests/conftest.py).
PURE_ENV = "ARC_CY_NO_EXTENSIONS"
PURE = env_flag(PURE_ENV)

# The implementations under test, by name: the compiled core and its twin,
# or the twin alone on a pure build.
ALL_IMPLEMENTATIONS = ("cython", "python")
IMPLEMENTATIONS = ("python",) if PURE else ALL_IMPLEMENTATIONS
# What arc_cy.ARCCachePolicy is: the core, or the twin on a pure build.
CHOSEN = IMPLEMENTATIONS[0]
MODULES = {"cython": "arc_cy._core.arc", "python": "arc_cy._twin.arc"}


# ARC+ under the same names, "-plus" added: what impl takes in a module
# marked both_policies (tests/conftest.py).
PLUS_IMPLEMENTATIONS = ("cython-plus", "python-plus")


def is_plus(name: str) -> bool:
    """Whether implementation name is ARC+'s ("cython-plus", "python-plus")."""
    return name.endswith("-plus")


def load_policy_class(name: str) -> type:
    """The policy class of implementation name: ARCCachePolicy, or
    ARCPlusCachePolicy for a "-plus" name. The compiled module is imported
    directly: a missing build fails here instead of quietly testing the
    pure twin twice."""
    if is_plus(name):
        return load_plus_class(name.removesuffix("-plus"))
    return importlib.import_module(MODULES[name]).ARCCachePolicy  # type: ignore[no-any-return]


# ARC+ (arc_cy_plus): the compiled class and its plain twin.
PLUS_MODULES = {"cython": "arc_cy._core.arc", "python": "arc_cy._twin.plus"}


def load_plus_class(name: str) -> type:
    """The ARCPlusCachePolicy of implementation name, imported as
    load_policy_class imports ARCCachePolicy."""
    return importlib.import_module(PLUS_MODULES[name]).ARCPlusCachePolicy  # type: ignore[no-any-return]


REPO = Path(__file__).resolve().parents[1]
# The installed package's directory, ending in a separator: a frame runs
# arc_cy's code when its filename starts with it (a test for "arc_cy" in a
# filename also matches a checkout or a temporary copy named after it).
ARC_CY_DIR = os.path.dirname(os.path.abspath(_vllm.__file__)) + os.sep
"""The source tree (a checkout or an unpacked sdist) the tests came from."""


def edited(source: str, *pairs: str) -> str:
    """source with each old of (old, new, ...) replaced by its new, once."""
    for old, new in zip(pairs[::2], pairs[1::2]):
        assert source.count(old) == 1, f"{old!r} is not once in the file"
        source = source.replace(old, new)
    return source


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


# Token positions on the request context came with on_request_finished (0.31).
KEY_POSITIONS = hasattr(ReqContext, "set_offload_key_position")

CTX = ReqContext(req_id="tests")
"""A request context for calls whose context does not matter."""


def _release_touch(release: str) -> Any:
    """ARCCachePolicy.touch of vLLM ``release``, run from its stored arc.py."""
    path = REPO / "tests/data/vllm" / release / "vllm/v1/kv_offload/cpu/policies/arc.py"
    namespace: dict[str, Any] = {"__name__": f"vllm_{release.replace('.', '_')}_arc"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["ARCCachePolicy"].touch


if HAVE_VLLM:
    from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy as _VllmARC

    ORACLE_TOUCHES = hasattr(_VllmARC, "touch")
    """Whether vLLM's ARC has touch() (0.30 to 0.33; 0.34 removed it)."""

    if ORACLE_TOUCHES:
        VllmARC = _VllmARC
    else:

        class VllmARC(_VllmARC):  # type: ignore[no-redef]
            """vLLM's ARC, given back the touch() it had until 0.33.0, which
            arc_cy keeps for those releases' managers: 0.33.0's own code,
            from its arc.py in tests/data (faithful while the rest of that
            file is this release's arc.py: tests/test_vllm_releases.py,
            test_the_oracles_touch_is_vllms_own)."""

            touch = _release_touch("0.33.0")

else:
    ORACLE_TOUCHES = True

    class VllmARC:  # type: ignore[no-redef]
        """Without vLLM: refuses to be made (a test that uses vLLM's ARC
        is marked needs_vllm and never gets here)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError(
                "vLLM's ARCCachePolicy is not available (vLLM is not installed): "
                "a test that uses it is marked needs_vllm"
            )


def twin(cls: type) -> type:
    """The twin of a policy class: ARC's, or ARC+'s for an ARCPlusCachePolicy."""
    plus = cls.__name__ == "ARCPlusCachePolicy"
    return load_plus_class("python") if plus else load_policy_class("python")


def no_copy(cls: type) -> str:
    """The compiled core's refusal to be copied (MSG_NO_COPY): it names the
    twin of its policy, which copies."""
    t = twin(cls)
    return MSG_NO_COPY.format(cls.__qualname__, f"{t.__module__.split('.')[-1]}.{t.__qualname__}")


def oracle(cls: type) -> type:
    """What a policy class must decide as: vLLM's ARC for an ARCCachePolicy,
    ARC+'s twin for an ARCPlusCachePolicy (arc_cy._policy.PLUS_DOC)."""
    return twin(cls) if cls.__name__ == "ARCPlusCachePolicy" else VllmARC


# vLLM 0.32's CachePolicy.insert takes no req_context; 0.33 added it.
# Without vLLM, arc_cy's insert (which takes it) is the only one.
INSERT_TAKES_CONTEXT = (
    "req_context" in inspect.signature(VllmARC.insert).parameters if HAVE_VLLM else True
)


def _oracle_hooks() -> frozenset[str]:
    # The hooks the installed vLLM's ARC has: 0.30 has none of these, 0.31
    # and 0.32 lack on_request_access. A test calls only these on every
    # policy, as the release's own manager would.
    return frozenset(name for name in HOOKS if hasattr(VllmARC, name))


if HAVE_VLLM:  # what vLLM's ARC has: a module that imports it needs vLLM
    ORACLE_HOOKS = _oracle_hooks()
# Not vLLM's manager module: it imports vllm.config, seconds of CPU in each
# child process that imports these helpers (reuse and ghost_hits ask the
# manager they are given).


# What the plugin's log line names: ARC+ ("arc_cy_plus") too where the
# installed vLLM's manager calls on_request_finished (0.31 and later).
REGISTERED = (
    "policies 'arc_cy' and 'arc_cy_plus'"
    if HAVE_VLLM and hasattr(VllmARC, "on_request_finished")
    else "policy 'arc_cy'"
)


def reuse(manager: Any, keys: list[Any], req_id: str = "reuse") -> None:
    """A request's hits on ready keys, as the installed vLLM's manager
    learns of them: touch() until 0.33; from 0.34, a load of the keys in a
    request that finishes (0.34.0's own tests' reuse_keys)."""
    ctx = ReqContext(req_id=req_id)
    if hasattr(manager, "touch"):  # vLLM 0.30 to 0.33
        manager.touch(keys, ctx)
    else:
        manager.prepare_load(keys, ctx)
        manager.complete_load(keys, ctx)
        manager.on_request_finished(ctx)


def ghost_hits(manager: Any, keys: list[Any]) -> None:
    """A request's store misses on keys, as the installed vLLM's manager
    hands them to the policy: touch() until 0.33 (0.30 has no
    on_store_miss); from 0.34, on_store_miss (0.34.0's own tests)."""
    ctx = ReqContext(req_id="miss")
    if hasattr(manager, "touch"):  # vLLM 0.30 to 0.33
        manager.touch(keys, ctx)
    else:
        manager._policy.on_store_miss(keys, ctx)


def insert(policy: Any, key: Any, chunk: Any, req_context: Any) -> None:
    """policy.insert, called as the installed vLLM's manager calls it."""
    if INSERT_TAKES_CONTEXT:
        policy.insert(key, chunk, req_context)
    else:
        policy.insert(key, chunk)
