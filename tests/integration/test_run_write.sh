#!/usr/bin/env bash
# test_run_write.sh -- `pdlink run --mode write` end to end on every seed topology (1p1d, 2p1d, 1p2d,
# p4d8, p8d4) with the "tiny" preset (8 KV heads: P4/D8 and P8/D4 split heads), a short workload, and
# the JSON report checked with /usr/bin/python3: every topology passes, parity n/n, 0 mismatched bytes,
# 0 expired transfers, 0 blocks held, KV pushed and verified, write_done sent == counted == max(P, D) per
# request (the report's release rows), one receive per request. Then: no child left.
set -euo pipefail
source "$(dirname "$0")/test_run_lib.bash" test_run_write pdlink pdlink-node pdlink-router

run_must_pass --mode write --model tiny --requests 12 --concurrency 4 --prompt-tokens 8-80 --max-tokens 8
/usr/bin/python3 "$SRC/tests/tools/check_run_report.py" "$WORK/report.json" --mode write || exit 1
no_child_left "$WORK/logs"
echo "PASS"
