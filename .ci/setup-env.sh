#!/usr/bin/env bash
# Make $ARC_CY_ENV match .ci/requirements.lock exactly, then build and install
# this checkout's arc_cy into it. Called by .ci/env.sh (source that instead).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${ARC_CY_ENV:?set by .ci/env.sh}" "${ARC_CY_PY:?set by .ci/env.sh}"
lock=$root/.ci/requirements.lock
base_py=${ARC_CY_BASE_PYTHON:-python3}

mkdir -p "$(dirname "$ARC_CY_ENV")"
# One setup at a time per environment; others wait, then reuse it.
exec 9>"$ARC_CY_ENV.lock"
flock 9

if [ ! -f "$ARC_CY_ENV/.arc_cy-ready" ]; then
    echo "arc_cy: creating the environment $ARC_CY_ENV from .ci/requirements.lock (vLLM is large: several minutes)" >&2
    rm -rf "$ARC_CY_ENV"
    "$base_py" -m venv "$ARC_CY_ENV"
    "$ARC_CY_PY" -m pip install -q "$(grep '^pip==' "$lock")"
    "$ARC_CY_PY" -m pip install -q -r "$lock"
    touch "$ARC_CY_ENV/.arc_cy-ready"
fi

# Remove what the lock does not pin (arc_cy included) and install what it
# pins but the environment lacks.
echo "arc_cy: syncing $ARC_CY_ENV to .ci/requirements.lock" >&2
"$ARC_CY_PY" -m uv pip sync -q --python "$ARC_CY_PY" "$lock"

echo "arc_cy: building and installing arc_cy from $root" >&2
"$ARC_CY_PY" -m pip install -q --no-deps "$root"
