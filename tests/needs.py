"""What a test needs beyond arc_cy, pytest and hypothesis: vLLM, mypy or
pyright. Without one, its tests skip ("needs vLLM"), so that a venv with
only arc_cy, pytest and hypothesis runs the rest (the fast layer); with
ARC_CY_TESTS_REQUIRE_ALL set (tests/run.sh sets it), a missing one is an
error instead, so a broken environment cannot pass by skipping.

A test says what it needs with ``@pytest.mark.needs("vllm")`` (conftest
applies the marker); a test module that imports vLLM at its top is skipped
as a whole when that import fails because vLLM is missing (conftest's
pytest_pycollect_makemodule).
"""

from __future__ import annotations

import importlib.util
import os

from arc_cy import _common
from arc_cy._env import env_flag

REQUIRE_ALL_ENV = "ARC_CY_TESTS_REQUIRE_ALL"

# What each need is called in messages, and whether this environment has it.
NAMES = {"vllm": "vLLM", "mypy": "mypy", "pyright": "pyright"}


def require_all(environ: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    """Whether a missing need is an error (ARC_CY_TESTS_REQUIRE_ALL set,
    not empty or 0)."""
    return env_flag(REQUIRE_ALL_ENV, environ)


def available(need: str) -> bool:
    if need not in NAMES:
        raise ValueError(f"unknown need {need!r}; known: {sorted(NAMES)}")
    if need == "vllm":
        # arc_cy's own answer: vLLM's base classes imported (a broken vLLM
        # counts as missing, and fails under ARC_CY_TESTS_REQUIRE_ALL).
        return bool(_common.HAVE_VLLM)
    return importlib.util.find_spec(need) is not None


def reason(need: str) -> str:
    """The skip reason: "needs vLLM" (or mypy, pyright)."""
    return f"needs {NAMES[need]}"


def decide(need: str, have: bool, strict: bool) -> tuple[str, str] | None:
    """What a test that needs ``need`` does: None (it runs), ("skip", why)
    or ("fail", why) when ``strict`` (ARC_CY_TESTS_REQUIRE_ALL) is set."""
    if have:
        return None
    why = reason(need)
    if not strict:
        return "skip", why
    detail = ""
    if need == "vllm" and _common.VLLM_IMPORT_ERROR is not None:
        detail = f" (vLLM is installed but failed to import: {_common.VLLM_IMPORT_ERROR!r})"
    return "fail", (
        f"{why}, which this environment lacks{detail}, and {REQUIRE_ALL_ENV} is set: "
        "the full suite may not skip"
    )


# What vLLM brings into an environment, which the fast layer lacks.
VLLM_ENVIRONMENT = ("vllm", "torch", "numpy")


def missing_module(exc: BaseException | None) -> tuple[str, str] | None:
    """The need behind an ImportError raised while a test module imports,
    and the missing module: ("vllm", name) when it is vLLM or what vLLM
    brings (torch, numpy) and this environment has no vLLM; else None (a
    real error)."""
    while exc is not None:
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            top = exc.name.split(".")[0]
            if top in VLLM_ENVIRONMENT and not available("vllm"):
                return "vllm", top
            return None
        exc = exc.__cause__ or exc.__context__
    return None
