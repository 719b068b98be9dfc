#!/bin/bash
# test_check_config.sh -- `pdlink check-config`: a valid kv-transfer-config exits 0 with what the parser
# settled on (text and --json); a bad value, an unknown key (with its did-you-mean), not JSON and a missing
# file exit 2 with a message naming the key, the value or the range; stdin ('-'); usage errors.
set -euo pipefail
. "$(dirname "$0")/test_cli_lib.bash"

# expect_rc NAME RC COMMAND...: COMMAND exits RC; its stdout and stderr land in $TMP/out.
expect_rc() {
    local name=$1 want=$2 rc=0
    shift 2
    "$@" >"$TMP/out" 2>&1 || rc=$?
    if [ "$rc" -eq "$want" ]; then pass "$name: exit $rc"; else fail "$name: exit $rc, expected $want"; fi
}
# expect_text NAME TEXT: $TMP/out contains TEXT.
expect_text() {
    if grep -qF -- "$2" "$TMP/out"; then pass "$1"; else fail "$1: no '$2' in: $(cat "$TMP/out")"; fi
}

cat >"$TMP/good.json" <<'JSON'
{"kv_connector": "PdlinkConnector", "kv_role": "kv_producer",
 "kv_connector_extra_config": {"host_ip": "127.0.0.1", "proxy_ip": "127.0.0.1", "proxy_ping_port": 36367,
   "http_port": 8100, "handshake_port": 6301, "notify_port": 61005, "read_mode": true, "backend": "tcp",
   "recv_abort_timeout": 5}}
JSON
expect_rc "valid" 0 "$PDLINK" check-config "$TMP/good.json"
expect_text "valid: text names role and mode" "valid: producer, READ mode, backend tcp"
"$PDLINK" check-config --json "$TMP/good.json" >"$TMP/good.out"
check "valid --json: ok and the settled values" "$TMP/good.out" \
    "d['ok'] is True and d['config']['role'] == 'producer' and d['config']['notify_port'] == 61005 and d['config']['read_mode'] is True"

expect_rc "valid from stdin" 0 sh -c "\"$PDLINK\" check-config - <\"$TMP/good.json\""

echo '{"kv_role": "kv_consumer", "kv_connector_extra_config": {"notify_prot": 61005}}' >"$TMP/typo.json"
expect_rc "unknown key" 2 "$PDLINK" check-config "$TMP/typo.json"
expect_text "unknown key: named with its did-you-mean" 'unknown key "notify_prot" (did you mean "notify_port"?)'
"$PDLINK" check-config --json "$TMP/typo.json" >"$TMP/typo.out" || true
check "unknown key --json: ok false, error names it" "$TMP/typo.out" \
    "d['ok'] is False and 'notify_prot' in d['error'] and 'notify_port' in d['error']"

echo '{"kv_connector_extra_config": {"frobnicate_everything": 1}}' >"$TMP/far.json"
expect_rc "unknown key, nothing near" 2 "$PDLINK" check-config "$TMP/far.json"
expect_text "unknown key, nothing near: named, keys listed elsewhere" 'unknown key "frobnicate_everything" (pdlink-node --help-config'

echo '{"kv_connector_extra_config": {"handshake_port": 70000}}' >"$TMP/range.json"
expect_rc "port out of range" 2 "$PDLINK" check-config "$TMP/range.json"
expect_text "port out of range: key, range and value" "handshake_port: expected an integer 0-65535"
expect_text "port out of range: the value" "70000"

echo '{"kv_role": "kv_producer", "kv_connector_extra_config": {"read_mode": "maybe"}}' >"$TMP/bool.json"
expect_rc "bad bool" 2 "$PDLINK" check-config "$TMP/bool.json"
expect_text "bad bool: key and value" "read_mode"

echo '{not json' >"$TMP/bad.json"
expect_rc "not JSON" 2 "$PDLINK" check-config "$TMP/bad.json"
expect_text "not JSON: says so" "invalid JSON"

expect_rc "missing file" 2 "$PDLINK" check-config "$TMP/nope.json"
expect_text "missing file: named" "nope.json: cannot open"
expect_rc "no FILE" 2 "$PDLINK" check-config
expect_rc "two FILEs" 2 "$PDLINK" check-config "$TMP/good.json" "$TMP/good.json"
expect_rc "unknown flag" 2 "$PDLINK" check-config --frob "$TMP/good.json"
expect_rc "--help" 0 "$PDLINK" check-config --help
expect_text "--help: usage" "usage: pdlink check-config"
finish
