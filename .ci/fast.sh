#!/usr/bin/env bash
# The layer without vLLM: arc_cy installed where vLLM is not (a documented
# use: the policy alone), tested by every test not marked needs_vllm. A test
# that imports vLLM without the mark fails here, not in a user's hands.
#
# Its environment holds arc_cy (built from this checkout, the core
# compiled), pytest, pytest-xdist, hypothesis and what they need, at the
# releases that the lock of ARC_CY_BASE_PYTHON (python3 if unset) pins:
# ${XDG_CACHE_HOME:-~/.cache}/arc_cy/fast-py<X.Y>, or ARC_CY_FAST_ENV, made
# by .ci/venv.sh (seconds, and the build). A test that needs another
# package (mypy, numpy) skips here, and only here. Extra arguments go to
# pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The lock's lines for the test runner and what it needs (the lock's
# `# via pytest`, `pytest-xdist`, `hypothesis`), and uv.
env=$(.ci/small-env.sh fast "${ARC_CY_FAST_ENV:-}" -- pytest pytest-xdist hypothesis \
    execnet iniconfig packaging pluggy pygments sortedcontainers uv)
if "$env/bin/python" -P -c 'import vllm' 2>/dev/null; then
    echo "fast: $env imports vllm: it must not" >&2
    exit 2
fi
exec "$env/bin/python" -P -m pytest -n logical --dist loadfile -p no:cacheprovider \
    -m "not needs_vllm" "$@"
