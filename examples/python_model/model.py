"""A network defined in PyTorch, for fasttrain to train from C++ (examples/python_model/README.md).

    python model.py net.pt     # writes the scripted module

Script it with the PyTorch whose release matches the LibTorch fasttrain was built with: an archive
from a newer PyTorch need not load in an older LibTorch.
"""
import sys

import torch
from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = torch.relu(self.norm1(self.conv1(x)))
        return torch.relu(x + self.norm2(self.conv2(y)))


class Net(nn.Module):
    """Fashion-MNIST's 28x28 grey images to 10 class logits: a stem, a residual block at 14x14, a
    strided conv to 7x7, global average pooling and a linear classifier."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.block = ResidualBlock(32)
        self.down = nn.Sequential(nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU())
        self.head = nn.Linear(64, classes)

    def forward(self, images):
        x = self.down(self.block(self.stem(images)))
        return self.head(x.mean(dim=(2, 3)))


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(Net()), sys.argv[1] if len(sys.argv) > 1 else "net.pt")
