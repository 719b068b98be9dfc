#!/usr/bin/env bash
# test_auth_cluster.sh -- authenticated mode end to end (docs/security.md): pdlink-router with
# --auth-key-file and --api-key, a prefill P (TP2) and a decode D (TP2) whose kv_connector_extra_config
# names the same auth_key_file and which run with --api-key, READ mode over the tcp engine, and a plain
# node S as the reference for every answer.
#   1. P and D register (their pings go over CURVE) and requests through the router answer 200 with the
#      reference's text; D verified KV bytes and saw none mismatched; nothing was refused.
#   2. The nodes' /v1 routes answer 401 without the bearer token and with a wrong one (counted in
#      pdlink_http_unauthorized_total); /health stays open.
#   3. A rogue decode registration from a plain ZeroMQ DEALER (no key), then from a CURVE client with a
#      key pair of its own: the router never lists it and counts the refusals
#      (vllm_router_discovery_total{kind="refused"}). Without --auth-key-file the same plain ping
#      registers (the rogue-registration attack of docs/security.md), which is checked first on a router of its own.
#   4. Startup errors: a world-readable key file stops the router and a node with the path named.
set -euo pipefail
source "$(dirname "$0")/test_node_lib.bash"
/usr/bin/python3 -c 'import zmq, msgpack' 2>/dev/null || { echo "SKIP: python3-zmq/python3-msgpack missing"; exit 77; }

KEY=$TMP/cluster.key
head -c 48 /dev/urandom | base64 >"$KEY"
chmod 600 "$KEY"
API=test-api-key-$RANDOM$RANDOM

# rogue_register PORT MODE : a fake decode pings the discovery port 3 times (MODE plain: no CURVE;
# MODE curve: CURVE with key pairs of its own, as one without the cluster secret must); exits when done.
rogue_register() {
    /usr/bin/python3 - "$1" "$2" <<'EOF'
import sys, time, zmq, msgpack
port, mode = int(sys.argv[1]), sys.argv[2]
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 500)
if mode == "curve":
    pub, sec = zmq.curve_keypair()
    spub, _ = zmq.curve_keypair()
    s.curve_publickey, s.curve_secretkey, s.curve_serverkey = pub, sec, spub
s.connect("tcp://127.0.0.1:%d" % port)
reg = {"type": "D", "http_address": "127.0.0.1:9", "zmq_address": "host:127.0.0.1,handshake:9,notify:9",
       "dp_size": 1, "tp_size": 1, "transfer_mode": "READ"}
for _ in range(3):
    # Never block: once the router refuses the handshake libzmq may drop the pipe, and a DEALER
    # without a pipe would wait for a peer forever.
    try:
        s.send(msgpack.packb(reg), zmq.NOBLOCK)
    except zmq.Again:
        pass
    time.sleep(0.2)
s.close()
ctx.term()
EOF
}

workers() { curl -s "http://127.0.0.1:$1/workers" -H "Authorization: Bearer $API" | jq -c "[(.prefill | length), (.decode | length)]"; }

# --- the attack without authenticated mode: a plain ping registers a fake decode -------------------
start_router || exit 1
OPEN_RPORT=$RPORT
rogue_register "$DISC" plain
wait_until "without --auth-key-file a rogue registration is listed (the attack)" 10 \
    bash -c "[[ \$(curl -s http://127.0.0.1:$OPEN_RPORT/workers | jq '.decode | length') == 1 ]]"

# --- the authenticated cluster -----------------------------------------------------------------------
RPF=$TMP/router-auth.ports
"$BUILD/pdlink-router" --host 127.0.0.1 --port 0 --vllm-pd-disaggregation --kv-connector moriio \
    --vllm-discovery-address 127.0.0.1:0 --policy round_robin --worker-ttl-ms 600000 --port-file "$RPF" \
    --auth-key-file "$KEY" --api-key "$API" >"$TMP/router-auth.log" 2>&1 &
CHILDREN+=($!)
for _ in $(seq 1 200); do [[ -s $RPF ]] && break; sleep 0.05; done
RPORT=$(sed -E 's/.*http=([0-9]+).*/\1/' "$RPF")
DISC=$(sed -E 's/.*discovery=([0-9]+).*/\1/' "$RPF")
[[ -n $RPORT && -n $DISC ]] || { echo "router did not start:"; cat "$TMP/router-auth.log"; exit 1; }

cfg() { # cfg ROLE HS NOTIFY
    printf '{"kv_connector":"MoRIIOConnector","kv_role":"%s","kv_connector_extra_config":{"host_ip":"127.0.0.1","handshake_port":%d,"notify_port":%d,"read_mode":true,"backend":"tcp","proxy_ip":"127.0.0.1","proxy_ping_port":%d,"handshake_timeout":2,"transfer_timeout":10,"auth_key_file":"%s"}}' \
        "$1" "$2" "$3" "$DISC" "$KEY"
}
with_ports 20 kv_node P cfg kv_producer --model tiny -tp 2 --num-gpu-blocks 128 --block-size 16 --api-key "$API" || exit 1
with_ports 20 kv_node D cfg kv_consumer --model tiny -tp 2 --num-gpu-blocks 128 --block-size 16 --max-model-len 512 \
    --api-key "$API" || exit 1
