#!/usr/bin/env bash
# test_router_cli.sh -- pdlink-router's command line: usage errors exit 2 with a message naming the
# flag, --help exits 0, a port in use exits 1, SIGTERM and SIGINT shut down cleanly with exit 0.
set -euo pipefail
B=${PDLINK_BUILD_DIR:-build}
R=$B/pdlink-router
[ -x "$R" ] || { echo "skip: $R not built"; exit 77; }
T=$(mktemp -d /tmp/pdl-router-cli-XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
expect_usage() { # expected-text args...
  local want=$1; shift
  local rc=0; "$R" "$@" >"$T/out" 2>&1 || rc=$?
  if [ $rc -ne 2 ] || ! grep -q -- "$want" "$T/out"; then
    echo "FAIL: pdlink-router $* -> rc $rc (want 2), output:"; cat "$T/out"; fails=$((fails+1))
  else
    echo "ok: $* -> 2 ($want)"
  fi
}
BASE=(--vllm-pd-disaggregation --kv-connector moriio --vllm-discovery-address 127.0.0.1:0 --port 0)
expect_usage "unknown flag '--bogus'" "${BASE[@]}" --bogus
expect_usage "vllm-pd-disaggregation is required" --kv-connector moriio --vllm-discovery-address 127.0.0.1:0
expect_usage "vllm-discovery-address" --vllm-pd-disaggregation --kv-connector moriio
expect_usage "'nixl' is not supported" "${BASE[@]}" --kv-connector nixl
expect_usage "unknown policy 'cache_aware'" "${BASE[@]}" --policy cache_aware
expect_usage "--decode-policy: unknown policy 'x'" "${BASE[@]}" --decode-policy x
expect_usage "--port '70000'" "${BASE[@]}" --port 70000
expect_usage "--port needs a value" "${BASE[@]}" --port
expect_usage "is not HOST:PORT" --vllm-pd-disaggregation --vllm-discovery-address nohostport
expect_usage "unknown level 'loud'" "${BASE[@]}" --log-level loud
expect_usage "unexpected argument 'extra'" "${BASE[@]}" extra

rc=0; "$R" --help >"$T/help" 2>&1 || rc=$?
if [ $rc -ne 0 ] || ! grep -q -- "--vllm-discovery-address" "$T/help"; then echo "FAIL: --help rc $rc"; fails=$((fails+1)); else echo "ok: --help"; fi

start() { # portfile args...
  local pf=$1; shift
  "$R" "${BASE[@]}" --port-file "$pf" "$@" >>"$T/router.log" 2>&1 &
  PID=$!
  for _ in $(seq 500); do [ -s "$pf" ] && return 0; kill -0 $PID 2>/dev/null || return 1; sleep 0.02; done
  return 1
}
for sig in TERM INT; do
  rm -f "$T/p"
  if ! start "$T/p" --policy round_robin --prometheus-port 0; then echo "FAIL: router did not start"; fails=$((fails+1)); continue; fi
  http=$(sed 's/.*http=\([0-9]*\).*/\1/' "$T/p")
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$http/health" || true)
  [ "$code" = 503 ] || { echo "FAIL: /health before registration is $code"; fails=$((fails+1)); }
  kill -$sig $PID; rc=0; wait $PID || rc=$?
  if [ $rc -ne 0 ]; then echo "FAIL: SIG$sig exit $rc"; fails=$((fails+1)); else echo "ok: SIG$sig -> 0"; fi
done

# A port in use: the second router cannot bind and exits 1 with a message.
rm -f "$T/p"
if start "$T/p"; then
  http=$(sed 's/.*http=\([0-9]*\).*/\1/' "$T/p")
  rc=0; "$R" --vllm-pd-disaggregation --kv-connector moriio --vllm-discovery-address 127.0.0.1:0 --port "$http" >"$T/out2" 2>&1 || rc=$?
  if [ $rc -ne 1 ] || ! grep -q "cannot listen" "$T/out2"; then echo "FAIL: port in use rc $rc"; cat "$T/out2"; fails=$((fails+1)); else echo "ok: port in use -> 1"; fi
  kill -TERM $PID; wait $PID
fi
[ $fails -eq 0 ] && echo "all ok" || echo "$fails failure(s)"
exit $((fails > 0))
