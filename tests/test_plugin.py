"""The plugin never raises out of vLLM's plugin loading (docs/usage.md,
"The guard"): whatever fails inside ``register()`` (a mistyped flag, a
broken vLLM, an error in any call it makes) is logged at ERROR and
registers nothing. The one exception is the name ``arc_cy`` taken by
another policy (test_manager.py). Through vLLM's own loader, in a fresh
process: test_manager.py's entry-point test."""

from __future__ import annotations

import logging
import os
import re

import pytest

import arc_cy
from arc_cy import _flags, _guard, plugin
from helpers import PURE

pytestmark = [pytest.mark.needs_vllm, pytest.mark.install]

BAD_VALUES = ("y", "2", "enable", "tru e")


@pytest.fixture
def registry(monkeypatch):
    """vLLM's factory registry, without arc_cy, restored afterwards."""
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    table = dict(CachePolicyFactory._registry)
    table.pop(plugin.POLICY_NAME, None)
    monkeypatch.setattr(CachePolicyFactory, "_registry", table)
    return table


@pytest.fixture
def fresh(monkeypatch):
    """arc_cy as a new process has it: the implementation not yet chosen
    (its flag read on the next use), the guard not yet run."""
    for name in ("ARCCachePolicy", "IMPLEMENTATION"):
        monkeypatch.delattr(arc_cy, name, raising=False)
    monkeypatch.setattr(_guard, "vllm_guard", _guard.VllmGuard())
    for flag in _flags.RUNTIME_FLAGS:
        monkeypatch.delenv(flag, raising=False)
    if PURE:  # a pure build has no core: the run's own choice stays
        monkeypatch.setenv("ARC_CY_NO_EXTENSIONS", "1")


def refused(caplog, registry) -> str:
    """The ERROR line register() logged; fails if it registered."""
    assert plugin.POLICY_NAME not in registry
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert errors[0].endswith("The 'arc_cy' cache policy is NOT registered."), errors
    return errors[0]


def test_every_flag_arc_cy_reads_is_listed():
    """RUNTIME_FLAGS generates the cases below: a flag named in the package's
    Python (a string that reads the environment) must be in it, or among the
    recording's settings (tests/test_record.py has their bad values)."""
    package = os.path.dirname(arc_cy.__file__)
    named = set()
    for folder, _, names in os.walk(package):
        for name in (n for n in names if n.endswith(".py")):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                named.update(re.findall(r"[\"'](ARC_CY_[A-Z_]+)[\"']", f.read()))
    listed = {*_flags.RUNTIME_FLAGS, *_flags.RECORDING}
    assert named and named <= listed, named - listed


@pytest.mark.parametrize("value", BAD_VALUES)
@pytest.mark.parametrize("flag", _flags.RUNTIME_FLAGS)
def test_a_mistyped_flag_is_logged_not_raised(flag, value, fresh, registry, monkeypatch, caplog):
    monkeypatch.setenv(flag, value)
    if flag != "ARC_CY_NO_EXTENSIONS":
        # The override flags are read where the code is not verified.
        unverified = _guard.CodeCheck("0.0.0", problems=("a test's vLLM",))
        monkeypatch.setattr(_guard, "check_vllm_code", lambda: unverified)
    with caplog.at_level(logging.ERROR, logger=plugin.logger.name):
        plugin.register()
    assert f"{flag}={value!r} is not a boolean" in refused(caplog, registry)


def _raiser(*args, **kwargs):
    raise OSError("injected")


# Every call register() makes, by where it is reached from the plugin.
CALLS = {
    "the implementation": lambda mp: mp.setattr(arc_cy, "__getattr__", _raiser),
    "the guard's result": lambda mp: mp.setattr(_guard, "check_vllm_code", _raiser),
    "the guard's allowed": lambda mp: mp.setattr(_guard.VllmGuard, "allowed", _raiser),
    "the hook check": lambda mp: mp.setattr(_guard, "plus_refusal", _raiser),
    "the verified message": lambda mp: mp.setattr(_guard, "verified_message", _raiser),
    "the refused message": lambda mp: (
        mp.setattr(_guard, "refused_message", _raiser),
        mp.setattr(_guard, "check_vllm_code", lambda: _guard.CodeCheck("0.0.0", problems=("x",))),
    ),
    "the factory's register": lambda mp: mp.setattr(
        _factory(), "register_cache_policy", classmethod(_raiser)
    ),
}


def _factory():
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

    return CachePolicyFactory


@pytest.mark.parametrize("call", sorted(CALLS))
def test_an_error_in_any_call_is_logged_not_raised(call, fresh, registry, monkeypatch, caplog):
    CALLS[call](monkeypatch)
    with caplog.at_level(logging.ERROR, logger=plugin.logger.name):
        plugin.register()
    assert "OSError: injected" in refused(caplog, registry)


def test_a_good_flag_still_registers(fresh, registry, monkeypatch, caplog):
    """The cases above fail for the reason they inject, not always."""
    monkeypatch.setenv("ARC_CY_NO_EXTENSIONS", "yes" if PURE else "no")
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        plugin.register()
    assert plugin.POLICY_NAME in registry
