# test_tally_lib.bash -- the pass/fail tally of the shell tests that keep going after a failed check
# (sourced, not a test itself): `ok WHAT` and `bad WHAT` count and print one line each, `tally` prints the
# counts and returns non-zero if any check failed, so a test ends with it.
PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok   - $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL - $*"; }
tally() {
    echo "# $PASS passed, $FAIL failed"
    [[ $FAIL -eq 0 ]]
}
