#!/usr/bin/env bash
# The test command: sets up (or reuses) the environment, builds arc_cy, and
# runs the test suite against the installed package. Extra arguments go to
# pytest, e.g. `tests/run.sh -k manager -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/env.sh
# -P: import arc_cy from the installed build, never from the source tree.
exec "$ARC_CY_PY" -P -m pytest "$@"
