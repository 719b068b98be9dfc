# test_node_lib.bash -- helpers shared by the pdlink-node shell tests (sourced, not a test itself).
#
# Nodes start with --port 0 --port-file, so no fixed TCP port is ever used; every child is recorded and
# killed on exit. Checks count passes and failures; `finish` prints the tally and sets the exit status.
# Source it after `set -euo pipefail`: the helpers that must not stop a test (cleanup, stop_node, the
# probes of a node that may be gone) say so with `|| true` or capture the status they report.

BUILD=${PDLINK_BUILD_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build}
SRC=${PDLINK_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
NODE_BIN=$BUILD/pdlink-node
if [[ ! -x $NODE_BIN ]]; then
    echo "SKIP: $NODE_BIN not built"
    exit 77
fi
for tool in curl jq; do
    command -v $tool >/dev/null || { echo "SKIP: $tool missing"; exit 77; }
done

TMP=$(mktemp -d /tmp/pdlink-node-test.XXXXXX)

CHILDREN=()
source "$(dirname "${BASH_SOURCE[0]}")/test_tally_lib.bash"

cleanup() {
    for pid in "${CHILDREN[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${CHILDREN[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$TMP"
}
trap cleanup EXIT

check() { # check DESCRIPTION COMMAND...
    local what=$1
    shift
    if "$@"; then ok "$what"; else bad "$what"; fi
}
check_eq() { # check_eq DESCRIPTION GOT WANT
    if [[ "$2" == "$3" ]]; then ok "$1"; else bad "$1: got '$2', want '$3'"; fi
}
check_contains() { # check_contains DESCRIPTION HAYSTACK NEEDLE
    if [[ "$2" == *"$3"* ]]; then ok "$1"; else bad "$1: '$3' not in '${2:0:300}'"; fi
}

# port_taken LOG : true if a node log says it could not bind a port (connector: "bind failed: Address
# already in use"; HTTP: "cannot listen on HOST:PORT (port in use?)").
port_taken() {
    grep -qE 'Address already in use|cannot listen on .*port in use' "$1"
}

# start_node NAME ARGS... : starts pdlink-node, waits for /health, sets ${NAME}_PORT and ${NAME}_PID.
# Returns 2 when the node exited because a port was in use, 1 on any other failure.
start_node() {
    local name=$1
    shift
    local pf=$TMP/$name.port
    rm -f "$pf"
    "$NODE_BIN" --host 127.0.0.1 --port 0 --port-file "$pf" "$@" >"$TMP/$name.log" 2>&1 &
    node_started "$name" $! "$pf"
}

# node_started NAME PID PORT_FILE : a pdlink-node just started in the background with --port-file
# PORT_FILE and its log in $TMP/NAME.log is recorded (killed on exit, stopped by finish); waits until it
# wrote PORT_FILE and answers /health, then sets ${NAME}_PORT and ${NAME}_PID. Returns 2 when the node
# exited because a port was in use, 1 on any other failure.
node_started() {
    local name=$1 pid=$2 pf=$3
    CHILDREN+=("$pid")
    NODE_NAMES+=("$name")
    printf -v "${name}_PID" '%s' "$pid"
    for _ in $(seq 1 400); do
        if [[ -s $pf ]]; then
            local port
            port=$(cat "$pf")
            if curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
                printf -v "${name}_PORT" '%s' "$port"
                return 0
            fi
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "node $name exited early:"
            cat "$TMP/$name.log"
            # A port taken between the probe and the bind: with_ports retries on a new range.
            port_taken "$TMP/$name.log" && return 2
            return 1
        fi
        sleep 0.05
    done
    echo "node $name not ready after 20 s:"
    cat "$TMP/$name.log"
    return 1
}

# stop_node NAME : SIGTERM and wait; sets STOP_RC.
stop_node() {
    local pidvar=${1}_PID
    local pid=${!pidvar}
    kill -TERM "$pid" 2>/dev/null || true
    STOP_RC=0
    wait "$pid" || STOP_RC=$?
}

# kill_node NAME : kill -9 and reap (it dies of the signal, which is not a failure here).
kill_node() {
    local pidvar=${1}_PID
    kill -9 "${!pidvar}" 2>/dev/null || true
    wait "${!pidvar}" 2>/dev/null || true
}

# post PORT PATH JSON [extra curl args] : prints "STATUS BODY" (body on one line)
post() {
    local port=$1 path=$2 body=$3
    shift 3
    curl -s -o "$TMP/body" -w '%{http_code}' -H 'Content-Type: application/json' "$@" \
        --data-binary "$body" "http://127.0.0.1:$port$path" >"$TMP/code" || true
    echo "$(cat "$TMP/code") $(tr -d '\n' <"$TMP/body")"
}

completion_text() { # completion_text PORT PROMPT MAX_TOKENS [CURL_ARGS...]
    local port=$1 prompt=$2 max=$3
    shift 3
    { curl -s -H 'Content-Type: application/json' "$@" \
        --data-binary "$(jq -cn --arg p "$prompt" --argjson m "$max" '{prompt:$p, max_tokens:$m}')" \
        "http://127.0.0.1:$port/v1/completions" || true; } | jq -r '.choices[0].text'
}

metric() { # metric PORT NAME_WITH_LABELS_PREFIX : sum of matching series
    { curl -s "http://127.0.0.1:$1/metrics" || true; } | awk -v n="$2" 'index($0, n) == 1 { s += $NF } END { printf "%d\n", s }'
}

NODE_NAMES=()

# finish : SIGTERM every node still running (each must exit 0: under ASan a leak makes it non-zero), look
# for sanitizer reports in every node log, print the tally and set the exit status.
finish() {
    for name in "${NODE_NAMES[@]}"; do
        local pidvar=${name}_PID
        if kill -0 "${!pidvar}" 2>/dev/null; then
            stop_node "$name"
            check_eq "node $name exits 0 on SIGTERM" "$STOP_RC" 0
        fi
    done
    if grep -l -E 'ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error:' "$TMP"/*.log \
        >"$TMP/sanitizer_hits" 2>/dev/null; then
        bad "sanitizer reports in: $(tr '\n' ' ' <"$TMP/sanitizer_hits")"
        grep -h -A30 -E 'ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error:' "$TMP"/*.log |
            head -80 || true
    else
        ok "no sanitizer reports in node logs"
    fi
    tally
}

# start_router : pdlink-router in the seed's MoRIIO mode (round robin, registrations that never expire) on
# ports it picks itself (--port 0, read back from its --port-file). Sets RPID, RPORT (HTTP) and DISC
# (discovery); logs to $TMP/router.log. Returns 1 if it did not start.
start_router() {
    local bin=$BUILD/pdlink-router rpf=$TMP/router.ports
    [[ -x $bin ]] || { echo "FAIL: $bin not built"; return 1; }
    "$bin" --host 127.0.0.1 --port 0 --vllm-pd-disaggregation --kv-connector moriio \
        --vllm-discovery-address 127.0.0.1:0 --policy round_robin --worker-ttl-ms 600000 --port-file "$rpf" \
        >"$TMP/router.log" 2>&1 &
    RPID=$!
    CHILDREN+=("$RPID")
    for _ in $(seq 1 200); do [[ -s $rpf ]] && break; sleep 0.05; done
    RPORT=$(sed -E 's/.*http=([0-9]+).*/\1/' "$rpf" 2>/dev/null || true)
    DISC=$(sed -E 's/.*discovery=([0-9]+).*/\1/' "$rpf" 2>/dev/null || true)
    [[ -n $RPORT && -n $DISC ]] || { echo "router did not start:"; cat "$TMP/router.log"; return 1; }
}

# stop_router : SIGTERM the router of start_router; it must exit 0.
stop_router() {
    kill -TERM "$RPID"
    local rc=0
    wait "$RPID" || rc=$?
    check_eq "router exits 0" "$rc" 0
}

# wait_until DESCRIPTION DEADLINE_S COMMAND... : polls COMMAND until it succeeds, then ok DESCRIPTION;
# the deadline only bounds a failure (bad DESCRIPTION, return 1).
wait_until() {
    local what=$1 secs=$2
    shift 2
    local end=$((SECONDS + secs))
    while ((SECONDS < end)); do
        if "$@"; then ok "$what"; return 0; fi
        sleep 0.1
    done
    bad "$what (not within $secs s)"
    return 1
}

# free_ports COUNT [COUNT...] : one base port per COUNT, from one range outside the kernel's ephemeral
# range that was free a moment ago (tests/tools/free_ports.py; connector ports are bases plus rank
# offsets, so a whole range must be free).
free_ports() {
    /usr/bin/python3 "$SRC/tests/tools/free_ports.py" "$@"
}

# with_ports COUNT FN ARGS... : runs `FN BASE ARGS...` with BASE the first of COUNT free ports. Another
# test can take a probed port before our node binds it; FN returns 2 for that (start_node does) and the
# call is repeated with a new range, up to 5 times.
with_ports() {
    local count=$1 fn=$2 base rc
    shift 2
    for _ in 1 2 3 4 5; do
        base=$(free_ports "$count") || return 1
        rc=0
        "$fn" "$base" "$@" || rc=$?
        [[ $rc -ne 2 ]] && return $rc
        echo "  ports $base-$((base + count - 1)) were taken before the node bound them; retrying on another range"
    done
    return 1
}

# kv_node BASE NAME CONFIG_FN ROLE ARGS... : start_node NAME ARGS... with the --kv-transfer-config that
# `CONFIG_FN ROLE BASE BASE+10` prints (handshake ports from BASE, notify ports from BASE+10: TP <= 10;
# use with_ports 20). Sets ${NAME}_KV to BASE.
kv_node() {
    local base=$1 name=$2 cfg=$3 role=$4
    shift 4
    printf -v "${name}_KV" '%s' "$base"
    start_node "$name" "$@" --kv-transfer-config "$("$cfg" "$role" "$base" $((base + 10)))"
}

# kv_config ROLE HANDSHAKE_BASE NOTIFY_BASE [EXTRA_JSON_MEMBERS] : the seed's --kv-transfer-config shape
kv_config() {
    printf '{"kv_connector":"MoRIIOConnector","kv_role":"%s","kv_connector_extra_config":{"host_ip":"127.0.0.1","handshake_port":%d,"notify_port":%d,"read_mode":true,"backend":"rdma","qp_per_transfer":2,"num_workers":2%s}}' \
        "$1" "$2" "$3" "${4:-}"
}

# prefill_leg PORT PROMPT TRANSFER_ID REQUEST_ID DECODE_TP : the router's prefill leg; prints the response
prefill_leg() {
    curl -s -H "X-Request-Id: $4" -H 'Content-Type: application/json' --data-binary \
        "$(jq -cn --arg p "$2" --arg t "$3" --argjson d "$5" \
            '{prompt:$p, max_tokens:1, stream:false, kv_transfer_params:{do_remote_decode:true, do_remote_prefill:false, transfer_id:$t, remote_tp_size:$d, remote_dp_size:1}}')" \
        "http://127.0.0.1:$1/v1/completions"
}

# decode_leg PORT PROMPT PARAMS_JSON REQUEST_ID MAX_TOKENS [STREAM] : the router's decode leg (params verbatim)
decode_leg() {
    curl -s -N -H "X-Request-Id: $4" -H 'Content-Type: application/json' --data-binary \
        "$(jq -cn --arg p "$2" --argjson k "$3" --argjson m "$5" --argjson s "${6:-false}" \
            '{prompt:$p, max_tokens:$m, stream:$s, kv_transfer_params:$k}')" \
        "http://127.0.0.1:$1/v1/completions"
}
