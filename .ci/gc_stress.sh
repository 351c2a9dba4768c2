#!/usr/bin/env bash
# GC stress: the hostile-input modules (marked gc_stress) under a collection
# at every allocation (docs/hardening.md, "Checks"), on ARC_CY_BASE_PYTHON.
# In one process (-n 0): a pytest-xdist worker's I/O thread runs collections
# too, and the hook in it crashed a worker and kept a short test from seeing
# any collection. Extra arguments go to pytest.
#
# It runs in a copy of the checkout's files and an environment of its own
# (ARC_CY_GC_ENV, default .../arc_cy/venv-py<X.Y>-gcstress), so that CI can
# run it beside the other legs (.ci/run): one process uses one core, and a
# build of its own cannot race another leg's build in the same tree.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base=$("$root/.ci/find-python" "${ARC_CY_BASE_PYTHON:-python3}")
pyver=$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_cy-gcstress.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The files git tracks, and those it does not ignore, as the tree has them.
git -C "$root" ls-files -z --cached --others --exclude-standard |
    (cd "$root" && tar --null -T - -cf -) | tar -C "$work" -xf -
cd "$work"
ARC_CY_ENV=${ARC_CY_GC_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/arc_cy/venv-py$pyver-gcstress} \
    ARC_CY_GC_STRESS=1 ARC_CY_TESTS_CORE=1 tests/run.sh -p no:cacheprovider -n 0 -m gc_stress "$@"
