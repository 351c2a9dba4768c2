#!/usr/bin/env bash
# Writes the lines of LOCK that pin each of NAMES to OUT, and fails naming
# what LOCK does not pin: the small environments (.ci/lint.sh, .ci/fast.sh)
# take their releases from the suite's lock, so the pins have one place.
#
#     .ci/pins.sh LOCK OUT NAME...
set -euo pipefail
lock=${1:?usage: .ci/pins.sh LOCK OUT NAME...}
out=${2:?usage: .ci/pins.sh LOCK OUT NAME...}
shift 2
pattern=$(IFS='|'; echo "$*")
grep -iE "^($pattern)==" "$lock" > "$out" || true
if [ "$(wc -l < "$out")" != "$#" ]; then
    echo "arc_cy: $lock does not pin each of $*: $(xargs < "$out")" >&2
    exit 2
fi
