# test_cli_lib.bash -- the prologue of the tests that run `pdlink` subcommands and check their JSON
# (sourced, not a test itself): $PDLINK and $PY, a $TMP removed on exit, and pass / fail / check, which
# count failures; `finish` exits 1 if any check failed. A missing program skips (exit 77), which CI=true
# turns into a failure.
PDLINK="${PDLINK_BUILD_DIR:?PDLINK_BUILD_DIR is not set}/pdlink"
PY=/usr/bin/python3
if [ ! -x "$PDLINK" ] || [ ! -x "$PY" ]; then
    echo "skip: $PDLINK or $PY is missing"
    exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }

# check NAME FILE PYTHON-EXPRESSION-ON-d: the expression must be true for the parsed document d.
check() {
    local name=$1 file=$2 expr=$3
    if "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if ($expr) else 1)" "$file"; then
        pass "$name"
    else
        fail "$name: $expr"
    fi
}

finish() {
    if [ "$fails" -ne 0 ]; then
        echo "$fails check(s) failed"
        exit 1
    fi
    echo "all checks passed"
}
