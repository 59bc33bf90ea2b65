#!/usr/bin/env python3
"""Loads a fasttrain final/model.safetensors into the PyTorch peer model and evaluates it.

The peer is the same network written in plain torch.nn (built from the run's config.toml), so this
checks that the weights file is standard safetensors with PyTorch's state_dict names: the
`safetensors` package opens it, every tensor maps onto a parameter or buffer (strict=True), and the
test accuracy equals fasttrain's.

  .venv/bin/python tests/interop/safetensors_peer.py RUN_DIR/config.toml RUN_DIR/final/model.safetensors
prints {"test_accuracy": ..., "test_loss": ..., "samples": ..., "torch": VERSION} like `fasttrain eval`.
"""
import gzip
import json
import os
import struct
import sys
import tomllib

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

def read_idx(directory, stem):
    for name in (stem, stem + ".gz"):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                data = f.read()
            dims = data[3]
            shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
            return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)
    raise SystemExit(f"error: no {stem} in {directory}")


def head(config, features):
    """fasttrain's classifier_head: for each hidden size [Dropout] Linear ReLU, then [Dropout] Linear."""
    layers, dropout = [], config["model"]["dropout"]
    for hidden in config["model"]["hidden"]:
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        layers += [nn.Linear(features, hidden), nn.ReLU(inplace=True)]
        features = hidden
    if dropout > 0:
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(features, 10))
    return nn.Sequential(*layers)


class Mlp(nn.Module):
    def __init__(self, config, channels, height, width):
        super().__init__()
        self.layers = head(config, channels * height * width)

    def forward(self, x):
        return self.layers(x.flatten(1))


class Cnn(nn.Module):
    def __init__(self, config, channels, height, width):
        super().__init__()
        model, stages = config["model"], []
        for stage_width in model["widths"]:
            stages.append(nn.Conv2d(channels, stage_width, 3, padding=1, bias=not model["batchnorm"] or model.get("bias_before_norm", False)))
            if model["pool_first"]:
                stages.append(nn.MaxPool2d(2))
            if model["batchnorm"]:
                stages.append(nn.BatchNorm2d(stage_width))
            stages.append(nn.ReLU(inplace=True))
            if not model["pool_first"]:
                stages.append(nn.MaxPool2d(2))
            channels, height, width = stage_width, height // 2, width // 2
        self.features = nn.Sequential(*stages)
        self.classifier = head(config, channels * height * width)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1], "rb") as f:
        config = tomllib.load(f)
    data = config["data"]
    directory = data["path"] or "/usr/share/datasets/" + data["dataset"]
    train = read_idx(directory, "train-images-idx3-ubyte")
    if data["train_limit"] > 0:
        train = train[:data["train_limit"]]
    images = read_idx(directory, "t10k-images-idx3-ubyte").unsqueeze(1)   # [N, 1, 28, 28] uint8
    labels = read_idx(directory, "t10k-labels-idx1-ubyte").long()

    # The normalisation fasttrain uses: the training set's mean and population std, then per pixel
    # in float32 (v / 255 - mean) / std, as torchvision's ToTensor + Normalize compute it.
    mean = std = None
    if data["normalize"]:
        pixels = train.double() / 255.0
        mean = torch.tensor(pixels.mean().item(), dtype=torch.float32)
        std = torch.tensor(pixels.std(unbiased=False).item(), dtype=torch.float32)
    else:
        mean, std = torch.tensor(0.0), torch.tensor(1.0)
    inputs = ((images.float() / 255.0) - mean) / std

    kind = {"mlp": Mlp, "cnn": Cnn}.get(config["model"]["name"])
    if kind is None:
        raise SystemExit(f"error: the peer has no {config['model']['name']} model (mlp and cnn only)")
    model = kind(config, 1, 28, 28)
    model.load_state_dict(load_file(sys.argv[2]), strict=True)
    model.eval()
    torch.set_num_threads(1)
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for begin in range(0, len(labels), 1000):
            logits = model(inputs[begin:begin + 1000])
            target = labels[begin:begin + 1000]
            loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
            correct += (logits.argmax(1) == target).sum().item()
    print(json.dumps({"test_accuracy": correct / len(labels), "test_loss": loss_sum / len(labels),
                      "samples": len(labels), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
