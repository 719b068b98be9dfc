#!/usr/bin/env bash
# test_run_chaos_pause.sh -- `pdlink run --chaos` with its whole default schedule behind the
# real vllm-router: per topology, decode-0 and then prefill-0 are killed with kill -9 and restarted on
# their ports, then decode-0 is stopped with SIGSTOP for 6 s and prefill-0 for 8 s (longer than the
# nodes' consumer_gone_timeout, 5 s) and continued with SIGCONT, under load; then the workload runs once
# more. Three short runs: shm READ on 2p1d and 1p2d, tcp READ on 2p1d, shm WRITE on 2p1d. Each JSON
# report is checked with check_run_report.py --chaos --vllm-router: every topology passes (final batch
# all ok with parity, 0 mismatched bytes, 0 expired, 0 held), every event's victim served again, no
# request failed outside the outage windows, every success equals the reference, and the transfers
# reaped during the chaos phase (vllm-router sends no failed release for a failed decode leg) stay
# within what the outages' failures excuse. Times are printed, never asserted.
# Exit 77 (skip) only when PDLINK_NO_VENV=1 and there is no vllm-router (as test_run_vllm_router.sh).
set -euo pipefail
source "$(dirname "$0")/test_run_lib.bash" test_run_chaos_pause pdlink pdlink-node
need_vllm_router
WORKLOAD=(--model tiny --requests 12 --concurrency 4 --prompt-tokens 8-80 --max-tokens 8)

# chaos_run NAME MODE BACKEND TOPOLOGY... : one run behind vllm-router, its report checked.
chaos_run() {
    local name=$1 mode=$2 backend=$3
    shift 3
    local topos=() t
    for t in "$@"; do topos+=(--topology "$t"); done
    local out=$WORK/$name
    mkdir -p "$out"
    local rc=0
    PDLINK_VLLM_ROUTER=$ROUTER "$BUILD/pdlink" run --chaos --router vllm-router --mode "$mode" --backend "$backend" \
        "${topos[@]}" "${WORKLOAD[@]}" --json "$out/report.json" --log-dir "$WORK/logs-$name" \
        >"$out/out.txt" 2>"$out/err.txt" || rc=$?
    if [ "$rc" -ne 0 ]; then
        cat "$out/out.txt"
        echo "FAIL: $name: pdlink run exited with $rc; stderr:"
        tail -40 "$out/err.txt"
        exit 1
    fi
    grep -q "^PASS: $#/$# topologies" "$out/out.txt" || { cat "$out/out.txt"; fail "$name: no PASS verdict line"; }
    # The event rows and the chaos phase's reaps, for the log.
    sed -n '/^  chaos: passes/,/^  chaos: reaped/p' "$out/out.txt"
    local list
    list=$(IFS=,; echo "$*")
    /usr/bin/python3 "$SRC/tests/tools/check_run_report.py" "$out/report.json" --chaos --mode "$mode" \
        --backend "$backend" --topologies "$list" --vllm-router "$WORK/logs-$name" || fail "$name: report check"
    no_child_left "$WORK/logs-$name"
}

chaos_run shm-read read shm 2p1d 1p2d
chaos_run tcp-read read tcp 2p1d
chaos_run shm-write write shm 2p1d
echo "PASS"
