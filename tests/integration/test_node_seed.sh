#!/usr/bin/env bash
# test_node_seed.sh -- the seed's `vllm serve` commands translated line for line to pdlink-node (same
# flags, the same --kv-transfer-config JSON shape, ignored GPU flags), with probed ports instead of the
# seed's fixed ones. Checks the G2 discovery pings a router receives (a Python ZMQ ROUTER stands in for
# vllm-router's discovery socket), then a P/D request whose peer addresses come from the request id the
# way vllm-router builds it (`___prefill_addr_{zmq}___decode_addr_{zmq}_{32 hex}`).
set -euo pipefail
source "$(dirname "$0")/test_node_lib.bash"
/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null || { echo "SKIP: python3-zmq/msgpack missing"; exit 77; }

# The stand-in binds a free port itself (no probe-then-bind window) and reports it in a file.
/usr/bin/python3 - "$SRC/tests/tools" "$TMP/router.port" >"$TMP/pings" 2>"$TMP/pings.err" <<'PY' &
import json, os, sys, time, msgpack, zmq
sys.path.insert(0, sys.argv[1])
import free_ports
ctx = zmq.Context()
s = ctx.socket(zmq.ROUTER)
lo, hi = free_ports.safe_window(free_ports.ephemeral_range())
port = s.bind_to_random_port("tcp://127.0.0.1", min_port=lo, max_port=hi + 1, max_tries=1000)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write("%d\n" % port)
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
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
for _ in $(seq 1 400); do [[ -s $TMP/router.port ]] && break; sleep 0.05; done
ROUTER_PORT=$(cat "$TMP/router.port" 2>/dev/null)
[[ -n $ROUTER_PORT ]] || { echo "the stand-in router did not start:"; cat "$TMP/pings.err"; exit 1; }

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
# seed_node BASE NAME TP ROLE : HTTP port BASE (the seed names it in the config too, so it is not port 0),
# handshake ports from BASE+1, notify ports from BASE+11 (use with_ports 21). Sets ${NAME}_HTTP and
# ${NAME}_KV; returns 2 when a port was taken before the node bound it (with_ports retries).
seed_node() {
    local port=$1 name=$2 tp=$3 role=$4 hs=$(($1 + 1)) nt=$(($1 + 11))
    printf -v "${name}_HTTP" '%s' "$port"
    printf -v "${name}_KV" '%s' "$hs"
    local pf=$TMP/$name.port
    rm -f "$pf"
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
    node_started "$name" $! "$pf"
}
with_ports 21 seed_node P 4 kv_producer || exit 1
with_ports 21 seed_node D 8 kv_consumer || exit 1
PH=$P_HTTP DH=$D_HTTP pb=$P_KV
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
