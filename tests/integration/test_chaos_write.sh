#!/usr/bin/env bash
# test_chaos_write.sh -- test_chaos.sh in WRITE mode (read_mode false): the prefill pushes.
set -euo pipefail
CHAOS_MODE=write exec bash "$(dirname "$0")/test_chaos.sh"
