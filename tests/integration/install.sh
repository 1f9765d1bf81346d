#!/usr/bin/env bash
# make install's client library works from a program outside the tree:
# installed into a DESTDIR, client_example.c is built in a directory of its
# own with nothing but `pkg-config paramserv`, and client.sh runs that build
# against 2 real shards, once linked with the .so and once statically with
# the .a.  The .so exports exactly the functions the public headers declare
# (all marked PS_API), under the soname of paramserv/version.h's MAJOR; the
# version macros, ps_version(), paramserv.pc's Version and the file's name
# agree; each public header compiles alone.
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
part() { sed -n "s/^#define PARAMSERV_VERSION_$1 \([0-9]*\)$/\1/p" include/paramserv/version.h; }
major=$(part MAJOR) version=$(part MAJOR).$(part MINOR).$(part PATCH)
soname=libparamserv.so.$major
for m in models/*.json models/examples/*.json; do
  cmp -s "$m" "$T/root/usr/share/paramserv/$m" || fail "make install: $m not in /usr/share/paramserv"
done

[ -n "$major" ] || fail "include/paramserv/version.h: no PARAMSERV_VERSION_MAJOR"
[[ $(readelf -d "$lib/libparamserv.so") == *"Library soname: [$soname]"* ]] ||
  fail "$lib/libparamserv.so: no soname $soname"
[[ $(readlink "$lib/$soname") = libparamserv.so.$version &&
  $(readlink "$lib/libparamserv.so") = "$soname" ]] ||
  fail "$lib: libparamserv.so -> $soname -> libparamserv.so.$version links missing"
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
[ "$(pc --modversion paramserv)" = "$version" ] ||
  fail "paramserv.pc: Version $(pc --modversion paramserv), version.h says $version"
# The version the header says is the one the library reports.
cat >version.c <<'EOF'
#include <stdio.h>
#include <paramserv/client.h>
int main(void) {
  int major, minor, patch;
  const char *v = ps_version(&major, &minor, &patch);
  printf("%s %d.%d.%d %d.%d.%d\n", v, major, minor, patch, PARAMSERV_VERSION_MAJOR,
         PARAMSERV_VERSION_MINOR, PARAMSERV_VERSION_PATCH);
  return 0;
}
EOF
cc "${sanflags[@]}" -std=c11 -Wall -Werror -o version version.c $(pc --cflags --libs paramserv) \
  -Wl,-rpath,"$lib" || fail "version.c: no build against the installed library"
[ "$(./version)" = "$version $version $version" ] ||
  fail "ps_version() and the PARAMSERV_VERSION_* macros: $(./version), version.h says $version"
# The program finds the library in the DESTDIR by its rpath.
cc "${sanflags[@]}" -o client_example client_example.c $(pc --cflags --libs paramserv) \
  -lm -Wl,-rpath,"$lib" || fail "client_example.c: no out-of-tree build with pkg-config"
[[ $(ldd client_example) == *"$soname => $lib/$soname "* ]] ||
  fail "client_example does not load $lib/$soname: $(ldd client_example)"
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
echo "ok: installed library $version: $(echo "$exported" | wc -l) functions exported, soname $soname;" \
  "built out of tree with pkg-config, with the .so and with libparamserv.a"
