#!/usr/bin/env bash
# test_node_http_hardening.sh -- pdlink-node's HTTP front against hostile clients (docs/security.md):
#   - a decode leg naming a closed port and one naming an open port that is no KV peer get the same
#     error text (no port-scan oracle through the decode); the node's log keeps the cause;
#   - Expect: 100-continue with a Content-Length over the 16 MiB limit gets 413, never "100 Continue";
#   - two Content-Length headers get 400.
set -euo pipefail
source "$(dirname "$0")/test_node_lib.bash"

fast_config() { kv_config "$1" "$2" "$3" ',"handshake_timeout":2,"transfer_timeout":3'; }
with_ports 20 kv_node D fast_config kv_consumer --model tiny --num-gpu-blocks 64 || exit 1

# An open port that accepts and never speaks (no ZeroMQ greeting), and a closed one.
/usr/bin/python3 - "$TMP/open.port" <<'PY' &
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(64)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
held = []
while True:
    held.append(s.accept()[0])
PY
CHILDREN+=($!)
wait_until "the silent listener is up" 10 test -s "$TMP/open.port"
OPEN=$(cat "$TMP/open.port")
CLOSED=$(free_ports 1)

leg() { # leg PORT : the error message of a decode leg whose producer is 127.0.0.1:PORT, ports and ids masked
    local body
    body=$(jq -cn --argjson p "$1" '{prompt:"x", max_tokens:2, kv_transfer_params:{do_remote_prefill:true,
        transfer_id:"tx-scan", remote_block_ids:[0], remote_engine_id:("127.0.0.1:" + ($p|tostring)),
        remote_host:"127.0.0.1", remote_handshake_port:$p, remote_notify_port:$p, tp_size:1}}')
    curl -s -w ' %{http_code}' -H 'Content-Type: application/json' --data-binary "$body" \
        "http://127.0.0.1:$D_PORT/v1/completions" | sed -e "s/127\.0\.0\.1:$1/ADDR/g" -e 's/request [0-9a-f]*/request ID/'
}
closed=$(leg "$CLOSED")
open=$(leg "$OPEN")
echo "  closed: $closed"
echo "  open:   $open"
check_contains "a closed producer port is a 500" "$closed" " 500"
check_eq "a closed port and an open non-ZeroMQ port read the same" "$open" "$closed"
check "the node's log keeps the cause (connection refused)" grep -q "tx-scan.*refused" "$TMP/D.log"

raw() { # raw REQUEST_TEXT [all] : the status line the node answers (all: the whole answer)
    /usr/bin/python3 - "$D_PORT" "$1" "${2:-}" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
s.sendall(sys.argv[2].encode().decode("unicode_escape").encode())
data = b""
while b"\r\n" not in data or (sys.argv[3] == "all" and b"}" not in data and b"header" not in data):
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
print(data.decode(errors="replace") if sys.argv[3] == "all" else data.split(b"\r\n", 1)[0].decode(errors="replace"))
PY
}
check_eq "Expect: 100-continue over 16 MiB gets 413" \
    "$(raw 'POST /v1/completions HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\nContent-Length: 16777217\r\nExpect: 100-continue\r\n\r\n')" \
    "HTTP/1.1 413 Content Too Large"
dup=$(raw 'POST /v1/completions HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\nContent-Length: 2\r\nContent-Length: 30\r\n\r\n{}' all)
check_contains "two Content-Length headers get 400" "$dup" "HTTP/1.1 400 Bad Request"
check_contains "... for their framing, not for the body" "$dup" "more than one Content-Length header"
finish
