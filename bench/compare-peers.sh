#!/bin/bash
# compare-peers.sh -- pdlink's engines next to UCX's ucp_get on the same machine, same sizes, same
# transport class, in one run: shared memory (ucx_perftest with UCX_TLS=posix,cma vs pdlink shm and
# pdlink ucx on the same UCX_TLS) and TCP over loopback (UCX_TLS=tcp, UCX_NET_DEVICES=lo vs pdlink tcp
# and pdlink ucx on the same UCX_TLS). One get in flight (ucx_perftest default) is compared with pdlink
# batch 1; 16 gets in flight (-O 16) with pdlink batch 16. UCX prints MiB/s; every column here is GB/s
# (10^9 bytes/s). NIXL and Mooncake (PyPI) are not run by this script: the last lines say so.
# Each row is PAIRS (default 5, at least 5) alternating passes of UCX and pdlink: median of the per-pass
# ratios, min-max, and "unstable" when they spread too wide (the method of pdlink bench, bench/pairs.h).
#
# usage: [PAIRS=N] bench/compare-peers.sh [PDLINK_BINARY] [SIZES]     e.g. bench/compare-peers.sh build/pdlink 4K,64K,1M,16M
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

# ucx_gbps_once TLS SIZE OUTSTANDING -> GB/s (overall bandwidth of the timed iterations), or n/a
ucx_gbps_once() {
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

# ucx_gbps TLS SIZE OUTSTANDING: up to 3 tries, since on a loaded machine the server is sometimes not
# listening yet when the client starts, and a pass without its UCX figure cannot count as a pair.
ucx_gbps() {
    local r
    for _ in 1 2 3; do
        r=$(ucx_gbps_once "$@")
        [ "$r" != n/a ] && break
        sleep 1
    done
    echo "$r"
}

# pdlink_run BACKEND BATCH TLS K -> runs pdlink bench once for all sizes, writes $TMP/pdl.BACKEND.BATCH.K.json;
# TLS is the UCX_TLS the ucx backend gets (the same one ucx_perftest ran on).
pdlink_run() {
    local backend=$1 batch=$2 tls=$3 k=$4
    local envs=(UCX_TLS="$tls")
    [ "$tls" = tcp ] && envs+=(UCX_NET_DEVICES=lo)
    env "${envs[@]}" "$PDLINK" bench --backend "$backend" --op read --block-sizes "$SIZES" --batch-sizes "$batch" \
        --no-hetero --json "$TMP/pdl.$backend.$batch.$k.json" >"$TMP/pdl.$backend.$batch.$k.txt" 2>/dev/null ||
        echo "compare-peers: pdlink bench --backend $backend failed" >&2
}

# Method (the same as pdlink bench's, bench/pairs.h): for each transport class and batch, PAIRS passes
# alternate UCX (A: one ucx_perftest per size) and pdlink (B: one pdlink bench run over all sizes, each
# backend); a row's ratio is the median of the per-pass ratios pdlink / UCX with their min-max, the GB/s
# columns are medians, and a row whose spread ((q3 - q1) / median of the ratios) is above 0.25 prints
# "unstable" instead of a ratio. The ceiling column is pdlink bench's own median ceiling and its verdict.
PAIRS=${PAIRS:-5}
[ "$PAIRS" -ge 5 ] 2>/dev/null || { echo "compare-peers: PAIRS must be at least 5" >&2; exit 2; }

summarize() { # CLASS BACKEND BATCH TLS -> one table row per size
    $PY - "$TMP" "$1" "$2" "$3" "$4" "$PAIRS" "$SIZES" <<'EOF'
import json, math, sys
tmp, cls, backend, batch, tls, pairs, sizes = sys.argv[1:8]
def to_bytes(s):
    m = {"K": 1 << 10, "k": 1 << 10, "M": 1 << 20, "m": 1 << 20, "G": 1 << 30, "g": 1 << 30}
    return int(s[:-1]) * m[s[-1]] if s[-1] in m else int(s)
def med(v):
    v = sorted(v); n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
def rank(v, q):  # nearest rank, as bench/pairs.c
    v = sorted(v); k = math.ceil(q * len(v))
    return v[min(max(k, 1), len(v)) - 1]
for s in sizes.split(","):
    ucx, pdl, ceil, ratios, verdicts = [], [], [], [], set()
    for k in range(1, int(pairs) + 1):
        try:
            u = float(open("%s/ucx.%s.%s.%s.%d" % (tmp, cls, batch, s, k)).read())
            rows = json.load(open("%s/pdl.%s.%s.%d.json" % (tmp, backend, batch, k)))["rows"]
            r = [x for x in rows if x["block"] == to_bytes(s)][0]
        except Exception:
            continue
        if u <= 0:
            continue
        ucx.append(u); pdl.append(r["gbps"]); ceil.append(r["ceiling_gbps"]); ratios.append(r["gbps"] / u)
        verdicts.add(r.get("verdict", "?"))
    label = "%s (%s) x%s" % (backend, tls, batch)
    if len(ratios) < 5:
        print("%-26s %6s %9s %11s %13s %6s %11s  too few valid passes (%d of %s)" % (label, s, "n/a", "n/a", "n/a", "n/a",
              "", len(ratios), pairs))
        continue
    m = med(ratios)
    spread = (rank(ratios, 0.75) - rank(ratios, 0.25)) / m if m > 0 else 0
    ok = spread <= 0.25
    print("%-26s %6s %9.2f %11.2f %13.2f %6s %11s  %s; %s" % (label, s, med(ucx), med(pdl), med(ceil),
          "%.2f" % m if ok else "-", "%.2f-%.2f" % (min(ratios), max(ratios)),
          "ok" if ok else "unstable (spread %.2f)" % spread, "/".join(sorted(verdicts))))
EOF
}

echo "pdlink vs UCX ucp_get (UCX $(ucx_info -v 2>/dev/null | sed -n 's/^# Version //p' | head -1)), READ, GB = 10^9 B/s, $(date -u +%FT%TZ)"
echo "method: $PAIRS alternating passes (UCX, pdlink) per row; x UCX = median of the per-pass ratios [min-max];"
echo "GB/s = medians; spread = (q3 - q1) / median of the ratios, above 0.25 = unstable"
printf "%-26s %6s %9s %11s %13s %6s %11s  %s\n" "pdlink backend (UCX_TLS) xN" "size" "UCX GB/s" "pdlink GB/s" \
    "ceiling GB/s" "x UCX" "min-max" "verdict (x UCX; pdlink bench vs its ceiling)"
for class in shm tcp; do
    tls=posix,cma
    [ $class = tcp ] && tls=tcp
    for batch in 1 16; do
        for k in $(seq 1 "$PAIRS"); do
            for s in ${SIZES//,/ }; do
                ucx_gbps $tls "$(to_bytes "$s")" $batch >"$TMP/ucx.$class.$batch.$s.$k"
            done
            for backend in $class ucx; do
                pdlink_run $backend $batch $tls "$k"
            done
        done
        for backend in $class ucx; do
            summarize $class $backend $batch $tls
        done
    done
done
echo "x1: one get in flight (ucx_perftest default) vs pdlink batch 1; x16: ucx_perftest -O 16 vs pdlink batch 16."
echo "ceiling: pdlink bench's same-run ceiling for that row (memcpy for shm and ucx on posix,cma; TCP stream for tcp"
echo "and ucx on tcp), the median over the passes; after ';' the verdicts pdlink bench gave that row vs its ceiling."
echo "pdlink ucx runs on the same UCX_TLS as ucx_perftest (the tcp rows add UCX_NET_DEVICES=lo)."
echo "NIXL (PyPI nixl) and Mooncake Transfer Engine (PyPI mooncake-transfer-engine): not run by this script (not"
echo "installed in this repository's environment); their columns are absent, not zero."
