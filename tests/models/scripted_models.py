"""Modules written in Python and saved with torch.jit.save, for tests/models/torchscript_test.cpp.

    python scripted_models.py OUT_DIR

Run with the PyTorch whose release matches the LibTorch under test (a 2.11 archive need not load in
1.13): .venv/bin/python for the pip build, Debian's /usr/bin/python3 (python3-torch 1.13) for the other.
Writes OUT_DIR/<name>.pt for each module below.
"""
import os
import sys
from typing import Dict

import torch
from torch import nn


class Cnn(nn.Module):
    """fasttrain's cnn of configs/default.toml (widths [16, 32], hidden [256], batchnorm, pool_first),
    layer for layer: the same state_dict names as fasttrain's, so the C++ model can load its weights."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.MaxPool2d(2), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.MaxPool2d(2), nn.BatchNorm2d(32), nn.ReLU(inplace=True))
        self.classifier = nn.Sequential(nn.Linear(32 * 7 * 7, 256), nn.ReLU(inplace=True), nn.Linear(256, classes))

    def forward(self, images):
        return self.classifier(self.features(images).flatten(1))


class ScaledRegressor(nn.Module):
    """Two inputs: features [B, 6] and a per-sample scale [B, 1] (batch.at("scale"))."""

    def __init__(self, dropout: float = 0.3):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 1))

    def forward(self, x, scale):
        return self.layers(x) * scale


class Heads(nn.Module):
    """Named outputs: Dict[str, Tensor]."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(6, 8)
        self.value = nn.Linear(8, 1)

    def forward(self, x) -> Dict[str, torch.Tensor]:
        h = torch.relu(self.trunk(x))
        return {"prediction": self.value(h), "code": h}


class NoForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(6, 2)

    @torch.jit.export
    def encode(self, x):
        return self.encoder(x)


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    modules = {
        "cnn": torch.jit.script(Cnn()),
        "cnn_traced": torch.jit.trace(Cnn().eval(), torch.randn(2, 1, 28, 28)),
        "cnn_7_classes": torch.jit.script(Cnn(classes=7)),
        "regressor": torch.jit.script(ScaledRegressor()),
        "regressor_plain": torch.jit.script(ScaledRegressor(dropout=0.0)),
        "heads": torch.jit.script(Heads()),
        "no_forward": torch.jit.script(NoForward()),
    }
    for name, module in modules.items():
        torch.jit.save(module, os.path.join(out, name + ".pt"))


if __name__ == "__main__":
    main(sys.argv[1])
