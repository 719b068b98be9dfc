#!/bin/bash
# compare-peers.sh -- pdlink's engines next to UCX's ucp_get on the same machine, same sizes, same
# transport class, in one run: shared memory (ucx_perftest with UCX_TLS=posix,cma vs pdlink shm and
# pdlink ucx on the same UCX_TLS) and TCP over loopback (UCX_TLS=tcp, UCX_NET_DEVICES=lo vs pdlink tcp
# and pdlink ucx on the same UCX_TLS). One get in flight (ucx_perftest default) is compared with pdlink
# batch 1; 16 gets in flight (-O 16) with pdlink batch 16. UCX prints MiB/s; every column here is GB/s
# (10^9 bytes/s). NIXL and Mooncake (PyPI) are not run by this script: the last lines say so.
#
# usage: bench/compare-peers.sh [PDLINK_BINARY] [SIZES]     e.g. bench/compare-peers.sh build/pdlink 4K,64K,1M,16M
# Needs ucx_perftest (Debian package ucx-utils, installed by scripts/install-deps); installs it with
# apt-get when running as root, otherwise says how. Servers are started on a free port of 127.0.0.1 and
# stopped by their PID.
set -u

PDLINK=${1:-$(dirname "$0")/../build/pdlink}
SIZES=${2:-4K,64K,1M,16M}
if [ ! -x "$PDLINK" ]; then
    echo "compare-peers: $PDLINK is not built (pass the pdlink binary as the first argument)" >&2
    exit 2
fi
if ! command -v ucx_perftest >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "compare-peers: installing ucx-utils (ucx_perftest)..." >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y ucx-utils >/dev/null 2>&1 ||
            { apt-get update >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y ucx-utils >/dev/null 2>&1; }
    fi
    if ! command -v ucx_perftest >/dev/null; then
        echo "compare-peers: ucx_perftest not found; install it with: sudo apt-get install -y ucx-utils" >&2
        exit 2
    fi
fi
PY=/usr/bin/python3
[ -x $PY ] || PY=python3
TMP=$(mktemp -d)
SERVER=
cleanup() {
    if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; fi
    rm -rf "$TMP"
}
trap cleanup EXIT

to_bytes() { # 4K -> 4096
    local v=${1%[KkMmGg]} u=${1: -1}
    case $u in K|k) echo $((v * 1024)) ;; M|m) echo $((v * 1048576)) ;; G|g) echo $((v * 1073741824)) ;; *) echo "$1" ;; esac
}

free_port() {
    local p
    for _ in $(seq 1 50); do
        p=$((20000 + RANDOM % 30000))
        if ! ss -ltnH "sport = :$p" 2>/dev/null | grep -q .; then echo $p; return; fi
    done
    echo 0
}

# ucx_gbps TLS SIZE OUTSTANDING -> GB/s (overall bandwidth of the timed iterations)
ucx_gbps() {
    local tls=$1 size=$2 out=$3 port iters
    port=$(free_port)
    iters=$(( 2000000000 / size )); [ $iters -gt 20000 ] && iters=20000; [ $iters -lt 40 ] && iters=40
    if [ "$tls" = tcp ]; then
        # ucp_get over tcp costs ~1.1 ms per get (machine.md 4d): cap the iterations so a row takes seconds.
        [ "$out" = 1 ] && [ $iters -gt 2000 ] && iters=2000
    fi
    local envs=(UCX_TLS="$tls")
    [ "$tls" = tcp ] && envs+=(UCX_NET_DEVICES=lo)
    env "${envs[@]}" timeout 120 ucx_perftest -p "$port" >"$TMP/srv.log" 2>&1 &
    SERVER=$!
    sleep 0.3
    env "${envs[@]}" timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t ucp_get -s "$size" \
        -n "$iters" -w 10 -O "$out" -f >"$TMP/cli.log" 2>&1
    wait "$SERVER" 2>/dev/null
    SERVER=
    # last table row: iters, lat 50%, lat avg, lat overall, MB/s avg, MB/s overall, ...
    awk 'NF >= 8 && $1 ~ /^[0-9]+$/ { bw = $6 } END { if (bw == "") print "n/a"; else printf "%.2f", bw * 1048576 / 1e9 }' "$TMP/cli.log"
}

# pdlink_run BACKEND BATCH TLS -> runs pdlink bench once for all sizes, writes $TMP/pdl.BACKEND.BATCH.json;
# TLS is the UCX_TLS the ucx backend gets (the same one ucx_perftest ran on).
pdlink_run() {
    local backend=$1 batch=$2 tls=$3
    local envs=(UCX_TLS="$tls")
    [ "$tls" = tcp ] && envs+=(UCX_NET_DEVICES=lo)
    env "${envs[@]}" "$PDLINK" bench --backend "$backend" --op read --block-sizes "$SIZES" --batch-sizes "$batch" \
        --no-hetero --json "$TMP/pdl.$backend.$batch.json" >"$TMP/pdl.$backend.$batch.txt" 2>/dev/null ||
        echo "compare-peers: pdlink bench --backend $backend failed" >&2
}

pdlink_gbps() { # BACKEND BATCH SIZE_BYTES
    $PY - "$TMP/pdl.$1.$2.json" "$3" <<'EOF'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
    r = [x for x in rows if x["block"] == int(sys.argv[2])]
    print("%.2f %.2f" % (r[0]["gbps"], r[0]["ceiling_gbps"]) if r else "n/a n/a")
except Exception:
    print("n/a n/a")
EOF
}

echo "pdlink vs UCX ucp_get (UCX $(ucx_info -v 2>/dev/null | sed -n 's/^# Version //p' | head -1)), READ, GB = 10^9 B/s, $(date -u +%FT%TZ)"
printf "%-30s %8s %12s %12s %14s %7s\n" "pdlink backend (UCX_TLS) xN" "size" "UCX GB/s" "pdlink GB/s" "ceiling GB/s" "x UCX"
for class in shm tcp; do
    tls=posix,cma
    [ $class = tcp ] && tls=tcp
    for batch in 1 16; do
        declare -A ucx=()
        for s in ${SIZES//,/ }; do
            ucx[$s]=$(ucx_gbps $tls "$(to_bytes "$s")" $batch)
        done
        for backend in $class ucx; do
            pdlink_run $backend $batch $tls
            for s in ${SIZES//,/ }; do
                b=$(to_bytes "$s")
                u=${ucx[$s]}
                read -r p c <<<"$(pdlink_gbps $backend $batch "$b")"
                ratio=$($PY -c "import sys; u,p=sys.argv[1],sys.argv[2]; print('%.2f' % (float(p)/float(u)) if u not in ('n/a','0.00') and p!='n/a' else 'n/a')" "$u" "$p")
                printf "%-30s %8s %12s %12s %14s %7s\n" "$backend ($tls) x$batch" "$s" "$u" "$p" "$c" "$ratio"
            done
        done
        unset ucx
    done
done
echo "x1: one get in flight (ucx_perftest default) vs pdlink batch 1; x16: ucx_perftest -O 16 vs pdlink batch 16."
echo "ceiling: pdlink bench's same-run ceiling for that row (memcpy for shm and ucx on posix,cma; TCP stream for tcp"
echo "and ucx on tcp). pdlink ucx runs on the same UCX_TLS as ucx_perftest (the tcp rows add UCX_NET_DEVICES=lo)."
echo "NIXL (PyPI nixl) and Mooncake Transfer Engine (PyPI mooncake-transfer-engine): not run by this script (not"
echo "installed in this repository's environment); their columns are absent, not zero."
