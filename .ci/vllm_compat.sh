#!/usr/bin/env bash
# On demand, not in CI: check arc_cy against another vLLM release, in an
# environment of its own, e.g.
#     .ci/vllm_compat.sh 0.30.0
#     .ci/vllm_compat.sh 0.30.0 --stand-in lru   # vLLM's lru in arc_cy's place: must fail
# The environment (${XDG_CACHE_HOME:-~/.cache}/arc_cy/venv-vllm-VERSION-pyX.Y,
# or ARC_CY_COMPAT_ENV) holds that vLLM, pytest and hypothesis, and this
# checkout's arc_cy, on ARC_CY_BASE_PYTHON (a version or a path; python3 if
# unset). It runs, with ARC_CY_ALLOW_UNVERIFIED_VLLM=1:
#   * tests/test_vllm_releases.py: that release's own CPUOffloadingManager
#     and CachePolicyFactory, driven as its scheduler drives them (0.30's
#     touches included), by the plugin name and by the module path;
#   * tests/test_scheduler_e2e.py and tests/test_tiering.py: that release's
#     real v1 Scheduler and OffloadingConnector (and tiering spec) on CPU,
#     arc_cy against vLLM's arc, decision for decision;
#   * the differential tests on random policy calls and manager traffic
#     (the calls that release makes), and the vLLM PR 55461 cases;
#   * `python -m arc_cy`, the operator's self-check, through that release's
#     plugin loading and manager;
# then prints how the guard judges that release, and the table of
# arc_cy/_verified.py with it added (.ci/fingerprint.py), and ends with what a
# user of that release gets with NO override (.ci/no_override.py): the plugin
# registers, the module path builds the manager, `python -m arc_cy` exits 0.
# If that last step fails, it names the guard's reasons: add the printed
# table, and a rerun passes. Extra arguments go to pytest. A release joins
# the table only after this passes (and SUPPORTED_VLLM, the [vllm] extra,
# then spans it), with its files in tests/data/vllm (see its README).
set -euo pipefail
version=${1:?usage: .ci/vllm_compat.sh VLLM_VERSION [--stand-in POLICY] [pytest args]}
shift
tests=(tests/test_vllm_releases.py tests/test_scheduler_e2e.py tests/test_tiering.py
       tests/test_differential.py tests/test_manager.py)
select="releases or scheduler_e2e or tiering or random or pr_55461"
if [ "${1:-}" = --stand-in ]; then
    export ARC_CY_COMPAT_STAND_IN=${2:?--stand-in needs a vLLM policy name, e.g. lru}
    shift 2
    tests=(tests/test_vllm_releases.py)
    select="traffic"
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base_py=$("$root/.ci/find-python" "${ARC_CY_BASE_PYTHON:-python3}")
pyver=$("$base_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
env=${ARC_CY_COMPAT_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/arc_cy/venv-vllm-$version-py$pyver}
py=$env/bin/python

if [ ! -f "$env/.arc_cy-ready" ]; then
    echo "compat: creating $env with vllm==$version on Python $pyver (several minutes)" >&2
    rm -rf "$env"
    "$base_py" -m venv "$env"
    # uv, as for the CI environments: parallel downloads, and files it has
    # fetched before are linked, not copied.
    "$py" -m pip install -q --disable-pip-version-check "$(grep -h '^uv==' "$root"/.ci/requirements-py*.lock | head -1)"
    # As a user installs it: plainly, or, where PyPI lacks a pin that
    # release asks for (0.34.0's flashinfer-python==0.7.3), with the
    # overrides CI's locks use (.ci/overrides.txt, which says why).
    reqs=("vllm==$version" "pytest>=8" "hypothesis>=6.100")
    if ! "$py" -m uv pip install -q --python "$py" "${reqs[@]}"; then
        echo "compat: vllm==$version does not install as it pins; again with .ci/overrides.txt" >&2
        "$py" -m uv pip install -q --python "$py" --override "$root/.ci/overrides.txt" "${reqs[@]}"
    fi
    # vLLM pulls in torchvision, torchaudio and torchcodec, which the KV
    # offloading paths do not use; PyPI's builds of them fail to import
    # beside some torch releases (0.30.0 pins torchaudio 2.11 beside torch
    # 2.13), and then so does vLLM's manager. Without them it imports.
    "$py" -m uv pip uninstall -q --python "$py" torchvision torchaudio torchcodec
    touch "$env/.arc_cy-ready"
fi
"$py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$root"
echo "compat: vLLM $("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -1) on Python $pyver, arc_cy from $root${ARC_CY_COMPAT_STAND_IN:+, with the vLLM policy $ARC_CY_COMPAT_STAND_IN standing in for arc_cy}" >&2
cd "$root"
ARC_CY_ALLOW_UNVERIFIED_VLLM=1 "$py" -P -m pytest -p no:cacheprovider "${tests[@]}" -k "$select" "$@"
(cd "${TMPDIR:-/tmp}" && ARC_CY_ALLOW_UNVERIFIED_VLLM=1 "$py" -P -m arc_cy)
echo "compat: vLLM $version passed, with the override; how the guard judges it:" >&2
"$py" -P "$root/.ci/fingerprint.py"
echo "compat: what a user of vLLM $version gets with no override:" >&2
(cd "${TMPDIR:-/tmp}" && "$py" -P "$root/.ci/no_override.py")
