#!/bin/bash
# test_deploy_container.sh -- the container recipes' steps in a plain shell (deploy/container/build.sh),
# from a copy of the repository (its tracked and new files, no build trees), as a user's checkout runs
# them: `make wheel`'s script builds the wheel (libpdlink compiled by the wheel's build), it is
# pip-installed into a throwaway venv and passes check-install.py (what the Containerfile runs after its
# pip install), and Containerfile.router's package lists are checked against cmake/PdlDeps.cmake and the
# libraries this build's pdlink-router links. The image builds are not run (no container runtime is
# assumed); build.sh says so, and this test checks that it does, so no step drops out unnoticed.
# Needs PyPI (the wheel's isolated build and cffi in the venv): without it, exit 77 (a failure under CI).
set -euo pipefail
src=${PDLINK_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
build=${PDLINK_BUILD_DIR:-$src/build}
if ! /usr/bin/python3 -c 'import urllib.request; urllib.request.urlopen("https://pypi.org/simple/cffi/", timeout=20)' 2>/dev/null; then
    echo "SKIP: the wheel build and the venv install need PyPI"; exit 77
fi
tmp=$(mktemp -d /tmp/pdlink-deploy.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/repo"
(cd "$src" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    [ -e "$f" ] && printf '%s\0' "$f"; done | tar -c --null -T - -f -) | tar -x -C "$tmp/repo"
log=$tmp/build.log
env -u PDLINK_BUILD_DIR -u PDLINK_SOURCE_DIR "$tmp/repo/deploy/container/build.sh" --dist "$tmp/dist" \
    --router-build "$build" 2>&1 | tee "$log"
for want in '^ok: pdlink-.*manylinux_2_[0-9]+_x86_64\.whl: the vLLM image needs glibc' \
            '^ok: the wheel installs and passes check-install.py' \
            '^check-install: pdlink .* config parser, plugin pdlink.vllm.plugin:register: ok' \
            '^ok: build stage has [0-9]+ required -dev packages; runtime stage covers' \
            '^not run: Containerfile image build' '^not run: Containerfile.router image build' \
            '^done: steps 1-3 ok, 0 image\(s\) built'; do
    grep -Eq "$want" "$log" || { echo "FAIL: build.sh printed no line matching /$want/"; exit 1; }
done

# The package check fails when it should: the router's runtime stage without libcurl4 (pdlink-router
# links libcurl.so.4) is refused, with the library and the package named.
sed -i 's/ libcurl4 / /' "$tmp/repo/deploy/container/Containerfile.router"
if "$tmp/repo/deploy/container/build.sh" --wheel "$(ls "$tmp"/dist/pdlink-*.whl)" --router-build "$build" > "$log" 2>&1; then
    echo "FAIL: build.sh accepted a router runtime stage without libcurl4"; exit 1
fi
grep -q '^FAIL: pdlink-router links libcurl.so.4 (libcurl4), not in Containerfile.router' "$log" ||
    { cat "$log"; echo "FAIL: build.sh did not name libcurl4"; exit 1; }
echo "PASS: the container recipes' steps ran (images not built); a missing runtime package is refused"
