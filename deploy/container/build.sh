#!/bin/bash
# build.sh -- the container recipes' steps (Containerfile: vLLM + the pdlink wheel; Containerfile.router:
# pdlink-router), run and checked in a plain shell; the image builds themselves only when asked.
#
#   deploy/container/build.sh [--wheel FILE | --dist DIR] [--router-build DIR] [--image TAG] [--router-image TAG]
#
#   1. wheel   `make wheel` (scripts/build-wheel) into --dist DIR (kept) or a scratch folder, unless
#              --wheel names one; its platform tag says the glibc the vLLM image needs (manylinux_2_X: glibc 2.X or newer)
#   2. venv    the wheel pip-installed into a throwaway venv (as the Containerfile's RUN does; cffi comes
#              from PyPI), then check-install.py run by that venv's python from outside the repository
#   3. router  Containerfile.router's package lists against this repository and a pdlink-router built
#              here (--router-build DIR, default $PDLINK_BUILD_DIR or build/): the build stage installs
#              every Debian package cmake/PdlDeps.cmake requires for the programs (not cmocka, not UCX),
#              and each library pdlink-router links (readelf NEEDED) is in a runtime-stage package (dpkg -S)
#   4. image   `docker build` (or podman) of each recipe given a tag; without one the step prints that it
#              did not run. A build copies the wheel into dist/ at the repository root (the build context)
# Every step prints one "ok:" or "FAIL:" line; the script exits 1 on the first failure.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/deploy/container
wheel="" dist="" router_build=${PDLINK_BUILD_DIR:-$root/build} image="" router_image=""
while [ $# -gt 0 ]; do
    case $1 in
        --wheel) wheel=$2; shift 2 ;;
        --dist) dist=$2; shift 2 ;;
        --router-build) router_build=$2; shift 2 ;;
        --image) image=$2; shift 2 ;;
        --router-image) router_image=$2; shift 2 ;;
        *) echo "usage: $0 [--wheel FILE | --dist DIR] [--router-build DIR] [--image TAG] [--router-image TAG]" >&2; exit 2 ;;
    esac
done
tmp=$(mktemp -d /tmp/pdlink-container.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $(date +%T) $*"; }

step "1. wheel"
if [ -z "$wheel" ]; then
    # As `make wheel`: libpdlink compiled by the wheel's own build, not a build tree's (a test's
    # PDLINK_BUILD_DIR may be a Debug or sanitizer build, or older than the sources).
    dist=${dist:-$tmp/dist}
    env -u PDLINK_BUILD_DIR "$root/scripts/build-wheel" "$dist" > "$tmp/wheel.log" 2>&1 || { tail -30 "$tmp/wheel.log"; fail "scripts/build-wheel"; }
    wheel=$(ls "$dist"/pdlink-*manylinux*.whl 2>/dev/null | head -1)
    [ -n "$wheel" ] || fail "scripts/build-wheel left no manylinux wheel in $dist"
fi
[ -f "$wheel" ] || fail "no wheel at $wheel"
glibc=$(basename "$wheel" | sed -nE 's/.*manylinux_([0-9]+)_([0-9]+)_x86_64\.whl$/\1.\2/p')
[ -n "$glibc" ] || fail "$(basename "$wheel") has no manylinux_X_Y_x86_64 tag"
grep -q '^ARG VLLM_IMAGE=' "$here/Containerfile" || fail "Containerfile has no ARG VLLM_IMAGE"
echo "ok: $(basename "$wheel"): the vLLM image needs glibc $glibc+ and CPython 3.9+ (abi3)"

step "2. venv: pip install the wheel, check-install.py"
/usr/bin/python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel" > "$tmp/pip.log" 2>&1 ||
    { tail -20 "$tmp/pip.log"; fail "pip install $(basename "$wheel")"; }
(cd "$tmp" && env -u PYTHONPATH "$tmp/venv/bin/python" "$here/check-install.py") || fail "check-install.py"
echo "ok: the wheel installs and passes check-install.py"

step "3. router: Containerfile.router's packages"
# The apt-get install line of each stage: stage 1 is the build, stage 2 the runtime.
stage_pkgs() {
    awk -v want="$1" '/^FROM /{n++} n==want' "$here/Containerfile.router" |
        sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | grep 'apt-get install' |
        sed -e 's/.*--no-install-recommends//' -e 's/&&.*//' | tr -s ' ' '\n' | grep -v '^$' | sort -u
}
build_pkgs=$(stage_pkgs 1) run_pkgs=$(stage_pkgs 2)
[ -n "$build_pkgs" ] && [ -n "$run_pkgs" ] || fail "could not read the apt-get lines of Containerfile.router"
need=$(grep -E '^ *pdl_require\(' "$root/cmake/PdlDeps.cmake" | grep -v -e CMOCKA -e UCX |
    sed -E 's/^ *pdl_require\([A-Z]+ [^ ]+ ([^ ]+) .*/\1/' | sort -u)
[ -n "$need" ] || fail "no pdl_require lines in cmake/PdlDeps.cmake"
for p in $need; do
    grep -qx "$p" <<<"$build_pkgs" || fail "Containerfile.router's build stage lacks $p (cmake/PdlDeps.cmake requires it)"
done
bin=$router_build/pdlink-router
[ -x "$bin" ] || fail "no pdlink-router at $bin (build it, or give --router-build DIR)"
"$bin" --help > /dev/null || fail "$bin --help"
for lib in $(readelf -d "$bin" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p'); do
    # A sanitizer build (ASan, UBSan, TSan) links its runtime; the image's Release build does not.
    case $lib in libasan.so*|libubsan.so*|libtsan.so*) echo "note: $lib is a sanitizer build's runtime, not the image's"; continue ;; esac
    # The image builds with -DPDL_WITH_UCX=OFF (Containerfile.router); a build here may have UCX.
    case $lib in libucp.so*|libucs.so*|libuct.so*|libucm.so*) echo "note: $lib is UCX's, which the image builds without"; continue ;; esac
    # The library of this architecture's directory: libm.so.6 is also libc6-i386's (/lib32).
    pkg=$(dpkg -S "*/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/$lib" 2>/dev/null | head -1 | cut -d: -f1)
    [ -n "$pkg" ] || pkg=$(dpkg -S "*/$lib" 2>/dev/null | head -1 | cut -d: -f1)
    [ -n "$pkg" ] || fail "pdlink-router links $lib, which no installed Debian package provides"
    [ "$pkg" = libc6 ] || grep -qx "$pkg" <<<"$run_pkgs" || fail "pdlink-router links $lib ($pkg), not in Containerfile.router's runtime stage"
done
echo "ok: build stage has $(wc -w <<<"$need") required -dev packages; runtime stage covers every library pdlink-router links"

step "4. image"
runtime=$(command -v docker || command -v podman || true)
built=0
for pair in "$image:Containerfile" "$router_image:Containerfile.router"; do
    tag=${pair%%:Containerfile*} file=Containerfile${pair##*:Containerfile}
    if [ -z "$tag" ]; then echo "not run: $file image build (give --image/--router-image TAG)"; continue; fi
    [ -n "$runtime" ] || fail "no docker or podman for $file"
    if [ "$file" = Containerfile ]; then mkdir -p "$root/dist" && cp "$wheel" "$root/dist/"; fi
    "$runtime" build -f "$here/$file" -t "$tag" "$root" || fail "$runtime build -f $file"
    echo "ok: $tag built from $file"; built=$((built + 1))
done
echo "done: steps 1-3 ok, $built image(s) built"
