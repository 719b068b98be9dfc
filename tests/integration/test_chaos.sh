#!/usr/bin/env bash
# test_chaos.sh -- one failure stays one failure, end to end through pdlink-router: a decode
# node is killed with kill -9 while requests run, bad requests are sent meanwhile, the decode is
# restarted on the same ports, and the run reports what clients saw.
#
# Cluster: router, prefill P (TP2), decodes D1 (TP2, the victim) and D2 (TP1), READ mode (tcp engine),
# or WRITE mode with CHAOS_MODE=write; a plain node S as the reference for every answer. Phases:
#   A. 12 requests: all 200, every answer equals the reference's.
#   outage. A background client keeps sending; once it has 3 answers D1 is killed (kill -9) -- possibly in
#      the middle of a pull; bad requests go to the router and to the nodes (each must get its 4xx); D1
#      restarts on the same HTTP and KV ports; the background client stops after 4 more answers.
#      Every failure the client saw must name D1 as the failed leg (X-Pdlink-Failed-Leg): requests on
#      P and D2 kept succeeding.
#   B. 12 requests: all 200 and equal to the reference, D1's first ones after its restart included.
#   end. Nothing held on P within 5 s (the consumer-gone watch and the releases; defer_timeout is 60 s),
#      no mismatched KV byte on either decode, and verified bytes on both.
# The report line "chaos:" sums it up. Deadlines only bound failures; no pass depends on timing.
set -euo pipefail
source "$(dirname "$0")/test_node_lib.bash"
MODE=${CHAOS_MODE:-read}
[[ $MODE == read ]] && RM=true || RM=false

start_router || exit 1

cfg() { # cfg ROLE HS NOTIFY
    printf '{"kv_connector":"MoRIIOConnector","kv_role":"%s","kv_connector_extra_config":{"host_ip":"127.0.0.1","handshake_port":%d,"notify_port":%d,"read_mode":%s,"backend":"tcp","proxy_ip":"127.0.0.1","proxy_ping_port":%d,"handshake_timeout":2,"transfer_timeout":10,"defer_timeout":60,"consumer_gone_timeout":2}}' \
        "$1" "$2" "$3" "$RM" "$DISC"
}
with_ports 20 kv_node P cfg kv_producer --model tiny -tp 2 --num-gpu-blocks 128 --block-size 16 || exit 1
with_ports 20 kv_node D1 cfg kv_consumer --model tiny -tp 2 --num-gpu-blocks 128 --block-size 16 --max-model-len 512 || exit 1
with_ports 20 kv_node D2 cfg kv_consumer --model tiny -tp 1 --num-gpu-blocks 128 --block-size 16 --max-model-len 512 || exit 1
start_node S --model tiny -tp 1 || exit 1

# all_registered : the router lists P and both decodes (until then round robin has one decode only)
all_registered() {
    [[ $(curl -s "http://127.0.0.1:$RPORT/workers" | jq '(.prefill | length) + (.decode | length)' 2>/dev/null) == 3 ]]
}
for _ in $(seq 1 400); do all_registered && break; sleep 0.05; done
check "router lists the prefill and both decodes" all_registered

PROMPTS=("The quick brown fox jumps over the lazy dog"
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
    "$(printf 'a long prompt with many words in it %.0s' $(seq 1 12))"
    "Hello")
REF=()
for p in "${PROMPTS[@]}"; do REF+=("$(completion_text $S_PORT "$p" 8)"); done

# one_request I OUT : request I through the router; appends "status|failed_leg|same-as-reference" to OUT.
one_request() {
    local i=$1 out=$2 k=$(($1 % 4)) body hdr code leg same
    body=$(mktemp "$TMP/b.XXXXXX")
    hdr=$(mktemp "$TMP/h.XXXXXX")
    code=$(curl -s -m 60 -o "$body" -D "$hdr" -w '%{http_code}' -H 'Content-Type: application/json' \
        --data-binary "$(jq -cn --arg p "${PROMPTS[$k]}" '{prompt:$p, max_tokens:8}')" \
        "http://127.0.0.1:$RPORT/v1/completions" || true)
    leg=$({ grep -i '^X-Pdlink-Failed-Leg:' "$hdr" || true; } | cut -d' ' -f2- | tr -d '\r')
    same=no
    [[ $code == 200 && "$(jq -r '.choices[0].text' <"$body" 2>/dev/null)" == "${REF[$k]}" ]] && same=yes
    echo "$code|$leg|$same" >>"$out"
    rm -f "$body" "$hdr"
}

phase() { # phase NAME N : N requests, two at a time; every one must be 200 and equal the reference
    local name=$1 n=$2 out=$TMP/phase-$1
    : >"$out"
    for ((i = 0; i < n; i += 2)); do
        one_request "$i" "$out" &
        local pid=$! # never a bare `wait`: the nodes and the router are children too
        one_request "$((i + 1))" "$out"
        wait "$pid"
    done
    local good
    good=$(grep -c '^200||yes$' "$out" || true)
    check_eq "phase $name: $n requests answered 200 with the reference's text" "$good" "$n"
    [[ $good == "$n" ]] || sort "$out" | uniq -c
    PHASE_OK[$name]=$good
}
declare -A PHASE_OK

