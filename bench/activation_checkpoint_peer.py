#!/usr/bin/env python3
"""The Python PyTorch peer of fasttrain's memory.checkpoint: the same small ResNet (stem conv-BN-ReLU,
basic blocks conv-BN-ReLU-conv-BN + shortcut, ReLU; stages after the first halve the resolution;
global average pool, linear head) trained with AdamW on random 28x28 batches, with every residual
block under torch.utils.checkpoint (use_reentrant=True, like fasttrain's) or none. Prints one JSON
line: the median milliseconds per step of each. PyTorch's CPU allocator keeps no statistics, so
the peer's memory is not measured.

  .venv/bin/python bench/activation_checkpoint_peer.py --widths 32 64 --blocks 8 --batch 128 --threads 1
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def conv3x3(cin, cout, stride):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(cin, cout, stride), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = conv3x3(cout, cout, 1), nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        y += self.shortcut(x) if self.shortcut is not None else x
        return F.relu_(y)


class ResNet(nn.Module):
    def __init__(self, widths, blocks, checkpointed):
        super().__init__()
        self.stem = nn.Sequential(conv3x3(1, widths[0], 1), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
        layers, channels = [], widths[0]
        for stage, width in enumerate(widths):
            for block in range(blocks):
                layers.append(BasicBlock(channels, width, 2 if stage > 0 and block == 0 else 1))
                channels = width
        self.stages = nn.ModuleList(layers)
        self.head = nn.Linear(channels, 10)
        self.checkpointed = checkpointed

    def forward(self, x):
        x = self.stem(x)
        for block in self.stages:
            x = checkpoint(block, x, use_reentrant=True) if self.checkpointed else block(x)
        return self.head(x.mean((2, 3)))


def ms_per_step(opts, checkpointed):
    torch.manual_seed(0)
    model = ResNet(opts.widths, opts.blocks, checkpointed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(opts.batch, 1, 28, 28), torch.randint(0, 10, (opts.batch,))
    times = []
    for step in range(opts.steps):
        start = time.perf_counter()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= 2:  # the first steps allocate the optimizer state and warm the kernels
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--widths", type=int, nargs="+", default=[32, 64])
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    opts = p.parse_args()
    torch.set_num_threads(opts.threads)
    none, blocks = ms_per_step(opts, False), ms_per_step(opts, True)
    print(json.dumps({"ms_per_step_none": round(none, 2), "ms_per_step_blocks": round(blocks, 2),
                      "step_time_cost": round(blocks / none - 1, 4), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
