"""The test suite's own machinery: what a test needs (tests/needs.py:
without vLLM, mypy or pyright it skips, "needs vLLM"; under
ARC_CY_TESTS_REQUIRE_ALL, which tests/run.sh sets, it fails)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import needs
from helpers import REPO

# --- the decision ---------------------------------------------------------------


@pytest.mark.parametrize("need", sorted(needs.NAMES))
def test_a_missing_need_skips_or_fails(need):
    assert needs.decide(need, True, False) is None
    assert needs.decide(need, True, True) is None
    assert needs.decide(need, False, False) == ("skip", f"needs {needs.NAMES[need]}")
    what, why = needs.decide(need, False, True)
    assert what == "fail"
    assert why.startswith(f"needs {needs.NAMES[need]}, which this environment lacks")
    assert needs.REQUIRE_ALL_ENV in why


@pytest.mark.parametrize(
    ("value", "strict"), [(None, False), ("", False), ("0", False), ("1", True), ("yes", True)]
)
def test_require_all_variable(value, strict):
    environ = {} if value is None else {needs.REQUIRE_ALL_ENV: value}
    assert needs.require_all(environ) is strict


def test_run_sh_requires_all():
    assert f"export {needs.REQUIRE_ALL_ENV}=1\n" in (REPO / "tests" / "run.sh").read_text()


def test_an_unknown_need_is_an_error():
    with pytest.raises(ValueError, match="unknown need"):
        needs.available("vlm")


# --- the stand-ins -----------------------------------------------------------------


@pytest.mark.needs("vllm")
def test_with_vllm_the_tests_use_vllms_types():
    """The full run tests what it always did: vLLM's own ChunkStatus and
    ReqContext, not the stand-ins."""
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

    import helpers

    assert helpers.ChunkStatus is ChunkStatus
    assert helpers.ReqContext is ReqContext
    assert helpers.VllmARC is ARCCachePolicy


@pytest.mark.needs("vllm")
def test_the_req_context_stand_in_is_a_part_of_vllms():
    import dataclasses

    from vllm.v1.kv_offload.base import ReqContext

    import helpers

    ours = {f.name: (f.default, f.init) for f in dataclasses.fields(helpers.StandInReqContext)}
    theirs = {f.name: (f.default, f.init) for f in dataclasses.fields(ReqContext)}
    assert ours.items() <= theirs.items()
    for name in ("set_offload_key_position", "get_offload_key_position"):
        assert hasattr(ReqContext, name), name
    a, b = helpers.StandInReqContext(req_id="r"), ReqContext(req_id="r")
    for ctx in (a, b):
        ctx.set_offload_key_position(b"k", 7)
    assert [c.get_offload_key_position(k) for c in (a, b) for k in (b"k", b"x")] == [7, None] * 2


# --- in a child pytest, with vLLM hidden -----------------------------------------

# One test marked needs("vllm"), and one module that imports vLLM at its top.
MARKED = "tests/test_copy.py::test_vllms_policy_copies"
IMPORTING = "tests/test_manager.py"


def _pytest_without_vllm(
    tmp_path: Path, require_all: bool, *tests: str
) -> subprocess.CompletedProcess:
    # A vllm package that raises what a missing one raises, first on the path.
    fake = tmp_path / "fake" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'vllm'\", name='vllm')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != needs.REQUIRE_ALL_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(fake.parent), env.get("PYTHONPATH")) if p)
    if require_all:
        env[needs.REQUIRE_ALL_ENV] = "1"
    return subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rsfE", *tests],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_without_vllm_they_skip(tmp_path):
    proc = _pytest_without_vllm(tmp_path, False, MARKED, IMPORTING)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    skips = re.findall(r"^SKIPPED \[(\d+)\] (\S+?):\d+: (.*)$", out, re.M)
    assert sorted(skips) == [
        ("1", "tests/conftest.py", "needs vLLM (tests/test_manager.py imports vllm)"),
        ("3", "tests/test_copy.py", "needs vLLM"),
    ], out[-3000:]
    assert out.splitlines()[-1].startswith("4 skipped in "), out[-3000:]


FAILS = (
    f"needs vLLM, which this environment lacks, and {needs.REQUIRE_ALL_ENV} is set: "
    "the full suite may not skip"
)


def test_under_require_all_a_marked_test_fails(tmp_path):
    proc = _pytest_without_vllm(tmp_path, True, MARKED)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert out.splitlines()[-1].startswith("3 errors in "), out[-3000:]  # in setup
    assert out.count(FAILS) >= 3, out[-3000:]


def test_under_require_all_a_module_importing_vllm_is_an_error(tmp_path):
    proc = _pytest_without_vllm(tmp_path, True, IMPORTING)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]  # interrupted: a collection error
    assert "ERROR tests/test_manager.py" in out, out[-3000:]
    assert FAILS in out, out[-3000:]
