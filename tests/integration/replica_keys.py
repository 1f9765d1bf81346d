#!/usr/bin/python3
"""A shard's replica in a real Redis, for replica-format.sh (REDIS.md).

  replica_keys.py PORT TAG save FILE       every key of TAG, DUMPed, to FILE
  replica_keys.py PORT TAG load FILE       FLUSHALL, then RESTORE them
  replica_keys.py PORT TAG image           the current snapshot's state image
                                           (raw chunks, format 4 or 5) on stdout:
                                           "<version> <sha256>"
  replica_keys.py PORT TAG to-format-4     rewrite a replica of a shard without
                                           sparse tables as format 4 wrote it:
                                           the meta without format 5's fields
  replica_keys.py PORT TAG to-format-2     rewrite it as format 2 wrote it:
                                           chunks and log gradients as LZ4
                                           blocks, push entries' `v` as `g`;
                                           prints "<n> chunks, <m> gradients"
  replica_keys.py PORT TAG cut-entry       the newest push entry's `v` one
                                           float short
  replica_keys.py PORT TAG set-format F    the meta's `format` field := F

TAG is the shard's hash tag, e.g. {itest:ps:0}.
"""
import hashlib
import pickle
import sys

import lz4.block
import redis


def keys(r, tag):
    return [k for k in r.scan_iter(match=tag.replace("{", "\\{").replace("}", "\\}") + ":*")]


def stream(r, tag):
    return r.get(tag + ":logkey")


def rewrite_stream(r, key, fn):
    """Every entry of stream `key` through fn(id, fields) -> fields, ids kept."""
    entries = r.xrange(key)
    r.delete(key)
    for eid, fields in entries:
        r.xadd(key, fn(eid, dict(fields)), id=eid)
    if not entries:
        r.xgroup_create(key, "g", id="$", mkstream=True)
        r.xgroup_destroy(key, "g")


def main():
    port, tag, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    r = redis.Redis(host="127.0.0.1", port=port)
    meta = tag + ":meta"
    if cmd == "save":
        with open(sys.argv[4], "wb") as fh:
            pickle.dump({k: r.dump(k) for k in keys(r, tag)}, fh)
    elif cmd == "load":
        with open(sys.argv[4], "rb") as fh:
            saved = pickle.load(fh)
        r.flushall()
        for k, v in saved.items():
            r.restore(k, 0, v)
    elif cmd == "image":
        m = r.hgetall(meta)
        assert m[b"format"] in (b"4", b"5"), m[b"format"]
        snap, chunks = m[b"snap"].decode(), int(m[b"chunks"])
        img = b"".join(r.get(f"{tag}:snap:{snap}:{i}") for i in range(chunks))
        assert len(img) == 4 * int(m[b"image_floats"]), (len(img), m[b"image_floats"])
        print(m[b"version"].decode(), hashlib.sha256(img).hexdigest())
    elif cmd == "to-format-4":
        m = r.hgetall(meta)
        assert m[b"deltas"] == b"0" and m[b"rows"] == b"", (m[b"deltas"], m[b"rows"])
        r.hdel(meta, "deltas", "merged", "row_bits", "rank_next", "rows")
        r.hset(meta, "format", "4")
        for sid, v in r.hgetall(tag + ":snaps").items():
            r.hset(tag + ":snaps", sid, v.split()[0])
    elif cmd == "to-format-2":
        m = r.hgetall(meta)
        snap, chunks = m[b"snap"].decode(), int(m[b"chunks"])
        for i in range(chunks):
            k = f"{tag}:snap:{snap}:{i}"
            r.set(k, lz4.block.compress(r.get(k), store_size=False))
        r.hset(meta, "format", "2")

        converted = []

        def entry(eid, f):
            if b"v" in f:
                f[b"g"] = lz4.block.compress(f.pop(b"v"), store_size=False)
                converted.append(eid)
            return f
        rewrite_stream(r, stream(r, tag), entry)
        print(f"{chunks} chunks, {len(converted)} gradients")
    elif cmd == "cut-entry":
        key = stream(r, tag)
        last = [eid for eid, f in r.xrange(key) if b"v" in f][-1]

        def cut(eid, f):
            if eid == last:
                f[b"v"] = f[b"v"][:-4]
            return f
        rewrite_stream(r, key, cut)
    elif cmd == "set-format":
        r.hset(meta, "format", sys.argv[4])
    else:
        sys.exit(f"replica_keys.py: unknown command {cmd!r}")


if __name__ == "__main__":
    main()
