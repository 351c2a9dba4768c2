#!/usr/bin/env bash
# The main job: the benchmark suite (default: about 10 minutes on 2 cores;
# --full: the whole grid). Results go to bench/results/ (or --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
export ARC_CY_BENCH_COMMAND="bench/run.sh${*:+ $*}"
exec "$ARC_CY_PY" -P bench/run.py "$@"
