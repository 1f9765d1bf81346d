#!/usr/bin/python3
"""Evaluate a `paramserv ckpt export --format npy` directory in PyTorch, from
what the export holds alone: model.json (the model file, src/nn/MODELFILE.md)
says the layers, normalization.json how an image's bytes become the input,
and <layer>.weight.npy / <layer>.bias.npy the values.  Prints the mean loss
and the accuracy on the Fashion-MNIST test set (t10k), for
tests/integration/train-ckpt.sh, which compares them with what `paramserv
train` and `paramserv eval` printed.

  model_torch_eval.py NPYDIR DATADIR
"""
import gzip
import json
import os
import sys

import numpy as np
import torch
from torch import nn


def idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def split(data, name):
    """The plain file when both exist, as paramserv reads them."""
    plain = os.path.join(data, name)
    return idx(plain if os.path.exists(plain) else plain + ".gz")


class Flat(nn.Module):
    """A dense layer takes c*h*w values in channel-major order, with or
    without a flatten before it (MODELFILE.md)."""

    def forward(self, x):
        return x.reshape(len(x), -1)


def build(model, npy):
    layers, used = [], []
    shape = list(model["input"])
    for layer in model["layers"]:
        t = layer["type"]
        if t in ("dense", "conv2d"):
            w = torch.from_numpy(np.load(os.path.join(npy, layer["name"] + ".weight.npy")))
            b = torch.from_numpy(np.load(os.path.join(npy, layer["name"] + ".bias.npy")))
            used += [layer["name"] + ".weight", layer["name"] + ".bias"]
        if t == "dense":
            lin = nn.Linear(w.shape[1], w.shape[0])
            lin.weight.data.copy_(w)
            lin.bias.data.copy_(b)
            layers += [Flat(), lin]
        elif t == "conv2d":
            k, s, p = layer["kernel"], layer.get("stride", 1), layer.get("padding", 0)
            conv = nn.Conv2d(w.shape[1], w.shape[0], k, stride=s, padding=p)
            conv.weight.data.copy_(w)
            conv.bias.data.copy_(b)
            layers.append(conv)
        elif t == "maxpool":
            k = layer["kernel"]
            layers.append(nn.MaxPool2d(k, stride=layer.get("stride", k), padding=layer.get("padding", 0)))
        elif t == "relu":
            layers.append(nn.ReLU())
        elif t == "flatten":
            layers.append(Flat())
        elif t == "dropout":
            layers.append(nn.Dropout2d(layer["p"]) if layer.get("channels") else nn.Dropout(layer["p"]))
        elif t == "log_softmax":
            layers += [Flat(), nn.LogSoftmax(dim=1)]
        else:
            sys.exit("unknown layer type %r" % t)
    exported = sorted(f[:-4] for f in os.listdir(npy) if f.endswith(".npy"))
    if exported != sorted(used):
        sys.exit("the export holds %s, model.json names %s" % (exported, sorted(used)))
    return nn.Sequential(*layers).eval(), shape, len(used)


def main():
    npy, data = sys.argv[1:3]
    model = json.load(open(os.path.join(npy, "model.json")))
    norm = json.load(open(os.path.join(npy, "normalization.json")))
    net, shape, n = build(model, npy)
    images = split(data, "t10k-images-idx3-ubyte").astype(np.float32)
    labels = torch.from_numpy(split(data, "t10k-labels-idx1-ubyte").astype(np.int64))
    x = torch.from_numpy((images / norm["divide"] - norm["mean"]) / norm["std"])
    x = x.reshape([len(x)] + shape).float()
    torch.set_num_threads(2)
    with torch.no_grad():
        out = torch.cat([net(x[i:i + 1000]) for i in range(0, len(x), 1000)])
    loss = nn.functional.nll_loss(out, labels).item()
    acc = (out.argmax(dim=1) == labels).double().mean().item()
    print("torch %s: %d arrays, inputs (b / %g - %g) / %g: test_loss %.6f test_acc %.4f"
          % (torch.__version__, n, norm["divide"], norm["mean"], norm["std"], loss, acc))


main()
