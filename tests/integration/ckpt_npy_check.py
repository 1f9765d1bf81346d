#!/usr/bin/env python3
"""Checks of a checkpoint (recovery/FORMAT.md) that do not go through
paramserv's own reader, for tests/integration/ckpt-restore.sh.

  ckpt_npy_check.py xxh CKPT
      `lz4 -d` each shard file, undo the filter, and compare the XXH64 of
      the bytes with the manifest's `xxh64` (and the sizes with its sizes).
  ckpt_npy_check.py export CKPT NPYDIR SAFETENSORS
      Reassemble every variable's values from the shard files (lz4 -d, undo
      the filter, place each part) and compare them, bit for bit, with
      NPYDIR/<name>.npy and with the tensors of the .safetensors file.

The .npy files are read with numpy when it is installed (np.load), else by
a parser of NPY 1.0 written here.  XXH64: the system's libxxhash through
ctypes when it loads, and an implementation in Python here (checked against
xxhash's known answers) on inputs up to 1 MiB, or on all of them without
libxxhash; where both run they must agree.
Prints one line of figures per check; exits 1 on the first mismatch.
"""
import ast
import ctypes
import ctypes.util
import json
import os
import struct
import subprocess
import sys

M64 = (1 << 64) - 1
P1 = 0x9E3779B185EBCA87
P2 = 0xC2B2AE3D27D4EB4F
P3 = 0x165667B19E3779F9
P4 = 0x85EBCA77C2B2AE63
P5 = 0x27D4EB2F165667C5


def die(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, lane):
    acc = (acc + lane * P2) & M64
    return (_rotl(acc, 31) * P1) & M64


def _merge(h, v):
    h ^= _round(0, v)
    return (h * P1 + P4) & M64


