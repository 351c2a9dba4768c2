#!/usr/bin/env bash
# Make $ARC_CY_ENGINE_ENV match .ci/requirements-engine-py3.11.lock exactly,
# then build and install this checkout's arc_cy into it. Called by
# .ci/engine-env.sh (source that instead).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${ARC_CY_ENGINE_ENV:?set by .ci/engine-env.sh}" "${ARC_CY_ENGINE_PY:?set by .ci/engine-env.sh}"
lock=$root/.ci/requirements-engine-py3.11.lock
wheels=${ARC_CY_TORCH_WHEELS:-/opt/wheels}
torch_pin=$(grep '^torch==' "$lock")
if ! ls "$wheels"/torch-"${torch_pin#torch==}"-cp311-*.whl >/dev/null 2>&1; then
    echo "arc_cy engine: no wheel of $torch_pin in $wheels (ARC_CY_TORCH_WHEELS): the CPU build of torch is on no package index" >&2
    exit 2
fi
base=$("$root/.ci/find-python" 3.11)

mkdir -p "$(dirname "$ARC_CY_ENGINE_ENV")"
exec 9>"$ARC_CY_ENGINE_ENV.lock"
flock 9
if [ ! -f "$ARC_CY_ENGINE_ENV/.arc_cy-ready" ]; then
    echo "arc_cy engine: creating $ARC_CY_ENGINE_ENV (Python 3.11) from .ci/$(basename "$lock") (about 3.5 GB: minutes)" >&2
    rm -rf "$ARC_CY_ENGINE_ENV"
    "$base" -m venv "$ARC_CY_ENGINE_ENV"
    "$ARC_CY_ENGINE_PY" -m pip install -q --disable-pip-version-check "$(grep '^uv==' "$lock")"
    touch "$ARC_CY_ENGINE_ENV/.arc_cy-ready"
fi
echo "arc_cy engine: syncing $ARC_CY_ENGINE_ENV to .ci/$(basename "$lock")" >&2
"$ARC_CY_ENGINE_PY" -m uv pip sync -q --compile-bytecode --python "$ARC_CY_ENGINE_PY" --find-links "$wheels" "$lock"
echo "arc_cy engine: building and installing arc_cy from $root" >&2
"$ARC_CY_ENGINE_PY" -m pip install -q --disable-pip-version-check --no-deps "$root"
