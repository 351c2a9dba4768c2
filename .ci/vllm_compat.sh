#!/usr/bin/env bash
# On demand, not in CI: check arc_cy against the ARCCachePolicy of another
# vLLM release, in an environment of its own, e.g.
#     .ci/vllm_compat.sh 0.32.0
# The environment (${XDG_CACHE_HOME:-~/.cache}/arc_cy/venv-vllm-VERSION, or
# ARC_CY_COMPAT_ENV) holds that vLLM, pytest and hypothesis, and this
# checkout's arc_cy. It runs the differential tests (random traffic through
# the policy API and through that release's CPUOffloadingManager) and the
# vLLM PR 55461 cases, with ARC_CY_IGNORE_VLLM_VERSION=1. A release joins
# arc_cy.SUPPORTED_VLLM (arc_cy/_compat.py) only after this passes.
set -euo pipefail
version=${1:?usage: .ci/vllm_compat.sh VLLM_VERSION [pytest args]}
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
env=${ARC_CY_COMPAT_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/arc_cy/venv-vllm-$version}
py=$env/bin/python

if [ ! -f "$env/.arc_cy-ready" ]; then
    echo "compat: creating $env with vllm==$version (several minutes)" >&2
    rm -rf "$env"
    "${ARC_CY_BASE_PYTHON:-python3}" -m venv "$env"
    "$py" -m pip install -q "vllm==$version" "pytest>=8" "hypothesis>=6.100"
    # Where pip takes a CPU build of torch from this machine's disk (vLLM
    # 0.32 pins torch 2.13.0), PyPI's torchvision and torchaudio fail to
    # load beside it; the checks below need neither.
    "$py" -m pip uninstall -y -q torchvision torchaudio torchcodec
    touch "$env/.arc_cy-ready"
fi
"$py" -m pip install -q --force-reinstall --no-deps "$root"
echo "compat: vLLM $("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -1), arc_cy from $root" >&2
cd "$root"
ARC_CY_IGNORE_VLLM_VERSION=1 "$py" -P -m pytest -p no:cacheprovider \
    tests/test_differential.py tests/test_manager.py -k "random or pr_55461" "$@"
