#!/usr/bin/env bash
# test_run_vllm_router.sh -- `pdlink run --router vllm-router`: the real vllm-router (PyPI wheel 0.1.17,
# installed into the project venv by scripts/install-deps) started with the seed's exact flags in front
# of pdlink-nodes, on every seed topology (1p1d, 2p1d, 1p2d, p4d8, p8d4) with the "tiny" preset, and the
# same checks as with pdlink-router: parity n/n with a single node, every KV byte verified, releases =
# expected, 0 expired, 0 held. The router's own log must show it ran consistent_hash in MoRIIO mode.
# Exit 77 (skip) only when PDLINK_NO_VENV=1 and there is no vllm-router; a missing vllm-router is a
# failure otherwise, so that CI cannot pass by skipping it.
set -euo pipefail
source "$(dirname "$0")/test_run_lib.bash" test_run_vllm_router pdlink pdlink-node
need_vllm_router

PDLINK_VLLM_ROUTER=$ROUTER run_must_pass --router vllm-router --model tiny --requests 12 --concurrency 4 \
    --prompt-tokens 8-80 --max-tokens 8
/usr/bin/python3 "$SRC/tests/tools/check_run_report.py" "$WORK/report.json" --vllm-router "$WORK/logs" || exit 1
no_child_left "$WORK/logs"
echo "ok: all five seed topologies behind vllm-router: parity, bytes, releases, 0 expired, 0 held"
