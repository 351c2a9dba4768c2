"""The pinned CI environment, the extras and the installed package agree."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import arc_cy
from helpers import REPO, pyproject

pytestmark = [pytest.mark.sdist, pytest.mark.install]

LOCK_DIR = REPO / ".ci"
PYVER = "{}.{}".format(*sys.version_info[:2])
LOCK = LOCK_DIR / f"requirements-py{PYVER}.lock"


def lock_versions() -> list[str]:
    """The Python versions with a lock: the verified Pythons."""
    found = [re.fullmatch(r"requirements-py(3\.\d+)\.lock", p.name) for p in LOCK_DIR.iterdir()]
    return sorted((m[1] for m in found if m), key=lambda v: tuple(map(int, v.split("."))))


def locked(path: Path = LOCK) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line)
        assert match, f"not an exact pin in {path.name}: {line!r}"
        pins[canonicalize_name(match[1])] = match[2]
    return pins


def declared() -> list[tuple[str, Requirement]]:
    """Every requirement pyproject.toml declares that CI must satisfy."""
    project = pyproject()
    reqs = [("build-system", r) for r in project["build-system"]["requires"]]
    reqs += [("dependencies", r) for r in project["project"]["dependencies"]]
    for extra, items in project["project"]["optional-dependencies"].items():
        reqs += [(f"[{extra}]", r) for r in items]
    return [(where, Requirement(r)) for where, r in reqs]


def test_this_python_has_a_lock() -> None:
    assert PYVER in lock_versions(), f"no {LOCK.name}: Python {PYVER} is not verified"
    header = LOCK.read_text().splitlines()[:3]
    assert any(f"# Python {PYVER}, " in line for line in header), header


@pytest.mark.parametrize("version", lock_versions())
def test_lock_is_what_the_environment_sync_reads(version: str) -> None:
    # tools/lock.sh writes `uv pip compile` output: pins at the start of a
    # line, uv's annotations as comments. .ci/venv.sh installs uv from the
    # line `grep '^uv=='` finds, then `uv pip sync`s the lock, and installs
    # arc_cy with the pip it pins; .ci/lint.sh takes the linters' lines.
    path = LOCK_DIR / f"requirements-py{version}.lock"
    lines = path.read_text().splitlines()
    assert any(f"# Python {version}, " in line for line in lines[:3]), lines[:3]
    pins = locked(path)  # every other line an exact pin or a comment
    assert "pip" in pins
    assert [line for line in lines if line.startswith("uv==")] == [f"uv=={pins['uv']}"]
    for line in lines:
        assert line == line.lstrip() or line.lstrip().startswith("#"), line


@pytest.mark.parametrize("version", lock_versions())
def test_lock_satisfies_pyproject(version: str) -> None:
    path = LOCK_DIR / f"requirements-py{version}.lock"
    pins = locked(path)
    for where, req in declared():
        if req.marker is not None and not req.marker.evaluate({"python_version": version}):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} ({where}) is not pinned in {path.name}"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{path.name} pins {name}=={pins[name]}, outside {req} ({where})"
        )
    # The top-level CI requirements too (.ci/requirements.in).
    for line in (LOCK_DIR / "requirements.in").read_text().splitlines():
        line = line.partition("#")[0].strip()
        if line:
            req = Requirement(line)
            name = canonicalize_name(req.name)
            assert name in pins and req.specifier.contains(pins[name], prereleases=True), (
                f"{path.name} does not satisfy {req} (.ci/requirements.in)"
            )


def test_every_python_tests_the_same_vllm_and_torch_and_lints_alike() -> None:
    # The linters too: .ci/lint.sh (and pre-commit, which runs it) takes
    # them from the lock of whichever Python it runs on.
    names = ("vllm", "torch", "ruff", "cython-lint")
    stacks = {
        v: {n: locked(LOCK_DIR / f"requirements-py{v}.lock")[n] for n in names}
        for v in lock_versions()
    }
    assert len({tuple(s.items()) for s in stacks.values()}) == 1, stacks


def test_classifiers_are_the_verified_pythons() -> None:
    # Verified means: a lock, so that the test command runs there, and CI
    # runs it on every one of them (.ci/run), and .ci/wheel.sh builds a
    # wheel for each. The metadata claims exactly those Pythons, no more.
    project = pyproject()
    versions = lock_versions()
    prefix = "Programming Language :: Python :: 3."
    claimed = sorted(
        (
            c.removeprefix("Programming Language :: Python :: ")
            for c in project["project"]["classifiers"]
            if c.startswith(prefix)
        ),
        key=lambda v: tuple(map(int, v.split("."))),
    )
    assert claimed == versions
    assert project["project"]["requires-python"] == f">={versions[0]}"


def test_vllm_requirements_match_the_supported_range() -> None:
    # arc_cy.SUPPORTED_VLLM is the one declaration: the [vllm] extra is it,
    # and the vLLM that CI tests with is in it.
    supported = Requirement("vllm" + arc_cy.SUPPORTED_VLLM).specifier
    [extra] = pyproject()["project"]["optional-dependencies"]["vllm"]
    assert Requirement(extra).specifier == supported
    assert supported.contains(locked()["vllm"])


@pytest.mark.needs_vllm
def test_environment_is_the_lock() -> None:
    # .ci/env.sh syncs the environment to the lock before every run, so a
    # package installed by hand cannot make a missing dependency pass.
    pins = locked()
    # The environment's own site-packages only: setuptools puts its vendored
    # distributions on sys.path once something imports it.
    paths = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    installed = {
        canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions(path=paths)
    }
    installed.pop("arc-cy")
    extra = sorted(set(installed) - set(pins))
    missing = sorted(set(pins) - set(installed))
    assert not extra, f"installed but not in {LOCK.name}: {extra}"
    assert not missing, f"in {LOCK.name} but not installed: {missing}"
    wrong = {n: (installed[n], pins[n]) for n in pins if installed[n] != pins[n]}
    assert not wrong, f"installed vs locked versions differ: {wrong}"


def test_one_version_source() -> None:
    assert "version" in pyproject()["project"]["dynamic"]
    assert metadata.version("arc-cy") == arc_cy.__version__
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"## {arc_cy.__version__}" in changelog


def test_installed_metadata() -> None:
    meta = metadata.metadata("arc-cy")
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Requires-Python"] == f">={lock_versions()[0]}"
    assert f"Programming Language :: Python :: {PYVER}" in meta.get_all("Classifier")
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    assert "Programming Language :: Python :: Implementation :: CPython" in classifiers
    files = {str(f) for f in metadata.files("arc-cy") or ()}
    assert any(f.endswith("licenses/LICENSE") for f in files), files
    for name in ("py.typed", "_core/arc.pyi", "_twin/arc.py"):
        assert f"arc_cy/{name}" in files
    assert not any(f.endswith(".c") for f in files)


def _closure(reqs: list[Requirement]) -> set[str]:
    """Distributions that installing reqs brings in (from installed metadata)."""
    seen: set[str] = set()
    todo = [(r, tuple(sorted(r.extras))) for r in reqs]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(req.name) or ():
            dep = Requirement(text)
            envs = [{"extra": e} for e in ("", *extras)]
            if dep.marker is None or any(dep.marker.evaluate(env) for env in envs):
                todo.append((dep, tuple(sorted(dep.extras))))
    return seen


def _third_party_imports(paths: list[Path]) -> set[str]:
    # The project's own modules (bench/ and tests/ import arc_cy_harness).
    local = {p.stem for p in REPO.glob("*/*.py")} | {p.stem for p in REPO.glob("tests/progs/*.py")}
    local |= {"arc_cy", "arc_cy_harness"}
    # CPython's own test module (the faults fuzzer's set_nomemory): built
    # with CPython, left out of sys.stdlib_module_names.
    stdlib = sys.stdlib_module_names | {"_testcapi"}
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in stdlib and top not in local:
                    found.add(top)
    return found


@pytest.mark.parametrize(
    ("extra", "folder"),
    [("test", "tests"), ("test", "harness"), ("bench", "bench"), ("bench", "harness")],
)
@pytest.mark.needs_vllm
def test_extra_brings_what_is_imported(extra: str, folder: str) -> None:
    # Every third-party module that tests/, bench/ or harness/ (which both
    # use) imports is installed by `pip install arc-cy[extra]`, directly or as
    # a dependency.
    project = pyproject()["project"]
    reqs = [Requirement(r) for r in project["optional-dependencies"][extra]]
    reqs += [Requirement(r) for r in project["dependencies"]]
    brought = _closure(reqs)
    paths = sorted((REPO / folder).rglob("*.py"))
    dists = metadata.packages_distributions()
    missing = {}
    for module in _third_party_imports(paths):
        owners = {canonicalize_name(d) for d in dists.get(module, ())}
        if not owners & brought:
            missing[module] = sorted(owners) or "not installed"
    assert not missing, f"imported by {folder}/ but not brought by [{extra}]: {missing}"


def test_a_build_packs_only_what_it_makes(tmp_path: Path) -> None:
    # An in-tree build (pip install .) reuses build/lib, and the wheel takes
    # everything there: what an earlier build left (a module since removed,
    # a compiled core in a pure build) must not be packed.
    pytest.importorskip("setuptools", minversion="77")  # pyproject's build-system
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(
        REPO / "arc_cy",
        tree / "arc_cy",
        ignore=shutil.ignore_patterns("*.c", "*.so", "*.html", "__pycache__"),
    )
    left = tree / "build" / "lib" / "arc_cy"
    (left / "_core").mkdir(parents=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    # A module since removed, the core where it was before it moved, and a
    # core left by a compiled build in this pure one.
    stale = ["_removed.py", "_arc_c" + suffix, "_core/arc" + suffix]
    for name in stale:
        (left / name).write_bytes(b"")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["--disable-pip-version-check", "-w", str(tmp_path / "out"), str(tree)],
        env={**os.environ, "ARC_CY_NO_EXTENSIONS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "out").glob("arc_cy-*.whl")
    packed = {n.removeprefix("arc_cy/") for n in zipfile.ZipFile(wheel).namelist()}
    # The build ran, and kept what it makes (the package data too).
    kept = {"_twin/arc.py", "py.typed", "_core/arc.pyi", "_core/arc.pyx", "_core/capi.pxd"}
    kept |= {"_core/nodes.pxd", "_core/table.pxd", "_core/work.pxd", "_core/layout.h"}
    assert kept <= packed
    assert not packed & set(stale), sorted(packed)
    assert not any(left.joinpath(name).exists() for name in stale)
