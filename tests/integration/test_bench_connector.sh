#!/bin/bash
# test_bench_connector.sh -- `pdlink bench --connector` runs tiny and its output is well formed: the
# JSON has one row per topology and prompt length, a release row each, split rows for P4/D8 and P8/D4,
# every KV byte of every transfer compared (verified bytes = verified transfers x bytes) and none
# differed; usage errors exit 2. Never asserts on a timing or a ratio's value.
set -euo pipefail
. "$(dirname "$0")/test_cli_lib.bash"

rc=0
# The real geometry with one short prompt (one block: every transfer moves the same bytes) and the fewest
# pairs and reps.
"$PDLINK" --log-level warn bench --connector --tokens 16 --topologies P4/D8,P8/D4 --pairs 5 --reps 1 \
    --zmq-rts 20 --json "$TMP/b.json" >"$TMP/out.txt" 2>"$TMP/err.txt" || rc=$?
[ "$rc" = 0 ] && pass "exit 0" || { fail "exit $rc"; cat "$TMP/err.txt"; }
grep -q "^P4/D8 *16 " "$TMP/out.txt" && pass "table has the P4/D8 row" || fail "no P4/D8 row in the table"
grep -q "^verified [0-9]* bytes, 0 differed, 0 transfers failed" "$TMP/out.txt" && pass "table's verdict line" ||
    fail "verdict line missing"
J="$TMP/b.json"
check "two topologies, one length" "$J" 'len(d["rows"]) == 2 and len(d["release"]) == 2'
check "split rows against P4/D4" "$J" 'len(d["split"]) == 2 and all(s["homogeneous"] == "P4/D4" for s in d["split"])'
check "row fields" "$J" 'all(r["bytes"] > 0 and r["connector_gbps"] > 0 and r["engine_gbps"] > 0 and r["memcpy_gbps"] > 0 and r["pull_p99_us"] >= r["pull_p50_us"] > 0 for r in d["rows"])'
check "ratios have median or a spread verdict" "$J" 'all((x["median"] is None) == x["spread_too_wide"] and x["min"] <= x["max"] for r in d["rows"] for x in (r["connector_vs_engine"], r["connector_vs_memcpy"]))'
check "release rows" "$J" 'all(r["release_p50_us"] > 0 and r["zmq_rt_us"] > 0 for r in d["release"])'
# llama-3.1-8b: 32 layers x 2 halves x 8 heads x 16 tokens x 128 dims x 2 bytes per block.
check "bytes per transfer" "$J" '[r["bytes"] for r in d["rows"]] == [2097152, 2097152]'
check "no byte differed, no transfer failed" "$J" 'd["bad_bytes"] == 0 and d["failed_transfers"] == 0'
check "every transfer fully compared" "$J" 'd["verified_transfers"] > 0 and d["verified_bytes"] == d["verified_transfers"] * 2097152'

rc=0
# 256 tokens over P4/D4: 8 MiB per consumer and producer rank, so the connector posts several batches of
# whole layers per rank (xfer.c: up to 2 MiB each); every byte still arrives.
"$PDLINK" --log-level warn bench --connector --tokens 256 --topologies P4/D4 --pairs 5 --reps 1 --zmq-rts 5 \
    --json "$TMP/big.json" >/dev/null 2>"$TMP/err2.txt" || rc=$?
[ "$rc" = 0 ] && pass "256 tokens: exit 0" || { fail "256 tokens: exit $rc"; cat "$TMP/err2.txt"; }
check "256 tokens: one row, no split rows" "$TMP/big.json" 'len(d["rows"]) == 1 and d["split"] == [] and d["rows"][0]["bytes"] == 33554432'
check "256 tokens: every transfer fully compared, none differed" "$TMP/big.json" 'd["bad_bytes"] == 0 and d["failed_transfers"] == 0 and d["verified_transfers"] > 0 and d["verified_bytes"] == d["verified_transfers"] * 33554432'

"$PDLINK" bench --connector --help >"$TMP/help.txt" && grep -q -- "--topologies" "$TMP/help.txt" && pass "--help" ||
    fail "--help"
rc=0
"$PDLINK" bench --connector --pairs 2 >/dev/null 2>"$TMP/e2.txt" || rc=$?
[ $rc = 2 ] && grep -q -- "--pairs" "$TMP/e2.txt" && pass "--pairs 2 refused" || fail "--pairs 2 not refused with exit 2"
rc=0
"$PDLINK" bench --connector --topologies P3/D5 >/dev/null 2>&1 || rc=$?
[ $rc = 2 ] && pass "unknown topology refused" || fail "unknown topology not refused"

finish
