#!/usr/bin/env bash
# Makes or syncs a small environment without vLLM (.ci/lint.sh's, .ci/fast.sh's)
# and prints its path: ENV, else ${XDG_CACHE_HOME:-~/.cache}/arc_cy/KIND-py<X.Y>
# for ARC_CY_BASE_PYTHON (python3 if unset). It holds NAMES at the releases
# that Python's lock pins, so the pins have one place; it fails naming what
# the lock does not pin, or what a package needs that NAMES lack. OPTIONS go
# to .ci/venv.sh (--no-project: do not install arc_cy).
#
#     .ci/small-env.sh KIND ENV [OPTIONS] -- NAMES...
set -euo pipefail
usage="usage: .ci/small-env.sh KIND ENV [OPTIONS] -- NAMES..."
kind=${1:?$usage}
env=${2?$usage}
shift 2
options=()
while [ "${1:?$usage}" != "--" ]; do
    options+=("$1")
    shift
done
shift
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base=$(.ci/find-python "${ARC_CY_BASE_PYTHON:-python3}")
pyver=$("$base" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
lock=.ci/requirements-py$pyver.lock
env=${env:-${XDG_CACHE_HOME:-$HOME/.cache}/arc_cy/$kind-py$pyver}
pins=$(mktemp "${TMPDIR:-/tmp}/arc_cy-$kind-pins.XXXXXX")
trap 'rm -f "$pins"' EXIT
grep -iE "^($(IFS='|'; echo "$*"))==" "$lock" > "$pins" || true
if [ "$(wc -l < "$pins")" != "$#" ]; then
    echo "arc_cy: $lock does not pin each of $*: $(xargs < "$pins")" >&2
    exit 2
fi
.ci/venv.sh "$env" "$pins" --python "$base" "${options[@]}" >&2
"$env/bin/python" -m uv pip check -q --python "$env/bin/python" >&2
echo "$env"
