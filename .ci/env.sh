# Source this: sets ARC_CY_PY to a Python that has vLLM 0.33.0, the test and
# bench tools, and this checkout's arc_cy freshly built and installed.
#
# The vLLM environment is about 10 GB, so it is made once per machine and
# reused: it lives outside the checkout, keyed by the Python version and a
# hash of .ci/requirements.txt. Set ARC_CY_ENV to put it elsewhere.
set -euo pipefail

_arc_cy_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_arc_cy_base_py=${ARC_CY_BASE_PYTHON:-python3}
_arc_cy_pyver=$("$_arc_cy_base_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
_arc_cy_key=$(cat "$_arc_cy_root/.ci/requirements.txt" | sha256sum | cut -c1-12)
ARC_CY_ENV=${ARC_CY_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/arc_cy/venv-py$_arc_cy_pyver-$_arc_cy_key}
export ARC_CY_ENV
ARC_CY_PY=$ARC_CY_ENV/bin/python
export ARC_CY_PY

mkdir -p "$(dirname "$ARC_CY_ENV")"
(
    # One setup at a time per environment; others wait, then reuse it.
    flock 9
    if [ ! -f "$ARC_CY_ENV/.arc_cy-ready" ]; then
        echo "arc_cy: creating the environment $ARC_CY_ENV (vLLM is large: a few minutes)" >&2
        rm -rf "$ARC_CY_ENV"
        "$_arc_cy_base_py" -m venv "$ARC_CY_ENV"
        "$ARC_CY_PY" -m pip install -q --upgrade pip
        "$ARC_CY_PY" -m pip install -q -r "$_arc_cy_root/.ci/requirements.txt"
        touch "$ARC_CY_ENV/.arc_cy-ready"
    fi
    echo "arc_cy: building and installing arc_cy from $_arc_cy_root" >&2
    "$ARC_CY_PY" -m pip install -q --no-deps --force-reinstall "$_arc_cy_root"
) 9>"$ARC_CY_ENV.lock"
