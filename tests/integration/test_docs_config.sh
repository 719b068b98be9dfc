#!/usr/bin/env bash
# test_docs_config.sh -- docs/connector.md's configuration table lists the keys pdlink-node --help-config
# prints (the connector's key table, src/connector/config.c), no more, no less:
#   1. every key the program prints is a row of the table, with the same type and default;
#   2. every row of the table is a key the program prints.
set -euo pipefail
export LC_ALL=C
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${PDLINK_BUILD_DIR:-$ROOT/build}
cd "$ROOT"
PASS=0 FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok   - $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $*"; }

[[ -x $BUILD/pdlink-node ]] || { echo "FAIL - no $BUILD/pdlink-node (build first)"; exit 1; }
# A paragraph per key; its first line is "NAME  TYPE  default DEFAULT" ("" for an empty default).
help=$("$BUILD/pdlink-node" --help-config | sed -nE 's/^([a-z_]+) +([a-z]+) +default (.*)$/\1|\2|\3/p')
[[ -n $help ]] || { echo "FAIL - pdlink-node --help-config printed no key"; exit 1; }

# The table: rows after the "| key | type | default |" header in the Configuration section, up to the
# first blank line, as "key|type|default" (the key's first backticked word, the default's first one).
section=$(awk '/^## Configuration$/ { on = 1; next } on && /^## / { exit } on { print }' docs/connector.md)
docs=$(awk '/^\| key \| type \| default \|/ { on = 1; next } on && /^$/ { exit } on && !/^\|---/ { print }' <<<"$section" |
    awk -F'|' '{
        key = $2; type = $3; def = $4
        match(key, /`[^`]+`/); key = substr(key, RSTART + 1, RLENGTH - 2)
        gsub(/^ +| +$/, "", type)
        match(def, /`[^`]*`/); def = substr(def, RSTART + 1, RLENGTH - 2)
        print key "|" type "|" def
    }')
[[ -n $docs ]] || { echo "FAIL - docs/connector.md has no '| key | type | default |' table under '## Configuration'"; exit 1; }

missing=0
while IFS='|' read -r key type def; do
    row=$(grep -E "^$key\|" <<<"$docs" || true)
    if [[ -z $row ]]; then
        bad "key $key (pdlink-node --help-config) is not in docs/connector.md's table"; missing=1
    elif [[ $row != "$key|$type|$def" ]]; then
        bad "docs/connector.md says '${row#*|}' (type|default) for $key, the program '$type|$def'"; missing=1
    fi
done <<<"$help"
[[ $missing == 0 ]] && ok "all $(wc -l <<<"$help") keys of --help-config are in docs/connector.md with their type and default"

extra=0
while IFS='|' read -r key _ _; do
    if ! grep -qE "^$key\|" <<<"$help"; then bad "docs/connector.md's table names '$key', which is no key"; extra=1; fi
done <<<"$docs"
[[ $extra == 0 ]] && ok "every key of docs/connector.md's table is a key of --help-config"

echo "# $PASS passed, $FAIL failed"
[[ $FAIL == 0 ]]
