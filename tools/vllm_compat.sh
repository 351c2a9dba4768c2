#!/usr/bin/env bash
# On demand, not in CI: check arc_cy against another vLLM release, in an
# environment of its own, e.g.
#     tools/vllm_compat.sh 0.30.0
#     tools/vllm_compat.sh 0.30.0 --stand-in lru   # vLLM's lru in arc_cy's place: must fail
# The environment (${XDG_CACHE_HOME:-~/.cache}/arc_cy/venv-vllm-VERSION-pyX.Y,
# or ARC_CY_COMPAT_ENV) holds that vLLM, pytest and hypothesis, and this
# checkout's arc_cy, on ARC_CY_BASE_PYTHON (a version or a path; python3 if
# unset): .ci/venv.sh makes it (with the uv of that Python's lock) and
# installs arc_cy; this script installs that vLLM into it, once. It runs,
# with ARC_CY_ALLOW_UNVERIFIED_VLLM=1, the tests of the compat mark:
#   * tests/test_vllm_releases.py: that release's own CPUOffloadingManager
#     and CachePolicyFactory, driven as its scheduler drives them (0.30's
#     touches included), by the plugin name and by the module path;
#   * tests/test_scheduler_e2e.py and tests/test_tiering.py: that release's
#     real v1 Scheduler and OffloadingConnector (and tiering spec) on CPU,
#     arc_cy against vLLM's arc, decision for decision;
#   * the differential tests on random policy calls and manager traffic
#     (the calls that release makes), and the vLLM PR 55461 cases;
# and `python -m arc_cy`, the operator's self-check, through that release's
# plugin loading and manager; then prints how the guard judges that
# release, and the table of arc_cy/_guard/verified.py with it added
# (tools/fingerprint.py); compares, for a release in tests/data/vllm, the
# files vendored there with its sdist on PyPI (tools/vendored.py); and ends with what a user of that release gets
# with NO override (tools/no_override.py): the plugin registers, the module
# path builds the manager, `python -m arc_cy` exits 0. If that last step
# fails, it names the guard's reasons: add the printed table, and a rerun
# passes. With --stand-in POLICY it runs only the test of the stand_in mark,
# which must fail. Extra arguments go to pytest. A release joins the table
# only after this passes (and SUPPORTED_VLLM, the [vllm] extra, then spans
# it), with its files in tests/data/vllm (see its README).
set -euo pipefail
version=${1:?usage: tools/vllm_compat.sh VLLM_VERSION [--stand-in POLICY] [pytest args]}
shift
select=compat
if [ "${1:-}" = --stand-in ]; then
    export ARC_CY_COMPAT_STAND_IN=${2:?--stand-in needs a vLLM policy name, e.g. lru}
    shift 2
    select=stand_in
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base_py=$("$root/.ci/find-python" "${ARC_CY_BASE_PYTHON:-python3}")
pyver=$("$base_py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
env=${ARC_CY_COMPAT_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/arc_cy/venv-vllm-$version-py$pyver}
py=$env/bin/python

# An environment of another release (ARC_CY_COMPAT_ENV reused) is made anew.
if [ -f "$env/.arc_cy-vllm" ] && [ "$(cat "$env/.arc_cy-vllm")" != "$version" ]; then
    rm -rf "$env"
fi
# Not synced to a lock: that release installs as a user installs it, below.
"$root/.ci/venv.sh" "$env" "$root/.ci/requirements-py$pyver.lock" --python "$base_py" --no-sync
if [ ! -f "$env/.arc_cy-vllm" ]; then
    echo "compat: installing vllm==$version into $env (several minutes)" >&2
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
    echo "$version" > "$env/.arc_cy-vllm"
fi
echo "compat: vLLM $("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -1) on Python $pyver, arc_cy from $root${ARC_CY_COMPAT_STAND_IN:+, with the vLLM policy $ARC_CY_COMPAT_STAND_IN standing in for arc_cy}" >&2
cd "$root"
ARC_CY_ALLOW_UNVERIFIED_VLLM=1 "$py" -P -m pytest -p no:cacheprovider tests -m "$select" "$@"
(cd "${TMPDIR:-/tmp}" && ARC_CY_ALLOW_UNVERIFIED_VLLM=1 "$py" -P -m arc_cy)
echo "compat: vLLM $version passed, with the override; how the guard judges it:" >&2
"$py" -P "$root/tools/fingerprint.py"
if python3 -c 'import json, sys; sys.exit(sys.argv[1] not in json.load(open(sys.argv[2])))' \
        "$version" "$root/tests/data/vllm/record.json"; then
    echo "compat: vLLM $version's vendored files (tests/data/vllm) against its sdist on PyPI:" >&2
    python3 "$root/tools/vendored.py" compare "$version"
fi
echo "compat: what a user of vLLM $version gets with no override:" >&2
(cd "${TMPDIR:-/tmp}" && "$py" -P "$root/tools/no_override.py")
