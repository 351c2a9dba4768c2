#!/usr/bin/env python3
"""Judge vLLM releases as arc_cy's guard does on release day, and print
arc_cy/_guard/verified.py with them added (or replaced):

    tools/fingerprint.py                the vLLM this Python imports
    tools/fingerprint.py DIR ...        trees holding vllm/ (site-packages,
                                        a checkout, tests/data/vllm/X)

For each vLLM: the SHA-256 of its four judged files (arc.py, base.py, the
CPU and tiering managers: ``files.digest``), which verified ARC code its
own is, and what its callers use of the policy. A release joins the table only after
tools/vllm_compat.sh passed on it: the table accepts its files by hash.
Exits 1 if a release cannot be read.

Run it with a Python that has arc_cy installed (``import arc_cy`` loads
no vLLM), or with the checkout on the path (``PYTHONPATH=.``).
"""

from __future__ import annotations

import os
import sys
import textwrap

from arc_cy import _guard
from arc_cy._guard import fingerprint as fp
from arc_cy._guard import verified
from arc_cy._guard.files import FILES, KV_OFFLOAD, digest, find_callers


def _tree(target: str | None) -> tuple[str, str]:
    """(version, the directory holding vllm/) of one vLLM."""
    if target is None:
        import vllm

        return str(vllm.__version__), os.path.dirname(
            os.path.dirname(os.path.abspath(vllm.__file__))
        )
    version = os.path.basename(os.path.normpath(target))
    version_file = os.path.join(target, "vllm", "_version.py")
    if os.path.exists(version_file):
        ns: dict[str, object] = {}
        with open(version_file) as f:
            exec(f.read(), ns)
        version = str(ns.get("__version__", version))
    return version, target


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def judge(target: str | None, table: dict[str, dict]) -> bool:
    version, root = _tree(target)
    kv = os.path.join(root, *KV_OFFLOAD.split("."))
    print(f"vLLM {version} ({root}):")
    paths = {m: os.path.join(root, *m.split(".")) + ".py" for m in FILES}
    if not all(os.path.isfile(p) for p in list(paths.values())[:2]):
        print("    no arc.py and base.py")
        return False
    sources = {m: _read(p) for m, p in paths.items() if os.path.isfile(p)}
    arc, base = sources[_guard.ARC_MODULE], sources[_guard.BASE_MODULE]
    for path, source in find_callers([kv]).values():  # as the guard finds them
        if path not in paths.values():
            sources[path] = source
    code, names = fp.arc_code(arc, base)
    matching = [r for r in _guard.releases() if _guard.verified_code(r) == code]
    same = version if version in matching else matching[0] if matching else None
    print(f"    its ARC code is verified vLLM {same}'s" if same else "    new ARC code")
    watched = names | _guard._arc_cy_names() | fp.DYNAMIC
    uses: set[str] = set()
    for module, source in sources.items():
        if module not in (_guard.ARC_MODULE, _guard.BASE_MODULE):
            found = fp.caller_uses(source, watched)
            name = os.path.relpath(module, kv) if "/" in module else FILES[module]
            print(f"    {name} uses {sorted(found)}")
            uses |= set(found)
    table["FILES"][version] = digest({m: s for m, s in sources.items() if m in FILES})
    for by_key in [*table["ARC"].values(), *table["USES"].values()]:
        for key, rs in list(by_key.items()):
            by_key[key] = " ".join(r for r in rs.split() if r != version)
    added = [(table["ARC"].setdefault(n, {}), fp_) for n, fp_ in code.items()]
    for by_key, key in added + [(table["USES"].setdefault(u, {}), "") for u in uses]:
        by_key[key] = " ".join(
            sorted({*by_key.get(key, "").split(), version}, key=_guard.release_key)
        )
    return True


def _string(value: str, indent: str) -> str:
    lines = textwrap.wrap(value, 88 - len(indent), break_on_hyphens=False)
    if len(lines) <= 1:
        return f'"{value}"'
    inner = "".join(f'{indent}    "{line} "\n' for line in lines[:-1])
    return f'(\n{inner}{indent}    "{lines[-1]}"\n{indent})'


def main(argv: list[str]) -> int:
    table = {
        "FILES": dict(verified.FILES),
        "ARC": {n: dict(e.split(" ", 1) for e in v.split("; ")) for n, v in verified.ARC.items()},
        "USES": {u: {"": rs} for u, rs in verified.USES.items()},
    }
    ok = all([judge(t, table) for t in (list(argv) or [None])])
    releases = sorted(table["FILES"], key=_guard.release_key)
    newest = _guard.release_key(releases[-1])
    out = [f'"""{verified.__doc__}"""\n\n']
    out.append(f'SUPPORTED_VLLM = ">={releases[0]},<{newest[0]}.{newest[1] + 1}"\n')
    out.append("FILES: dict[str, str] = {\n")
    out += [f'    "{r}": "{table["FILES"][r]}",\n' for r in releases]
    out.append("}\nARC: dict[str, str] = {\n")
    for name, by_fp in sorted(table["ARC"].items()):
        if value := "; ".join(f"{f} {rs}" for f, rs in by_fp.items() if rs):
            line = f'    "{name}": "{value}",\n'
            out.append(line if len(line) <= 101 else f'    "{name}": {_string(value, "    ")},\n')
    out.append("}\nUSES: dict[str, str] = {\n")
    out += [f'    "{u}": "{rs[""]}",\n' for u, rs in sorted(table["USES"].items()) if rs[""]]
    out.append("}\n")
    print("\narc_cy/_guard/verified.py, with these releases:\n")
    print("".join(out))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
