#!/usr/bin/env bash
# The test command: sets up (or reuses) the environment, builds arc_cy, and
# runs the test suite against the installed package. Extra arguments go to
# pytest, e.g. `tests/run.sh -k manager -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
# ARC_CY_TESTS_REQUIRE_ALL: every skip is a failure (tests/conftest.py), so
# that a broken environment cannot pass by skipping what it lacks.
export ARC_CY_TESTS_REQUIRE_ALL=1
# -P: import arc_cy from the installed build, never from the source tree.
# -n logical: one pytest-xdist worker per CPU, each taking whole test files
# (--dist loadfile: a module's tests share one process, as they would
# alone). Later arguments win: -n 0 runs everything in this process.
exec "$ARC_CY_PY" -P -m pytest -n logical --dist loadfile "$@"
