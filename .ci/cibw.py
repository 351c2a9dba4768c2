#!/usr/bin/env python3
"""Read pyproject.toml's [tool.cibuildwheel] for .ci/wheel.sh.

The release wheels have one configuration: cibuildwheel's. .ci/wheel.sh
(the local release check) takes from it which Pythons to build, how to
repair a wheel and how to test it, so the two pipelines cannot drift:

    .ci/cibw.py versions                    the Python versions cibuildwheel builds for
                                            this machine's architecture (manylinux,
                                            CPython): "3.11 3.12 3.13"
    .ci/cibw.py test-command                its test-command, one shell command a line
                                            (cibuildwheel runs them joined by &&)
    .ci/cibw.py repair-command DEST WHEEL   its Linux repair-wheel-command for WHEEL,
                                            writing into DEST, as one shell command

Options, first: --pyproject PATH (default: the checkout's pyproject.toml),
--arch ARCH (default: this machine's).

A [tool.cibuildwheel] setting that wheel.sh does not follow (test-requires,
before-test, environment, overrides, ...) is an error (exit 2) naming it:
teach wheel.sh to follow it, or list it in NOT_FOLLOWED with the reason.
Standard library only (Python 3.11+: tomllib).
"""

from __future__ import annotations

import argparse
import fnmatch
import platform
import re
import shlex
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# The settings wheel.sh follows, top level or under [tool.cibuildwheel.linux].
FOLLOWED = {"build", "skip", "test-command", "archs", "repair-wheel-command"}
# The settings it leaves to cibuildwheel, and why.
NOT_FOLLOWED = {
    # wheel.sh builds on this machine, not in the manylinux image: auditwheel
    # repair tags the wheel by the symbols it links against.
    "manylinux-x86_64-image": "wheel.sh builds on the host",
    "manylinux-aarch64-image": "wheel.sh builds on the host",
}
# Tables of other platforms: not what wheel.sh builds.
OTHER_PLATFORMS = {"macos", "windows", "ios", "android", "pyodide"}


class ConfigError(Exception):
    pass


def _words(value: Any, key: str) -> list[str]:
    """A setting given as a string of space-separated words or a list."""
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [w for v in value for w in v.split()]
    raise ConfigError(f"[tool.cibuildwheel] {key}: not a string or a list of strings")


def _commands(value: Any, key: str) -> list[str]:
    """A command setting: one string, or a list of commands (run joined by &&)."""
    commands = [value] if isinstance(value, str) else value
    if not isinstance(commands, list) or not all(isinstance(v, str) for v in commands):
        raise ConfigError(f"[tool.cibuildwheel] {key}: not a string or a list of strings")
    if any("\n" in c for c in commands):
        raise ConfigError(f"[tool.cibuildwheel] {key}: a command spans lines (list them instead)")
    return list(commands)


def linux_options(pyproject: dict[str, Any]) -> dict[str, Any]:
    """[tool.cibuildwheel] with [tool.cibuildwheel.linux] over it, checked."""
    top = dict(pyproject.get("tool", {}).get("cibuildwheel", {}))
    linux = top.pop("linux", {})
    for name in OTHER_PLATFORMS:
        top.pop(name, None)
    options = {**top, **linux}
    unknown = sorted(set(options) - FOLLOWED - set(NOT_FOLLOWED))
    if unknown:
        raise ConfigError(
            f"[tool.cibuildwheel] sets {', '.join(unknown)}, which .ci/wheel.sh does not "
            "follow: teach .ci/wheel.sh (and .ci/cibw.py) to, so both pipelines agree"
        )
    return options


def _python_allowed(requires: str | None, minor: int) -> bool:
    """Whether project.requires-python admits 3.<minor> (cibuildwheel skips others)."""
    if not requires:
        return True
    try:
        from packaging.specifiers import SpecifierSet
    except ImportError:
        match = re.fullmatch(r"\s*>=\s*3\.(\d+)\s*", requires)
        if not match:
            raise ConfigError(f"requires-python {requires!r}: only '>=3.N' is read") from None
        return minor >= int(match[1])
    return SpecifierSet(requires).contains(f"3.{minor}.0")


def versions(pyproject: dict[str, Any], arch: str) -> list[str]:
    """The CPython versions cibuildwheel builds as manylinux wheels for arch."""
    options = linux_options(pyproject)
    archs = _words(options.get("archs", "auto"), "archs")
    if arch not in archs and not {"auto", "native", "all"} & set(archs):
        raise ConfigError(f"cibuildwheel builds for {' '.join(archs)}, not this machine's {arch}")
    build = _words(options.get("build", "*"), "build")
    skip = _words(options.get("skip", ""), "skip")
    requires = pyproject.get("project", {}).get("requires-python")
    found = []
    for minor in range(6, 40):
        identifier = f"cp3{minor}-manylinux_{arch}"
        if (
            any(fnmatch.fnmatch(identifier, p) for p in build)
            and not any(fnmatch.fnmatch(identifier, p) for p in skip)
            and _python_allowed(requires, minor)
        ):
            found.append(f"3.{minor}")
    if not found:
        raise ConfigError(f"cibuildwheel's build and skip select no CPython manylinux_{arch} wheel")
    return found


def test_commands(pyproject: dict[str, Any], project_dir: str) -> list[str]:
    options = linux_options(pyproject)
    commands = _commands(options.get("test-command", []), "test-command")
    return [c.replace("{project}", project_dir).replace("{package}", project_dir) for c in commands]


def repair_command(pyproject: dict[str, Any], dest_dir: str, wheel: str) -> str:
    options = linux_options(pyproject)
    if "repair-wheel-command" not in options:
        # cibuildwheel's Linux default.
        commands = ["auditwheel repair -w {dest_dir} {wheel}"]
    else:
        commands = _commands(options["repair-wheel-command"], "repair-wheel-command")
    joined = " && ".join(commands)
    joined = joined.replace("{dest_dir}", shlex.quote(dest_dir))
    return joined.replace("{wheel}", shlex.quote(wheel))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=".ci/cibw.py", description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    parser.add_argument("--arch", default=platform.machine())
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("versions")
    tests = sub.add_parser("test-command")
    tests.add_argument("--project", default=str(ROOT), help="what {project} and {package} are")
    repair = sub.add_parser("repair-command")
    repair.add_argument("dest_dir")
    repair.add_argument("wheel")
    args = parser.parse_args(argv)
    pyproject = tomllib.loads(args.pyproject.read_text())
    try:
        if args.what == "versions":
            print(" ".join(versions(pyproject, args.arch)))
        elif args.what == "test-command":
            for command in test_commands(pyproject, args.project):
                print(command)
        else:
            print(repair_command(pyproject, args.dest_dir, args.wheel))
    except ConfigError as exc:
        print(f"cibw: {args.pyproject}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
