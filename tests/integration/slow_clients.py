#!/usr/bin/python3
"""Clients that take what they can, for slow-clients.sh.

  slow_clients.py SHARD_PORT METRICS_PORT N [SOURCE_IP]

Holds N idle, unauthenticated TCP connections to a shard's port (they read
its CHALLENGE and never answer) and N slow HTTP connections to its metrics
port (a request line and one header, then one more header byte every 3 s,
never the blank line that ends the request), all from SOURCE_IP (default
127.0.0.2, so that a client at 127.0.0.1 is another address to the
server's per-address limit).  Connections the server closes are opened
again every 5 s, so that N are asked for all along.

First it probes the cap before HELLO: a connection that announces a PUSH of
64 KiB (under a slice's cap, over the handshake's 2048 bytes) before
authenticating must be answered with an ERROR from the header alone; it
prints "probe: ERROR <message>" (or "probe: FAILED <why>": a shard without
the cap waits for the 64 KiB).

Prints "flood: up ..." once the first N of each kind were tried, then a
count line every 5 s: "flood: shard open A closed B | metrics open C closed
D".  Runs until SIGTERM or SIGINT, then prints the totals and exits 0.
"""
import errno
import resource
import selectors
import signal
import socket
import struct
import sys
import time

MAGIC, VERSION = 0x56525350, 4
T_PUSH, T_ERROR = 6, 10
HEADER = struct.Struct("<IHHIQI")


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * n + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    if soft != resource.RLIM_INFINITY and soft < want:
        sys.exit("slow_clients.py: RLIMIT_NOFILE %d, %d needed" % (soft, want))


def read_exact(s, n, deadline):
    b = b""
    while len(b) < n:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = s.recv(n - len(b))
        if not chunk:
            raise EOFError("closed after %d of %d bytes" % (len(b), n))
        b += chunk
    return b


def probe(port, source):
    """A PUSH header of 64 KiB before HELLO: the shard must refuse it."""
    deadline = time.monotonic() + 20
    s = socket.socket()
    try:
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        magic, _, typ, _, _, length = HEADER.unpack(read_exact(s, HEADER.size, deadline))
        read_exact(s, length, deadline)  # the CHALLENGE
        s.sendall(HEADER.pack(MAGIC, VERSION, T_PUSH, 0, 0, 1 << 16))
        magic, _, typ, _, _, length = HEADER.unpack(read_exact(s, HEADER.size, deadline))
        if typ != T_ERROR:
            return "FAILED: answered type %d, expected ERROR" % typ
        body = read_exact(s, length, deadline)
        return "ERROR " + body[16:].decode("utf-8", "replace")
    except (OSError, EOFError) as e:
        return "FAILED: %s" % e
    finally:
        s.close()


class Flood:
    def __init__(self, port, n, source, greeting, dribble):
        self.port, self.n, self.source = port, n, source
        self.greeting, self.dribble = greeting, dribble
        self.socks = {}  # socket -> connected (bool)
        self.tried = self.closed = 0

    def top_up(self, sel):
        while len(self.socks) < self.n:
            s = socket.socket()
            s.setblocking(False)
            try:
                s.bind((self.source, 0))
                s.connect_ex(("127.0.0.1", self.port))
            except OSError:
                s.close()
                return
            self.tried += 1
            self.socks[s] = False
            sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, self)

    def event(self, sel, s, mask):
        if not self.socks[s]:
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self.drop(sel, s)
                return
            self.socks[s] = True
            sel.modify(s, selectors.EVENT_READ, self)
            if self.greeting:
                try:
                    s.send(self.greeting)
                except OSError:
                    self.drop(sel, s)
                return
        if mask & selectors.EVENT_READ:
            try:
                data = s.recv(65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.drop(sel, s)

    def drop(self, sel, s):
        sel.unregister(s)
        del self.socks[s]
        s.close()
        self.closed += 1

    def tick(self, sel):
        for s, up in list(self.socks.items()):
            if up and self.dribble:
                try:
                    s.send(self.dribble)
                except OSError:
                    self.drop(sel, s)

    def open(self):
        return sum(1 for up in self.socks.values() if up)


def main():
    shard_port, metrics_port, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    source = sys.argv[4] if len(sys.argv) > 4 else "127.0.0.2"
    raise_nofile(n)
    print("probe: " + probe(shard_port, source), flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    sel = selectors.DefaultSelector()
    shard = Flood(shard_port, n, source, None, None)
    http = Flood(metrics_port, n, source,
                 b"GET /metrics HTTP/1.1\r\nHost: shard\r\nX-Slow: a", b"a")
    for f in (shard, http):
        f.top_up(sel)
    print("flood: up: %d connections tried to the shard's port, %d to its metrics port"
          % (shard.tried, http.tried), flush=True)
    last_top = last_dribble = time.monotonic()
    while not stop:
        for key, mask in sel.select(timeout=0.5):
            key.data.event(sel, key.fileobj, mask)
        now = time.monotonic()
        if now - last_dribble >= 3:
            http.tick(sel)
            last_dribble = now
        if now - last_top >= 5:
            for f in (shard, http):
                f.top_up(sel)
            print("flood: shard open %d closed %d | metrics open %d closed %d"
                  % (shard.open(), shard.closed, http.open(), http.closed), flush=True)
            last_top = now
    print("flood: done: shard tried %d closed %d | metrics tried %d closed %d"
          % (shard.tried, shard.closed, http.tried, http.closed), flush=True)


if __name__ == "__main__":
    main()
