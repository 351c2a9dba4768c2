# Source this from bash: sets and exports ARC_CY_ENV and ARC_CY_PY (a Python
# with vLLM and the test and bench tools), after syncing that environment to
# .ci/requirements.lock and installing this checkout's arc_cy into it.
#
# The environment is about 10 GB, so it lives outside the checkout and is
# reused: ~/.cache/arc_cy/venv-py<version> unless ARC_CY_ENV says elsewhere.
# Every source syncs it to the lock, removing whatever is not pinned there, so
# a package installed by hand cannot hide a missing dependency.
#
# It leaves the caller's shell options alone; on failure it returns non-zero.
_arc_cy_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || return
_arc_cy_pyver=$("${ARC_CY_BASE_PYTHON:-python3}" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || return
export ARC_CY_ENV=${ARC_CY_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/arc_cy/venv-py$_arc_cy_pyver}
export ARC_CY_PY=$ARC_CY_ENV/bin/python
bash "$_arc_cy_root/.ci/setup-env.sh" || return
unset _arc_cy_root _arc_cy_pyver
