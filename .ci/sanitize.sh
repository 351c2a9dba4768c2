#!/usr/bin/env bash
# Build the compiled core with AddressSanitizer + UndefinedBehaviorSanitizer
# and run the crash-prone tests against that build.
#
# Usage (from anywhere; takes a few minutes):
#     .ci/sanitize.sh                       # the hostile-input modules, both fuzzers (CI budgets), refcounts
#     .ci/sanitize.sh -k evict              # extra arguments go to pytest
#     ARC_CY_SANITIZE=address .ci/sanitize.sh   # another sanitizer set
#
# How it works:
#   * the checkout is copied to a temporary directory and built there with
#     `setup.py build_ext --inplace` and ARC_CY_SANITIZE (default
#     "address,undefined"; setup.py turns it into -fsanitize=... flags).
#     Nothing is installed: the shared environment keeps its normal build.
#   * pytest runs with PYTHONPATH=<tmp copy> and -P, so `import arc_cy` (and
#     tests/helpers.py's direct import of `arc_cy._core.arc`) loads the
#     sanitized extension; the script checks that it did.
#   * gcc's ASan runtime is LD_PRELOADed (the python binary is not built
#     with ASan); PYTHONMALLOC=malloc lets ASan see every Python allocation;
#     detect_leaks=0 because CPython itself leaks at exit. UBSan findings
#     abort (-fno-sanitize-recover in setup.py), so any finding fails the run.
#   * the temporary copy is removed at the end (ARC_CY_KEEP_SANITIZED=1
#     keeps it and prints its path, for reruns by hand).
# Exit status: pytest's (non-zero on any test failure or sanitizer report).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/.ci/env.sh"   # sets ARC_CY_PY (and refreshes the normal build)
sanitizers=${ARC_CY_SANITIZE:-address,undefined}

work=$(mktemp -d "${TMPDIR:-/tmp}/arc_cy-sanitize.XXXXXX")
if [ -z "${ARC_CY_KEEP_SANITIZED:-}" ]; then
    trap 'rm -rf "$work"' EXIT
else
    echo "sanitize: keeping $work" >&2
fi
# Only what the build and the tests need (collecting every test module
# reads .ci, tools, bench and docs): sources, not build outputs.
tar -C "$root" --exclude='*.so' --exclude='*.c' --exclude=build \
    --exclude='*.egg-info' --exclude=__pycache__ --exclude=.hypothesis --exclude=bench/results \
    -cf - setup.py pyproject.toml README.md LICENSE arc_cy tests harness .ci tools bench docs \
    | tar -C "$work" -xf -

echo "sanitize: building with -fsanitize=$sanitizers in $work" >&2
(cd "$work" && ARC_CY_SANITIZE=$sanitizers "$ARC_CY_PY" setup.py -q build_ext --inplace) >&2

preload=$(gcc -print-file-name=libasan.so)
if [ ! -e "$preload" ]; then
    echo "sanitize: gcc's libasan.so not found" >&2
    exit 2
fi
if [[ $sanitizers == *undefined* ]]; then
    preload="$preload $(gcc -print-file-name=libubsan.so)"
fi

run() {
    env LD_PRELOAD="$preload" PYTHONMALLOC=malloc PYTHONPATH="$work" \
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:allocator_may_return_null=1" \
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
        ARC_CY_FUZZ_PROFILE=ci ARC_CY_TESTS_CORE=1 \
        "$ARC_CY_PY" -P "$@"
}

# The sanitized build must be the one the tests import.
run -c "import arc_cy._core.arc as m, sys; p = m.__file__; print('sanitize: testing', p, file=sys.stderr); sys.exit(not p.startswith('$work'))"

cd "$work"
# The hostile-input modules and the fuzzers and refcounts (the gc_stress and
# sanitize marks), one pytest-xdist worker per CPU, as tests/run.sh.
run -m pytest -p no:cacheprovider -q -n logical --dist loadfile \
    -m "gc_stress or sanitize" tests "$@"
