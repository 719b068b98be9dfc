#!/bin/bash
# compare-peers.sh -- pdlink's engines beside the systems users would otherwise pick, on the same machine,
# same sizes, same transport class, in one run: UCX's ucx_perftest (ucp_get), NIXL (PyPI nixl, UCX
# backend) and Mooncake Transfer Engine (PyPI mooncake-transfer-engine, TCP transport), all DRAM to DRAM
# between two processes, READ.
#   class shm: UCX_TLS=posix,cma for ucx_perftest, NIXL and pdlink ucx, beside pdlink's shm engine;
#   class tcp: UCX_TLS=tcp, UCX_NET_DEVICES=lo for the same three, beside pdlink's tcp engine.
# Mooncake runs its TCP transport in both classes. A batch of N descriptors is compared with
# ucx_perftest -O N (N gets in flight). UCX prints MiB/s; every figure here is GB/s (10^9 bytes/s).
# Each row is PAIRS (default 5, at least 5) passes; a pass measures every system of the row back to
# back (UCX, pdlink shm|tcp, pdlink ucx, NIXL, Mooncake), so ratios are taken per pass: median of the
# per-pass ratios, min-max, "unstable" past a 0.25 spread (the method of pdlink bench, bench/pairs.h).
# ucx_perftest -O N re-reads one buffer of one block for all N gets (cache-resident), while a pdlink
# batch reads N distinct blocks: for N > 1 and blocks of 64 KiB or more each pass also runs one
# ucx_perftest get of N x block bytes (-O 1), the same bytes and memory footprint as the batch, shown
# as a second ucx_perftest column ("footprint") beside the first; for N = 1 the two are the same run.
# And the other way round, for N > 1 each pass also runs pdlink ucx with --same-block: every descriptor
# of its batch names one block on both sides, N re-reads of one buffer, what ucx_perftest -O N measures
# ("pdlink ucx same-block"); the like-for-like ratio is that column over ucx_perftest's.
#
# usage: [PAIRS=N] [BATCHES=1,16] [RESULTS=DIR] [PEERS_VENV=DIR] bench/compare-peers.sh [--full] [PDLINK_BINARY] [SIZES]
#   e.g. bench/compare-peers.sh build/pdlink 4K,64K,1M,16M      (the default grid: these sizes, batches 1,16)
#   --full: the whole grid, sizes 4K,16K,64K,256K,1M,4M,16M,64M and batches 1,4,16,64,256,1024 (hours
#   here: ucp_get over UCX tcp costs ~1 ms per operation; points above 256 MiB per batch are skipped).
# Writes RESULTS (default build/peers-results/UTC-TIMESTAMP): table.md, table.csv, raw.csv (every pass),
# peers.png, failures.txt (the command and output of any peer that could not run), and the pdlink bench
# text of the last pass. NIXL and Mooncake come from the venv scripts/install-peers makes (default
# build/peers-venv); without it they are marked "not installed" and everything else still runs.
# Needs ucx_perftest (Debian package ucx-utils, installed by scripts/install-deps); installs it with
# apt-get when running as root, otherwise says how. Servers are started on a free port of 127.0.0.1 and
# stopped by their PID.
set -u

here=$(cd "$(dirname "$0")" && pwd)
FULL=0
case ${1:-} in
    --full) FULL=1; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
PDLINK=${1:-$here/../build/pdlink}
if [ $FULL = 1 ]; then
    SIZES=${2:-4K,16K,64K,256K,1M,4M,16M,64M}
    BATCHES=${BATCHES:-1,4,16,64,256,1024}
else
    SIZES=${2:-4K,64K,1M,16M}
    BATCHES=${BATCHES:-1,16}
fi
RESULTS=${RESULTS:-$here/../build/peers-results/$(date -u +%Y%m%dT%H%M%SZ)}
PEERS_VENV=${PEERS_VENV:-$here/../build/peers-venv}
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
PAIRS=${PAIRS:-5}
[ "$PAIRS" -ge 5 ] 2>/dev/null || { echo "compare-peers: PAIRS must be at least 5" >&2; exit 2; }
mkdir -p "$RESULTS" || exit 2
RESULTS=$(cd "$RESULTS" && pwd)
: >"$RESULTS/failures.txt"
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
        # ucp_get over tcp costs ~1.1 ms per get (docs/benchmarks.md#this-machine) and its bandwidth is
        # ~0.1-1 GB/s: cap the
        # iterations to 300 single gets and 256 MiB so that a row takes seconds.
        [ "$out" = 1 ] && [ $iters -gt 300 ] && iters=300
        [ $((iters * size)) -gt 268435456 ] && iters=$((268435456 / size))
        [ $iters -lt 10 ] && iters=10
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
    awk 'NF >= 8 && $1 ~ /^[0-9]+$/ { bw = $6 } END { if (bw == "") print "n/a"; else printf "%.4f", bw * 1048576 / 1e9 }' "$TMP/cli.log"
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

# pdlink_run CLASS BACKEND BATCH TLS K [same] -> runs pdlink bench once for all sizes, writes
# $TMP/pdl.CLASS.BACKEND.BATCH.K.json (BACKEND "ucxsame" with "same": the ucx backend with --same-block);
# TLS is the UCX_TLS the ucx backend gets (the same one ucx_perftest ran on).
pdlink_run() {
    local class=$1 backend=$2 batch=$3 tls=$4 k=$5 name=$2
    local envs=(UCX_TLS="$tls") extra=()
    [ "$tls" = tcp ] && envs+=(UCX_NET_DEVICES=lo)
    [ "${6:-}" = same ] && { name=${backend}same; extra=(--same-block); }
    local cmd=(env "${envs[@]}" "$PDLINK" bench --backend "$backend" --op read --block-sizes "$SIZES" --batch-sizes "$batch"
        --no-hetero "${extra[@]}")
    "${cmd[@]}" --json "$TMP/pdl.$class.$name.$batch.$k.json" >"$TMP/pdl.$class.$name.$batch.$k.txt" 2>&1 ||
        note_failure "pdlink bench --backend $backend ${extra[*]} (pass $k)" "$TMP/pdl.$class.$name.$batch.$k.txt" "${cmd[@]}"
}

