#!/usr/bin/env bash
# test_layers.sh -- the layers of libpdlink depend only downward (common < topo < layout < wire < engine <
# connector), checked twice over:
#   1. at link level: every pdl_* symbol a layer's archive uses is defined in that layer or one below it
#      (nm on build/libpdl_<layer>.a), so an upward call is caught even when someone declares it by hand;
#   2. at compile level: with a layer's include roots (what CMake gives it), an internal or public header of
#      a higher layer does not resolve, and one of a lower layer does;
#   3. no source, test or benchmark #includes a .c file (a program's code is reached through its library).
set -euo pipefail
BUILD=${PDLINK_BUILD_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/build}
LAYERS=(common topo layout wire engine connector)
source "$(dirname "$0")/test_tally_lib.bash"

defined=$(mktemp)
trap 'rm -f "$defined"' EXIT
for layer in "${LAYERS[@]}"; do
    lib=$BUILD/libpdl_$layer.a
    if [[ ! -f $lib ]]; then
        bad "$lib exists"
        continue
    fi
    nm -g --defined-only "$lib" 2>/dev/null | awk 'NF == 3 { print $3 }' >>"$defined"
    upward=$(nm -g --undefined-only "$lib" 2>/dev/null | awk '{ print $NF }' | grep -E '^pdl_' | sort -u |
        grep -vxF -f "$defined" || true)
    if [[ -z $upward ]]; then
        ok "$layer uses only pdl_* symbols of its own layer or below"
    else
        bad "$layer uses pdl_* symbols defined in no layer at or below it (an upward dependency): $(echo $upward)"
    fi
done

CC=${CC:-cc}
roots() { # roots LAYER : the -I flags CMake gives that layer (its own root and every root below it)
    local flags="" l
    for l in "${LAYERS[@]}"; do
        flags="$flags -I$BUILD/layers/$l"
        [[ $l == "$1" ]] && break
    done
    echo "$flags"
}
compiles() { # compiles LAYER HEADER
    # shellcheck disable=SC2046
    echo "#include \"$2\"" | $CC -std=c11 -D_GNU_SOURCE -fsyntax-only $(roots "$1") -x c - 2>/dev/null
}
check_sees() {
    if compiles "$1" "$2"; then ok "$1 sees $2"; else bad "$1 should see $2"; fi
}
check_blind() {
    if compiles "$1" "$2"; then bad "$1 must not see $2 (upward include)"; else ok "$1 cannot include $2"; fi
}
check_sees engine wire/mp.h
check_sees engine pdlink/wire.h
check_blind engine connector/internal.h
check_blind engine pdlink/connector.h
check_blind wire engine/backend.h
check_blind wire pdlink/engine.h
check_blind topo pdlink/layout.h
check_blind common pdlink/topo.h
check_sees connector engine/backend.h

SRC=${PDLINK_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
included_c=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"][^">]*\.c[">]' "$SRC/src" "$SRC/tests" "$SRC/bench" \
    --include='*.c' --include='*.h' || true)
if [[ -z $included_c ]]; then
    ok "no .c file is #included"
else
    bad "a .c file is #included (link the program's library instead): $included_c"
fi

tally
