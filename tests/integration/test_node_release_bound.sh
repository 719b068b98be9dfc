#!/usr/bin/env bash
# test_node_release_bound.sh -- the decode's HTTP API releases only what it pulled (docs/security.md).
#
# A prefill leg sent straight to a TP-1 prefill holds a victim's KV for the decode its request id names.
# Then a client sends that decode requests naming the victim's transfer id which the decode rejects
# before any pull: "max_tokens": -1, remote_block_ids of the wrong count, and of
# strings. Without that rule, the first two made the decode send failed releases from the consumer's own host,
# which the prefill accepted: its held blocks 2 -> 0, and the victim's decode leg failed (500). Now the
# decode sends nothing (pdlink_transfers_abandoned_total stays 0, counted synchronously when an abandon
# is queued), the blocks stay held, and the victim's own decode leg pulls them, verifies every byte and
# frees them. Polls use a deadline only as the failure bound.
set -euo pipefail
source "$(dirname "$0")/test_node_lib.bash"

with_ports 20 kv_node P kv_config kv_producer --model tiny -tp 1 --num-gpu-blocks 64 --block-size 16 || exit 1
with_ports 20 kv_node D kv_config kv_consumer --model tiny -tp 1 --num-gpu-blocks 64 --block-size 16 || exit 1

PZ="host:127.0.0.1,handshake:$P_KV,notify:$((P_KV + 10))"
DZ="host:127.0.0.1,handshake:$D_KV,notify:$((D_KV + 10))"
RID="___prefill_addr_${PZ}___decode_addr_${DZ}_0123456789abcdef0123456789abcdef"
PROMPT="the quick brown fox jumps over the lazy dog and then the quick brown fox jumps again"
TID="tx-victim-$RANDOM$RANDOM"

pre=$(prefill_leg $P_PORT "$PROMPT" "$TID" "$RID" 1)
params=$(jq -c .kv_transfer_params <<<"$pre")
held=$(metric $P_PORT pdlink_held_blocks)
check "the victim's prefill leg holds its blocks ($held)" [ "${held:-0}" -gt 0 ]

attack() { # attack DESCRIPTION JSON_BODY
    local r
    r=$(curl -s -w ' %{http_code}' -H "X-Request-Id: $RID" -H 'Content-Type: application/json' --data-binary "$2" \
        "http://127.0.0.1:$D_PORT/v1/completions")
    check_eq "decode rejects $1" "${r##* }" 400
}
attack "max_tokens -1 naming the victim's transfer" \
    "$(jq -cn --arg p "$PROMPT" --argjson k "$params" '{prompt:$p, max_tokens:-1, kv_transfer_params:$k}')"
attack "the victim's transfer with the wrong block count" \
    "$(jq -cn --arg p "$PROMPT" --argjson k "$params" '{prompt:$p, max_tokens:4, kv_transfer_params:($k + {remote_block_ids:[0,1,2,3,4,5]})}')"
attack "the victim's transfer with remote_block_ids of strings" \
    "$(jq -cn --arg p "$PROMPT" --argjson k "$params" '{prompt:$p, max_tokens:4, kv_transfer_params:($k + {remote_block_ids:["a"]})}')"

check_eq "the decode abandoned nothing it did not pull" "$(metric $D_PORT pdlink_transfers_abandoned_total)" 0
check_eq "the decode sent no release" "$(metric $D_PORT pdlink_releases_sent_total)" 0
check_eq "the victim's blocks are still held" "$(metric $P_PORT pdlink_held_blocks)" "$held"

r=$(decode_leg $D_PORT "$PROMPT" "$params" "$RID" 4)
check "the victim's decode leg succeeds" jq -e '.choices[0].text | length > 0' <<<"$r"
check_eq "its KV verified, no byte mismatched" "$(metric $D_PORT pdlink_kv_bytes_mismatched_total)" 0
held_zero() { [[ $(metric $P_PORT pdlink_held_blocks) == 0 ]]; }
wait_until "the victim's own release freed the blocks" 20 held_zero
check_eq "no release was refused or failed on the prefill" \
    "$(metric $P_PORT pdlink_releases_refused_total)/$(metric $P_PORT pdlink_releases_failed_total)" "0/0"
finish
