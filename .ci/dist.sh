#!/usr/bin/env bash
# Check the sdist: build it, check what it holds, unpack it into an empty
# directory, and run the README test command there (which builds arc_cy from
# the unpacked sources into the suite's environment, as .ci/env.sh does for
# a checkout). Extra arguments go to pytest (CI: -m sdist).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/.ci/env.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_cy-dist.XXXXXX")
trap 'rm -rf "$work"' EXIT

# A clean export of HEAD: the sdist must not depend on untracked files.
git -C "$root" archive --format=tar HEAD | tar -C "$work" --one-top-level=tree -xf -
"$ARC_CY_PY" -m build --sdist --outdir "$work/dist" "$work/tree" >&2
sdist=$(ls "$work"/dist/arc_cy-*.tar.gz)
echo "dist: built $(basename "$sdist")" >&2

"$ARC_CY_PY" - "$sdist" "$root" <<'PY'
import subprocess, sys, tarfile
sdist, root = sys.argv[1:]
with tarfile.open(sdist) as tar:
    names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
tracked = set(subprocess.run(["git", "-C", root, "ls-files"], capture_output=True,
                             text=True, check=True).stdout.split())
# Everything needed to build and test: the package, its build files, and
# every tracked file under tests/, engine_tests/, harness/, .ci/ and tools/
# (bench/ too, less its reference run).
need = {f for f in tracked
        if f.startswith(("arc_cy/", "tests/", "engine_tests/", "harness/", ".ci/", "tools/"))
        or (f.startswith("bench/") and not f.startswith(("bench/results/", "bench/reference/")))}
need |= {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "setup.py", "MANIFEST.in",
         ".pre-commit-config.yaml"}
missing = sorted(need - names)
generated = sorted(n for n in names if n.endswith((".c", ".so", ".html", ".pyc")))
print(f"dist: the sdist holds {len(names)} files", file=sys.stderr)
if missing or generated:
    sys.exit(f"dist: sdist is missing {missing}; holds generated files {generated}")
PY

mkdir "$work/unpacked"
tar -C "$work/unpacked" --strip-components=1 -xzf "$sdist"
cd "$work/unpacked"
echo "dist: running the tests of the unpacked sdist in $PWD" >&2
tests/run.sh "$@"
