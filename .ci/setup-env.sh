#!/usr/bin/env bash
# Make $ARC_CY_ENV match $ARC_CY_LOCK exactly, then build and install this
# checkout's arc_cy into it. Called by .ci/env.sh (source that instead).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${ARC_CY_ENV:?set by .ci/env.sh}" "${ARC_CY_PY:?set by .ci/env.sh}"
: "${ARC_CY_LOCK:?set by .ci/env.sh}" "${ARC_CY_BASE_PYTHON:?set by .ci/env.sh}"
pyver=$("$ARC_CY_BASE_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ ! -f "$ARC_CY_LOCK" ]; then
    verified=$(cd "$root/.ci" && ls requirements-py*.lock | sed 's/requirements-py\(.*\)\.lock/\1/' | xargs)
    echo "arc_cy: Python $pyver ($ARC_CY_BASE_PYTHON) has no lock, .ci/$(basename "$ARC_CY_LOCK"): arc_cy is verified on Python $verified (.ci/lock.sh makes a lock for another)" >&2
    exit 2
fi

mkdir -p "$(dirname "$ARC_CY_ENV")"
# One setup at a time per environment; others wait, then reuse it.
exec 9>"$ARC_CY_ENV.lock"
flock 9

# An environment made from another Python (ARC_CY_ENV reused across
# versions) is made anew.
if [ -f "$ARC_CY_ENV/.arc_cy-ready" ] &&
   [ "$("$ARC_CY_PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$pyver" ]; then
    echo "arc_cy: $ARC_CY_ENV is not a Python $pyver environment: making it anew" >&2
    rm -f "$ARC_CY_ENV/.arc_cy-ready"
fi
if [ ! -f "$ARC_CY_ENV/.arc_cy-ready" ]; then
    echo "arc_cy: creating the environment $ARC_CY_ENV (Python $pyver) from .ci/$(basename "$ARC_CY_LOCK") (vLLM is large: several minutes)" >&2
    rm -rf "$ARC_CY_ENV"
    "$ARC_CY_BASE_PYTHON" -m venv "$ARC_CY_ENV"
    # uv (pinned in the lock) does the install below: it downloads in
    # parallel, and a second environment links what the first fetched.
    "$ARC_CY_PY" -m pip install -q --disable-pip-version-check "$(grep '^uv==' "$ARC_CY_LOCK")"
    touch "$ARC_CY_ENV/.arc_cy-ready"
fi

# Remove what the lock does not pin (arc_cy included) and install what it
# pins but the environment lacks. --compile-bytecode: as pip does by
# default. uv does not, and with PYTHONDONTWRITEBYTECODE set every process
# that imports vLLM then compiles it from source (25 s, not 10); once
# compiled, later syncs only check the .pyc files (seconds).
echo "arc_cy: syncing $ARC_CY_ENV to .ci/$(basename "$ARC_CY_LOCK")" >&2
"$ARC_CY_PY" -m uv pip sync -q --compile-bytecode --python "$ARC_CY_PY" "$ARC_CY_LOCK"

echo "arc_cy: building and installing arc_cy from $root" >&2
"$ARC_CY_PY" -m pip install -q --disable-pip-version-check --no-deps "$root"
