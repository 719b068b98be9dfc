#!/bin/bash
# test_example.sh -- libpdlink as an installed library: `cmake --install` of this build tree into a DESTDIR
# under it, then the out-of-tree example (examples/engine_pair.c) built against that tree with
# pkg-config (shared and static) and with find_package(pdlink) (shared and static), each run over tcp
# and shm. Also checks what was installed: the SONAME, that libpdlink.so exports exactly pdl_* API names,
# the headers (the umbrella pdlink.h includes all of them and compiles alone, none includes another
# library's header, version.h says the project's version), pdlink.pc, the CMake package, the programs and
# their man pages.
# Needs PDLINK_BUILD_DIR and PDLINK_SOURCE_DIR (set by CTest).
set -euo pipefail
build=${PDLINK_BUILD_DIR:?} src=${PDLINK_SOURCE_DIR:?}
work=$build/install-test
rm -rf "$work"
mkdir -p "$work"
dest=$work/root prefix=/opt/pdlink
fail() { echo "FAIL: $*" >&2; exit 1; }

DESTDIR=$dest cmake --install "$build" --prefix $prefix > "$work/install.log"
root=$dest$prefix
pc=$(find "$root" -name pdlink.pc)
[ -n "$pc" ] || fail "no pdlink.pc installed"
libdir=$(dirname "$(dirname "$pc")")
echo "installed: $(cd "$root" && find . -type f -o -type l | sort | tr '\n' ' ')"

for f in include/pdlink/engine.h include/pdlink/connector.h include/pdlink/version.h; do
    [ -f "$root/$f" ] || fail "$f not installed"
done
for f in libpdlink.a libpdlink.so cmake/pdlink/pdlinkConfig.cmake cmake/pdlink/pdlinkConfigVersion.cmake; do
    [ -e "$libdir/$f" ] || fail "$libdir/$f not installed"
