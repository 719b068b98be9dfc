#!/usr/bin/env bash
# test_docs_refs.sh -- every reference in the code and the docs leads to a file of this repository:
#   1. no source, header, benchmark or doc cites a document that is not here (a spec section `SPEC §N`,
#      the router or machine notes, the MoRIIO notes) or an issue number: the protocol, topology, router and
#      machine facts the code follows are in docs/, and the history is in git;
#   2. every `docs/<name>.md` named in src/, include/, bench/, docs/, tests/ or README.md, and every relative
#      `.md` link of a docs page, names an existing file;
#   3. every `#section` such a reference carries is a heading of that file (GitHub's anchor rules).
# Files listed in PENDING still carry such citations and are skipped by check 1 (the test names those that
# are clean, so the list can shrink).
set -euo pipefail
export LC_ALL=C
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
source tests/integration/test_tally_lib.bash

CITE='SPEC §|router-spec|machine\.md|moriio-spec|reference §|shared/(spec|reference)|[Ii]ssue [0-9]+'
SCOPE=(src include bench docs README.md)

# Files whose owners are still editing them; the citations there are replaced once they are done.
# docs/connector.md keeps one heading with an issue number because docs/python.md links to its anchor.
PENDING=()
is_pending() {
    local f
    for f in "${PENDING[@]}"; do [[ $f == "$1" ]] && return 0; done
    return 1
}

# 1. Citations of documents that are not here.
hits=$(grep -rnE "$CITE" "${SCOPE[@]}" || true)
stray=0
while IFS= read -r line; do
    [[ -z $line ]] && continue
    file=${line%%:*}
    if is_pending "$file"; then continue; fi
    bad "cites a document that is not in the repository: $line"
    stray=1
done <<<"$hits"
[[ $stray == 0 ]] && ok "no SPEC/router-spec/machine.md/moriio-spec/issue citations outside the pending files"
for f in "${PENDING[@]}"; do
    if [[ -f $f ]] && ! grep -qE "$CITE" "$f"; then
        echo "note - $f no longer cites anything missing: it can leave PENDING in $0"
    fi
done

# GitHub's anchor of a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to
# hyphens; a repeated heading gets -1, -2 ...
anchors_of() {
    grep -E '^#{1,6} ' "$1" | sed -E 's/^#+ +//; s/ +#*$//' | tr 'A-Z' 'a-z' |
        sed -E 's/[^a-z0-9 _-]//g; s/ /-/g' | awk '{ n = seen[$0]++; print (n ? $0 "-" n : $0) }'
}
declare -A ANCHORS=()
have_anchor() { # file anchor
    if [[ -z ${ANCHORS[$1]+x} ]]; then ANCHORS[$1]=$'\n'$(anchors_of "$1")$'\n'; fi
    [[ ${ANCHORS[$1]} == *$'\n'"$2"$'\n'* ]]
}

# check_ref WHERE TARGET_FILE ANCHOR
nrefs=0 broken=0
check_ref() {
    nrefs=$((nrefs + 1))
    if [[ ! -f $2 ]]; then
        bad "$1 names $2, which does not exist"; broken=1; return
    fi
    if [[ -n $3 ]] && ! have_anchor "$2" "$3"; then
        bad "$1 names $2#$3, which is not a heading of $2"; broken=1
    fi
}

# 2+3a. `docs/<name>.md[#anchor]` anywhere in code, tests and docs (paths from the repository root).
while IFS= read -r hit; do
    where=${hit%%:docs/*}
    ref=docs/${hit#*:docs/}
    file=${ref%%#*}
    anchor=; [[ $ref == *'#'* ]] && anchor=${ref#*#}
    check_ref "$where" "$file" "$anchor"
done < <(grep -rnoE '(^|[^A-Za-z0-9_./-])docs/[A-Za-z0-9_./-]+\.md(#[A-Za-z0-9_-]+)?' \
             src include bench docs tests README.md | sed -E 's/:[^:]*docs\//:docs\//' || true)

# 2+3b. Markdown links of docs pages: ](name.md#anchor) relative to docs/, ](#anchor) within the page.
for page in docs/*.md; do
    while IFS= read -r link; do
        target=${link#](}; target=${target%)}
        file=${target%%#*}
        anchor=; [[ $target == *'#'* ]] && anchor=${target#*#}
        if [[ -z $file ]]; then
            file=$page
        else
            [[ $file == *://* ]] && continue
            file=$(realpath -m --relative-to="$ROOT" "docs/$file")
        fi
        check_ref "$page" "$file" "$anchor"
    done < <(grep -oE '\]\([^) ]*(\.md|\.md#[A-Za-z0-9_-]+|#[A-Za-z0-9_-]+)\)' "$page" || true)
done
[[ $broken == 0 ]] && ok "$nrefs references to docs/*.md files and sections resolve"

tally
