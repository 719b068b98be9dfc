#!/usr/bin/env bash
# test_node_write.sh -- pdlink-node in WRITE mode (read_mode false), driven with curl the way
# vllm-router's MoRIIO WRITE mode drives it (docs/vllm-router.md#write-dispatch): the prefill and decode legs are sent at
# the same time, the request id carries both addresses, the prefill leg carries the decode's TP in
# remote_tp_size and the decode leg the prefill's. Heterogeneous TP with split KV heads (tiny: 8 KV heads;
# P4 -> D8 and P8 -> D4) and MLA (P8 -> D2): the decode's output equals a single node's, every pushed
# byte verifies, the prefill frees every block; a decode leg whose prefill never comes fails (5xx) within
# transfer_timeout and frees its blocks.
set -euo pipefail
source "$(dirname "$0")/test_node_lib.bash"

PROMPT="Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"

wcfg() { # wcfg ROLE HS NOTIFY : WRITE-mode kv-transfer-config
    printf '{"kv_connector":"MoRIIOConnector","kv_role":"%s","kv_connector_extra_config":{"host_ip":"127.0.0.1","handshake_port":%d,"notify_port":%d,"read_mode":false,"backend":"rdma","handshake_timeout":2,"transfer_timeout":3,"defer_timeout":5}}' \
        "$1" "$2" "$3"
}
zaddr() { printf 'host:127.0.0.1,handshake:%d,notify:%d' "$1" "$2"; }

for spec in "P4 kv_producer tiny 256 4" "D8 kv_consumer tiny 256 8" "P8 kv_producer tiny 256 8" \
    "D4 kv_consumer tiny 256 4" "PM kv_producer tiny-mla 64 8" "DM kv_consumer tiny-mla 64 2"; do
    read -r name role model blocks tp <<<"$spec"
    with_ports 20 kv_node "$name" wcfg "$role" --model "$model" --num-gpu-blocks "$blocks" -tp "$tp" || exit 1
    kv=${name}_KV
    printf -v "${name}_Z" '%s' "$(zaddr ${!kv} $((${!kv} + 10)))"
done
start_node S --model tiny -tp 1 || exit 1
start_node SM --model tiny-mla -tp 1 || exit 1
want=$(completion_text $S_PORT "$PROMPT" 12)
want_mla=$(completion_text $SM_PORT "$PROMPT" 12)
echo "  single node: \"$want\""

# wpd NAME P_PORT P_TP P_ZMQ D_PORT D_TP D_ZMQ WANT : both legs at once, as the router sends them
wpd() {
    local name=$1 pp=$2 ptp=$3 pz=$4 dp=$5 dtp=$6 dz=$7 want=$8
    local rid="cmpl-___prefill_addr_${pz}___decode_addr_${dz}_$(printf '%08x%08x%08x%08x' $RANDOM$RANDOM $RANDOM $RANDOM $RANDOM)-0"
    local tid="tx-w-$name-$RANDOM$RANDOM"
    curl -s -H "X-Request-Id: $rid" -H 'Content-Type: application/json' --data-binary \
        "$(jq -cn --arg p "$PROMPT" --arg t "$tid" --argjson d "$dtp" \
            '{prompt:$p, max_tokens:1, stream:false, kv_transfer_params:{do_remote_decode:true, do_remote_prefill:false, remote_engine_id:null, remote_block_ids:null, transfer_id:$t, remote_tp_size:$d, remote_dp_size:1}}')" \
        "http://127.0.0.1:$pp/v1/completions" >"$TMP/$name.pre" &
    local ppid=$!
    local dec
    dec=$(curl -s -H "X-Request-Id: $rid" -H 'Content-Type: application/json' --data-binary \
        "$(jq -cn --arg p "$PROMPT" --arg t "$tid" --argjson q "$ptp" \
            '{prompt:$p, max_tokens:12, stream:false, kv_transfer_params:{do_remote_decode:false, do_remote_prefill:true, remote_engine_id:null, remote_block_ids:null, transfer_id:$t, remote_tp_size:$q, remote_dp_size:1}}')" \
        "http://127.0.0.1:$dp/v1/completions")
    wait $ppid
    local pre
    pre=$(cat "$TMP/$name.pre")
    check_eq "$name prefill finish_reason length" "$(jq -r '.choices[0].finish_reason' <<<"$pre")" length
    check_eq "$name prefill kv_transfer_params null (WRITE mode)" "$(jq -c '.kv_transfer_params' <<<"$pre")" null
    check_eq "$name decode output equals the single node's" "$(jq -r '.choices[0].text' <<<"$dec")" "$want"
    [[ "$(jq -r '.choices[0].text' <<<"$dec")" == "$want" ]] || echo "  decode said: $dec"
}
wpd "P4->D8" $P4_PORT 4 "$P4_Z" $D8_PORT 8 "$D8_Z" "$want"
wpd "P8->D4" $P8_PORT 8 "$P8_Z" $D4_PORT 4 "$D4_Z" "$want"
wpd "P8->D4-again" $P8_PORT 8 "$P8_Z" $D4_PORT 4 "$D4_Z" "$want"
wpd "P8->D2-MLA" $PM_PORT 8 "$PM_Z" $DM_PORT 2 "$DM_Z" "$want_mla"

