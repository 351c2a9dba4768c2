#!/usr/bin/env bash
# The main job: the benchmark suite (default: about 6 minutes on 2 cores;
# --full: the whole grid, with the multi-turn scheduler bench at 1M chunks:
# add about 35 minutes for that part). Results go to bench/results/, which git
# ignores (or --out DIR); --reference also copies the report to
# bench/reference/pyX.Y/, the committed reference run for the Python it ran
# on (ARC_CY_BASE_PYTHON, as for tests/run.sh). See docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
    case $arg in
        -h|--help)  # answers at once: no environment is built for it
            exec "$(.ci/find-python "${ARC_CY_BASE_PYTHON:-python3}")" -P bench/run.py --help ;;
    esac
done
source .ci/env.sh
export ARC_CY_BENCH_COMMAND="bench/run.sh${*:+ $*}"
exec "$ARC_CY_PY" -P bench/run.py "$@"
