#!/bin/bash
# test_engine_netns.sh -- the tcp backend between two network namespaces joined by a veth pair, as
# "two hosts": `pdlink bench --serve` runs as the target in one namespace, `pdlink bench --connect` as the
# initiator in the other; both READ and WRITE are validated byte by byte (the bench exits 1 on a
# mismatch). Needs root and `ip netns`; exits 77 (skip) with the reason otherwise. The namespaces and
# the target process are always cleaned up.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
    echo "SKIP: needs root for ip netns (running as uid $(id -u))"
    exit 77
fi
if ! command -v ip >/dev/null; then
    echo "SKIP: the ip command (iproute2) is not installed"
    exit 77
fi
BUILD=${PDLINK_BUILD_DIR:-$(dirname "$0")/../../build}
PDLINK=$BUILD/pdlink
if [ ! -x "$PDLINK" ]; then
    echo "FAIL: $PDLINK not built"
    exit 1
fi

# Unique names so parallel runs do not collide; veth names are limited to 15 characters.
TAG=$$
NS_A=pdl_eng_a_$TAG
NS_B=pdl_eng_b_$TAG
VA=pdlva$TAG
VB=pdlvb$TAG
SUB=$(( (TAG % 200) + 20 ))
IP_A=10.$SUB.77.1
IP_B=10.$SUB.77.2
TMP=$(mktemp -d)
TARGET_PID=

cleanup() {
    if [ -n "$TARGET_PID" ] && kill -0 "$TARGET_PID" 2>/dev/null; then
        kill "$TARGET_PID" 2>/dev/null || true
        wait "$TARGET_PID" 2>/dev/null || true
    fi
    ip netns del "$NS_A" 2>/dev/null || true
    ip netns del "$NS_B" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

if ! ip netns add "$NS_A" 2>"$TMP/err" || ! ip netns add "$NS_B" 2>>"$TMP/err"; then
    echo "SKIP: ip netns add failed: $(cat "$TMP/err")"
    exit 77
fi
if ! ip link add "$VA" netns "$NS_A" type veth peer name "$VB" netns "$NS_B" 2>"$TMP/err"; then
    echo "SKIP: veth pair failed: $(cat "$TMP/err")"
    exit 77
fi
ip -n "$NS_A" addr add "$IP_A/24" dev "$VA" && ip -n "$NS_B" addr add "$IP_B/24" dev "$VB" &&
    ip -n "$NS_A" link set "$VA" up && ip -n "$NS_B" link set "$VB" up &&
    ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up || {
    echo "SKIP: configuring the veth pair failed"
    exit 77
}

run_pair() { # op
    local op=$1
    rm -f "$TMP/port"
    # The target takes the largest region these options need (block * batch <= 1M here).
    ip netns exec "$NS_B" "$PDLINK" bench --serve "$IP_B:0" --port-file "$TMP/port" --backend tcp --host "$IP_B" \
        --block-sizes 4K,64K,1M --batch-sizes 1,16 --max-batch-bytes 16M --no-hetero >"$TMP/target.$op" 2>&1 &
    TARGET_PID=$!
    for _ in $(seq 1 100); do
        [ -s "$TMP/port" ] && break
        sleep 0.05
    done
    if [ ! -s "$TMP/port" ]; then
        echo "FAIL: the target did not start:"
        cat "$TMP/target.$op"
        return 1
    fi
    local port
    port=$(cat "$TMP/port")
    local rc=0 trc=0
    timeout 120 ip netns exec "$NS_A" "$PDLINK" bench --connect "$IP_B:$port" --backend tcp --host "$IP_A" --op "$op" \
        --block-sizes 4K,64K,1M --batch-sizes 1,16 --max-batch-bytes 16M --iters 20 --no-hetero >"$TMP/init.$op" \
        2>"$TMP/init.$op.err" || rc=$?
    wait "$TARGET_PID" || trc=$?
    TARGET_PID=
    cat "$TMP/init.$op"
    if [ $rc != 0 ] || [ $trc != 0 ]; then
        echo "FAIL: $op between namespaces: initiator exit $rc, target exit $trc"
        cat "$TMP/init.$op.err" "$TMP/target.$op"
        return 1
    fi
    # Every row must be there (3 block sizes x 2 batch sizes) and none may report a mismatch.
    local rows
    rows=$(grep -c '^sweep' "$TMP/init.$op" || true)
    if [ "$rows" != 6 ] || grep -q MISMATCH "$TMP/init.$op"; then
        echo "FAIL: $op between namespaces: $rows rows, or a data mismatch"
        return 1
    fi
    echo "ok: tcp $op between $NS_A ($IP_A) and $NS_B ($IP_B), 6 points validated"
}

run_pair read || exit 1
run_pair write || exit 1
exit 0
