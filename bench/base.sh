#!/usr/bin/env bash
# Build a revision's compiled core as the package NAME (default arc_cy_base),
# so a benchmark can run it side by side with the others, interleaved (the
# contender NAME):
#     source .ci/env.sh
#     old=$(bench/base.sh main) new=$(bench/base.sh HEAD arc_cy_head)
#     ARC_CY_BENCH_BASE=$old:$new bench/run.sh --only evict,store_latency --out /tmp/ab
# Prints the directory (under /tmp) that holds the package. Compare two
# revisions built this way (same Cython, same flags): the installed arc_cy
# was built by pip with the Cython its isolated build fetched. The order of
# the contenders counts: on the large-cache evict tables one revision ran
# up to 25% slower last than first (bench/reference/NOTES.md); to claim a
# gap that small, run both orders.
set -euo pipefail
rev=${1:?usage: bench/base.sh REV [NAME]}
name=${2:-arc_cy_base}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${ARC_CY_PY:?source .ci/env.sh first}
dir=$(mktemp -d "${TMPDIR:-/tmp}/arc_cy_base.XXXXXX")
git -C "$root" archive "$rev" arc_cy | tar -x -C "$dir"
mv "$dir/arc_cy" "$dir/$name"
find "$dir/$name" -name '*.py' -o -name '*.pyx' -o -name '*.pxd' | xargs sed -i \
    "s/\\barc_cy\\./$name./g; s/^from arc_cy import/from $name import/"
# The core's module: arc_cy._core.arc since it has a folder, arc_cy._arc_c before.
if [ -f "$dir/$name/_core/arc.pyx" ]; then module=_core.arc; else module=_arc_c; fi
cat > "$dir/setup.py" <<PY
from Cython.Build import cythonize
from setuptools import Extension, setup

ext = Extension("$name.$module", ["$name/${module/./\/}.pyx"], include_dirs=["$(dirname "$name/${module/./\/}")"],
                extra_compile_args=["-O3", "-g0"])
setup(name="$name", ext_modules=cythonize([ext], language_level=3, quiet=True))
PY
(cd "$dir" && "$py" setup.py -q build_ext --inplace) >&2
echo "$dir"
