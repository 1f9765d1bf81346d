#!/usr/bin/python3
"""PyTorch side of scripts/bench-engine.

Trains the same models as paramserv (mlp, cnn) on Fashion-MNIST held in memory
as preloaded tensors (no DataLoader) and prints one machine-readable line:

    torch samples/s X

With --epochs E --eval it instead trains E full epochs and prints the test
accuracy after each (a check that the model really learns).

Run it with OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 in the environment (the
driver does): torch uses its own intra-op pool of --threads threads and one
inter-op thread; a second BLAS pool fighting over the same cores makes it
several times slower.
"""

import argparse
import ctypes
import ctypes.util
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn

MEAN, STD = 0.2860, 0.3530
DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"


def die(msg):
    print("bench_engine_torch: " + msg, file=sys.stderr)
    sys.exit(1)


def read_idx(path, want_ndim):
    """An unsigned-byte IDX file (gzipped or plain) as a numpy array."""
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path = path + ".gz"
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        die("cannot read %s: %s" % (path, e))
    if len(buf) < 4:
        die("%s: too short for an IDX header" % path)
    zero, dtype, ndim = struct.unpack(">HBB", buf[:4])
    if zero != 0 or dtype != 0x08 or ndim != want_ndim:
        die("%s: expected an unsigned-byte IDX with %d dims, found type 0x%02x ndim %d"
            % (path, want_ndim, dtype, ndim))
    dims = struct.unpack(">" + "I" * ndim, buf[4:4 + 4 * ndim])
    off = 4 + 4 * ndim
    count = int(np.prod(dims))
    if len(buf) - off < count:
        die("%s: truncated (%d bytes of data, %d expected)" % (path, len(buf) - off, count))
    return np.frombuffer(buf, dtype=np.uint8, count=count, offset=off).reshape(dims)


def load_split(data_dir, split):
    images = read_idx(os.path.join(data_dir, split + "-images-idx3-ubyte.gz"), 3)
    labels = read_idx(os.path.join(data_dir, split + "-labels-idx1-ubyte.gz"), 1)
    if images.shape[0] != labels.shape[0]:
        die("%s split: %d images but %d labels" % (split, images.shape[0], labels.shape[0]))
    x = (images.astype(np.float32) / 255.0 - MEAN) / STD
    x = torch.from_numpy(np.ascontiguousarray(x)).unsqueeze(1)  # N x 1 x 28 x 28
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


class Net(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        if kind == "mlp":
            self.body = nn.Sequential(
                nn.Flatten(),
                nn.Linear(784, 256), nn.ReLU(),
                nn.Linear(256, 128), nn.ReLU(),
                nn.Linear(128, 10),
                nn.LogSoftmax(dim=1),
            )
        elif kind == "cnn":
            self.body = nn.Sequential(
                # As paramserv's cnn: whole-channel dropout with drop
                # probabilities 0.5 and 0.25 (the example's keep
                # probabilities 0.5 and 0.75), see src/nn/model.c.
                nn.Conv2d(1, 32, 3),        # 32 x 26 x 26
                nn.Dropout2d(p=0.5),
                nn.ReLU(),
                nn.Conv2d(32, 64, 3),       # 64 x 24 x 24
                nn.Dropout2d(p=0.25),
                nn.MaxPool2d(2),            # 64 x 12 x 12
                nn.Flatten(),               # 9216
                nn.Linear(9216, 128), nn.ReLU(),
                nn.Linear(128, 20), nn.ReLU(),
                nn.Linear(20, 10),
                nn.LogSoftmax(dim=1),
            )
        else:
            raise ValueError(kind)

    def forward(self, x):
        return self.body(x)


def make_optimizer(name, params, lr):
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "nesterov":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, initial_accumulator_value=0.1, eps=1e-10)
    die("unknown optimizer %r (adam|sgd|momentum|nesterov|adagrad)" % name)


