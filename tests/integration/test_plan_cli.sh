#!/bin/bash
# test_plan_cli.sh -- `pdlink plan` end to end: the seed topologies as JSON (checked with python3's json
# module), the human output, xPyD pairs, WRITE mode, MLA, and usage/topology errors (exit 2, message
# naming the values).
set -euo pipefail
. "$(dirname "$0")/test_cli_lib.bash"

# Seed topologies, one document each, and all four together.
"$PDLINK" plan --prefill-tp 4 --decode-tp 8 --model llama-3.1-8b --json >"$TMP/p4d8.json" || fail "P4/D8 exit $?"
"$PDLINK" plan --prefill-tp 8 --decode-tp 4 --model llama-3.1-8b --json >"$TMP/p8d4.json" || fail "P8/D4 exit $?"
"$PDLINK" plan --prefill-tp 4,4 --decode-tp 8 --model llama-3.1-8b --json >"$TMP/p44d8.json" || fail "P4+P4/D8 exit $?"
"$PDLINK" plan --prefill-tp 8 --decode-tp 4,4 --model llama-3.1-8b --json >"$TMP/p8d44.json" || fail "P8/D4+D4 exit $?"
"$PDLINK" plan --seed --json >"$TMP/seed.json" || fail "--seed exit $?"

P='d["topologies"][0]["pairs"][0]'
check "P4/D8: decode 5's group is [2]" "$TMP/p4d8.json" "$P[\"consumers\"][5][\"group\"] == [2]"
check "P4/D8: decode 5 reads head 5 from slot 1 of prefill 2" "$TMP/p4d8.json" \
    "[(r['producer_rank'], r['first_head'], r['src_head']) for r in $P['consumers'][5]['reads']] == [(2, 5, 1)]"
check "P4/D8: decode 5's K slice is bytes [4096, 8192) of prefill block" "$TMP/p4d8.json" \
    "$P['consumers'][5]['reads'][0]['ranges'][0]['src_offset'] == 4096 and $P['consumers'][5]['reads'][0]['ranges'][0]['len'] == 4096"
check "P4/D8: every prefill rank expects 2 releases" "$TMP/p4d8.json" \
    "all(p['expected_acks'] == 2 and len(p['release_from']) == 2 for p in $P['producers'])"
check "P4/D8: block_len 8192 on prefill, 4096 on decode" "$TMP/p4d8.json" \
    "$P['prefill_rank_geometry']['block_len'] == 8192 and $P['decode_rank_geometry']['block_len'] == 4096"
check "P4/D8: MoRIIO rejects (heads must be split)" "$TMP/p4d8.json" \
    "not $P['moriio']['supported'] and 'split' in $P['moriio']['summary']"
check "P4/D8: geometry from the preset" "$TMP/p4d8.json" \
    "d['geometry']['num_layers'] == 32 and d['geometry']['total_kv_heads'] == 8 and d['geometry']['head_dim'] == 128 and d['model']['name'] == 'llama-3.1-8b'"

check "P8/D4: prefill 3 expects 1 release and is in a group" "$TMP/p8d4.json" \
    "$P['producers'][3]['expected_acks'] == 1 and $P['producers'][3]['in_groups_of'] == [1]"
check "P8/D4: decode 1 releases prefill 2 and 3" "$TMP/p8d4.json" "$P['consumers'][1]['releases_to'] == [2, 3]"
check "P8/D4: decode 1 reads one head from each of prefill 2 and 3" "$TMP/p8d4.json" \
    "[(r['producer_rank'], r['dst_head']) for r in $P['consumers'][1]['reads']] == [(2, 0), (3, 1)]"
check "P8/D4: every prefill rank is released by exactly 1 decode rank" "$TMP/p8d4.json" \
    "sorted(sum([c['releases_to'] for c in $P['consumers']], [])) == list(range(8))"

check "P4+P4/D8: one distinct pair (4, 8)" "$TMP/p44d8.json" \
    "d['topologies'][0]['prefill_instances'] == [4, 4] and [(p['prefill_tp'], p['decode_tp']) for p in d['topologies'][0]['pairs']] == [(4, 8)]"
check "P8/D4+D4: one distinct pair (8, 4)" "$TMP/p8d44.json" \
    "d['topologies'][0]['decode_instances'] == [4, 4] and [(p['prefill_tp'], p['decode_tp']) for p in d['topologies'][0]['pairs']] == [(8, 4)]"
check "--seed: the four seed topologies" "$TMP/seed.json" \
    "[t['name'] for t in d['topologies']] == ['P4/D8', 'P8/D4', 'P4+P4/D8', 'P8/D4+D4'] and d['model']['name'] == 'llama-3.1-8b'"

