#!/usr/bin/env bash
# test_node_pd.sh -- pdlink-node in P/D: a prefill node and a decode node driven directly with curl the
# way vllm-router's MoRIIO READ mode drives them (prefill leg with max_tokens 1 and do_remote_decode, then
# the decode leg with the prefill's kv_transfer_params verbatim). Heterogeneous TP with split KV heads
# (tiny: 8 KV heads; P4 -> D8 and P8 -> D4) and MLA: the decode's output equals a single node's, every
# received byte verifies, the producer frees every held block, and bad params are 4xx / failed pulls 5xx.
set -euo pipefail
source "$(dirname "$0")/test_node_lib.bash"

PROMPT="Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"
fast_config() { kv_config "$1" "$2" "$3" ',"handshake_timeout":2,"transfer_timeout":3'; }

with_ports 20 kv_node P4 kv_config kv_producer --model tiny --num-gpu-blocks 256 -tp 4 || exit 1
with_ports 20 kv_node D8 fast_config kv_consumer --model tiny --num-gpu-blocks 256 -tp 8 || exit 1
with_ports 20 kv_node P8 kv_config kv_producer --model tiny --num-gpu-blocks 256 -tp 8 || exit 1
with_ports 20 kv_node D4 fast_config kv_consumer --model tiny --num-gpu-blocks 256 -tp 4 || exit 1
start_node S --model tiny -tp 1 || exit 1
want=$(completion_text $S_PORT "$PROMPT" 12)
echo "  single node: \"$want\""

# pd NAME P_PORT D_PORT D_TP : one request through P then D; checks parity
pd() {
    local name=$1 pp=$2 dp=$3 dtp=$4 rid="$1-$RANDOM$RANDOM" tid="tx-$1-$RANDOM"
    local pre
    pre=$(prefill_leg $pp "$PROMPT" $tid $rid $dtp)
    check_eq "$name prefill finish_reason length" "$(jq -r '.choices[0].finish_reason' <<<"$pre")" length
    check_eq "$name prefill returns 1 token" "$(jq -r '.usage.completion_tokens' <<<"$pre")" 1
    check_eq "$name prefill params do_remote_prefill" "$(jq -r '.kv_transfer_params.do_remote_prefill' <<<"$pre")" true
    check_eq "$name prefill params echo transfer_id" "$(jq -r '.kv_transfer_params.transfer_id' <<<"$pre")" "$tid"
    check_eq "$name prefill token is the single node's first" "$(jq -r '.choices[0].text' <<<"$pre")" \
        " $(cut -d' ' -f2 <<<"$want")"
    local params
    params=$(jq -c '.kv_transfer_params' <<<"$pre")
    local dec
    dec=$(decode_leg $dp "$PROMPT" "$params" $rid 12)
    check_eq "$name decode output equals the single node's" "$(jq -r '.choices[0].text' <<<"$dec")" "$want"
    check_eq "$name decode kv_transfer_params null" "$(jq -c '.kv_transfer_params' <<<"$dec")" null
}
pd "P4->D8" $P4_PORT $D8_PORT 8
pd "P8->D4" $P8_PORT $D4_PORT 4

# MLA (one latent head, replicated: whole blocks from one producer rank) and token-major (NHD) layouts
# where a head slice is one run per token.
with_ports 20 kv_node PM kv_config kv_producer --model tiny-mla -tp 8 --num-gpu-blocks 64 || exit 1
with_ports 20 kv_node DM fast_config kv_consumer --model tiny-mla -tp 2 --num-gpu-blocks 64 || exit 1
start_node SM --model tiny-mla -tp 1 || exit 1
with_ports 20 kv_node PN kv_config kv_producer --model tiny -tp 2 --kv-layout nhd --block-size 8 --num-gpu-blocks 64 || exit 1
with_ports 20 kv_node DN fast_config kv_consumer --model tiny -tp 8 --kv-layout nhd --block-size 8 --num-gpu-blocks 64 \
    || exit 1
