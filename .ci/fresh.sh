#!/usr/bin/env bash
# The name the developers' guide gives the fresh-machine check; the script is
# tools/fresh.sh, with the maintainer's other tools.
exec "$(dirname "${BASH_SOURCE[0]}")/../tools/fresh.sh" "$@"
