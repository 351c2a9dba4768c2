#!/usr/bin/env bash
# The main job: the benchmark suite (default: about 6 minutes on 2 cores;
# --full: the whole grid, with the multi-turn scheduler bench at 1M chunks:
# add about 35 minutes for that part). Results go to bench/results/, which git
# ignores (or --out DIR); --reference also copies the report to
# bench/reference/pyX.Y/, the committed reference run for the Python it ran
# on (ARC_CY_BASE_PYTHON, as for tests/run.sh). See docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
export ARC_CY_BENCH_COMMAND="bench/run.sh${*:+ $*}"
exec "$ARC_CY_PY" -P bench/run.py "$@"