for pair in "PM DM SM 2" "PN DN S 8"; do
    read -r pn dn sn dtp <<<"$pair"
    pp=${pn}_PORT dp=${dn}_PORT sp=${sn}_PORT
    rid="$pn-$RANDOM"
    pre=$(prefill_leg ${!pp} "$PROMPT" tx-$pn-$RANDOM $rid $dtp)
    dec=$(decode_leg ${!dp} "$PROMPT" "$(jq -c .kv_transfer_params <<<"$pre")" $rid 12)
    check_eq "$pn->$dn decode output equals the single node's" "$(jq -r '.choices[0].text' <<<"$dec")" \
        "$(completion_text ${!sp} "$PROMPT" 12)"
    check_eq "$dn mismatched 0 bytes" "$(metric ${!dp} pdlink_kv_bytes_mismatched_total)" 0
done

# Streaming decode leg.
rid="stream-$RANDOM"
pre=$(prefill_leg $P4_PORT "$PROMPT" tx-stream-$RANDOM $rid 8)
decode_leg $D8_PORT "$PROMPT" "$(jq -c .kv_transfer_params <<<"$pre")" $rid 12 true >"$TMP/sse"
check_eq "streamed decode: 12 chunks + [DONE]" "$(grep -c '^data: ' "$TMP/sse")" 13
check_eq "streamed decode text equals the single node's" \
    "$(grep '^data: {' "$TMP/sse" | sed 's/^data: //' | jq -j '.choices[0].text')" "$want"

# Several concurrent P/D requests with different prompts.
conc=()
for i in $(seq 1 6); do
    (
        p="$PROMPT variant $i"
        r="conc-$i-$RANDOM"
        pre=$(prefill_leg $P4_PORT "$p" tx-conc-$i-$RANDOM $r 8)
        decode_leg $D8_PORT "$p" "$(jq -c .kv_transfer_params <<<"$pre")" $r 6 | jq -r '.choices[0].text' >"$TMP/conc.$i"
    ) &
    conc+=($!)
done
wait "${conc[@]}"
for i in $(seq 1 6); do
    check_eq "concurrent P/D request $i equals the single node's" "$(cat "$TMP/conc.$i")" \
        "$(completion_text $S_PORT "$PROMPT variant $i" 6)"
done

# ---- bad params: 4xx naming the field, nothing held or leaked
expect_code() { # expect_code DESCRIPTION PORT WANT_CODE NEEDLE BODY [curl args]
    local what=$1 port=$2 want=$3 needle=$4 body=$5
    shift 5
    local r
    r=$(post $port /v1/completions "$body" "$@")
    local msg
    msg=$(jq -r '.error.message' <<<"${r#* }" 2>/dev/null)
    if [[ ${r%% *} == "$want" && $msg == *"$needle"* ]]; then ok "$what → $want: $msg"; else bad "$what: got $r"; fi
}
expect_code "producer leg without transfer_id" $P4_PORT 400 "transfer_id" \
    '{"prompt":"x","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}'
expect_code "decode leg on the producer" $P4_PORT 400 "do_remote_prefill" \
    '{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"transfer_id":"t"}}'
expect_code "prefill leg on the consumer" $D8_PORT 400 "do_remote_decode" \
    '{"prompt":"x","kv_transfer_params":{"do_remote_decode":true,"transfer_id":"t"}}'
expect_code "decode leg without transfer_id" $D8_PORT 400 "transfer_id" \
    '{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[0],"remote_engine_id":"e"}}'
expect_code "decode leg without remote_block_ids" $D8_PORT 400 "remote_block_ids" \
    '{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"transfer_id":"t","remote_engine_id":"e"}}'
expect_code "decode leg with remote_block_ids of strings" $D8_PORT 400 "remote_block_ids" \
    '{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"transfer_id":"t","remote_block_ids":["a"]}}'
expect_code "decode leg without remote_engine_id" $D8_PORT 400 "remote_engine_id" \
    '{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"transfer_id":"t","remote_block_ids":[0]}}'
expect_code "decode leg without a peer address" $D8_PORT 400 "remote_host" \
    '{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"transfer_id":"t","remote_block_ids":[0],"remote_engine_id":"e"}}'
expect_code "decode leg with the wrong block count" $D8_PORT 400 "remote_block_ids" \
    '{"prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"transfer_id":"t","remote_block_ids":[0,1,2],"remote_engine_id":"e","remote_host":"127.0.0.1","remote_handshake_port":1,"remote_notify_port":1,"tp_size":4}}'

