#!/usr/bin/env python3
"""Print the fingerprints arc_cy's vLLM code guard compares, as entries of
arc_cy/_compat.py's VERIFIED_VLLM, and check the policy's callers:

    .ci/fingerprint.py                      the vLLM this Python imports
    .ci/fingerprint.py vllm-0.33.0-*.whl    a wheel (read in place)
    .ci/fingerprint.py DIR                  a tree holding vllm/ (a checkout, site-packages)

For each vLLM: the fingerprints of its cpu/policies/arc.py and base.py
(arc_cy/_fingerprint.py: sha256 of the AST, docstrings dropped), then the
attributes the CPU manager and the tiering primary tier use on their policy.
Exits 1 if a caller uses an attribute that base.py's CachePolicy does not
define. .ci/vllm_compat.sh runs it on the release it verified; only the
fingerprints of releases that passed belong in VERIFIED_VLLM.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import zipfile
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_fingerprint_module():  # type: ignore[no-untyped-def]
    # By path, not `import arc_cy`: the analysis is standard library only,
    # and importing the package would need its compiled core (or warn).
    path = os.path.join(ROOT, "arc_cy", "_fingerprint.py")
    spec = importlib.util.spec_from_file_location("_arc_cy_fingerprint", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fp = _load_fingerprint_module()


def _file_name(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _readers(target: str | None) -> tuple[str, Callable[[str], bytes | None], str]:
    """(version, read(module) -> source or None, where) for one vLLM."""
    if target is None:
        import vllm

        def read(module: str) -> bytes | None:
            path = fp.module_file(module)
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        return str(vllm.__version__), read, os.path.dirname(vllm.__file__)
    if os.path.isdir(target):
        def read(module: str) -> bytes | None:
            path = os.path.join(target, _file_name(module))
            if not os.path.exists(path):
                return None
            with open(path, "rb") as f:
                return f.read()

        ns: dict[str, object] = {}
        version_file = os.path.join(target, "vllm", "_version.py")
        if os.path.exists(version_file):
            with open(version_file) as f:
                exec(f.read(), ns)
        return str(ns.get("__version__", "unknown")), read, target
    wheel = zipfile.ZipFile(target)
    names = set(wheel.namelist())

    def read(module: str) -> bytes | None:
        name = _file_name(module)
        return wheel.read(name) if name in names else None

    return os.path.basename(target).split("-")[1], read, target


def report(target: str | None) -> bool:
    version, read, where = _readers(target)
    print(f"vLLM {version} ({where}):")
    analyses = {}
    for module in (*fp.FINGERPRINTED.values(), *fp.CALLER_MODULES):
        source = read(module)
        if source is not None:
            analyses[module] = fp.analyse_source(source)
    missing = [m for m in fp.FINGERPRINTED.values() if m not in analyses]
    if missing:
        print(f"    no source for {', '.join(missing)}")
        return False
    print(f'    "{version}": {{')
    for name, module in fp.FINGERPRINTED.items():
        print(f'        "{name}": "{analyses[module]["fingerprint"]}",')
    print("    },")
    defined = set(analyses[fp.BASE_MODULE]["defines"] or ())
    ok = True
    for module in fp.CALLER_MODULES:
        if module not in analyses:
            print(f"    {_file_name(module)}: not in this release")
            continue
        uses = analyses[module]["uses"]
        unknown = sorted(set(uses) - defined)
        if not uses:
            print(f"    {_file_name(module)} uses nothing on a policy itself")
            continue
        used = ", ".join(sorted(uses))
        if unknown:
            ok = False
            print(f"    {_file_name(module)} uses {used}; NOT defined by base.py's "
                  f"CachePolicy: {', '.join(unknown)}")
        else:
            print(f"    {_file_name(module)} uses {used} on its policy: all defined "
                  "by base.py's CachePolicy")
    return ok


def main(argv: list[str]) -> int:
    targets: list[str | None] = list(argv) or [None]
    results = [report(t) for t in targets]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
