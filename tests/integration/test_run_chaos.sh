#!/usr/bin/env bash
# test_run_chaos.sh -- `pdlink run --chaos`, the short version, on every seed topology with the
# "tiny" preset, READ mode (WRITE mode with CHAOS_MODE=write: test_run_chaos_write.sh): per topology,
# decode-0 and then prefill-0 are killed with kill -9 under load and restarted on their ports, then the
# workload runs once more. The JSON report is checked with check_run_report.py --chaos: every topology
# passes (final batch all ok with parity, 0 mismatched bytes, 0 blocks held at the end), both victims
# served again, no request failed outside the outage windows and every success equals the reference.
# Recovery times are printed, never asserted.
set -euo pipefail
source "$(dirname "$0")/test_run_lib.bash" test_run_chaos pdlink pdlink-node pdlink-router
MODE=${CHAOS_MODE:-read}

# The kills only: the pauses (6-8 s each, per topology) are test_run_chaos_pause.sh's, on fewer topologies.
SCHEDULE=kill-decode,kill-prefill
run_must_pass --chaos --chaos-schedule "$SCHEDULE" --mode "$MODE" --model tiny --requests 12 --concurrency 4 \
    --prompt-tokens 8-80 --max-tokens 8
/usr/bin/python3 "$SRC/tests/tools/check_run_report.py" "$WORK/report.json" --mode "$MODE" --chaos \
    --schedule "$SCHEDULE" || exit 1
no_child_left "$WORK/logs"
echo "PASS"
