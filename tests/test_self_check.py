"""``python -m arc_cy``: the report and the self-check, in subprocesses."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import arc_cy
from arc_cy.__main__ import LOCKSTEP_PASSED
from arc_cy._guard import releases
from arc_cy._guard.verified import SUPPORTED_VLLM
from arc_cy_harness import vllm_overlay
from helpers import IMPLEMENTATIONS, PURE, PURE_ENV, REGISTERED, REPO, build_requirement

pytestmark = pytest.mark.install

NEWEST = releases()[0]

# The Cython range of pyproject.toml's [build-system] requires.
BUILD_CYTHON = build_requirement("Cython").specifier


def start_main(
    cwd: Path,
    extra_env: dict[str, str] | None = None,
    pythonpath: str = "",
    safe_path: bool = True,
    args: list[str] | None = None,
) -> subprocess.Popen[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ARC_CY_NO_EXTENSIONS", "VLLM_PLUGINS", "PYTHONPATH")
    }
    if PURE:  # as a pure build's user runs it: arc_cy warns without it
        env[PURE_ENV] = "1"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    env.update(extra_env or {})
    # -P and a neutral cwd: the installed arc_cy, never the source tree
    # (safe_path=False: as an operator types it, the cwd first on sys.path).
    return subprocess.Popen(
        [sys.executable, *(["-P"] if safe_path else []), "-m", "arc_cy", *(args or [])],
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
    # A fake vLLM (arc_cy_harness.vllm_overlay): the installed release's code under a
    # version arc_cy never verified must register ...
    "vllm_newer": {"FAKE_VLLM_VERSION": "0.35.0"},
    # ... and so must one that cannot say its version ...
    "vllm_unversioned": {"FAKE_VLLM_VERSION": "-"},
    # ... and one whose CPU manager changed by a comment, judged on release
    # day (the lockstep through its managers, reported) ...
    "vllm_release_day": {"FAKE_VLLM_VERSION": "0.35.0", "FAKE_VLLM_OVERLAY": "1"},
    # ... and a local build whose arc.py differs in one line of decision
    # code must not, unless overridden.
    "vllm_patched": {"FAKE_VLLM_VERSION": "0.35.0+local", "FAKE_VLLM_OVERLAY": "1"},
    "vllm_patched_overridden": {
        "FAKE_VLLM_VERSION": "0.35.0+local",
        "FAKE_VLLM_OVERLAY": "1",
        "ARC_CY_ALLOW_UNVERIFIED_VLLM": "1",
    },
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str]]:
    pytest.importorskip("vllm")  # the runs load vLLM's plugins, one a patched vLLM
    cwd = tmp_path_factory.mktemp("cwd")
    fake = tmp_path_factory.mktemp("fake_vllm")
    arc = vllm_overlay.write(fake)
    day = tmp_path_factory.mktemp("release_day")
    comment = ("class CPUOffloadingManager(", "# changed\nclass CPUOffloadingManager(")
    vllm_overlay.write(day, vllm_overlay.MANAGER_FILE, comment)
    overlays = {"vllm_release_day": str(day)}
    procs = {
        name: start_main(
            cwd,
            env,
            pythonpath=overlays.get(name, str(fake)) if "FAKE_VLLM_VERSION" in env else "",
        )
        for name, env in RUNS.items()
    }
    results = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        results[name] = (proc.returncode, stdout, stderr)
    results["overlay"] = (0, str(arc), "")
    return results


def fields(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        name, sep, value = line.partition(": ")
        if sep and name in (
            "implementation",
            "ARC_CY_NO_EXTENSIONS",
            "built with Cython",
            "package",
            "vLLM",
            "warning",
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
    [
        pytest.param(None, "cython", "arc_cy._core.arc", marks=pytest.mark.compiled),
        ("1", "python", "arc_cy._twin.arc"),
    ],
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
    assert f["ARC_CY_NO_EXTENSIONS"] == ("unset" if no_extensions is None else repr(no_extensions))
    # The Cython recorded in the compiled module at build time: the runtime
    # environment need not have Cython at all.
    if PURE:
        assert f["built with Cython"].startswith("n/a (the compiled core does not import: ")
    else:
        from arc_cy._core import arc as core

        assert f["built with Cython"] == core.CYTHON_VERSION
        assert Version(core.CYTHON_VERSION) in SpecifierSet(BUILD_CYTHON)
    assert f["package"] == str(Path(arc_cy.__file__).parent)
    version = metadata.version("vllm")
    matched = f"its ARC code is verified vLLM {version}'s"
    assert f["vLLM"] == f"{version} ({matched}; {LOCKSTEP_PASSED})"
    assert f["Python"].startswith(platform.python_version() + " (")
    assert f["plugin"] == f'"arc_cy" registered -> {module}.ARCCachePolicy'
    assert f["plugin log"] == (
        f"arc_cy: registered CPU offloading cache {REGISTERED} "
        f"({impl} implementation) on vLLM {version}: {matched}"
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


@pytest.mark.compiled
@pytest.mark.parametrize(
    ("run", "version"),
    [("vllm_newer", "0.35.0"), ("vllm_unversioned", "unknown"), ("vllm_release_day", "0.35.0")],
)
def test_a_verified_releases_code_under_another_version(
    runs: dict[str, tuple[int, str, str]], run: str, version: str
) -> None:
    returncode, stdout, stderr = runs[run]
    assert returncode == 0, stdout + stderr
    f = fields(stdout)
    installed = metadata.version("vllm")
    assert (
        f["vLLM"] == f"{version} (its ARC code is verified vLLM {installed}'s; {LOCKSTEP_PASSED})"
    )
    assert f["plugin"] == '"arc_cy" registered -> arc_cy._core.arc.ARCCachePolicy'
    assert f["plugin log"].endswith(
        f"on vLLM {version}: its ARC code is verified vLLM {installed}'s"
    )
    assert f["self-check"].startswith("ok: ")


@pytest.mark.compiled
def test_refuses_a_patched_vllm(runs: dict[str, tuple[int, str, str]]) -> None:
    returncode, stdout, stderr = runs["vllm_patched"]
    assert returncode == 1, stdout + stderr
    f = fields(stdout)
    assert f["vLLM"] == "0.35.0+local NOT VERIFIED"
    assert f["error"].startswith(
        "arc_cy: vLLM 0.35.0+local's ARC code is not code arc_cy verified: "
        f"`ARCCachePolicy.evict` ({runs['overlay'][1]}) differs from verified vLLM "
        f"{metadata.version('vllm')}'s."
    )
    assert "`tools/vllm_compat.sh VERSION`" in f["error"]
    assert "ARC_CY_ALLOW_UNVERIFIED_VLLM=1" in f["error"]
    assert f["self-check"].startswith("not run")
    # import arc_cy itself still works: the report got this far.
    assert f["implementation"] == "cython (arc_cy._core.arc)"


@pytest.mark.compiled
def test_patched_vllm_override(runs: dict[str, tuple[int, str, str]]) -> None:
    returncode, stdout, stderr = runs["vllm_patched_overridden"]
    assert returncode == 0, stdout + stderr
    f = fields(stdout)
    assert f["vLLM"] == (
        "0.35.0+local NOT VERIFIED, used anyway because ARC_CY_ALLOW_UNVERIFIED_VLLM is set"
    )
    assert f["warning"].startswith(
        "arc_cy: using arc_cy on vLLM 0.35.0+local's unverified code because "
        f"ARC_CY_ALLOW_UNVERIFIED_VLLM is set (`ARCCachePolicy.evict` ({runs['overlay'][1]})"
    )
    assert f["plugin"] == '"arc_cy" registered -> arc_cy._core.arc.ARCCachePolicy'
    assert f["plugin log"].endswith("on vLLM 0.35.0+local: UNVERIFIED code")
    # (The patched line does not change the self-check's two-chunk cycle.)
    assert f["self-check"].startswith("ok: ")


def test_from_a_source_tree(tmp_path: Path) -> None:
    # `python -m arc_cy` in a checkout's root imports the source tree, which
    # has no compiled core and is not what vLLM loads: it says so and fails.
    tree = tmp_path / "checkout"
    shutil.copytree(
        REPO / "arc_cy",
        tree / "arc_cy",
        ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__"),
    )
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(REPO / name, tree / name)
    proc = start_main(tree, {PURE_ENV: ""}, safe_path=False)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1, stdout + stderr
    f = fields(stdout)
    assert f["implementation"] == "python (arc_cy._twin.arc)"
    installed = Path(arc_cy.__file__).parent
    assert f["package"] == (
        f"{tree / 'arc_cy'} is a source tree, which shadows the installed arc_cy "
        f"({installed}) that vLLM loads; this report is not about an installed "
        "arc_cy. Run `python -m arc_cy` from another directory, or `python -P -m arc_cy`."
    )
    assert f["self-check"] == "not run (see the package line above)"
    assert f"This arc_cy is the source tree {tree / 'arc_cy'}" in stderr


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
        if impl not in IMPLEMENTATIONS:
            continue
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


def test_an_old_vllm_is_outside_the_supported_range(tmp_path: Path) -> None:
    # A vLLM from before vllm.v1: say it is outside the range, name the range.
    path = _fake_vllm(tmp_path, "__version__ = '0.8.5'\n")
    proc = start_main(tmp_path, {}, pythonpath=path)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stdout + stderr
    assert fields(stdout)["vLLM"] == (
        f"0.8.5 is outside the range arc_cy supports ({SUPPORTED_VLLM}: vLLM 0.30.0 "
        f"to {NEWEST}); it has no vllm.v1. Install a vLLM in that range "
        "(pip install 'arc_cy[vllm]')"
    )


@pytest.mark.needs_vllm
def test_a_vllm_whose_policy_module_fails_to_import_is_broken(tmp_path: Path) -> None:
    # A verified release whose base.py fails on one of vLLM's own modules
    # (a missing vllm._C): broken, with the import error, never "outside
    # the range"; the plugin registers nothing and does not raise.
    from importlib.util import find_spec

    from arc_cy._guard import BASE_MODULE

    shutil.copy(vllm_overlay.SITECUSTOMIZE, tmp_path / "sitecustomize.py")
    source = Path(str(find_spec(BASE_MODULE).origin)).read_text()  # type: ignore[union-attr]
    base = tmp_path.joinpath(*BASE_MODULE.split(".")).with_suffix(".py")
    base.parent.mkdir(parents=True)
    base.write_text("import vllm._C_for_arc_cy_tests\n" + source)
    proc = start_main(tmp_path, {"FAKE_VLLM_OVERLAY": "1"}, pythonpath=str(tmp_path))
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1, stdout + stderr
    f = fields(stdout)
    assert f["vLLM"] == (
        f"{metadata.version('vllm')} is broken: its policy module {BASE_MODULE} does not "
        "import what arc_cy needs: ModuleNotFoundError: No module named "
        "'vllm._C_for_arc_cy_tests'"
    )
    assert f["self-check"].startswith("not run")


@pytest.mark.parametrize("closed", [1, 2], ids=["stdout", "stderr"])
def test_a_closed_stream_is_no_crash(closed: int, tmp_path: Path) -> None:
    # `python -m arc_cy >&-` (or `2>&-`): Python starts with that stream None.
    path = _fake_vllm(
        tmp_path, "raise ModuleNotFoundError(\"No module named 'vllm'\", name='vllm')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARC_CY_NO_EXTENSIONS"}
    if PURE:
        env[PURE_ENV] = "1"
    env["PYTHONPATH"] = path
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "arc_cy"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE if closed == 2 else None,
        stderr=subprocess.PIPE if closed == 1 else None,
        preexec_fn=lambda: os.close(closed),
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    if closed == 1:
        assert proc.stderr == ""
    else:
        assert "self-check: ok" in proc.stdout


# A vllm whose import stops the process: what runs without importing vLLM
# (and so at once) never sees it.
NO_VLLM_IMPORT = "raise SystemExit('vllm was imported')\n"


def test_help_answers_at_once(tmp_path: Path) -> None:
    proc = start_main(
        tmp_path, {}, pythonpath=_fake_vllm(tmp_path, NO_VLLM_IMPORT), args=["--help"]
    )
    stdout, stderr = proc.communicate(timeout=60)
    assert (proc.returncode, stderr) == (0, ""), stdout + stderr
    assert stdout.startswith("usage: python -m arc_cy [-h] [--version]\n")
    assert "--version" in stdout and "store/evict cycle" in stdout


def test_version_answers_at_once(tmp_path: Path) -> None:
    proc = start_main(
        tmp_path, {}, pythonpath=_fake_vllm(tmp_path, NO_VLLM_IMPORT), args=["--version"]
    )
    stdout, stderr = proc.communicate(timeout=60)
    assert (proc.returncode, stdout, stderr) == (0, f"arc_cy {arc_cy.__version__}\n", "")


def test_an_unknown_flag_is_an_error(tmp_path: Path) -> None:
    proc = start_main(
        tmp_path, {}, pythonpath=_fake_vllm(tmp_path, NO_VLLM_IMPORT), args=["--verbose"]
    )
    stdout, stderr = proc.communicate(timeout=60)
    assert (proc.returncode, stdout) == (2, "")
    assert stderr == (
        "usage: python -m arc_cy [-h] [--version]\n"
        "python -m arc_cy: error: unrecognized arguments: --verbose\n"
    )


def test_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    # As `python -m arc_cy | head -1` when head has gone: the reader's end
    # is closed before the report is written.
    path = _fake_vllm(
        tmp_path, "raise ModuleNotFoundError(\"No module named 'vllm'\", name='vllm')\n"
    )
    proc = start_main(tmp_path, {}, pythonpath=path)
    assert proc.stdout is not None
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=300)
    assert (proc.returncode, stderr) == (141, "")
