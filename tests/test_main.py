"""``python -m arc_cy``: the report and the self-check, in subprocesses."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest


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
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str]]:
    cwd = tmp_path_factory.mktemp("cwd")
    procs = {name: start_main(cwd, env) for name, env in RUNS.items()}
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
            "Cython",
            "vLLM",
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
    assert stdout.startswith("arc_cy 0.1.0\n")
    assert f["implementation"] == f"{impl} ({module})"
    assert f["ARC_CY_NO_EXTENSIONS"] == (
        "unset" if no_extensions is None else repr(no_extensions)
    )
    assert f["Cython"] == metadata.version("Cython")
    assert f["vLLM"] == metadata.version("vllm") == "0.33.0"
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


def test_without_vllm(tmp_path: Path) -> None:
    # A package named vllm that fails to import, first on the path: arc_cy
    # runs as on a machine without vLLM.
    fake = tmp_path / "novllm" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('vLLM hidden by the test')\n")
    for no_extensions, impl in ((None, "cython"), ("1", "python")):
        env = {} if no_extensions is None else {"ARC_CY_NO_EXTENSIONS": no_extensions}
        proc = start_main(tmp_path, env, pythonpath=str(fake.parent))
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stdout + stderr
        f = fields(stdout)
        assert f["implementation"].startswith(impl + " ")
        assert f["vLLM"] == "not installed"
        assert f["plugin"] == "n/a (vLLM not installed)"
        assert f["self-check"] == (
            "ok: inserted 2 chunks and evicted the oldest through the policy alone"
        )