phase A 12

# outage: a background client; kill -9 D1 once it has 3 answers
OUT=$TMP/outage
: >"$OUT"
(i=0; while [[ ! -e $TMP/stop ]]; do one_request "$i" "$OUT"; i=$((i + 1)); done) &
BG=$!
lines() { wc -l <"$OUT"; }
for _ in $(seq 1 1200); do (($(lines) >= 3)) && break; sleep 0.05; done
t_kill=$(date +%s.%N)
kill_node D1
echo "  D1 killed (kill -9) after $(lines) background answers"

# bad requests meanwhile: each gets its 4xx, none costs a held block for long
r=$(post $RPORT /v1/completions '{"prompt":"P","max_tokens":-1}')
check_eq "router refuses max_tokens -1" "${r%% *}" 400
r=$(post $RPORT /v1/completions '{"prompt": "unterminated')
check_eq "router refuses malformed JSON" "${r%% *}" 400
r=$(post $RPORT /v1/completions "$(jq -cn --arg p "${PROMPTS[0]}" '{prompt:$p, max_tokens:600}')")
[[ ${r%% *} == 400 || ${r%% *} == 500 ]] && ok "over-long request refused (${r%% *})" || bad "over-long request: ${r:0:200}"
r=$(post $D2_PORT /v1/completions '{"prompt":"P","max_tokens":4,"kv_transfer_params":{"do_remote_prefill":true,"transfer_id":"tx-bogus","remote_block_ids":[1,2],"remote_engine_id":"x","remote_host":"127.0.0.1","remote_handshake_port":1,"remote_notify_port":1}}')
[[ ${r%% *} =~ ^[45] ]] && ok "decode answers a transfer from nowhere with an error (${r%% *})" || bad "bogus transfer: ${r:0:200}"
r=$(post $P_PORT /v1/completions '{"prompt":"P","max_tokens":4,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":true}}')
check_eq "prefill refuses contradictory kv_transfer_params" "${r%% *}" 400

# restart D1 on the same HTTP and KV ports
before_restart=$(lines)
kv_node "$D1_KV" D1 cfg kv_consumer --model tiny -tp 2 --num-gpu-blocks 128 --block-size 16 --max-model-len 512 \
    --port "$D1_PORT" || { bad "D1 restarts on its ports"; finish; exit 1; }
t_up=$(date +%s.%N)
ok "D1 restarted on its ports (HTTP $D1_PORT, KV $D1_KV)"
for _ in $(seq 1 1200); do (($(lines) >= before_restart + 4)) && break; sleep 0.05; done
touch "$TMP/stop"
wait "$BG"
total=$(lines)
okc=$(grep -c '^200||yes$' "$OUT" || true)
errs=$((total - okc))
# every failure names D1's decode leg (the only node down)
others=$({ grep -v '^200||yes$' "$OUT" || true; } | grep -vc "decode 127.0.0.1:$D1_PORT" || true)
check_eq "every failure the client saw during the outage was D1's decode leg" "$others" 0
[[ $others == 0 ]] || grep -v '^200||yes$' "$OUT" | sort | uniq -c

phase B 12
# the first success after the restart: any 200 in phase B (D1 takes every other request)
recover=$(awk -v a="$t_kill" -v b="$t_up" 'BEGIN { printf "%.1f", b - a }')

# end: nothing held on P within 5 s; every KV byte verified on both decodes
held_zero() { [[ $(metric $P_PORT pdlink_held_blocks) == 0 ]]; }
held_ok=no
for _ in $(seq 1 50); do held_zero && { held_ok=yes; break; }; sleep 0.1; done
check_eq "prefill holds no block within 5 s after the run (defer_timeout 60 s)" "$held_ok" yes
mis=$(($(metric $D1_PORT pdlink_kv_bytes_mismatched_total) + $(metric $D2_PORT pdlink_kv_bytes_mismatched_total)))
v1=$(metric $D1_PORT pdlink_kv_bytes_verified_total)
v2=$(metric $D2_PORT pdlink_kv_bytes_verified_total)
check_eq "no mismatched KV byte on either decode" "$mis" 0
check "the restarted D1 verified KV bytes" test "$v1" -gt 0
check "D2 verified KV bytes" test "$v2" -gt 0
gone=$(metric $P_PORT pdlink_consumer_gone_freed_total)
relf=$(metric $P_PORT pdlink_releases_failed_total)
aband=$(metric $P_PORT pdlink_pushes_abandoned_total)
echo "chaos ($MODE): phase A ${PHASE_OK[A]}/12 ok; outage $okc/$total ok ($errs errors seen by clients, all on" \
    "the killed decode's leg); D1 restarted ${recover} s after the kill (the bad requests in between); phase B ${PHASE_OK[B]}/12 ok; held on P after" \
    "recovery: $(metric $P_PORT pdlink_held_blocks) blocks; mismatched $mis bytes; verified D1 $v1 + D2 $v2 bytes;" \
    "P: consumer_gone_freed $gone, failed releases $relf, pushes abandoned $aband"

stop_router
finish
