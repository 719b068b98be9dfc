#!/usr/bin/env bash
# test_router_release_write.sh -- WRITE mode (read_mode false): a request that fails on one leg pins no
# block on the other leg. A TP-2 prefill and a TP-1 decode behind pdlink-router; the router
# sends both legs at once. defer_timeout and transfer_timeout are 60 s, so anything freed within the
# 20 s failure bounds was freed by an abandon, not by a timeout.
#   1. a normal request succeeds and leaves nothing held.
#   2. the decode refuses (prompt + max_tokens over its max_model_len) while the prefill pushes: the
#      decode abandons (failed release to each prefill rank) and the router sends its own; the prefill's
#      push, waiting for remote_blocks that never come, is freed (pdlink_pushes_abandoned_total).
#      Before: held until the prefill's 60 s defer_timeout.
#   3. the prefill refuses (prompt over its max_model_len) while the decode waits for the push: the
#      prefill abandons (a failed write_done from each rank), so the decode's receive fails at once and
#      the client gets its answer. Before: the decode held its blocks for transfer_timeout + 7 s (67 s),
#      and the client waited as long.
#   4. the decode is dead (kill -9 after it registered): the router's failed releases free the push.
set -euo pipefail
source "$(dirname "$0")/test_node_lib.bash"

start_router || exit 1

wcfg() { # wcfg ROLE HS NOTIFY : WRITE mode, registered with the router, 60 s timeouts
    printf '{"kv_connector":"MoRIIOConnector","kv_role":"%s","kv_connector_extra_config":{"host_ip":"127.0.0.1","handshake_port":%d,"notify_port":%d,"read_mode":false,"backend":"rdma","proxy_ip":"127.0.0.1","proxy_ping_port":%d,"handshake_timeout":2,"transfer_timeout":60,"defer_timeout":60}}' \
        "$1" "$2" "$3" "$DISC"
}
with_ports 20 kv_node P wcfg kv_producer --model tiny -tp 2 --num-gpu-blocks 64 --block-size 16 \
    --max-model-len 128 || exit 1
with_ports 20 kv_node D wcfg kv_consumer --model tiny -tp 1 --num-gpu-blocks 64 --block-size 16 \
    --max-model-len 512 || exit 1

registered() { [[ $(curl -s "http://127.0.0.1:$RPORT/health" -o /dev/null -w '%{http_code}') == 200 ]]; }
p_held_zero() { [[ $(metric $P_PORT pdlink_held_blocks) == 0 ]]; }
d_all_free() { [[ $(metric $D_PORT pdlink_free_blocks) == 64 ]]; }
abandoned() { [[ $(metric $P_PORT pdlink_pushes_abandoned_total) -ge $1 ]]; }
wait_until "prefill and decode registered with the router" 20 registered || { finish; exit 1; }

SHORT="the quick brown fox jumps over the lazy dog" # ~10 tokens
LONG=$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 1 20)) # ~180 tokens

# 1. a normal request
r=$(post $RPORT /v1/completions "$(jq -cn --arg p "$SHORT" '{prompt:$p, max_tokens:8}')")
check_eq "a normal WRITE-mode request succeeds" "${r%% *}" 200
wait_until "the prefill's push is freed" 20 p_held_zero
wait_until "the decode's blocks are free" 20 d_all_free

# 2. the decode refuses: ~10 + 600 tokens > its 512
r=$(post $RPORT /v1/completions "$(jq -cn --arg p "$SHORT" '{prompt:$p, max_tokens:600}')")
check_eq "the decode's 400 is passed through" "${r%% *}" 400
wait_until "the prefill's push is freed after the decode's 400 (no 60 s defer_timeout)" 20 p_held_zero
wait_until "both prefill ranks acted on a failed release" 20 abandoned 2

# 3. the prefill refuses: ~180 prompt tokens > its 128, the decode (512) would take them
t0=$SECONDS
r=$(curl -s -m 45 -o "$TMP/r3" -w '%{http_code}' -H 'Content-Type: application/json' \
    --data-binary "$(jq -cn --arg p "$LONG" '{prompt:$p, max_tokens:8}')" "http://127.0.0.1:$RPORT/v1/completions")
check_eq "the prefill's 400 reaches the client (not a timeout)" "$r" 400
echo "  answered in $((SECONDS - t0)) s (transfer_timeout 60 s)"
check_eq "the decode counted a failed write_done from each prefill rank" \
    "$(metric $D_PORT pdlink_write_done_failed_total)" 2
wait_until "the decode's blocks are free" 20 d_all_free
check_eq "nothing held on the prefill" "$(metric $P_PORT pdlink_held_blocks)" 0

# 4. the decode is dead (still registered: TTL 600 s)
before=$(metric $P_PORT pdlink_pushes_abandoned_total)
kill_node D
r=$(post $RPORT /v1/completions "$(jq -cn --arg p "$SHORT" '{prompt:$p, max_tokens:8}')")
check_eq "a dead decode is a 500" "${r%% *}" 500
wait_until "the prefill's push is freed after the decode leg was refused (router's releases)" 20 p_held_zero
wait_until "both prefill ranks acted on the router's failed releases" 20 abandoned $((before + 2))

stop_router
finish
