#!/usr/bin/env bash
# test_node_seed.sh -- the seed's `vllm serve` commands translated line for line to pdlink-node (same
# flags, the same --kv-transfer-config JSON shape, ignored GPU flags), with probed ports instead of the
# seed's fixed ones. Checks the G2 discovery pings a router receives (a Python ZMQ ROUTER stands in for
# vllm-router's discovery socket), then a P/D request whose peer addresses come from the request id the
# way vllm-router builds it (`___prefill_addr_{zmq}___decode_addr_{zmq}_{32 hex}`).
source "$(dirname "$0")/test_node_lib.bash"
/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null || { echo "SKIP: python3-zmq/msgpack missing"; exit 77; }

ROUTER_PORT=$(free_base 1)
/usr/bin/python3 - "$ROUTER_PORT" >"$TMP/pings" 2>"$TMP/pings.err" <<'PY' &
import json, sys, time, msgpack, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.ROUTER)
s.bind("tcp://127.0.0.1:%s" % sys.argv[1])
seen = {}
deadline = time.time() + 20
while time.time() < deadline and len(seen) < 2:
    if s.poll(200):
        frames = s.recv_multipart()
        msg = msgpack.unpackb(frames[-1], raw=False)
        seen.setdefault(msg.get("type"), msg)
for t in sorted(seen):
    print(json.dumps(seen[t], sort_keys=True))
sys.stdout.flush()
PY
CHILDREN+=($!)
PING_PID=$!

PH=$(free_base 1)
DH=$(free_base 1)
pb=$(free_base 20)
db=$(free_base 20)
seed_cfg() { # ROLE HTTP_PORT HANDSHAKE NOTIFY -- the seed's JSON, with its newlines and indentation
    cat <<JSON
{
    "kv_connector": "MoRIIOConnector",
    "kv_role": "$1",
    "kv_connector_extra_config": {
      "host_ip": "127.0.0.1",
      "proxy_ip": "127.0.0.1",
      "proxy_ping_port": $ROUTER_PORT,
      "http_port": $2,
      "handshake_port": $3,
      "notify_port": $4,
      "read_mode": true,
      "backend": "rdma",
      "qp_per_transfer": 4,
      "num_workers": 4
    }
  }
JSON
}
seed_node() { # NAME PORT TP ROLE HANDSHAKE NOTIFY
    local name=$1 port=$2 tp=$3 role=$4 hs=$5 nt=$6
    local pf=$TMP/$name.port
    "$NODE_BIN" serve MiniMaxAI/MiniMax-M3-MXFP8 --model tiny \
        --host 127.0.0.1 \
        --port "$port" \
        --trust-remote-code \
        --tensor-parallel-size "$tp" \
        --block-size 128 \
        --language-model-only \
        --kv-cache-dtype fp8 \
        --attention-backend TRITON_ATTN \
        --no-enable-prefix-caching \
        --gpu-memory-utilization 0.90 \
        --tool-call-parser minimax_m3 \
        --reasoning-parser minimax_m3 \
        --enable-auto-tool-choice \
        --num-gpu-blocks 64 --log-level info \
        --port-file "$pf" \
        --kv-transfer-config "$(seed_cfg "$role" "$port" "$hs" "$nt")" >"$TMP/$name.log" 2>&1 &
    CHILDREN+=($!)
    NODE_NAMES+=("$name")
    printf -v "${name}_PID" '%s' "$!"
    for _ in $(seq 1 400); do
        [[ -s $pf ]] && curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
        sleep 0.05
    done
    cat "$TMP/$name.log"
    return 1
}
seed_node P $PH 4 kv_producer $pb $((pb + 10)) || exit 1
seed_node D $DH 8 kv_consumer $db $((db + 10)) || exit 1
start_node S --model tiny --served-model-name MiniMaxAI/MiniMax-M3-MXFP8 --kv-cache-dtype fp8 --block-size 128 || exit 1

check_eq "served model name is the seed's" "$(curl -s http://127.0.0.1:$PH/v1/models | jq -r '.data[0].id')" \
    MiniMaxAI/MiniMax-M3-MXFP8

wait $PING_PID
P_REG=$(grep '"type": "P"' "$TMP/pings")
D_REG=$(grep '"type": "D"' "$TMP/pings")
echo "  P ping: $P_REG"
echo "  D ping: $D_REG"
check_eq "P ping http_address" "$(jq -r .http_address <<<"$P_REG")" "127.0.0.1:$PH"
check_eq "P ping zmq_address" "$(jq -r .zmq_address <<<"$P_REG")" "host:127.0.0.1,handshake:$pb,notify:$((pb + 10))"
check_eq "P ping tp_size" "$(jq -r .tp_size <<<"$P_REG")" 4
check_eq "P ping dp_size" "$(jq -r .dp_size <<<"$P_REG")" 1
check_eq "P ping transfer_mode" "$(jq -r .transfer_mode <<<"$P_REG")" READ
check_eq "D ping http_address" "$(jq -r .http_address <<<"$D_REG")" "127.0.0.1:$DH"
check_eq "D ping tp_size" "$(jq -r .tp_size <<<"$D_REG")" 8
check_eq "D ping transfer_mode" "$(jq -r .transfer_mode <<<"$D_REG")" READ

# The router's request id: both peers' zmq addresses and a 32-hex uuid.
PZ=$(jq -r .zmq_address <<<"$P_REG")
DZ=$(jq -r .zmq_address <<<"$D_REG")
RID="___prefill_addr_${PZ}___decode_addr_${DZ}_0123456789abcdef0123456789abcdef"
PROMPT="Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends every day with four."
want=$(curl -s -d "$(jq -cn --arg p "$PROMPT" '{model:"MiniMaxAI/MiniMax-M3-MXFP8", prompt:$p, max_tokens:10}')" \
    http://127.0.0.1:$S_PORT/v1/completions | jq -r '.choices[0].text')
pre=$(prefill_leg $PH "$PROMPT" "tx-$RANDOM" "$RID" 8)
check_eq "prefill id is cmpl-<router request id>" "$(jq -r .id <<<"$pre")" "cmpl-$RID"
# Drop the explicit address so the decode must take the prefill address from the request id (upstream S3).
params=$(jq -c '.kv_transfer_params | del(.remote_host, .remote_handshake_port, .remote_notify_port)' <<<"$pre")
dec=$(decode_leg $DH "$PROMPT" "$params" "$RID" 10)
check_eq "P4/D8 fp8 block 128 with the peer from the request id equals a single node" \
    "$(jq -r '.choices[0].text' <<<"$dec")" "$want"
echo "  output: \"$want\""
check_eq "decode verified, 0 mismatched" "$(metric $DH pdlink_kv_bytes_mismatched_total)" 0
for _ in $(seq 1 100); do [[ $(metric $PH pdlink_held_blocks) == 0 ]] && break; sleep 0.05; done
check_eq "prefill held blocks back to 0" "$(metric $PH pdlink_held_blocks)" 0
check "ignored vLLM flags did not stop the node" grep -q "ready: model MiniMaxAI/MiniMax-M3-MXFP8" "$TMP/P.log"
finish
