#!/usr/bin/env bash
# stress.sh -- the integration tests repeated while other work loads every core: shakes out tests that
# pass only on an idle machine (ports taken between probe and bind, deadlines too short under load).
#
#   tests/stress.sh [N]      run each test up to N times (ctest --repeat until-fail:N, default 20)
#   make stress STRESS_N=N   the same after `make build`
# Environment: BUILD (build directory, default build), LOAD (busy loops, default one per core), JOBS
# (ctest -j, default 2), LABELS (ctest -L regex, default 'integration|python').
# The busy loops run at the tests' priority and are killed on exit, also on Ctrl-C. Exit status: ctest's.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20}
BUILD=${BUILD:-build}
LOAD=${LOAD:-$(nproc)}
JOBS=${JOBS:-2}
LABELS=${LABELS:-integration|python}
[[ -f $BUILD/CTestTestfile.cmake ]] || { echo "stress.sh: $BUILD is not a build directory (run make build)" >&2; exit 2; }

LOADERS=()
stop_load() {
    for pid in "${LOADERS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${LOADERS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    LOADERS=()
}
trap stop_load EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 "$LOAD"); do
    (while :; do :; done) &
    LOADERS+=($!)
done
echo "stress.sh: $LOAD busy loops (pids ${LOADERS[*]}); ctest -L '$LABELS' --repeat until-fail:$N -j $JOBS in $BUILD"
start=$(date +%s)
rc=0
ctest --test-dir "$BUILD" -L "$LABELS" --repeat until-fail:"$N" -j "$JOBS" --output-on-failure || rc=$?
echo "stress.sh: ctest exit $rc after $(($(date +%s) - start)) s, each test up to $N times under $LOAD busy loops"
exit $rc
