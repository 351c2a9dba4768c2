"""The vLLM version guard: arc_cy registers only on the vLLM it supports."""

from __future__ import annotations

import logging

import pytest
import vllm
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory

import arc_cy
from arc_cy import plugin
from arc_cy._compat import OVERRIDE_ENV, SUPPORTED_VLLM, vllm_supported


@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("0.33.0", True),
        ("0.33.2", True),
        ("0.33.1.dev12+g0123abc", True),
        ("0.33.0+cu130", True),
        ("0.32.0", True),
        ("0.32.9", True),
        ("0.31.0", True),
        ("0.30.0", True),
        ("0.30.0rc2", True),
        ("0.29.1", False),
        ("0.33.0rc1", True),
        ("0.34.0", False),
        ("0.34.0rc1", False),
        ("1.0.0", False),
        ("unknown", False),
        ("", False),
    ],
)
def test_vllm_supported(version: str, supported: bool) -> None:
    assert vllm_supported(version) is supported


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """vLLM's policy registry, emptied of arc_cy for this test only."""
    fresh = {k: v for k, v in CachePolicyFactory._registry.items() if k != "arc_cy"}
    monkeypatch.setattr(CachePolicyFactory, "_registry", fresh)
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    return fresh


def test_registers_on_a_supported_vllm(
    registry: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    assert vllm_supported(vllm.__version__)
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        plugin.register()
    assert CachePolicyFactory.get_cache_policy_cls("arc_cy") is arc_cy.ARCCachePolicy
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("fake", ["0.29.1", "0.34.0"])
def test_refuses_an_unsupported_vllm(
    fake: str,
    registry: dict[str, object],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(vllm, "__version__", fake)
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        plugin.register()
    assert "arc_cy" not in registry
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    message = record.getMessage()
    assert f"vLLM {fake} is not supported" in message
    assert f"vllm{SUPPORTED_VLLM}" in message
    assert f"{OVERRIDE_ENV}=1" in message
    assert "NOT registered" in message


def test_override_registers_with_a_warning(
    registry: dict[str, object],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(vllm, "__version__", "0.29.1")
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    with caplog.at_level(logging.INFO, logger=plugin.logger.name):
        plugin.register()
    assert CachePolicyFactory.get_cache_policy_cls("arc_cy") is arc_cy.ARCCachePolicy
    levels = [r.levelno for r in caplog.records]
    assert levels == [logging.WARNING, logging.INFO]
    assert "unsupported vLLM 0.29.1" in caplog.records[0].getMessage()


def test_override_zero_is_off(
    registry: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm, "__version__", "0.29.1")
    monkeypatch.setenv(OVERRIDE_ENV, "0")
    plugin.register()
    assert "arc_cy" not in registry
