#!/usr/bin/env bash
# The one maker of arc_cy's environments: every one (the suite's per Python,
# .ci/env.sh; the engine leg's, .ci/engine-env.sh; the linters', .ci/lint.sh;
# a vLLM release's, tools/vllm_compat.sh) is made and synced here.
#
#     .ci/venv.sh ENV LOCK [--python PY] [--find-links DIR] [--no-project] [--no-sync]
#
# It makes the virtual environment ENV (or reuses it), then syncs it to LOCK
# (uv pip compile's output: the whole environment pinned), then installs this
# checkout's arc_cy into it:
#   * ENV is made from PY (a version such as 3.12, or an interpreter's path:
#     .ci/find-python; ARC_CY_BASE_PYTHON, else python3, if not given), with
#     the uv that LOCK pins (the line `uv==...`); an ENV left half-made, or
#     made from a Python of another X.Y, is made anew. One maker at a time
#     per ENV (flock on ENV.lock); the others wait, then reuse it.
#   * `uv pip sync` makes ENV exactly LOCK: it removes what LOCK does not pin
#     (arc_cy included) and installs what it pins but ENV lacks, so a package
#     installed by hand cannot hide a missing dependency. --find-links DIR
#     also looks in DIR (the engine's torch is a wheel on this disk, on no
#     index). --no-sync skips it: ENV then holds what the caller installs
#     (tools/vllm_compat.sh: a vLLM release, as a user installs it).
#   * `pip install --no-deps` of this checkout (a build of arc_cy), unless
#     --no-project.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage="usage: .ci/venv.sh ENV LOCK [--python PY] [--find-links DIR] [--no-project] [--no-sync]"
env=${1:?$usage}
lock=${2:?$usage}
shift 2
python=${ARC_CY_BASE_PYTHON:-python3}
find_links=() project=1 sync=1
while [ $# -gt 0 ]; do
    case $1 in
        --python) python=${2:?$usage}; shift 2 ;;
        --find-links) find_links=(--find-links "${2:?$usage}"); shift 2 ;;
        --no-project) project=; shift ;;
        --no-sync) sync=; shift ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
if [ ! -f "$lock" ]; then
    echo "arc_cy: no lock $lock" >&2
    exit 2
fi
uv_pin=$(grep '^uv==' "$lock") || { echo "arc_cy: $lock pins no uv" >&2; exit 2; }
base=$("$root/.ci/find-python" "$python")
pyver=$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
py=$env/bin/python

mkdir -p "$(dirname "$env")"
exec 9>"$env.lock"
flock 9

if [ -f "$env/.arc_cy-ready" ] &&
   [ "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$pyver" ]; then
    echo "arc_cy: $env is not a Python $pyver environment: making it anew" >&2
    rm -f "$env/.arc_cy-ready"
fi
if [ ! -f "$env/.arc_cy-ready" ]; then
    echo "arc_cy: creating the environment $env (Python $pyver, $base): a large lock's first sync takes minutes" >&2
    rm -rf "$env"
    "$base" -m venv "$env"
    # uv does the installs: it downloads in parallel, and a second
    # environment links what the first fetched.
    "$py" -m pip install -q --disable-pip-version-check "$uv_pin"
    touch "$env/.arc_cy-ready"
fi

if [ -n "$sync" ]; then
    # --compile-bytecode: as pip does by default. uv does not, and with
    # PYTHONDONTWRITEBYTECODE set every process that imports vLLM then
    # compiles it from source (25 s, not 10); once compiled, later syncs
    # only check the .pyc files (seconds).
    echo "arc_cy: syncing $env to ${lock#"$root"/} ($(grep -c '^[^#[:space:]]' "$lock") pins)" >&2
    "$py" -m uv pip sync -q --compile-bytecode --python "$py" ${find_links[@]+"${find_links[@]}"} "$lock"
fi

if [ -n "$project" ]; then
    echo "arc_cy: building and installing arc_cy from $root" >&2
    "$py" -m pip install -q --disable-pip-version-check --no-deps "$root"
fi
