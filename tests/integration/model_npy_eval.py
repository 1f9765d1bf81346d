#!/usr/bin/python3
"""Evaluate a model file's exported weights in numpy, for
tests/integration/model-file.sh: the .npy files of `paramserv ckpt export`
are loaded by the layer names of the model file (src/nn/MODELFILE.md), the
network is run forward on the Fashion-MNIST test set as the file says
(conv2d with stride and padding, maxpool, relu, flatten, dense; dropout is
off at evaluation), and the accuracy printed.  That it matches the chief's
own evaluation of the same checkpoint shows the export's names, shapes and
order are what the file declares.

  model_npy_eval.py MODEL.json NPYDIR DATADIR
"""
import gzip
import json
import os
import sys

import numpy as np

MEAN, STD = 0.2860, 0.3530


def idx(path):
    with gzip.open(path) as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def windows(x, k, stride, pad, fill):
    """x [n, c, h, w] -> [n, c, oh, ow, k, k] views of every window."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    n, c, h, w = x.shape
    oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
    s = x.strides
    return np.lib.stride_tricks.as_strided(
        x, (n, c, oh, ow, k, k), (s[0], s[1], s[2] * stride, s[3] * stride, s[2], s[3]))


def main():
    model_path, npy, data = sys.argv[1:4]
    model = json.load(open(model_path))
    x = (idx(os.path.join(data, "t10k-images-idx3-ubyte.gz")).astype(np.float32) / 255 - MEAN) / STD
    y = idx(os.path.join(data, "t10k-labels-idx1-ubyte.gz"))
    x = x.reshape([len(x)] + model["input"])
    names = []
    for layer in model["layers"]:
        t = layer["type"]
        if t in ("dense", "conv2d"):
            w = np.load(os.path.join(npy, layer["name"] + ".weight.npy"))
            b = np.load(os.path.join(npy, layer["name"] + ".bias.npy"))
            names += [layer["name"] + ".weight", layer["name"] + ".bias"]
        if t == "dense":
            x = x.reshape(len(x), -1) @ w.T + b
        elif t == "conv2d":
            win = windows(x, layer["kernel"], layer.get("stride", 1), layer.get("padding", 0), 0.0)
            x = np.einsum("ncijkl,ockl->noij", win, w, optimize=True) + b[None, :, None, None]
        elif t == "maxpool":
            k = layer["kernel"]
            x = windows(x, k, layer.get("stride", k), layer.get("padding", 0), -np.inf).max(axis=(4, 5))
        elif t == "relu":
            x = np.maximum(x, 0)
        elif t == "flatten":
            x = x.reshape(len(x), -1)
    exported = sorted(f[:-4] for f in os.listdir(npy) if f.endswith(".npy"))
    if exported != sorted(names):
        sys.exit(f"exported {exported}, the model file names {sorted(names)}")
    acc = float((x.reshape(len(x), -1).argmax(axis=1) == y).mean())
    print(f"numpy: {len(names)} arrays by the layers' names, test accuracy {acc:.4f}")


main()