# A decode leg whose prefill never comes: load error (5xx) after transfer_timeout; blocks come back.
rid="cmpl-___prefill_addr_${P4_Z}___decode_addr_${D8_Z}_0123456789abcdef0123456789abcdef-0"
code=$(curl -s -o "$TMP/orphan.json" -w '%{http_code}' -H "X-Request-Id: $rid" -H 'Content-Type: application/json' \
    --data-binary "$(jq -cn --arg p "$PROMPT" '{prompt:$p, max_tokens:4, kv_transfer_params:{do_remote_prefill:true, transfer_id:"tx-orphan", remote_tp_size:4}}')" \
    "http://127.0.0.1:$D8_PORT/v1/completions")
check_eq "decode without its prefill fails with 500" "$code" 500
check_contains "the error names write_done" "$(cat "$TMP/orphan.json")" "write_done"

# A WRITE-mode prefill leg without any consumer address: 400 naming the key.
code=$(curl -s -o "$TMP/noaddr.json" -w '%{http_code}' -H "X-Request-Id: plain-id" -H 'Content-Type: application/json' \
    --data-binary "$(jq -cn --arg p "$PROMPT" '{prompt:$p, max_tokens:1, kv_transfer_params:{do_remote_decode:true, transfer_id:"tx-noaddr", remote_tp_size:8}}')" \
    "http://127.0.0.1:$P4_PORT/v1/completions")
check_eq "prefill without a decode address is 400" "$code" 400
check_contains "the error names remote_host" "$(cat "$TMP/noaddr.json")" "remote_host"

for n in P4 P8 PM; do
    port=${n}_PORT
    for _ in $(seq 1 200); do
        [[ "$(metric ${!port} pdlink_held_blocks)" == 0 ]] && break
        sleep 0.05
    done
    check_eq "$n holds no blocks after its pushes" "$(metric ${!port} pdlink_held_blocks)" 0
    check_eq "$n no failed writes" "$(metric ${!port} pdlink_write_failures_total)" 0
done
check_eq "P4 pushed once per rank" "$(metric $P4_PORT pdlink_write_done_sent_total)" 8
check_eq "D8 counted one write_done per rank" "$(metric $D8_PORT pdlink_write_done_received_total)" 8
check_eq "D4 counted 2 write_done per rank per request" "$(metric $D4_PORT pdlink_write_done_received_total)" 16
for n in D8 D4 DM; do
    port=${n}_PORT
    check_eq "$n mismatched 0 bytes" "$(metric ${!port} pdlink_kv_bytes_mismatched_total)" 0
    check_eq "$n free blocks back to total" "$(metric ${!port} pdlink_free_blocks)" "$(metric ${!port} pdlink_total_blocks)"
done
check "D8 verified bytes > 0" [ "$(metric $D8_PORT pdlink_kv_bytes_verified_total)" -gt 0 ]

finish
