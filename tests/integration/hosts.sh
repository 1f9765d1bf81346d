#!/usr/bin/env bash
# scripts/hosts, the multi-host harness: 3 hosts, each with its own address
# and host name; every host reaches every other and the root namespace
# reaches them; a cut between two hosts drops their packets and nothing
# else; a split cuts every host of one group off from every host of the
# other and nothing else; an isolated host is reached by nobody; heal
# restores all; down leaves no namespace, link or state behind; without
# root it refuses in one line.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib.bash

hosts_up it 3

# A listener on every host that answers with its host name.
for i in 1 2 3; do
  start "listen$i" $H exec "$i" /usr/bin/python3 -c '
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7777))
s.listen()
while True:
    c, _ = s.accept()
    c.sendall(socket.gethostname().encode())
    c.close()'
done
# reach FROM TO: the name host TO answers with, seen from host FROM (0: the
# root namespace), or "-" when it cannot be reached within 0.5 s.
reach() {
  local code="
import socket, sys
try:
    print(socket.create_connection(('$($H ip "$2")', 7777), timeout=0.5).recv(64).decode())
except OSError:
    print('-')"
  if [ "$1" = 0 ]; then /usr/bin/python3 -c "$code"; else $H exec "$1" /usr/bin/python3 -c "$code"; fi
}
expect() {  # expect FROM TO WANT
  local got
  got=$(reach "$1" "$2")
  [ "$got" = "$3" ] || fail "from ${1/#0/root} to h$2: got '$got', expected '$3'"
}
for ((i = 0; i < 100; i++)); do [ "$(reach 0 3)" = h3 ] && break; sleep 0.05; done
for a in 0 1 2 3; do
  for b in 1 2 3; do [ "$a" = "$b" ] || expect "$a" "$b" "h$b"; done
done
echo "ok: 3 hosts ($($H ip 1) .. $($H ip 3)), each named hI, reach one another and are reached from the root namespace"

$H cut 1 2
expect 1 2 -
expect 2 1 -
expect 1 3 h3
expect 3 2 h2
expect 0 1 h1
echo "ok: cut 1 2: h1 and h2 no longer reach each other; h3 and the root reach both"

$H heal
expect 1 2 h2
$H isolate 2
expect 1 2 -
expect 3 2 -
expect 0 2 -
expect 1 3 h3
echo "ok: isolate 2: nobody reaches h2; h1 and h3 still reach each other"

$H heal
expect 1 2 h2
$H split "1" "2 3"
expect 1 2 -
expect 1 3 -
expect 2 1 -
expect 3 1 -
expect 2 3 h3
expect 3 2 h2
for b in 1 2 3; do expect 0 "$b" "h$b"; done
echo "ok: split 1 | 2 3: h1 reaches neither h2 nor h3 and neither reaches it; h2 and h3 reach each other; the root reaches all three"

$H heal
for a in 1 2 3; do
  for b in 1 2 3; do [ "$a" = "$b" ] || expect "$a" "$b" "h$b"; done
done
echo "ok: heal: every host reaches every other again"

$H down
left=$( (ip netns list; ip -o link) | grep -c "$NAME" || true)
[ "$left" = 0 ] || fail "down left $left namespaces or links named $NAME"
[ ! -e "/run/paramserv-hosts/$NAME" ] || fail "down left its state"
echo "ok: down: no namespace, link or state left"

# setpriv is util-linux's, which scripts/deps installs: without it, fail.
command -v setpriv >/dev/null || fail "no setpriv (util-linux; make deps installs it)"
msg=$(setpriv --reuid=65534 --regid=65534 --clear-groups scripts/hosts --name "$NAME" up 2 2>&1) &&
  fail "up as nobody succeeded"
[ "$(wc -l <<<"$msg")" = 1 ] && grep -q "needs root" <<<"$msg" || fail "up as nobody said: $msg"
echo "ok: not root: $msg"
