#!/usr/bin/env bash
# Build another revision's compiled core as the package `arc_cy_base`, so a
# benchmark can run it side by side with this checkout's (the contender
# "arc_cy_base", interleaved with the others):
#     source .ci/env.sh
#     dir=$(bench/base.sh main)
#     ARC_CY_BENCH_BASE=$dir "$ARC_CY_PY" -P bench/evict.py --json /tmp/ab.json
# Prints the directory (under /tmp) that holds the package. Built with the
# flags setup.py uses for a release build.
set -euo pipefail
rev=${1:?usage: bench/base.sh REV}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${ARC_CY_PY:?source .ci/env.sh first}
dir=$(mktemp -d "${TMPDIR:-/tmp}/arc_cy_base.XXXXXX")
git -C "$root" archive "$rev" arc_cy | tar -x -C "$dir"
mv "$dir/arc_cy" "$dir/arc_cy_base"
sed -i 's/\barc_cy\./arc_cy_base./g; s/^from arc_cy import/from arc_cy_base import/' \
    "$dir"/arc_cy_base/*.py "$dir"/arc_cy_base/*.pyx
cat > "$dir/setup.py" <<'PY'
from Cython.Build import cythonize
from setuptools import Extension, setup

ext = Extension("arc_cy_base._arc_c", ["arc_cy_base/_arc_c.pyx"], include_dirs=["arc_cy_base"],
                extra_compile_args=["-O3", "-g0"])
setup(name="arc_cy_base", ext_modules=cythonize([ext], language_level=3, quiet=True))
PY
(cd "$dir" && "$py" setup.py -q build_ext --inplace) >&2
echo "$dir"