class Batches:
    """Full batches of indices taken in order from a permutation of the
    training set; a fresh permutation each time one is used up (a batch that
    straddles the end takes its rest from the next one, so every batch is full,
    as paramserv counts samples = steps * batch)."""

    def __init__(self, n, batch, gen):
        self.n, self.batch, self.gen = n, batch, gen
        self.perm = torch.randperm(n, generator=gen)
        self.pos = 0

    def next(self):
        b = self.batch
        if self.pos + b <= self.n:
            idx = self.perm[self.pos:self.pos + b]
            self.pos += b
            return idx
        head = self.perm[self.pos:]
        self.perm = torch.randperm(self.n, generator=self.gen)
        self.pos = b - head.numel()
        return torch.cat([head, self.perm[:self.pos]])


def train_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    out = model(x)
    loss = nn.functional.nll_loss(out, y)
    loss.backward()
    opt.step()
    return loss.detach()


def evaluate(model, x, y, chunk=1000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], chunk):
            pred = model(x[i:i + chunk]).argmax(dim=1)
            correct += int((pred == y[i:i + chunk]).sum())
    model.train()
    return correct / x.shape[0]


def openblas_info():
    """OpenBLAS' build config and core, if an OpenBLAS can be loaded."""
    for name in ("libopenblas.so.0", ctypes.util.find_library("openblas"), "libblas.so.3"):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            lib.openblas_get_config.restype = ctypes.c_char_p
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return "%s (core %s)" % (lib.openblas_get_config().decode(),
                                     lib.openblas_get_corename().decode())
        except (OSError, AttributeError):
            continue
    return "not found"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps timed (default: mlp 469, cnn 60)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--epochs", type=int, default=0,
                    help="train this many full epochs instead of --steps")
    ap.add_argument("--eval", action="store_true",
                    help="with --epochs: print the test accuracy after each epoch")
    ap.add_argument("--info", action="store_true",
                    help="print torch version, thread settings and OpenBLAS, then exit")
    a = ap.parse_args()

    if a.batch < 1 or a.threads < 1 or a.warmup < 0:
        die("--batch and --threads must be >= 1, --warmup >= 0")
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)

    if a.info:
        print("torch %s, numpy %s, intra-op threads %d, inter-op threads %d"
              % (torch.__version__, np.__version__, torch.get_num_threads(),
                 torch.get_num_interop_threads()))
        print("openblas %s" % openblas_info())
        return

    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    x_train, y_train = load_split(a.data, "train")
    if a.model == "mlp":
        x_train = x_train.reshape(x_train.shape[0], -1).contiguous()

    model = Net(a.model)
    model.train()
    opt = make_optimizer(a.optimizer, model.parameters(), a.lr)

    if a.epochs > 0:
        x_test, y_test = load_split(a.data, "t10k")
        if a.model == "mlp":
            x_test = x_test.reshape(x_test.shape[0], -1).contiguous()
        n = x_train.shape[0]
        for epoch in range(1, a.epochs + 1):
            perm = torch.randperm(n, generator=gen)
            t0 = time.perf_counter()
            loss_sum, steps = 0.0, 0
            for i in range(0, n, a.batch):
                idx = perm[i:i + a.batch]
                loss_sum += float(train_step(model, opt, x_train[idx], y_train[idx]))
                steps += 1
            dt = time.perf_counter() - t0
            line = "epoch %d loss %.4f seconds %.2f samples/s %.1f" % (
                epoch, loss_sum / steps, dt, n / dt)
            if a.eval:
                line += " test_acc %.4f" % evaluate(model, x_test, y_test)
            print(line, flush=True)
        return

    steps = a.steps if a.steps is not None else (469 if a.model == "mlp" else 60)
    if steps < 1:
        die("--steps must be >= 1")
    batches = Batches(x_train.shape[0], a.batch, gen)
    for _ in range(a.warmup):
        idx = batches.next()
        train_step(model, opt, x_train[idx], y_train[idx])
    t0 = time.perf_counter()
    for _ in range(steps):
        idx = batches.next()
        loss = train_step(model, opt, x_train[idx], y_train[idx])
    dt = time.perf_counter() - t0
    samples = steps * a.batch
    if not torch.isfinite(loss):
        die("loss is not finite after %d steps" % steps)
    print("torch steps %d samples %d seconds %.3f loss %.4f" % (steps, samples, dt, float(loss)))
    print("torch samples/s %.1f" % (samples / dt), flush=True)


if __name__ == "__main__":
    main()
