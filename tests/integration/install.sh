#!/usr/bin/env bash
# make install's client library works from a program outside the tree:
# installed into a DESTDIR, client_example.c is built in a directory of its
# own with nothing but `pkg-config paramserv`, and client.sh runs that build
# against 2 real shards, once linked with the .so and once statically with
# the .a.  The .so exports exactly the functions the public headers declare
# (all marked PS_API), under the soname libparamserv.so.1; each public
# header compiles alone.
# shellcheck disable=SC2046  # pkg-config's flags are split into words on purpose
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

# Install the build $BIN belongs to; a sanitized library needs a sanitized
# program (the ASan runtime must come first).
make_args=() sanflags=()
case $(dirname "$BIN") in
  build/san | */build/san) make_args=(SAN=1) sanflags=('-fsanitize=address,undefined') ;;
  build/cuda | */build/cuda) make_args=(CUDA=1) ;;
esac
env -u MAKEFLAGS -u MAKELEVEL make --no-print-directory install DESTDIR="$T/root" PREFIX=/usr \
  "${make_args[@]}" >"$T/install.log" 2>&1 || fail "make install exited $?"
lib=$T/root/usr/lib inc=$T/root/usr/include/paramserv
for m in models/*.json models/examples/*.json; do
  cmp -s "$m" "$T/root/usr/share/paramserv/$m" || fail "make install: $m not in /usr/share/paramserv"
done

[[ $(readelf -d "$lib/libparamserv.so") == *"Library soname: [libparamserv.so.1]"* ]] ||
  fail "$lib/libparamserv.so: no soname libparamserv.so.1"
[[ $(readlink "$lib/libparamserv.so.1") = libparamserv.so.1.0.0 &&
  $(readlink "$lib/libparamserv.so") = libparamserv.so.1 ]] ||
  fail "$lib: libparamserv.so -> .so.1 -> .so.1.0.0 links missing"
unmarked=$(grep -nE '^[A-Za-z].*\bps_[a-z0-9_]+\(' "$inc"/*.h | grep -v ':PS_API ' || true)
[ -z "$unmarked" ] || fail "public functions without PS_API: $unmarked"
api=$(sed -nE 's/^PS_API .*[ *](ps_[a-z0-9_]+)\(.*/\1/p' "$inc"/*.h | sort)
exported=$(nm -D --defined-only "$lib/libparamserv.so" | awk '{ print $3 }' | sort)
[ "$exported" = "$api" ] ||
  fail "libparamserv.so exports other than the PS_API functions:" \
    "$(diff <(echo "$api") <(echo "$exported") | grep '^[<>]' | tr '\n' ' ')"

# pc: pkg-config with the DESTDIR as sysroot, which moves paramserv.pc's
# -I and -L into it (and its dependencies' too, wrongly: they are in /).
export PKG_CONFIG_PATH=$lib/pkgconfig
pc() { PKG_CONFIG_SYSROOT_DIR=$T/root pkg-config "$@"; }
mkdir "$T/src"
cp tests/integration/client_example.c "$T/src/"
cd "$T/src"
for h in "$inc"/*.h; do
  echo "#include <paramserv/$(basename "$h")>" >one.c
  cc -std=c11 -Wall -Wextra -Werror -fsyntax-only $(pc --cflags paramserv) one.c ||
    fail "public header $(basename "$h") does not compile alone"
done
# The program finds the library in the DESTDIR by its rpath.
cc "${sanflags[@]}" -o client_example client_example.c $(pc --cflags --libs paramserv) \
  -lm -Wl,-rpath,"$lib" || fail "client_example.c: no out-of-tree build with pkg-config"
[[ $(ldd client_example) == *"libparamserv.so.1 => $lib/libparamserv.so.1 "* ]] ||
  fail "client_example does not load $lib/libparamserv.so.1: $(ldd client_example)"
# Static, as the README says: libparamserv.a by name (-lparamserv would take
# the .so), its dependencies (Requires.private) as shared libraries, and
# the system's (the pc's syslibs); -L for the DESTDIR.
cc "${sanflags[@]}" -o client_example_static client_example.c $(pc --cflags paramserv) -L"$lib" \
  -l:libparamserv.a $(pkg-config --libs $(pkg-config --print-requires-private paramserv)) \
  $(pkg-config --variable=syslibs paramserv) -lm ||
  fail "client_example.c: no static link of libparamserv.a with pkg-config"
[[ $(readelf -d client_example_static) != *libparamserv* ]] ||
  fail "client_example_static still needs libparamserv.so"
cd - >/dev/null

# Both builds through client.sh's calm part (the in-tree build meets its
# kills and restores; the code is the same).
for ex in client_example client_example_static; do
  CLIENT_CALM_ONLY=1 CLIENT_EXAMPLE=$T/src/$ex PARAMSERV=$BIN tests/integration/client.sh ||
    fail "client.sh on the out-of-tree $ex exited $?"
done
echo "ok: installed library: $(echo "$exported" | wc -l) functions exported, soname libparamserv.so.1;" \
  "built out of tree with pkg-config, with the .so and with libparamserv.a"
