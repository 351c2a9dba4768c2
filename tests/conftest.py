"""Shared fixtures: every behavioural test runs on both implementations."""

from __future__ import annotations

import importlib

import pytest

IMPLEMENTATIONS = ("cython", "python")
_MODULES = {"cython": "arc_cy._arc_c", "python": "arc_cy._arc_py"}


def load_policy_class(name: str) -> type:
    # The compiled module is imported directly: a missing build fails here
    # instead of quietly testing the pure twin twice.
    return importlib.import_module(_MODULES[name]).ARCCachePolicy


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> str:
    """Name of the implementation under test: "cython" or "python"."""
    return request.param


@pytest.fixture
def policy_cls(impl: str) -> type:
    """arc_cy's ARCCachePolicy class of the implementation under test."""
    return load_policy_class(impl)