def xxh64(data, seed=0):
    """XXH64 (xxhash's spec, XXH64 section), in plain Python."""
    n = len(data)
    i = 0
    if n >= 32:
        v1 = (seed + P1 + P2) & M64
        v2 = (seed + P2) & M64
        v3 = seed & M64
        v4 = (seed - P1) & M64
        stripes = n // 32
        mv = memoryview(data)[: stripes * 32]
        for a, b, c, d in struct.iter_unpack("<4Q", mv):
            v1 = (_rotl((v1 + a * P2) & M64, 31) * P1) & M64
            v2 = (_rotl((v2 + b * P2) & M64, 31) * P1) & M64
            v3 = (_rotl((v3 + c * P2) & M64, 31) * P1) & M64
            v4 = (_rotl((v4 + d * P2) & M64, 31) * P1) & M64
        i = stripes * 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & M64
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        (k,) = struct.unpack_from("<Q", data, i)
        h ^= _round(0, k)
        h = (_rotl(h, 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        (k,) = struct.unpack_from("<I", data, i)
        h ^= (k * P1) & M64
        h = (_rotl(h, 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h ^= (data[i] * P5) & M64
        h = (_rotl(h, 11) * P1) & M64
        i += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    h ^= h >> 32
    return h


def libxxhash():
    """The system's XXH64 through ctypes, or None."""
    for name in ("libxxhash.so.0", ctypes.util.find_library("xxhash")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            f = lib.XXH64
        except (OSError, AttributeError):
            continue
        f.restype = ctypes.c_uint64
        f.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
        return lambda b, seed=0: f(bytes(b), len(b), seed)
    return None


# Known answers (xxhash's test vectors), so that a wrong implementation here
# cannot agree with a wrong writer by accident.
for text, want in ((b"", 0xEF46DB3751D8E999), (b"abc", 0x44BC2CF5AD770999)):
    if xxh64(text) != want:
        die("xxh64 self-test failed on %r: %016x, expected %016x" % (text, xxh64(text), want))
_LIB = libxxhash()
if _LIB is not None:
    probe = bytes(range(256)) * 3 + b"tail"
    if _LIB(probe) != xxh64(probe):
        die("xxh64 here and libxxhash disagree on the probe")


def short(ckpt):
    """The checkpoint as PARENT/ckpt-<step>, for messages."""
    ckpt = os.path.normpath(ckpt)
    return os.path.join(os.path.basename(os.path.dirname(ckpt)), os.path.basename(ckpt))


PURE_MAX = 1 << 20  # bytes the plain-Python XXH64 hashes in reasonable time


def hash64(data):
    """(XXH64 of data, how it was computed): libxxhash when it loads, and the
    Python implementation too on up to PURE_MAX bytes (both must agree)."""
    pure = xxh64(data) if _LIB is None or len(data) <= PURE_MAX else None
    lib = _LIB(data) if _LIB is not None else None
    if pure is not None and lib is not None and pure != lib:
        die("XXH64: Python %016x, libxxhash %016x on %d bytes" % (pure, lib, len(data)))
    how = " and ".join(w for w, v in (("Python XXH64", pure), ("libxxhash", lib)) if v is not None)
    return (lib if lib is not None else pure), how


def manifest(ckpt):
    with open(os.path.join(ckpt, "MANIFEST.json"), "rb") as f:
        return json.load(f)


def lz4_decompress(path):
    """`lz4 -d` (the stock CLI: it checks the frame's content checksum)."""
    r = subprocess.run(["lz4", "-d", "-c", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        die("lz4 -d %s: exit %d: %s" % (path, r.returncode, r.stderr.decode(errors="replace").strip()))
    return r.stdout


def unfilter(stored, flt):
    """FORMAT.md 2.2: shuffle stores S[k*N + j] = U[4*j + k]."""
    if flt == "none":
        return stored
    if flt != "shuffle":
        die("unknown filter %r" % flt)
    if len(stored) % 4:
        die("shuffled size %d is not a multiple of 4" % len(stored))
    n = len(stored) // 4
    out = bytearray(len(stored))
    for k in range(4):
        out[k::4] = stored[k * n:(k + 1) * n]
    return bytes(out)


def shard_bytes(ckpt, m, i):
    """(stored, unfiltered) bytes of shard i, sizes checked against the manifest."""
    s = m["shards"][i]
    path = os.path.join(ckpt, s["file"])
    if os.path.getsize(path) != s["compressed_size"]:
        die("%s: %d bytes, manifest compressed_size %d" % (path, os.path.getsize(path), s["compressed_size"]))
    stored = lz4_decompress(path)
    if len(stored) != s["uncompressed_size"]:
        die("%s: lz4 -d gave %d bytes, manifest uncompressed_size %d" % (path, len(stored), s["uncompressed_size"]))
    return stored, unfilter(stored, m["filter"])


def cmd_xxh(ckpt):
    m = manifest(ckpt)
    for i, s in enumerate(m["shards"]):
        stored, raw = shard_bytes(ckpt, m, i)
        got, how = hash64(raw)
        if "%016x" % got != s["xxh64"]:
            die("%s/%s: XXH64 of the unfiltered lz4 -d output is %016x, manifest says %s (filter %s)"
                % (ckpt, s["file"], got, s["xxh64"], m["filter"]))
        note = ""
        if m["filter"] != "none":
            other, _ = hash64(stored)
            if "%016x" % other == s["xxh64"]:
                die("%s: the shuffled bytes hash to the manifest's xxh64 too: shuffle did nothing?" % ckpt)
            note = "; the still-shuffled bytes hash to %016x" % other
        print("%s/%s, filter %s: lz4 -d %d bytes -> %d bytes, XXH64 %016x = manifest (%s)%s"
              % (short(ckpt), s["file"], m["filter"], s["compressed_size"], len(raw), got, how, note))


def read_npy_plain(path):
    """NPY 1.0 as FORMAT.md section 8 describes it: (descr, shape, data bytes)."""
    with open(path, "rb") as f:
        b = f.read()
    if b[:6] != b"\x93NUMPY" or b[6:8] != b"\x01\x00":
        die("%s: not an NPY 1.0 file (%r)" % (path, b[:8]))
    (hlen,) = struct.unpack_from("<H", b, 8)
    start = 10 + hlen
    if start % 64:
        die("%s: data starts at %d, not a multiple of 64" % (path, start))
    header = b[10:start].decode("latin1")
    if not header.endswith("\n"):
        die("%s: header does not end with a newline" % path)
    h = ast.literal_eval(header.strip())
    if h.get("fortran_order") is not False:
        die("%s: fortran_order %r" % (path, h.get("fortran_order")))
    return h["descr"], tuple(h["shape"]), b[start:]


def read_npy(path):
    """(reader, shape, little-endian float32 bytes)."""
    try:
        import numpy as np
    except ImportError:
        descr, shape, data = read_npy_plain(path)
        if descr != "<f4":
            die("%s: descr %r, expected '<f4'" % (path, descr))
        n = 1
        for d in shape:
            n *= d
        if len(data) != 4 * n:
            die("%s: %d data bytes for shape %s" % (path, len(data), shape))
        return "NPY parser", shape, data
    a = np.load(path, allow_pickle=False)
    if a.dtype != np.dtype("<f4"):
        die("%s: dtype %s, expected <f4" % (path, a.dtype))
    return "numpy %s" % np.__version__, tuple(a.shape), a.astype("<f4").tobytes(order="C")


def read_safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    (n,) = struct.unpack_from("<Q", b, 0)
    if n % 8:
        die("%s: header length %d is not a multiple of 8" % (path, n))
    head = json.loads(b[8:8 + n].decode("utf-8"))
    return head, b[8 + n:]


def cmd_export(ckpt, npydir, st_path):
    m = manifest(ckpt)
    values = {}
    for i, s in enumerate(m["shards"]):
        _, raw = shard_bytes(ckpt, m, i)
        values[i] = raw[: 4 * s["floats"]]  # the values come first (FORMAT.md 2.1)
    head, data = read_safetensors(st_path)
    meta = head.get("__metadata__", {})
    if meta.get("paramserv.step") != m["step"] or meta.get("paramserv.model") != m["model"] or \
            meta.get("paramserv.layout_hash") != m["layout_hash"]:
        die("%s: metadata %r does not match the manifest (step %s, model %s, layout %s)"
            % (st_path, meta, m["step"], m["model"], m["layout_hash"]))
    names = [v["name"] for v in m["variables"]]
    if sorted(k for k in head if k != "__metadata__") != sorted(names):
        die("%s: tensors %s, manifest variables %s" % (st_path, sorted(head), names))
    npys = sorted(f for f in os.listdir(npydir) if f.endswith(".npy"))
    if npys != sorted(n + ".npy" for n in names):
        die("%s holds %s, expected one .npy per variable %s" % (npydir, npys, names))
    reader = None
    total = 0
    end = 0
    first = None
    for v in m["variables"]:
        # The variable from its parts, each a run of a shard's values.
        want = bytearray(4 * v["count"])
        covered = 0
        for p in v["parts"]:
            src = values[p["shard"]]
            want[4 * p["start"]: 4 * (p["start"] + p["count"])] = \
                src[4 * p["shard_off"]: 4 * (p["shard_off"] + p["count"])]
            covered += p["count"]
        if covered != v["count"]:
            die("%s: parts cover %d of %d elements" % (v["name"], covered, v["count"]))
        want = bytes(want)
        shape = tuple(v["shape"])
        reader, nshape, ndata = read_npy(os.path.join(npydir, v["name"] + ".npy"))
        if nshape != shape:
            die("%s.npy: shape %s, manifest %s" % (v["name"], nshape, shape))
        if ndata != want:
            k = next(j for j in range(0, len(want), 4) if ndata[j:j + 4] != want[j:j + 4]) // 4
            die("%s.npy: element %d is %r, the shard file holds %r" % (
                v["name"], k, struct.unpack_from("<f", ndata, 4 * k)[0],
                struct.unpack_from("<f", want, 4 * k)[0]))
        t = head[v["name"]]
        b0, b1 = t["data_offsets"]
        if t["dtype"] != "F32" or tuple(t["shape"]) != shape or b0 != end or b1 - b0 != len(want):
            die("%s in %s: %r (expected F32 %s at [%d, %d))" % (v["name"], st_path, t, shape, end, end + len(want)))
        if data[b0:b1] != want:
            die("%s in %s: values differ from the shard file's" % (v["name"], st_path))
        end = b1
        total += v["count"]
        if first is None:
            first = (v["name"], struct.unpack_from("<3f", want, 0), hash64(want)[0])
    if end != len(data):
        die("%s: %d data bytes after the tensors" % (st_path, len(data) - end))
    print("%d variables, %d floats equal bit for bit in the shard files (lz4 -d, filter %s), "
          "the .npy files (read by %s) and the .safetensors (step %s); %s[:3] = %s, XXH64 %016x"
          % (len(names), total, m["filter"], reader, meta["paramserv.step"],
             first[0], ", ".join("%.9g" % x for x in first[1]), first[2]))


def main(argv):
    if len(argv) == 3 and argv[1] == "xxh":
        cmd_xxh(argv[2])
    elif len(argv) == 5 and argv[1] == "export":
        cmd_export(argv[2], argv[3], argv[4])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
