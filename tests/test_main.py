"""``python -m arc_cy``: the report and the self-check, in subprocesses."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import arc_cy
from arc_cy import _arc_c

from helpers import build_requirement

# The Cython range of pyproject.toml's [build-system] requires.
BUILD_CYTHON = build_requirement("Cython").specifier


def start_main(
    cwd: Path, extra_env: dict[str, str] | None = None, pythonpath: str = ""
) -> subprocess.Popen[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ARC_CY_NO_EXTENSIONS", "VLLM_PLUGINS", "PYTHONPATH")
    }
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env.update(extra_env or {})
    # -P and a neutral cwd: the installed arc_cy, never the source tree.
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "arc_cy"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# Each run imports vLLM (slow): start them all at once, collect per test.
RUNS = {
    "default": {},
    "no_extensions": {"ARC_CY_NO_EXTENSIONS": "1"},
    # VLLM_PLUGINS is vLLM's allowlist: naming only another plugin keeps
    # arc_cy's entry point from running, as a misconfigured deployment would.
    "plugin_excluded": {"VLLM_PLUGINS": "lora_filesystem_resolver"},
    # vllm.__version__ faked to a release arc_cy does not support (see
    # fake_vllm_version): the guard must refuse it.
    "vllm_unsupported": {"FAKE_VLLM_VERSION": "0.29.0"},
    "vllm_unsupported_overridden": {
        "FAKE_VLLM_VERSION": "0.29.0",
        "ARC_CY_IGNORE_VLLM_VERSION": "1",
    },
}

# Imported before anything else (PYTHONPATH beats site-packages): sets
# vllm.__version__ to $FAKE_VLLM_VERSION, as another vLLM release would.
SITECUSTOMIZE = """
import os
if os.environ.get("FAKE_VLLM_VERSION"):
    import vllm
    vllm.__version__ = os.environ["FAKE_VLLM_VERSION"]
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str]]:
    cwd = tmp_path_factory.mktemp("cwd")
    fake = tmp_path_factory.mktemp("fake_version")
    (fake / "sitecustomize.py").write_text(SITECUSTOMIZE)
    procs = {
        name: start_main(cwd, env, pythonpath=str(fake) if "FAKE_VLLM_VERSION" in env else "")
        for name, env in RUNS.items()
    }
    results = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        results[name] = (proc.returncode, stdout, stderr)
    return results