start_node S --model tiny -tp 1 || exit 1

wait_until "P and D registered over CURVE" 20 bash -c "[[ \$(curl -s http://127.0.0.1:$RPORT/workers | jq -c '[(.prefill | length), (.decode | length)]') == '[1,1]' ]]"

PROMPTS=("The quick brown fox jumps over the lazy dog" "Hello" "$(printf 'a longer prompt %.0s' $(seq 1 20))")
same=0
for i in 0 1 2 0 1 2; do
    want=$(completion_text "$S_PORT" "${PROMPTS[$i]}" 8)
    got=$(completion_text "$RPORT" "${PROMPTS[$i]}" 8 -H "Authorization: Bearer $API")
    [[ -n $got && $got == "$want" ]] && same=$((same + 1))
done
check_eq "6 requests through the router answer the reference's text" "$same" 6
check "D verified KV bytes" bash -c "(( \$(curl -s http://127.0.0.1:$D_PORT/metrics | awk '/^pdlink_kv_bytes_verified_total/ {s+=\$NF} END {print s+0}') > 0 ))"
check_eq "D saw no mismatched KV byte" "$(metric "$D_PORT" pdlink_kv_bytes_mismatched_total)" 0
check_eq "P refused nothing (auth)" "$(metric "$P_PORT" pdlink_auth_refused_total)" 0
check_eq "D refused nothing (auth)" "$(metric "$D_PORT" pdlink_auth_refused_total)" 0

# --- node HTTP: the bearer token -------------------------------------------------------------------
BODY='{"prompt":"Hello","max_tokens":2}'
check_contains "P /v1/completions without a token: 401" "$(post "$P_PORT" /v1/completions "$BODY")" "401 "
check_contains "P /v1/completions with a wrong token: 401" \
    "$(post "$P_PORT" /v1/completions "$BODY" -H "Authorization: Bearer wrong-$API")" "401 "
check_contains "P GET /v1/models without a token: 401" \
    "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_PORT/v1/models")" "401"
check_contains "P GET /v1/models with the token: 200" \
    "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $API" "http://127.0.0.1:$P_PORT/v1/models")" "200"
check_contains "P /health needs no token" "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P_PORT/health")" "200"
check_eq "P counted 3 unauthorized requests" "$(metric "$P_PORT" pdlink_http_unauthorized_total)" 3

# --- router HTTP: --api-key checks the router's own clients too, as vLLM's --api-key does ------------
check_contains "router /v1/completions without a token: 401" "$(post "$RPORT" /v1/completions "$BODY")" "401 "
check_contains "router /v1/completions with a wrong token: 401" \
    "$(post "$RPORT" /v1/completions "$BODY" -H "Authorization: Bearer wrong-$API")" "401 "
check_contains "router GET /v1/models without a token: 401" \
    "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$RPORT/v1/models")" "401"
check_contains "router /v1/completions with the token: 200" \
    "$(post "$RPORT" /v1/completions "$BODY" -H "Authorization: Bearer $API")" "200 "
check_contains "router /health needs no token" "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$RPORT/health")" "200"
check_eq "router counted 3 unauthorized requests" \
    "$(metric "$RPORT" 'vllm_router_pd_errors_total{error_type="unauthorized"}')" 3

# --- rogue registrations ---------------------------------------------------------------------------
rogue_register "$DISC" plain
rogue_register "$DISC" curve
wait_until "the router counted the rogue connections as refused" 10 \
    bash -c "(( \$(curl -s http://127.0.0.1:$RPORT/metrics | awk '/^vllm_router_discovery_total\\{kind=\"refused\"\\}/ {print \$NF}') >= 2 ))"
sleep 1 # more than the router needs to list a registration it accepted (the attack above took < 1 s)
check_eq "the router still lists only P and D" "$(workers "$RPORT")" "[1,1]"

# --- startup errors --------------------------------------------------------------------------------
cp "$KEY" "$TMP/open.key"
chmod 644 "$TMP/open.key"
rc=0
out=$("$BUILD/pdlink-router" --port 0 --vllm-pd-disaggregation --kv-connector moriio \
    --vllm-discovery-address 127.0.0.1:0 --auth-key-file "$TMP/open.key" 2>&1) || rc=$?
check "router with a world-readable key file exits non-zero" test "$rc" -ne 0
check_contains "router names the key file" "$out" "$TMP/open.key"
rc=0
out=$("$NODE_BIN" --port 0 --model tiny --kv-transfer-config \
    "{\"kv_connector\":\"MoRIIOConnector\",\"kv_role\":\"kv_producer\",\"kv_connector_extra_config\":{\"auth_key_file\":\"$TMP/nokey\"}}" 2>&1) || rc=$?
check "node with a missing key file exits non-zero" test "$rc" -ne 0
check_contains "node names the key file" "$out" "$TMP/nokey"

finish
