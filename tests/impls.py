"""The two implementations under test, by name (no vLLM needed)."""

from __future__ import annotations

import importlib

IMPLEMENTATIONS = ("cython", "python")
MODULES = {"cython": "arc_cy._arc_c", "python": "arc_cy._arc_py"}


def load_policy_class(name: str) -> type:
    # The compiled module is imported directly: a missing build fails here
    # instead of quietly testing the pure twin twice.
    return importlib.import_module(MODULES[name]).ARCCachePolicy
