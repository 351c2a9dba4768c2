#!/usr/bin/env bash
# Lint the checkout: ruff (Python) and cython-lint (the .pyx), configured in
# pyproject.toml ([tool.ruff], [tool.cython-lint]); then every `# noqa` must
# name its codes and say why: `# noqa: E402 -- after the sys.path check`
# (ruff's RUF100 reports the unused ones). Extra arguments go to
# `ruff check` (e.g. --fix, --statistics). CI runs it first (.ci/run).
#
# The tools are the [lint] extra, pinned in the locks: .ci/env.sh syncs the
# environment of ARC_CY_BASE_PYTHON (python3 if unset) to its lock, without
# building arc_cy (ARC_CY_SKIP_INSTALL). pre-commit runs the same two
# linters (.pre-commit-config.yaml).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
ARC_CY_SKIP_INSTALL=1 source .ci/env.sh
# cython-lint runs pycodestyle by name.
export PATH=$ARC_CY_ENV/bin:$PATH
status=0
echo "lint: $(ruff --version): ruff check $*" >&2
ruff check "$@" . || status=1
echo "lint: cython-lint $("$ARC_CY_PY" -c 'from importlib.metadata import version; print(version("cython-lint"))')" >&2
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