# note_failure WHAT LOGFILE COMMAND... -> the command and the end of its output into failures.txt and stderr
note_failure() {
    local what=$1 log=$2
    shift 2
    {
        echo "== $what failed: $*"
        tail -n 25 "$log"
        echo
    } >>"$RESULTS/failures.txt"
    echo "compare-peers: $what failed (command and output in $RESULTS/failures.txt)" >&2
}

# Peers: usable when the venv's python imports the library; otherwise status.PEER says why (the exact
# command and its output), the table marks the peer and the run goes on without it.
PEER_PY=$PEERS_VENV/bin/python
peer_probe() { # PEER MODULE
    local peer=$1 mod=$2 out
    if [ ! -x "$PEER_PY" ]; then
        echo "not installed: $PEER_PY does not exist (run scripts/install-peers)" >"$TMP/status.$peer"
        return 1
    fi
    if ! out=$("$PEER_PY" -c "import $mod" 2>&1); then
        printf 'cannot run: `%s -c "import %s"` said: %s\n' "$PEER_PY" "$mod" "$(echo "$out" | tail -n 3 | tr '\n' ' ')" \
            >"$TMP/status.$peer"
        echo "== $peer: $PEER_PY -c \"import $mod\"" >>"$RESULTS/failures.txt"
        echo "$out" >>"$RESULTS/failures.txt"
        return 1
    fi
    echo ok >"$TMP/status.$peer"
}
NIXL_OK=0; MOONCAKE_OK=0
peer_probe nixl nixl_cu12._api && NIXL_OK=1
peer_probe mooncake mooncake.engine && MOONCAKE_OK=1

# peer_run PEER CLASS BATCH TLS K -> $TMP/PEER.CLASS.BATCH.K.json; a failed pass is recorded and marked.
peer_run() {
    local peer=$1 class=$2 batch=$3 tls=$4 k=$5
    local envs=() log="$TMP/$peer.$class.$batch.$k.txt"
    if [ "$peer" = nixl ]; then
        envs=(UCX_TLS="$tls")
        [ "$tls" = tcp ] && envs+=(UCX_NET_DEVICES=lo)
    fi
    local cmd=(env "${envs[@]}" timeout 900 "$PEER_PY" "$here/peers/${peer}_bench.py" --op read --block-sizes "$SIZES"
        --batch-sizes "$batch")
    if ! "${cmd[@]}" --json "$TMP/$peer.$class.$batch.$k.json" >"$log" 2>&1; then
        note_failure "$peer ($class, batch $batch, pass $k)" "$log" "${cmd[@]}"
        echo "failed in at least one pass (command and output in $RESULTS/failures.txt)" >"$TMP/status.$peer"
    fi
}

CLASSES="shm=posix,cma;tcp=tcp"
echo "pdlink vs ucx_perftest, NIXL, Mooncake TE (UCX $(ucx_info -v 2>/dev/null | sed -n 's/^# Version //p' | head -1)), READ, GB = 10^9 B/s, $(date -u +%FT%TZ)"
echo "sizes $SIZES, batches $BATCHES, $PAIRS alternating passes per row; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "NIXL: $(cat "$TMP/status.nixl"); Mooncake: $(cat "$TMP/status.mooncake")"
for class in shm tcp; do
    tls=posix,cma
    [ $class = tcp ] && tls=tcp
    for batch in ${BATCHES//,/ }; do
        for k in $(seq 1 "$PAIRS"); do
            echo "compare-peers: $class batch $batch pass $k/$PAIRS (load $(cut -d' ' -f1 /proc/loadavg))" >&2
            for s in ${SIZES//,/ }; do
                ucx_gbps $tls "$(to_bytes "$s")" "$batch" >"$TMP/ucx.$class.$batch.$s.$k"
                fp=$(( $(to_bytes "$s") * batch ))
                if [ "$batch" -gt 1 ] && [ "$(to_bytes "$s")" -ge 65536 ] && [ $fp -le 268435456 ]; then
                    ucx_gbps $tls $fp 1 >"$TMP/ucxfp.$class.$batch.$s.$k"
                fi
            done
            for backend in $class ucx; do
                pdlink_run $class $backend "$batch" $tls "$k"
            done
            [ "$batch" -gt 1 ] && pdlink_run $class ucx "$batch" $tls "$k" same
            [ $NIXL_OK = 1 ] && peer_run nixl $class "$batch" $tls "$k"
            [ $MOONCAKE_OK = 1 ] && peer_run mooncake $class "$batch" $tls "$k"
        done
        cp "$TMP"/pdl.$class.*."$batch.$PAIRS".txt "$RESULTS/" 2>/dev/null
    done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
REPORT_PY=python3
[ -x "$PEER_PY" ] && REPORT_PY=$PEER_PY
"$REPORT_PY" "$here/peers/report.py" "$TMP" "$RESULTS" "$PAIRS" "$SIZES" "$BATCHES" "$CLASSES"
echo "x N: N descriptors per pdlink/NIXL/Mooncake batch; ucx_perftest -O N (N gets in flight)."
echo "results: $RESULTS (table.md, table.csv, raw.csv, peers.png, failures.txt)"