def fields(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        name, sep, value = line.partition(": ")
        if sep and name in (
            "implementation",
            "ARC_CY_NO_EXTENSIONS",
            "built with Cython",
            "vLLM",
            "error",
            "Python",
            "plugin",
            "plugin log",
            "self-check",
        ):
            out[name] = value
    return out


@pytest.mark.parametrize(
    ("no_extensions", "impl", "module"),
    [(None, "cython", "arc_cy._arc_c"), ("1", "python", "arc_cy._arc_py")],
)
def test_report_and_self_check(
    runs: dict[str, tuple[int, str, str]],
    no_extensions: str | None,
    impl: str,
    module: str,
) -> None:
    returncode, stdout, stderr = runs["default" if no_extensions is None else "no_extensions"]
    assert returncode == 0, stdout + stderr
    f = fields(stdout)
    assert stdout.startswith(f"arc_cy {metadata.version('arc-cy')}\n")
    assert metadata.version("arc-cy") == arc_cy.__version__
    assert f["implementation"] == f"{impl} ({module})"
    assert f["ARC_CY_NO_EXTENSIONS"] == (
        "unset" if no_extensions is None else repr(no_extensions)
    )
    # The Cython recorded in the compiled module at build time: the runtime
    # environment need not have Cython at all.
    assert f["built with Cython"] == _arc_c.CYTHON_VERSION
    assert Version(_arc_c.CYTHON_VERSION) in SpecifierSet(BUILD_CYTHON)
    assert f["vLLM"] == (
        f"{metadata.version('vllm')} (supported: vllm{arc_cy.SUPPORTED_VLLM})"
    )
    assert f["Python"].startswith(platform.python_version() + " (")
    assert f["plugin"] == f'"arc_cy" registered -> {module}.ARCCachePolicy'
    assert f["plugin log"] == (
        "arc_cy: registered CPU offloading cache policy 'arc_cy' "
        f"({impl} implementation)"
    )
    assert f["self-check"].startswith("ok: ")
    assert 'CPUOffloadingManager(cache_policy="arc_cy")' in f["self-check"]


def test_fails_when_vllm_does_not_load_the_plugin(
    runs: dict[str, tuple[int, str, str]],
) -> None:
    returncode, stdout, stderr = runs["plugin_excluded"]
    assert returncode == 1, stdout + stderr
    f = fields(stdout)
    assert f["plugin"].startswith('"arc_cy" NOT registered')
    assert "plugin log" not in f
    assert f["self-check"].startswith('FAILED: vLLM does not know "arc_cy"')


def test_refuses_an_unsupported_vllm(
    runs: dict[str, tuple[int, str, str]],
) -> None:
    returncode, stdout, stderr = runs["vllm_unsupported"]
    assert returncode == 1, stdout + stderr
    f = fields(stdout)
    assert f["vLLM"] == "0.29.0 NOT SUPPORTED"
    assert "vLLM 0.29.0 is not supported" in f["error"]
    assert f"vllm{arc_cy.SUPPORTED_VLLM}" in f["error"]
    assert "ARC_CY_IGNORE_VLLM_VERSION=1" in f["error"]
    assert f["self-check"].startswith("not run")
    # import arc_cy itself still works: the report got this far.
    assert f["implementation"] == "cython (arc_cy._arc_c)"


def test_unsupported_vllm_override(runs: dict[str, tuple[int, str, str]]) -> None:
    returncode, stdout, stderr = runs["vllm_unsupported_overridden"]
    assert returncode == 0, stdout + stderr
    f = fields(stdout)
    assert f["vLLM"].startswith("0.29.0 NOT SUPPORTED")
    assert f["vLLM"].endswith("used anyway because ARC_CY_IGNORE_VLLM_VERSION is set")
    assert f["plugin"] == '"arc_cy" registered -> arc_cy._arc_c.ARCCachePolicy'
    assert f["self-check"].startswith("ok: ")


def _fake_vllm(tmp_path: Path, init: str) -> str:
    """A package named vllm whose __init__ runs init, first on the path."""
    fake = tmp_path / "fake" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(init)
    return str(fake.parent)


def test_without_vllm(tmp_path: Path) -> None:
    # vllm raises what a missing package raises: arc_cy runs as on a machine
    # without vLLM.
    path = _fake_vllm(
        tmp_path, "raise ModuleNotFoundError(\"No module named 'vllm'\", name='vllm')\n"
    )
    for no_extensions, impl in ((None, "cython"), ("1", "python")):
        env = {} if no_extensions is None else {"ARC_CY_NO_EXTENSIONS": no_extensions}
        proc = start_main(tmp_path, env, pythonpath=path)
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stdout + stderr
        f = fields(stdout)
        assert f["implementation"].startswith(impl + " ")
        assert f["vLLM"] == "not installed"
        assert f["plugin"] == "n/a (vLLM not installed)"
        assert f["self-check"] == (
            "ok: inserted 2 chunks and evicted the oldest through the policy alone"
        )


def test_broken_vllm(tmp_path: Path) -> None:
    # vLLM is there but fails to import: say why and fail, never "not installed".
    path = _fake_vllm(tmp_path, "raise ImportError('libcudart.so.13: cannot open')\n")
    proc = start_main(tmp_path, {}, pythonpath=path)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stdout + stderr
    f = fields(stdout)
    assert f["vLLM"] == (
        "installed but failed to import: ImportError: libcudart.so.13: cannot open"
    )
    assert f["self-check"].startswith("not run")
