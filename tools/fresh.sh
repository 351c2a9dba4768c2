#!/usr/bin/env bash
# Run the README test command as a new machine would: in a fresh clone of
# this checkout's HEAD (commit first: uncommitted changes are not in it), with
# ARC_CY_ENV a new, empty directory and empty download caches (uv's and
# pip's), so that nothing cached can supply a dependency that the project's
# own files do not install. All are removed afterwards. ARC_CY_BASE_PYTHON
# picks the Python (a version such as 3.12, or a path), as for tests/run.sh.
# Extra arguments go to pytest. Its last line is pytest's.
#
# It takes as long as building the vLLM environment (a few minutes, mostly
# downloads) plus the test suite, and needs about 10 GB free under
# ${TMPDIR:-/tmp}.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_cy-fresh.XXXXXX")
trap 'rm -rf "$work"' EXIT

git clone -q --no-local "$root" "$work/clone"
echo "fresh: $(git -C "$work/clone" log -1 --format='%h %s'), Python ${ARC_CY_BASE_PYTHON:-python3}, environment $work/env" >&2
cd "$work/clone"
XDG_CACHE_HOME="$work/cache" ARC_CY_ENV="$work/env" tests/run.sh "$@"