done
# The headers are the API alone: pdlink.h includes every one of them, and none names another library.
for h in "$root"/include/pdlink/*.h; do
    name=$(basename "$h")
    [ "$name" = pdlink.h ] || grep -q "#include \"pdlink/$name\"" "$root/include/pdlink/pdlink.h" ||
        fail "pdlink/pdlink.h does not include $name"
done
foreign=$(grep -h '^#include <' "$root"/include/pdlink/*.h | grep -vE '<(stdarg|stdbool|stddef|stdint)\.h>' || true)
[ -z "$foreign" ] || fail "an installed header includes a header of another library: $foreign"
echo '#include <pdlink/pdlink.h>' | ${CC:-cc} -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only \
    -I"$root/include" -x c - || fail "pdlink/pdlink.h does not compile on its own"
# version.h is generated from project(pdlink VERSION ...) in CMakeLists.txt.
want=$(sed -n 's/^project(pdlink VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
ver() { sed -n "s/^#define PDL_VERSION_$1 \\(.*\\)\$/\\1/p" "$root/include/pdlink/version.h"; }
[ "$(ver STRING)" = "\"$want\"" ] || fail "PDL_VERSION_STRING $(ver STRING), project version $want"
[ "$(ver MAJOR).$(ver MINOR).$(ver PATCH)" = "$want" ] ||
    fail "PDL_VERSION_MAJOR/MINOR/PATCH $(ver MAJOR).$(ver MINOR).$(ver PATCH), project version $want"
soname=$(readelf -d "$libdir/libpdlink.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
abi=$(sed -n 's/^#define PDL_ABI_VERSION \([0-9]*\)$/\1/p' "$root/include/pdlink/version.h")
[ "$soname" = "libpdlink.so.$abi" ] || fail "SONAME '$soname', expected libpdlink.so.$abi"
[ -e "$libdir/$soname" ] || fail "$soname (the SONAME link) not installed"
# The dynamic symbol table is the API: pdl_ names only, none of the internal pdl__ ones.
extra=$(nm -D --defined-only "$libdir/libpdlink.so" | awk '{sub(/@.*/, "", $3); print $3}' | grep -v '^pdl_[a-z]' | grep -v '^PDLINK_' || true)
[ -z "$extra" ] || fail "libpdlink.so exports non-API symbols: $extra"
# ... and every function the installed headers declare that the library defines.
nm -D --defined-only "$libdir/libpdlink.so" | awk '{sub(/@.*/, "", $3); print $3}' | sort > "$work/exported"
nm --defined-only "$libdir/libpdlink.a" 2>/dev/null | awk '$2 == "T" {print $3}' | sort -u > "$work/defined"
grep -ohE '[^A-Za-z0-9_]pdl_[a-z][a-z0-9_]*[[:space:]]*\(' "$root"/include/pdlink/*.h | grep -oE 'pdl_[a-z0-9_]*' |
    sort -u | comm -12 - "$work/defined" > "$work/declared"
missing=$(comm -23 "$work/declared" "$work/exported")
[ -z "$missing" ] || fail "declared in include/pdlink but not exported: $missing"
echo "libpdlink.so exports $(wc -l < "$work/exported") functions, the declared API"
if [ -x "$build/pdlink" ]; then
    for p in pdlink pdlink-node pdlink-router; do
        [ -x "$root/bin/$p" ] || fail "bin/$p not installed"
        if grep -q '^HELP2MAN:FILEPATH=/' "$build/CMakeCache.txt"; then
            [ -s "$root/share/man/man1/$p.1" ] || fail "share/man/man1/$p.1 not installed"
        fi
    done
    "$root/bin/pdlink" plan --prefill-tp 4 --decode-tp 8 --model tiny > /dev/null || fail "installed pdlink plan failed"
fi

run() { # name binary: runs it over tcp and shm
    for b in tcp shm; do
        out=$("$2" $b) || fail "$1 $b: $out"
        echo "$1 $b: ${out//$'\n'/ | }"
    done
}
cc=${CC:-cc}
export PKG_CONFIG_PATH=$libdir/pkgconfig
# shellcheck disable=SC2046
$cc -std=c11 -Wall -Wextra -Werror $(pkg-config --cflags pdlink) -o "$work/pair-pc" "$src/examples/engine_pair.c" \
    $(pkg-config --libs pdlink) -Wl,-rpath,"$libdir"
deps=$(ldd "$work/pair-pc")
grep -q "libpdlink.so.$abi => $libdir" <<< "$deps" || fail "pair-pc does not load $libdir/libpdlink.so.$abi"
run pkg-config "$work/pair-pc"
# libpdlink.a with its dependencies' shared libraries. (`pkg-config --static` would also ask for their
# own private dependencies, for a fully static link; Debian's libzmq.pc names a libprotokit.a there that
# Debian does not ship.)
# shellcheck disable=SC2046
$cc -std=c11 -Wall -Wextra -Werror $(pkg-config --cflags pdlink) -o "$work/pair-pc-static" "$src/examples/engine_pair.c" \
    "$libdir/libpdlink.a" $(pkg-config --libs $(pkg-config --print-requires-private pdlink)) -pthread -lm
deps=$(ldd "$work/pair-pc-static")
! grep -q libpdlink <<< "$deps" || fail "pair-pc-static loads libpdlink.so"
run pkg-config-static "$work/pair-pc-static"

for kind in shared static; do
    static=OFF; [ $kind = static ] && static=ON
    cmake -S "$src/examples" -B "$work/ex-$kind" -G Ninja -DCMAKE_PREFIX_PATH="$root" -DPDLINK_STATIC=$static \
        -DCMAKE_BUILD_RPATH="$libdir" > "$work/ex-$kind.log" || { cat "$work/ex-$kind.log"; fail "find_package ($kind)"; }
    cmake --build "$work/ex-$kind" >> "$work/ex-$kind.log" || { cat "$work/ex-$kind.log"; fail "build ($kind)"; }
    run "find_package-$kind" "$work/ex-$kind/engine_pair"
done
echo "OK"
