"""``python -m arc_cy``: report the installation and run a self-check.

Prints which implementation ``import arc_cy`` selected and where it was
imported from, the Cython that built the compiled core, the versions of vLLM
(and which verified release's ARC code it runs, ``arc_cy._guard``) and
Python, whether vLLM's general plugins register the ``"arc_cy"`` cache
policy name, and the result of one store/evict cycle: through vLLM's
``CPUOffloadingManager`` with ``cache_policy="arc_cy"`` (as an operator
configures it) when vLLM is installed, else through the policy alone.

Exits 0 when everything passes; 1 when the self-check fails, when the
arc_cy imported is a source tree rather than the installed one (run from a
checkout's root), when vLLM is installed but fails to import, or when the
installed vLLM's policy code is not one arc_cy verified (see
``ARC_CY_ALLOW_UNVERIFIED_VLLM``). ``--help`` and ``--version`` answer
without running anything.

``python -m arc_cy replay TRACE``: which policy fits a trace
(``arc_cy._replay``).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import arc_cy
from arc_cy._guard import (
    OVERRIDE_ENV,
    lockstep,
    lockstep_difference,
    overridden_message,
    override_set,
    refused_message,
    releases,
    verified_message,
    vllm_guard,
)
from arc_cy._guard.files import BASE_MODULE
from arc_cy._guard.verified import SUPPORTED_VLLM

LOCKSTEP_PASSED = (
    'its CPUOffloadingManager and tiering CPU primary tier decided alike with "arc" and with '
    f"arc_cy by both routes, {lockstep.REQUESTS} requests in lockstep"
)


def _built_with() -> str:
    """The Cython that generated the compiled core, recorded at build time."""
    try:
        from arc_cy._core import arc as core
    except ImportError as exc:
        return f"n/a (the compiled core does not import: {exc})"
    return str(core.CYTHON_VERSION)


def _package_report() -> tuple[bool, str]:
    """(ok, line) about where arc_cy was imported from: a source tree (a
    checkout's root on sys.path) is not what vLLM loads."""
    here = Path(arc_cy.__file__).resolve().parent
    tree = arc_cy._source_tree()
    if tree is None:
        return True, f"package: {here}"
    installed = []
    for dist in metadata.distributions(name="arc-cy"):
        if dist.read_text("RECORD") is None:  # build metadata, not an install
            continue
        init = Path(str(dist.locate_file("arc_cy/__init__.py")))
        if not init.is_file() or init.resolve().parent == here:
            # An editable install: this source tree is what is installed.
            return True, f"package: {here} (an editable install)"
        installed.append(str(init.resolve().parent))
    where = (
        f"which shadows the installed arc_cy ({', '.join(installed)}) that vLLM loads"
        if installed
        else "and arc_cy is not installed on this Python (pip install .)"
    )
    return False, (
        f"package: {here} is a source tree, {where}; this report is not about "
        "an installed arc_cy. Run `python -m arc_cy` from another directory, "
        "or `python -P -m arc_cy`."
    )


def _vllm_report() -> tuple[bool, list[str]]:
    """(ok, lines) about the installed vLLM: importable, and its ARC code
    one that arc_cy verified?"""
    from arc_cy import _vllm

    err = _vllm.VLLM_IMPORT_ERROR
    if not _vllm.VLLM_IMPORTED:
        if err is None:
            return True, ["vLLM: not installed"]
        return False, [f"vLLM: installed but failed to import: {type(err).__name__}: {err}"]
    code = vllm_guard.result()
    assert code is not None  # vLLM imports
    version = code.version
    if not _vllm.HAVE_VLLM:
        missing = getattr(err, "name", None) or ""
        if isinstance(err, ModuleNotFoundError) and (
            BASE_MODULE == missing or BASE_MODULE.startswith(missing + ".")
        ):
            # vllm imports, but has no module arc_cy builds on: too old or too new.
            return False, [
                f"vLLM: {version} is outside the range arc_cy supports ({SUPPORTED_VLLM}: "
                f"vLLM {releases()[-1]} to {releases()[0]}); it has no {missing}. Install a vLLM "
                "in that range (pip install 'arc_cy[vllm]')"
            ]
        return False, [
            f"vLLM: {version} is broken: its policy module {BASE_MODULE} does not import "
            f"what arc_cy needs: {type(err).__name__}: {err}"
        ]
    if code.ok and code.by_hash and (differs := lockstep_difference()):
        code = code._replace(problems=(differs,))
    if code.ok:
        return True, [f"vLLM: {version} ({verified_message(code)}; {LOCKSTEP_PASSED})"]
    if override_set():
        return True, [
            f"vLLM: {version} NOT VERIFIED, used anyway because {OVERRIDE_ENV} is set",
            f"warning: {overridden_message(code)}",
        ]
    return False, [
        f"vLLM: {version} NOT VERIFIED",
        f"error: {refused_message(code)}",
    ]


def _key(i: int) -> bytes:
    # Shaped like vLLM's OffloadKey: a 32-byte block hash + 4-byte group index.
    return bytes([i]) * 32 + (0).to_bytes(4, "big")


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _load_plugins() -> tuple[Any, list[str]]:
    """Load vLLM's general plugins; return the class registered as "arc_cy"
    (None if none) and arc_cy's plugin log messages."""
    import vllm.plugins
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    from arc_cy.plugin import POLICY_NAME, logger

    capture = _Capture()
    level = logger.level
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    try:
        vllm.plugins.load_general_plugins()  # type: ignore[no-untyped-call]  # vLLM's, unannotated
    finally:
        logger.removeHandler(capture)
        logger.setLevel(level)
    try:
        cls = CachePolicyFactory.get_cache_policy_cls(POLICY_NAME)
    except Exception:
        cls = None
    return cls, capture.messages


def _check_manager() -> str:
    """One store/evict cycle through CPUOffloadingManager(cache_policy="arc_cy"),
    compared with the same cycle on vLLM's own ARC."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    def cycle(policy: str) -> tuple[Any, list[Any]]:
        manager = CPUOffloadingManager(num_chunks=2, cache_policy=policy)
        ctx = ReqContext(req_id="arc_cy-self-check")
        trace: list[Any] = []
        first: list[Any] = [_key(1), _key(2)]
        out = manager.prepare_store(first, ctx)
        assert out is not None and out.keys_to_store == first, out
        manager.complete_store(first, ctx)
        trace.append(out.evicted_keys)
        # Full: storing a third chunk evicts the least recently stored one.
        third: list[Any] = [_key(3)]
        out = manager.prepare_store(third, ctx)
        assert out is not None, "store rejected"
        trace.append(out.evicted_keys)
        manager.complete_store(third, ctx)
        trace.append([manager.lookup(k, ctx) for k in [*first, *third]])
        return manager, trace

    manager, trace = cycle("arc_cy")
    policy = manager._policy
    if type(policy) is not arc_cy.ARCCachePolicy:
        raise AssertionError(
            f'cache_policy="arc_cy" built {type(policy).__module__}.'
            f"{type(policy).__qualname__}, not arc_cy.ARCCachePolicy"
        )
    _, oracle = cycle("arc")
    expected = [
        [],
        [_key(1)],
        [LookupResult.MISS, LookupResult.HIT, LookupResult.HIT],
    ]
    assert trace == expected, f"arc_cy: {trace}, expected {expected}"
    assert trace == oracle, f"arc_cy: {trace}, vLLM arc: {oracle}"
    assert list(policy.b1) == [_key(1)], list(policy.b1)
    policy._check_invariants()
    return (
        "ok: stored 2 chunks, a third evicted the oldest, through vLLM's "
        'CPUOffloadingManager(cache_policy="arc_cy"); same as vLLM\'s arc'
    )


def _check_policy() -> str:
    """One store/evict cycle through the policy alone (no vLLM)."""
    from arc_cy import ChunkStatus

    policy = arc_cy.ARCCachePolicy(cache_capacity=2)
    for i in (1, 2):
        chunk = ChunkStatus(i)
        policy.insert(_key(i), chunk, None)
        chunk.ref_cnt = 0  # stored
    evicted = policy.evict(1, set())
    assert evicted is not None and [k for k, _ in evicted] == [_key(1)], evicted
    assert list(policy.t1) == [_key(2)] and list(policy.b1) == [_key(1)]
    policy._check_invariants()
    return "ok: inserted 2 chunks and evicted the oldest through the policy alone"


def _parse_args(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m arc_cy",
        description="Report which arc_cy is installed (implementation, build, "
        "vLLM and whether its policy code is one arc_cy verified, Python), then "
        "run one store/evict cycle through vLLM's CPUOffloadingManager (or the "
        "policy alone without vLLM). Exits 0 when everything passes, else 1.",
        epilog="`python -m arc_cy replay TRACE` replays a trace (a recording made with "
        "ARC_CY_RECORD_TRACE) with each policy and says which to run: "
        "`python -m arc_cy replay --help`.",
    )
    parser.add_argument("--version", action="version", version=f"arc_cy {arc_cy.__version__}")
    parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["replay"]:
        from arc_cy._replay import main as replay

        return replay(argv[1:])
    _parse_args(argv)
    env = os.environ.get("ARC_CY_NO_EXTENSIONS")
    print(f"arc_cy {arc_cy.__version__}")
    try:
        module = arc_cy.ARCCachePolicy.__module__
    except ValueError as exc:  # a mistyped flag (arc_cy._flags)
        print(f"implementation: NOT CHOSEN: {exc}")
        return 1
    from arc_cy._vllm import HAVE_VLLM

    print(f"implementation: {arc_cy.IMPLEMENTATION} ({module})")
    print(f"ARC_CY_NO_EXTENSIONS: {'unset' if env is None else repr(env)}")
    print(f"built with Cython: {_built_with()}")
    package_ok, package_line = _package_report()
    print(package_line)
    vllm_ok, lines = _vllm_report()
    for line in lines:
        print(line)
    print(f"Python: {platform.python_version()} ({sys.executable})")

    if not package_ok:
        print("self-check: not run (see the package line above)")
        return 1
    if not vllm_ok:
        print("self-check: not run (see the vLLM line above)")
        return 1
    ok = True
    if HAVE_VLLM:
        try:
            cls, messages = _load_plugins()
        except Exception as exc:  # a broken plugin load is a failed check
            cls, messages = None, []
            print(f"plugin: loading vLLM's general plugins failed: {exc!r}")
        if cls is None:
            ok = False
            print(
                'plugin: "arc_cy" NOT registered after vLLM loaded its general '
                "plugins (is arc_cy installed with its vllm.general_plugins "
                "entry point? is it excluded by VLLM_PLUGINS?)"
            )
        else:
            print(f'plugin: "arc_cy" registered -> {cls.__module__}.{cls.__qualname__}')
        for message in messages:
            print(f"plugin log: {message}")
    else:
        print("plugin: n/a (vLLM not installed)")

    try:
        result = _check_manager() if HAVE_VLLM and ok else _check_policy()
    except Exception as exc:
        ok = False
        result = f"FAILED: {type(exc).__name__}: {exc}"
    else:
        if not ok:  # vLLM is installed but cannot find "arc_cy"
            result = 'FAILED: vLLM does not know "arc_cy" (policy alone: ' + result + ")"
    print(f"self-check: {result}")
    return 0 if ok else 1


def _run() -> int:
    try:
        status = main()
        if sys.stdout is not None:  # None: started with stdout closed (`>&-`)
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`python -m arc_cy | head -1`): stop quietly,
        # with the shell's status for it; nothing is left to flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return status


if __name__ == "__main__":
    sys.exit(_run())