# MLA replicated: MoRIIO supports it but leaves odd prefill ranks unreleased; pdlink releases all.
"$PDLINK" plan --prefill-tp 8 --decode-tp 4 --model deepseek-v3 --json >"$TMP/mla.json" || fail "MLA exit $?"
check "MLA P8/D4: one whole-block read per decode rank, odd ranks unreleased upstream" "$TMP/mla.json" \
    "all(len(c['reads']) == 1 for c in $P['consumers']) and $P['moriio']['unreleased_producer_ranks'] == [1, 3, 5, 7] and $P['decode_rank_geometry']['halves'] == 1"

# WRITE mode: P8/D4 fan-in goes the other way.
"$PDLINK" plan --prefill-tp 8 --decode-tp 4 --model tiny --mode write --json >"$TMP/w.json" || fail "WRITE exit $?"
check "WRITE P8/D4: each decode rank waits for 2 write_done, prefill 5 notifies decode 2" "$TMP/w.json" \
    "d['mode'] == 'write' and all(c['expected_write_done'] == 2 for c in $P['consumers']) and $P['producers'][5]['write_done_to'] == [2]"

# vLLM's fused CPU layout: one "KV" half, a head's rows of K then V; P2/D1 reads 2 heads from each rank.
"$PDLINK" plan --prefill-tp 2 --decode-tp 1 --kv-heads 4 --head-dim 32 --dtype fp32 --block-size 128 --kv-fused \
    --json >"$TMP/fused.json" || fail "fused exit $?"
check "fused P2/D1: one KV half, prefill rank 1's 2 heads land at byte 65536 of the block" "$TMP/fused.json" \
    "d['geometry']['kv_fused'] and $P['decode_rank_geometry']['halves'] == 1 and $P['decode_rank_geometry']['block_len'] == 4 * 128 * 64 * 4 and [(g['half'], g['dst_offset'], g['len']) for g in $P['consumers'][0]['reads'][1]['ranges']] == [('KV', 65536, 65536)]"
if "$PDLINK" plan --prefill-tp 2 --decode-tp 1 --mla --head-dim 64 --kv-fused >"$TMP/fm.out" 2>&1; then
    fail "fused MLA accepted"
else
    grep -q "kv-fused needs K and V" "$TMP/fm.out" && pass "fused MLA refused" || fail "fused MLA message: $(cat "$TMP/fm.out")"
fi

# NHD with a split head: per-token ranges.
"$PDLINK" plan --prefill-tp 4 --decode-tp 8 --model tiny --layout nhd --json >"$TMP/nhd.json" || fail "NHD exit $?"
check "NHD P4/D8: one range per token per half" "$TMP/nhd.json" \
    "all(r['count'] == 16 for r in $P['consumers'][3]['reads'][0]['ranges']) and d['geometry']['layout'] == 'nhd'"

# Human output names the pieces.
"$PDLINK" plan --prefill-tp 8 --decode-tp 4 --model llama-3.1-8b >"$TMP/human.txt" || fail "human exit $?"
if grep -q "decode rank 1: heads 2-3, group {2,3}" "$TMP/human.txt" && grep -q "expects 1 release(s)" "$TMP/human.txt"; then
    pass "human output: groups and releases"
else
    fail "human output: groups and releases"
fi

# Errors: exit 2 and a message naming the values.
expect_error() {
    local name=$1 pattern=$2
    shift 2
    local rc=0
    "$PDLINK" plan "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
    if [ $rc -eq 2 ] && grep -q -- "$pattern" "$TMP/err"; then
        pass "$name"
    else
        fail "$name (exit $rc, stderr: $(head -c 300 "$TMP/err"))"
    fi
}
expect_error "6/4 is refused with 'multiple'" "multiple" --prefill-tp 6 --decode-tp 4 --kv-heads 8 --head-dim 128
expect_error "4/6 names both sizes" "decode TP 6 is not a multiple of prefill TP 4" --prefill-tp 4 --decode-tp 6 --kv-heads 8 --head-dim 128
expect_error "heads that cannot be split" "16 KV heads cannot be split over TP 6" --prefill-tp 6 --decode-tp 12 --kv-heads 16 --head-dim 128
expect_error "unknown model" "unknown model preset 'nope'" --prefill-tp 4 --decode-tp 8 --model nope
expect_error "no arguments" "usage" 
expect_error "bad number" "--prefill-tp 'x'" --prefill-tp x --decode-tp 8 --model tiny
expect_error "missing head count" "--kv-heads is required" --prefill-tp 4 --decode-tp 8 --head-dim 128

"$PDLINK" plan --help >"$TMP/help" 2>&1 && grep -q "llama-3.1-70b" "$TMP/help" && pass "--help lists presets" || fail "--help"

finish
