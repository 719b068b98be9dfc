#!/bin/bash
# test_release.sh -- pdlink built and installed the way a distribution or a user does it, from a copy of
# the repository (its tracked and new files, no build trees):
#   1. Release with gcc: `make install DESTDIR=...` (library, programs, man pages; -Werror, no tests)
#   2. Release with clang: the library only
#   3. the pkg-config example (examples/engine_pair.c) built against the DESTDIR tree, run over tcp
#   4. scripts/build-wheel: `pip wheel ./python` with build isolation (libpdlink compiled by the build
#      itself), `auditwheel repair`, `auditwheel show`
#   5. the copy deleted; the wheel installed into a fresh venv in another directory; a two-process KV
#      transfer from it (tests/install/wheel_transfer.py)
# Nothing here waits on a clock: every step ends by itself or fails. Builds use JOBS (2) jobs.
# Needs network access to PyPI (the wheel's build requirements and cffi): without it, exit 77 (skip).
set -euo pipefail
src=${PDLINK_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
jobs=${JOBS:-2}
tmp=$(mktemp -d /tmp/pdlink-release.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $(date +%T) $*"; }

if ! /usr/bin/python3 - <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen("https://pypi.org/simple/cffi/", timeout=20)
except Exception as e:
    print(f"PyPI unreachable ({e})"); sys.exit(1)
PY
then echo "SKIP: the wheel build needs PyPI"; exit 77; fi

step "copy of the repository"
repo=$tmp/repo
mkdir -p "$repo"
(cd "$src" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    [ -e "$f" ] && printf '%s\0' "$f"; done | tar -c --null -T - -f -) | tar -x -C "$repo"

step "gcc Release: make install DESTDIR"
dest=$tmp/root
make -C "$repo" --no-print-directory install BUILD="$tmp/gcc" JOBS="$jobs" DESTDIR="$dest" PREFIX=/usr \
    CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Release -DPDL_BUILD_TESTS=OFF" > "$tmp/gcc.log" 2>&1 ||
    { tail -40 "$tmp/gcc.log"; fail "gcc Release build or install"; }
echo "gcc warnings: $(grep -c "warning:" "$tmp/gcc.log" || true)"
(cd "$dest" && find . \( -type f -o -type l \) | sort)

step "clang Release: the library"
CC=clang cmake -S "$repo" -B "$tmp/clang" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPDL_WERROR=ON \
    -DPDL_BUILD_PROGRAMS=OFF -DPDL_BUILD_TESTS=OFF > "$tmp/clang.log" 2>&1 &&
    cmake --build "$tmp/clang" -j "$jobs" >> "$tmp/clang.log" 2>&1 || { tail -40 "$tmp/clang.log"; fail "clang Release"; }
ls "$tmp/clang"/libpdlink.*

step "the pkg-config example against DESTDIR"
pc=$(find "$dest" -name pdlink.pc)
libdir=$(dirname "$(dirname "$pc")")
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror $(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags pdlink) \
    -o "$tmp/pair" "$src/examples/engine_pair.c" $(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --libs pdlink) \
    -Wl,-rpath,"$libdir"
"$tmp/pair" tcp || fail "example"

step "the wheel: scripts/build-wheel"
"$repo/scripts/build-wheel" "$tmp/dist" 2>&1 | tee "$tmp/wheel.log" | grep -v '^\s*$' | tail -25
whl=$(ls "$tmp"/dist/pdlink-*manylinux*.whl) || fail "no manylinux wheel"
echo "wheel: $(basename "$whl")"
grep -q "external versioned symbols" "$tmp/wheel.log" || fail "no auditwheel show output"

step "a fresh venv elsewhere, the repository copy and its build trees gone"
rm -rf "$repo" "$tmp/gcc" "$tmp/clang"
/usr/bin/python3 -m venv "$tmp/venv"
PIP_CONSTRAINT=$src/python/requirements-build.txt \
    "$tmp/venv/bin/pip" install -q --disable-pip-version-check "$whl"
# The extension must resolve every library inside the wheel or from the manylinux set.
so=$(ls "$tmp"/venv/lib/python3*/site-packages/pdlink/_pdlink*.so)
deps=$(ldd "$so")
! grep -q "not found" <<< "$deps" || fail "unresolved libraries: $deps"
grep -E "zmq|sodium|msgpack|jansson" <<< "$deps" | sed 's/^\s*/  /'
base=$(/usr/bin/python3 "$src/tests/tools/free_ports.py" 8)
(cd "$tmp" && env -u PYTHONPATH -u PDLINK_BUILD_DIR "$tmp/venv/bin/python" "$src/tests/install/wheel_transfer.py" "$base") ||
    fail "the two-process transfer from the wheel"
step "done"
