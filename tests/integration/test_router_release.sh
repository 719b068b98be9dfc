#!/usr/bin/env bash
# test_router_release.sh -- a bad request through pdlink-router pins no prefill block.
#
# A TP-2 prefill and a decode behind the router, READ mode. Four cases, each ending with the prefill's
# pdlink_held_blocks back at 0 well before its 60 s defer_timeout reaper could have freed anything:
#   1. "max_tokens": -1 (and other fields only the decode would refuse) are refused by the router with 400
#      before any leg: the prefill sees no request at all.
#   2. a decode that answers 400 after the prefill leg held the blocks (prompt + max_tokens over the
#      decode's max_model_len): the router sends failed releases to both prefill ranks.
#   3. a decode that is dead (kill -9 after it registered): connection refused, the same releases.
#   4. a normal request still succeeds afterwards, and its own blocks are freed by the decode.
# Polls use a deadline only as the failure bound (20 s, a third of the reaper's 60 s).
set -euo pipefail
source "$(dirname "$0")/test_node_lib.bash"

start_router || exit 1

DISC_CFG=",\"proxy_ip\":\"127.0.0.1\",\"proxy_ping_port\":$DISC"
p_config() { kv_config "$1" "$2" "$3" "$DISC_CFG"; }
d_config() { kv_config "$1" "$2" "$3" "$DISC_CFG,\"handshake_timeout\":2"; }
with_ports 20 kv_node P p_config kv_producer --model tiny -tp 2 --num-gpu-blocks 64 --block-size 16 || exit 1
with_ports 20 kv_node D d_config kv_consumer --model tiny -tp 1 --num-gpu-blocks 64 --block-size 16 \
    --max-model-len 512 || exit 1

registered() { [[ $(curl -s "http://127.0.0.1:$RPORT/health" -o /dev/null -w '%{http_code}') == 200 ]]; }
held_zero() { [[ $(metric $P_PORT pdlink_held_blocks) == 0 ]]; }
wait_until "prefill and decode registered with the router" 20 registered || { finish; exit 1; }

PROMPT=$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 1 20)) # ~180 tokens: 12 blocks
# 1. refused before any leg
before=$(metric $P_PORT pdlink_requests_total)
for body in '{"prompt":"P","max_tokens":-1}' '{"prompt":"P","max_tokens":0}' '{"prompt":"","max_tokens":4}' \
    '{"prompt":"P","max_tokens":4,"min_tokens":5}' '{"prompt":"P","n":2}' \
    '{"prompt":"P","stream_options":{"include_usage":true}}'; do
    r=$(post $RPORT /v1/completions "$body")
    check_eq "router refuses $body with 400" "${r%% *}" 400
done
r=$(post $RPORT /v1/chat/completions '{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":-1}')
check_eq "router refuses chat max_completion_tokens -1 with 400" "${r%% *}" 400
check_contains "the error names the field" "$r" "max_completion_tokens"
check_eq "the prefill saw none of them" "$(metric $P_PORT pdlink_requests_total)" "$before"
check_eq "nothing held after refused requests" "$(metric $P_PORT pdlink_held_blocks)" 0

# 2. the decode refuses after the prefill held the blocks: prompt + max_tokens > its max_model_len (512)
body=$(jq -cn --arg p "$PROMPT" '{prompt:$p, max_tokens:400}')
r=$(post $RPORT /v1/completions "$body")
check_eq "decode refuses the over-long request (400 passed through)" "${r%% *}" 400
check_contains "the decode's error is passed through" "$r" "maximum context length"
check_eq "the prefill served its leg" "$(metric $P_PORT pdlink_requests_total)" "$((before + 1))"
wait_until "prefill blocks freed after the decode's 400 (no 60 s reaper wait)" 20 held_zero
failed_releases() { [[ $(metric $P_PORT pdlink_releases_failed_total) == "$1" ]]; }
wait_until "both prefill ranks received a failed-status release (the router's)" 20 failed_releases 2

# 4 (first): a normal request works and leaves nothing held
body=$(jq -cn --arg p "$PROMPT" '{prompt:$p, max_tokens:8}')
r=$(post $RPORT /v1/completions "$body")
check_eq "a normal request succeeds" "${r%% *}" 200
wait_until "its blocks are freed by the decode" 20 held_zero

# 3. the decode is dead (still registered: TTL 600 s): connection refused on the decode leg
kill_node D
r=$(post $RPORT /v1/completions "$body")
check_eq "a dead decode is a 500" "${r%% *}" 500
wait_until "prefill blocks freed after the decode leg was refused" 20 held_zero
check_eq "by the router's failed-status releases" "$(metric $P_PORT pdlink_releases_failed_total)" 4

stop_router
finish
