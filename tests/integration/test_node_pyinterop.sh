#!/usr/bin/env bash
# test_node_pyinterop.sh -- the independent Python MoRIIO peer (tests/python/moriio_peer.py, pyzmq +
# msgpack, written from the reference notes) against running pdlink-node instances:
#   1. `interop`: it handshakes every rank of a pdlink-node producer (TP4) the way upstream does, then sends
#      one typed release and one legacy (plain transfer id) release to every rank; the node had held two
#      prefills under those transfer ids and must free both, counting 2 releases per rank.
#   2. `front`: it fronts a pdlink-node producer's rank 0 with the pdlink keys stripped from the handshake
#      (so the decode node sees an upstream-looking peer), decodes the releases a pdlink-node consumer
#      (TP2) sends as upstream's listener would, and forwards them; the decode output equals a single node.
set -euo pipefail
source "$(dirname "$0")/test_node_lib.bash"
PEER=$SRC/tests/python/moriio_peer.py
[[ -f $PEER ]] || { echo "SKIP: $PEER missing"; exit 77; }
/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null || { echo "SKIP: python3-zmq/msgpack missing"; exit 77; }

PROMPT="Weng earns 12 dollars an hour for babysitting. Yesterday, she just did 50 minutes of babysitting."
with_ports 20 kv_node P kv_config kv_producer --model tiny -tp 4 --num-gpu-blocks 64 || exit 1
pb=$P_KV
start_node S --model tiny || exit 1
want=$(completion_text $S_PORT "$PROMPT" 8)

# ---- 1. handshake + typed and legacy releases from the Python peer
for t in tx-py-typed tx-py-legacy; do
    pre=$(prefill_leg $P_PORT "$PROMPT" $t "rid-$t" 1)
    check_eq "prefill $t returns params" "$(jq -r .kv_transfer_params.transfer_id <<<"$pre")" $t
done
check "producer holds 2 transfers" [ "$(metric $P_PORT pdlink_held_transfers)" -eq 2 ]
rc=0
out=$(/usr/bin/python3 "$PEER" interop --hs-port $pb --notify-port $((pb + 10)) --tp 4 --typed tx-py-typed \
    --legacy tx-py-legacy 2>&1) || rc=$?
check_eq "python peer interop exits 0" "$rc" 0
echo "  peer: ${out:0:300}"
check_eq "python peer handshook 4 ranks" "$(jq -r '.ranks | length' <<<"$out" 2>/dev/null)" 4
check_eq "handshake engine_id" "$(jq -r '.ranks[0].engine_id' <<<"$out" 2>/dev/null)" "127.0.0.1:$pb"
for _ in $(seq 1 100); do [[ $(metric $P_PORT pdlink_held_transfers) == 0 ]] && break; sleep 0.05; done
check_eq "typed + legacy releases freed both transfers" "$(metric $P_PORT pdlink_held_transfers)" 0
check_eq "all blocks free again" "$(metric $P_PORT pdlink_free_blocks)" "$(metric $P_PORT pdlink_total_blocks)"
for r in 0 1 2 3; do
    check_eq "rank $r received 2 releases" "$(metric $P_PORT "pdlink_releases_received_total{rank=\"$r\"")" 2
done
check_eq "nothing dropped as malformed" "$(metric $P_PORT pdlink_dropped_malformed_total)" 0

# ---- 2. a pdlink-node consumer against an upstream-looking producer (the Python front)
with_ports 20 kv_node P1 kv_config kv_producer --model tiny -tp 1 --num-gpu-blocks 64 || exit 1
qb=$P1_KV
slow_config() { kv_config "$1" "$2" "$3" ',"handshake_timeout":5,"transfer_timeout":5'; }
with_ports 20 kv_node D slow_config kv_consumer --model tiny -tp 2 --num-gpu-blocks 64 || exit 1
/usr/bin/python3 "$PEER" front --producer-hs-port $qb --producer-notify-port $((qb + 10)) --strip-pdlink --expect 2 \
    --timeout 30 >"$TMP/front.out" 2>&1 &
FRONT=$!
CHILDREN+=($FRONT)
for _ in $(seq 1 200); do [[ -s $TMP/front.out ]] && break; sleep 0.05; done
fhs=$(head -1 "$TMP/front.out" | jq -r .handshake_port)
fnt=$(head -1 "$TMP/front.out" | jq -r .notify_port)
pre=$(prefill_leg $P1_PORT "$PROMPT" tx-front "rid-front" 2)
params=$(jq -c --argjson h "$fhs" --argjson n "$fnt" \
    '.kv_transfer_params | .remote_handshake_port = $h | .remote_notify_port = $n' <<<"$pre")
dec=$(decode_leg $D_PORT "$PROMPT" "$params" rid-front 8)
check_eq "decode through the upstream-looking front equals a single node" "$(jq -r '.choices[0].text' <<<"$dec")" "$want"
rc=0
wait $FRONT || rc=$?
check_eq "front received the 2 releases (one per consumer rank) and exits 0" "$rc" 0
echo "  front: $(tail -1 "$TMP/front.out")"
check_eq "releases decoded as upstream typed releases" "$(grep -c '"type": "release"' "$TMP/front.out")" 2
check_contains "release carries consumer_tp_size 2" "$(grep -m1 '"release"' "$TMP/front.out")" '"consumer_tp_size": 2'
for _ in $(seq 1 100); do [[ $(metric $P1_PORT pdlink_held_blocks) == 0 ]] && break; sleep 0.05; done
check_eq "forwarded releases freed the producer's blocks" "$(metric $P1_PORT pdlink_held_blocks)" 0
check_eq "decode mismatched 0 bytes" "$(metric $D_PORT pdlink_kv_bytes_mismatched_total)" 0
finish
