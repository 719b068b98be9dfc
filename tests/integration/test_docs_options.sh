#!/usr/bin/env bash
# test_docs_options.sh -- each `pdlink` command's --help, and pdlink-node's and pdlink-router's, and its
# docs page list the same options:
#   1. every option the command's --help prints is documented in its page's section;
#   2. every option that section lists exists in the command's --help.
# A section "lists" the options in its fenced code blocks (the usage lines) and in the first cell of its
# table rows (`| `--flag ARG` | ... |`); the rest of its prose may name other programs' flags. --help
# itself is left out. `pdlink`'s own options are checked one way only: README.md documents each, in
# prose, next to everything else there is to say.
set -euo pipefail
export LC_ALL=C
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PDLINK="${PDLINK_BUILD_DIR:?PDLINK_BUILD_DIR is not set}/pdlink"
NODE="$PDLINK_BUILD_DIR/pdlink-node"
ROUTER="$PDLINK_BUILD_DIR/pdlink-router"
for exe in "$PDLINK" "$NODE" "$ROUTER"; do
    if [[ ! -x $exe ]]; then
        echo "skip: $exe is missing"
        exit 77
    fi
done
cd "$ROOT"
PASS=0 FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok   - $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $*"; }

# The options of a --help text: the table rows the walker prints ("  --name ARG   help").
help_options() {
    grep -oE '^  --[a-z][a-z0-9-]*' | sed 's/^  //' | grep -vx -- '--help' | sort -u || true
}

# The section of FILE that starts at the heading matching REGEX (an awk regex on the whole line) and ends
# at the next heading of the same or a higher level; "^" for the text before the first "## " heading.
section() {
    local file=$1 re=$2
    if [[ $re == "^" ]]; then
        awk '/^## / { exit } { print }' "$file"
        return
    fi
    awk -v re="$re" '
        !on && $0 ~ re { on = 1; level = index($0, " "); print; next }
        on && /^#+ / && !code { l = index($0, " "); if (l <= level) exit }
        on && /^```/ { code = !code }
        on { print }' "$file"
}

# The options a section lists: in its code blocks, and in the first cell of its table rows.
listed_options() {
    awk '/^```/ { code = !code; next } code { print }' | grep -oE -- '--[a-z][a-z0-9-]*' || true
}
table_options() {
    grep -E '^\| *`--' | awk -F'|' '{ print $2 }' | grep -oE -- '--[a-z][a-z0-9-]*' || true
}

# check NAME FILE HEADING-REGEX COMMAND...: both directions for one command (COMMAND --help is run).
check() {
    local name=$1 file=$2 re=$3
    shift 3
    local help sec listed missing=0 extra=0
    help=$("$@" --help | help_options)
    [[ -n $help ]] || { bad "$name: --help printed no options"; return; }
    sec=$(section "$file" "$re")
    [[ -n $sec ]] || { bad "$name: $file has no section matching '$re'"; return; }
    listed=$( { listed_options <<<"$sec"; table_options <<<"$sec"; } | grep -vx -- '--help' | sort -u || true)
    for o in $help; do
        if ! grep -qx -- "$o" <<<"$listed"; then bad "$name: $o (in --help) is not listed in $file"; missing=1; fi
    done
    if [[ $missing == 0 ]]; then ok "$name: all $(wc -l <<<"$help") options of --help are listed in $file"; fi
    for o in $listed; do
        if ! grep -qx -- "$o" <<<"$help"; then bad "$name: $file lists $o, which --help does not"; extra=1; fi
    done
    if [[ $extra == 0 ]]; then ok "$name: every option $file lists is in --help"; fi
}

check "pdlink plan" docs/plan.md "^" "$PDLINK" plan
check "pdlink run" docs/run.md "^## Options$" "$PDLINK" run
check "pdlink check-config" docs/check-config.md "^" "$PDLINK" check-config
check "pdlink bench" docs/engine.md '^## `pdlink bench`$' "$PDLINK" bench
check "pdlink bench --connector" docs/connector.md '^## `pdlink bench --connector`$' "$PDLINK" bench --connector
check "pdlink-node" docs/node.md "^## Command line$" "$NODE"
check "pdlink-router" docs/router.md "^## Flags$" "$ROUTER"

missing=0
for o in $("$PDLINK" --help | help_options); do
    if ! grep -q -- "\`$o\b\|\`pdlink $o\b" README.md; then bad "pdlink: $o (in --help) is not in README.md"; missing=1; fi
done
if [[ $missing == 0 ]]; then ok "pdlink: every option of --help is in README.md"; fi

echo "# $PASS passed, $FAIL failed"
[[ $FAIL == 0 ]]
