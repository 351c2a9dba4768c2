#!/usr/bin/env bash
# Lint the checkout: ruff (Python: its checks, and its formatter's check)
# and cython-lint (the .pyx), configured in pyproject.toml ([tool.ruff],
# [tool.cython-lint]); then every `# noqa` must
# name its codes and say why: `# noqa: E402 -- after the sys.path check`
# (ruff's RUF100 reports the unused ones). Extra arguments go to
# `ruff check` (e.g. --fix, --statistics). CI runs it first (.ci/run).
#
# The tools are the [lint] extra, at the releases that the lock of
# ARC_CY_BASE_PYTHON (python3 if unset) pins, with the pins they need from
# it. They live in a small environment of their own, without vLLM (seconds
# to make): ${XDG_CACHE_HOME:-~/.cache}/arc_cy/lint-py<X.Y>, or
# ARC_CY_LINT_ENV, made and synced to those pins by .ci/venv.sh, as every
# environment is. pre-commit runs this script (.pre-commit-config.yaml), so
# the pins have one place.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The linters' lines of the lock: ruff, cython-lint and what cython-lint
# imports (Cython, pycodestyle, tokenize-rt; the lock's `# via cython-lint`),
# and uv, which makes the environment. A lock that moves them to releases
# with another dependency fails, naming it, until this list has it.
env=$(.ci/small-env.sh lint "${ARC_CY_LINT_ENV:-}" --no-project -- ruff cython-lint cython \
    pycodestyle tokenize-rt uv)
# cython-lint runs pycodestyle by name.
export PATH=$env/bin:$PATH
status=0
echo "lint: $(ruff --version): ruff check $*" >&2
ruff check "$@" . || status=1
echo "lint: ruff format --check (ruff format . rewrites)" >&2
ruff format --check . || status=1
echo "lint: cython-lint $("$env/bin/python" -c 'from importlib.metadata import version; print(version("cython-lint"))')" >&2
git ls-files -z '*.pyx' '*.pxd' '*.pxi' | xargs -0 -r cython-lint || status=1
# A noqa without its codes, or without a reason after ` -- `.
if git ls-files -z '*.py' '*.pyi' '*.pyx' | xargs -0 -r grep -nE '#[[:space:]]*noqa' |
        grep -vE '# noqa: [A-Z]+[0-9]+(, [A-Z]+[0-9]+)* -- [^[:space:]]'; then
    echo "lint: the noqa above must name its codes and say why: # noqa: CODE -- reason" >&2
    status=1
fi
if [ "$status" = 0 ]; then
    echo "lint: ok" >&2
fi
exit "$status"
