#!/usr/bin/env bash
# test_run_seed.sh -- `pdlink run` end to end on every seed topology (1p1d, 2p1d, 1p2d, p4d8, p8d4) with
# the small "tiny" preset (8 KV heads, so P4/D8 and P8/D4 split heads), a short workload, and the JSON
# report checked with /usr/bin/python3: every topology passes, parity n/n, 0 mismatched bytes, 0 expired
# transfers, 0 blocks held, KV moved and verified, releases sent == received. Then: no child left.
set -euo pipefail
source "$(dirname "$0")/test_run_lib.bash" test_run_seed pdlink pdlink-node pdlink-router

run_must_pass --model tiny --requests 12 --concurrency 4 --prompt-tokens 8-80 --max-tokens 8
/usr/bin/python3 "$SRC/tests/tools/check_run_report.py" "$WORK/report.json" --mode read || exit 1
no_child_left "$WORK/logs"
echo "PASS"
