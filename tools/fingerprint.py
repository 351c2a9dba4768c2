#!/usr/bin/env python3
"""Judge vLLM releases as arc_cy's guard does, and print arc_cy/_verified.py's
table with them added:

    tools/fingerprint.py                      the vLLM this Python imports
    tools/fingerprint.py vllm-0.34.0-*.whl    a wheel or an sdist (read in place)
    tools/fingerprint.py DIR ...              trees holding vllm/ (a checkout,
                                              site-packages, tests/data/vllm/X)

For each vLLM: which verified ARC code its own is (arc_cy._fingerprint
splits arc.py and base.py into the objects ARC runs and reads), and what
its callers use of the names the guard forbids, with arc_cy's policy names
(arc_cy._guard.POLICY_NAMES), as the guard scans. Then the table: VERIFIED
with each release joined to the entry of its ARC code (a new entry if none
has it) and its callers' fingerprints added. A caller in the table is
accepted as it shipped, whatever the scan finds, so add a release only
after tools/vllm_compat.sh passed on it. Exits 1 if a release cannot be read.

It imports arc_cy._fingerprint, _guard and _verified, which import nothing
else (``import arc_cy`` loads no vLLM and no compiled core): run it with a
Python that has arc_cy installed ("$ARC_CY_PY" tools/fingerprint.py, after
``source .ci/env.sh``), or with the checkout on the path
(``PYTHONPATH=. python3 tools/fingerprint.py``).
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import zipfile
from collections.abc import Callable

import arc_cy._fingerprint as fp
from arc_cy._guard import POLICY_NAMES
from arc_cy._verified import VERIFIED

MODULES = (fp.ARC_MODULE, fp.BASE_MODULE, *fp.CALLER_MODULES)


def _file_name(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _version_of(text: str) -> str:
    ns: dict[str, object] = {}
    exec(text, ns)
    return str(ns.get("__version__", "unknown"))


Reader = Callable[[str], bytes | None]


def _callers(names: set[str], read: Reader) -> list[str]:
    """The modules of an archive's vllm/v1/kv_offload tree that the guard
    judges as callers (arc_cy._fingerprint.find_callers, for a folder)."""
    prefix = fp.KV_OFFLOAD.replace(".", "/") + "/"
    policies = fp.POLICIES_PACKAGE.replace(".", "/") + "/"
    out = []
    for name in sorted(names):
        if not (name.startswith(prefix) and name.endswith(".py")) or name.startswith(policies):
            continue
        folders = name.split("/")[:-1]
        packages = ("/".join(folders[:i]) + "/__init__.py" for i in range(4, len(folders) + 1))
        if not all(p in names for p in packages):
            continue  # a folder that is not a package: no module of the tree
        module = name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        source = read(module) if not name.endswith("/__init__.py") else None
        if source is not None and fp.is_caller_source(source):
            out.append(module)
    return out


def _reader(target: str | None) -> tuple[str, Reader, str, list[str]]:
    """(version, read(module) -> source or None, where, the callers found
    in its tree) for one vLLM."""
    if target is None:
        import vllm

        root = os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))
        _, read, _, found = _reader(root)
        return str(vllm.__version__), read, os.path.dirname(vllm.__file__), found
    if os.path.isdir(target):

        def read(module: str) -> bytes | None:
            path = os.path.join(target, _file_name(module))
            if not os.path.isfile(path):
                return None
            with open(path, "rb") as f:
                return f.read()

        tree = os.path.join(target, *fp.KV_OFFLOAD.split("."))
        found = list(fp.find_callers(tree)) if os.path.isdir(tree) else []

        version_file = os.path.join(target, "vllm", "_version.py")
        version = "unknown"
        if os.path.exists(version_file):
            with open(version_file) as f:
                version = _version_of(f.read())
        return (
            os.path.basename(os.path.normpath(target)) if version == "unknown" else version,
            read,
            target,
            found,
        )
    name = os.path.basename(target)
    version = name.split("-")[1].removesuffix(".tar.gz")
    if name.endswith(".tar.gz"):
        tar = tarfile.open(target)
        members = {m.name.split("/", 1)[-1]: m for m in tar.getmembers() if m.isfile()}

        def read_tar(module: str) -> bytes | None:
            member = members.get(_file_name(module))
            return None if member is None else tar.extractfile(member).read()  # type: ignore[union-attr]

        return version, read_tar, target, _callers(set(members), read_tar)
    wheel = zipfile.ZipFile(target)
    names = set(wheel.namelist())

    def read_wheel(module: str) -> bytes | None:
        name = _file_name(module)
        return wheel.read(name) if name in names else None

    return version, read_wheel, target, _callers(names, read_wheel)


def judge(target: str | None, table: list[dict]) -> bool:
    """Report on one vLLM and join it to table; False if it cannot be read."""
    version, read, where, found = _reader(target)
    print(f"vLLM {version} ({where}):")
    modules = [*MODULES, *(m for m in found if m not in MODULES)]
    sources = {m: s for m in modules if (s := read(m)) is not None}
    paths = {m: f"{where}/{_file_name(m)}" for m in sources}
    missing = [m for m in (fp.ARC_MODULE, fp.BASE_MODULE) if m not in sources]
    if missing:
        print(f"    no source for {', '.join(missing)}")
        return False
    import ast

    code = fp.arc_code(ast.parse(sources[fp.ARC_MODULE]), ast.parse(sources[fp.BASE_MODULE]))
    found = fp.judge_sources(version, sources, paths, VERIFIED, POLICY_NAMES)
    if found.verified_as is not None:
        print(f"    its ARC code is verified vLLM {found.verified_as}'s")
    else:
        print(f"    its ARC code is none the table verified (nearest: vLLM {found.nearest}'s):")
        for change in found.changes:
            print(f"        {change.name} {change.how}")
    forbidden = fp.forbidden_names(code, POLICY_NAMES)
    writable = fp.policy_attributes(code, POLICY_NAMES)
    callers = {}
    for module in [*fp.CALLER_MODULES, *(m for m in sources if m not in MODULES)]:
        name = fp.short_name(module)
        if module not in sources:
            print(f"    {name}: not in this release")
            continue
        tree = ast.parse(sources[module])
        compiled = compile(sources[module], paths[module], "exec", dont_inherit=True)
        uses = fp.names_used(tree, compiled, forbidden)
        uses |= fp.attribute_writes(tree, compiled, writable)
        if uses or module in fp.CALLER_MODULES:
            # (another caller joins the table only when the scan needs it)
            callers[name] = fp.fingerprint(tree)
        if uses:
            print(
                f"    {name} uses what the guard forbids callers outside the table: "
                + ", ".join(f"{n!r} (line {line})" for n, line in sorted(uses.items()))
                + "; check that none is a call on the policy (tools/vllm_compat.sh drove it)"
            )
        else:
            print(f"    {name} uses nothing the guard forbids")

    entry = next((e for e in table if e["arc"] == dict(code.objects)), None)
    if entry is None:
        entry = {"releases": (), "arc": dict(code.objects), "callers": {}}
        table.append(entry)
    if version not in entry["releases"]:
        entry["releases"] = tuple(sorted({*entry["releases"], version}, key=fp.release_key))
    for name, mine in callers.items():
        entry["callers"][name] = tuple(sorted({*entry["callers"].get(name, ()), mine}))
    return True


def _item(key: str, values: tuple[str, ...], indent: str) -> str:
    # As ruff formats it: one line if it fits in 100 columns, else one
    # value per line, each with a trailing comma.
    items = ", ".join(f'"{v}"' for v in values)
    line = f'{indent}"{key}": ' + (f"({items},)" if len(values) == 1 else f"({items})") + ",\n"
    if len(line) <= 101:
        return line
    inner = "".join(f'{indent}    "{v}",\n' for v in values)
    return f'{indent}"{key}": (\n{inner}{indent}),\n'


def main(argv: list[str]) -> int:
    targets: list[str | None] = list(argv) or [None]
    table = [
        {"releases": e["releases"], "arc": dict(e["arc"]), "callers": dict(e["callers"])}
        for e in VERIFIED
    ]
    ok = all([judge(t, table) for t in targets])
    table.sort(key=lambda e: fp.release_key(e["releases"][0]))
    releases = sorted((r for e in table for r in e["releases"]), key=fp.release_key)
    newest = fp.release_key(releases[-1])
    out = io.StringIO()
    out.write(f'SUPPORTED_VLLM = ">={releases[0]},<{newest[0]}.{newest[1] + 1}"\n')
    out.write("VERIFIED: tuple[dict, ...] = (\n")
    for entry in table:
        out.write("    {\n")
        out.write(_item("releases", entry["releases"], "        "))
        out.write('        "arc": {\n')
        for name, value in sorted(entry["arc"].items()):
            out.write(f'            "{name}": "{value}",\n')
        out.write("        },\n")
        out.write('        "callers": {\n')
        for name, values in sorted(entry["callers"].items()):
            out.write(_item(name, values, "            "))
        out.write("        },\n")
        out.write("    },\n")
    out.write(")\n")
    print("\narc_cy/_verified.py, with these releases:\n")
    print(out.getvalue())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