# A decode leg whose producer is gone: the pull fails (500 naming the transfer), blocks are freed.
dead=$(free_ports 10)
expect_code "decode leg with a dead producer" $D8_PORT 500 "tx-dead" \
    "{\"prompt\":\"x\",\"kv_transfer_params\":{\"do_remote_prefill\":true,\"transfer_id\":\"tx-dead\",\"remote_block_ids\":[0],\"remote_engine_id\":\"127.0.0.1:$dead\",\"remote_host\":\"127.0.0.1\",\"remote_handshake_port\":$dead,\"remote_notify_port\":$((dead + 5)),\"tp_size\":4}}"
check_eq "decode blocks all free after the failed pull" "$(metric $D8_PORT pdlink_free_blocks)" \
    "$(metric $D8_PORT pdlink_total_blocks)"

# A producer with another seed: every received byte is wrong, the decode says so and fails.
with_ports 20 kv_node PX kv_config kv_producer --model tiny --num-gpu-blocks 256 -tp 4 --seed 99 || exit 1
rid="seed-$RANDOM"
pre=$(prefill_leg $PX_PORT "$PROMPT" tx-seed-$RANDOM $rid 8)
r=$(curl -s -w ' %{http_code}' -H "X-Request-Id: $rid" --data-binary \
    "$(jq -cn --arg p "$PROMPT" --argjson k "$(jq -c .kv_transfer_params <<<"$pre")" '{prompt:$p, max_tokens:4, kv_transfer_params:$k}')" \
    http://127.0.0.1:$D8_PORT/v1/completions)
check_eq "decode of wrong KV is a 500" "${r##* }" 500
check_contains "decode of wrong KV names layer/head/token" "$(jq -r .error.message <<<"${r% *}")" "KV verification failed"
echo "  $(jq -r .error.message <<<"${r% *}")"
check "mismatched bytes counted" [ "$(metric $D8_PORT pdlink_kv_bytes_mismatched_total)" -gt 0 ]

# ---- after the releases: nothing held on any producer, bytes verified on the decodes
for n in P4 P8 PX PM PN; do
    port_var=${n}_PORT
    for _ in $(seq 1 100); do
        [[ $(metric ${!port_var} pdlink_held_blocks) == 0 ]] && break
        sleep 0.05
    done
    check_eq "$n holds 0 blocks after the releases" "$(metric ${!port_var} pdlink_held_blocks)" 0
    check_eq "$n free blocks back to total" "$(metric ${!port_var} pdlink_free_blocks)" \
        "$(metric ${!port_var} pdlink_total_blocks)"
    check_eq "$n expired nothing" "$(metric ${!port_var} pdlink_expired_total)" 0
done
# P4 served 8 transfers (2 + 6 concurrent); each of its ranks expects D/P = 2 releases per transfer.
check_eq "P4 received 2 releases per rank per transfer (P4/D8 fan-in)" \
    "$(metric $P4_PORT 'pdlink_releases_received_total{rank="0"')" 16
check_eq "P8 received 1 release per rank per transfer (P8/D4)" \
    "$(metric $P8_PORT 'pdlink_releases_received_total{rank="7"')" 1
for n in D8 D4; do
    port_var=${n}_PORT
    check "$n verified received bytes" [ "$(metric ${!port_var} pdlink_kv_bytes_verified_total)" -gt 0 ]
    check "$n pulls observed in the histogram" [ "$(metric ${!port_var} 'pdlink_transfer_seconds_count')" -gt 0 ]
done
check_eq "D4 mismatched 0 bytes" "$(metric $D4_PORT pdlink_kv_bytes_mismatched_total)" 0
check_eq "D4 free blocks back to total" "$(metric $D4_PORT pdlink_free_blocks)" "$(metric $D4_PORT pdlink_total_blocks)"
echo "  D8 metrics: $(curl -s http://127.0.0.1:$D8_PORT/metrics | grep -E '^pdlink_(kv_bytes_verified|kv_bytes_mismatched|requests)' | tr '\n' ' ')"

finish
