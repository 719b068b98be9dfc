#!/usr/bin/env bash
# test_docs_metrics.sh -- docs/node.md's Metrics section lists what pdlink-node serves on /metrics, no more,
# no less:
#   1. every per-rank counter of PDL_RANK_COUNTERS (include/pdlink/connector.h) is in its per-rank table;
#   2. every series src/node/metrics.c writes itself is named there;
#   3. every name the section mentions is one of those (per-rank table entries are counter names without
#      `pdlink_` and `_total`; histogram suffixes _sum/_count/_bucket are the histogram's).
set -euo pipefail
export LC_ALL=C
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
source tests/integration/test_tally_lib.bash

section=$(awk '/^## Metrics$/ { on = 1; print; next } on && /^## / { exit } on { print }' docs/node.md)
[[ -n $section ]] || { echo "FAIL - docs/node.md has no '## Metrics' section"; exit 1; }

counters=$(awk '/define PDL_RANK_COUNTERS/ { on = 1 } on { print } on && !/\\$/ { exit }' include/pdlink/connector.h |
    grep -oE 'X\([a-z0-9_]+, *"pdlink_[a-z0-9_]+"' | grep -oE 'pdlink_[a-z0-9_]+' | sort -u)
node_series=$(grep -oE '"pdlink_[a-z0-9_]+"' src/node/metrics.c | tr -d '"' | sort -u)
[[ -n $counters && -n $node_series ]] || { echo "FAIL - could not read the counter table or src/node/metrics.c"; exit 1; }

# The per-rank table: rows after the "| topic |" header up to the first blank line; its backticked words.
per_rank=$(awk '/^\| topic \|/ { on = 1; next } on && /^$/ { exit } on { print }' <<<"$section" |
    grep -oE '`[a-z0-9_]+`' | tr -d '`' | sort -u)

missing=0
for c in $counters; do
    short=${c#pdlink_}; short=${short%_total}
    if ! grep -qx "$short" <<<"$per_rank"; then bad "per-rank counter $c is not in docs/node.md's per-rank table"; missing=1; fi
done
[[ $missing == 0 ]] && ok "all $(wc -l <<<"$counters") PDL_RANK_COUNTERS rows are in docs/node.md"

missing=0
for n in $node_series; do
    if ! grep -q "\`$n[\`{]" <<<"$section"; then bad "$n (src/node/metrics.c) is not in docs/node.md's Metrics section"; missing=1; fi
done
[[ $missing == 0 ]] && ok "all $(wc -l <<<"$node_series") series of src/node/metrics.c are in docs/node.md"

extra=0
for s in $per_rank; do
    if ! grep -qx "pdlink_${s}_total" <<<"$counters"; then bad "docs/node.md's per-rank table names '$s', which is no counter"; extra=1; fi
done
for n in $(grep -oE 'pdlink_[a-z0-9_]+' <<<"$section" | sort -u); do
    base=$(sed -E 's/_(sum|count|bucket)$//' <<<"$n")
    if ! grep -qx -e "$n" -e "$base" <<<"$counters"$'\n'"$node_series"; then
        bad "docs/node.md's Metrics section names $n, which pdlink-node does not serve"; extra=1
    fi
done
[[ $extra == 0 ]] && ok "every name in docs/node.md's Metrics section is served"

tally
