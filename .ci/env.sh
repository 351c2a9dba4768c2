# Source this from bash: sets and exports ARC_CY_ENV and ARC_CY_PY (a Python
# with vLLM and the test and bench tools), after syncing that environment to
# its Python's lock and installing this checkout's arc_cy into it
# (.ci/venv.sh, which makes every environment).
#
# The Python: ARC_CY_BASE_PYTHON, a version (3.12) or an interpreter's path,
# python3 if unset. Each verified Python has its own lock,
# .ci/requirements-py<X.Y>.lock; a Python without one, or one asked for but
# not found, is an error that names it.
#
# The environment is about 10 GB, so it lives outside the checkout and is
# reused: ~/.cache/arc_cy/venv-py<X.Y> unless ARC_CY_ENV says elsewhere.
# Every source syncs it to the lock, removing whatever is not pinned there, so
# a package installed by hand cannot hide a missing dependency.
#
# It leaves the caller's shell options alone; on failure it returns non-zero.
_arc_cy_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || return
ARC_CY_BASE_PYTHON=$("$_arc_cy_root/.ci/find-python" "${ARC_CY_BASE_PYTHON:-python3}") || return
export ARC_CY_BASE_PYTHON
_arc_cy_pyver=$("$ARC_CY_BASE_PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || return
if [ ! -f "$_arc_cy_root/.ci/requirements-py$_arc_cy_pyver.lock" ]; then
    echo "arc_cy: Python $_arc_cy_pyver ($ARC_CY_BASE_PYTHON) has no lock, .ci/requirements-py$_arc_cy_pyver.lock: arc_cy is verified on Python $(cd "$_arc_cy_root/.ci" && ls requirements-py*.lock | sed 's/requirements-py\(.*\)\.lock/\1/' | xargs) (tools/lock.sh makes a lock for another)" >&2
    return 2
fi
export ARC_CY_ENV=${ARC_CY_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/arc_cy/venv-py$_arc_cy_pyver}
export ARC_CY_PY=$ARC_CY_ENV/bin/python
"$_arc_cy_root/.ci/venv.sh" "$ARC_CY_ENV" "$_arc_cy_root/.ci/requirements-py$_arc_cy_pyver.lock" \
    --python "$ARC_CY_BASE_PYTHON" || return
unset _arc_cy_root _arc_cy_pyver
