#!/usr/bin/env python3
"""Print the fingerprints arc_cy's vLLM code guard compares, as entries of
arc_cy/_compat.py's VERIFIED_VLLM, and check the policy's callers:

    .ci/fingerprint.py                      the vLLM this Python imports
    .ci/fingerprint.py vllm-0.33.0-*.whl    a wheel (read in place)
    .ci/fingerprint.py DIR                  a tree holding vllm/ (a checkout, site-packages)

For each vLLM: the fingerprints of its cpu/policies/arc.py and base.py
(arc_cy/_fingerprint.py: sha256 of the AST, docstrings dropped), then
whether the CPU manager's and the tiering primary tier's code uses a name
that vLLM's ARC policy has beyond base.py's CachePolicy, or a computed
attribute name (arc_cy._fingerprint.DYNAMIC). Exits 1 if one does.
.ci/vllm_compat.sh runs it on the release it verified; only the
fingerprints of releases that passed belong in VERIFIED_VLLM.
"""

from __future__ import annotations

import ast
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
            spec = fp.module_spec(module)
            if spec is None:
                return None
            path = str(spec.origin)
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
    sources = {}
    for module in (*fp.FINGERPRINTED.values(), *fp.CALLER_MODULES):
        source = read(module)
        if source is not None:
            sources[module] = source
    missing = [m for m in fp.FINGERPRINTED.values() if m not in sources]
    if missing:
        print(f"    no source for {', '.join(missing)}")
        return False
    trees = {m: ast.parse(sources[m]) for m in fp.FINGERPRINTED.values()}
    print(f'    "{version}": {{')
    for name, module in fp.FINGERPRINTED.items():
        print(f'        "{name}": "{fp.fingerprint(trees[module])}",')
    print("    },")
    beyond = fp.beyond_base(trees[fp.ARC_MODULE], trees[fp.BASE_MODULE])
    ok = True
    for module in fp.CALLER_MODULES:
        name = _file_name(module)
        if module not in sources:
            print(f"    {name}: not in this release")
            continue
        uses = fp.caller_uses(compile(sources[module], name, "exec", dont_inherit=True), beyond)
        if uses:
            ok = False
            print(
                f"    {name} uses what base.py's CachePolicy does not define: "
                + ", ".join(f"{n!r} (line {line})" for n, line in uses)
            )
        else:
            print(
                f"    {name} uses nothing that vLLM's ARC policy has beyond "
                "base.py's CachePolicy, and no computed attribute name"
            )
    return ok


def main(argv: list[str]) -> int:
    targets: list[str | None] = list(argv) or [None]
    results = [report(t) for t in targets]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
