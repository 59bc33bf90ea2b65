#!/usr/bin/env python3
"""Peer of bench/loader_bench.cpp: the same pipeline with torch.utils.data.DataLoader.

Fashion-MNIST train set, batch 256, per-sample pad(2) + random 28x28 crop, horizontal flip (p=0.5),
ToTensor-style scaling and normalisation, all with torch ops on each sample as torchvision's
RandomCrop / RandomHorizontalFlip / ToTensor / Normalize do (torchvision itself is not installed).
Prints one JSON line per worker count.

Run with .venv/bin/python (PyTorch 2.11, scripts/install-deps) or /usr/bin/python3 (Debian's 1.13):
    .venv/bin/python bench/loader_peer.py [--data DIR] [--workers 0,2] [--epochs 1] [--batch-size 256]
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

MEAN = 0.2860
STD = 0.3530


def read_idx(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    assert data[0] == 0 and data[1] == 0 and data[2] == 0x08, f"{path}: not an unsigned-byte IDX file"
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(rank)]
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)
    return torch.from_numpy(array.copy())


def find(directory, name):
    for candidate in (name, name + ".gz"):
        path = os.path.join(directory, candidate)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{name}(.gz) not in {directory}")


class FashionMnist(Dataset):
    def __init__(self, directory, padding=2):
        self.images = read_idx(find(directory, "train-images-idx3-ubyte")).unsqueeze(1)  # [N,1,28,28] uint8
        self.labels = read_idx(find(directory, "train-labels-idx1-ubyte")).long()
        self.padding = padding

    def __len__(self):
        return self.images.shape[0]

    def __getitem__(self, index):
        image = self.images[index]  # [1, 28, 28] uint8
        h, w = image.shape[1], image.shape[2]
        # RandomCrop(28, padding=2): zero-pad, then a random window of the original size.
        padded = F.pad(image, (self.padding,) * 4)
        top = int(torch.randint(0, 2 * self.padding + 1, (1,)).item())
        left = int(torch.randint(0, 2 * self.padding + 1, (1,)).item())
        image = padded[:, top : top + h, left : left + w]
        # RandomHorizontalFlip(0.5).
        if torch.rand(1).item() < 0.5:
            image = image.flip(-1)
        # ToTensor + Normalize.
        image = image.float().div(255)
        image = image.sub(MEAN).div(STD)
        return image, self.labels[index]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dataset = FashionMnist(args.data)
    for workers in [int(w) for w in args.workers.split(",")]:
        torch.manual_seed(args.seed)
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=False,
                            num_workers=workers, persistent_workers=workers > 0)
        samples = 0
        checksum = 0.0
        begin = time.perf_counter()
        for _ in range(args.epochs):
            for inputs, targets in loader:
                samples += targets.shape[0]
                checksum += float(inputs[0, 0, 0, 0])
        seconds = time.perf_counter() - begin
        print(json.dumps({"bench": "loader", "impl": "torch", "torch": torch.__version__, "workers": workers,
                          "batch_size": args.batch_size, "epochs": args.epochs, "samples": samples,
                          "seconds": round(seconds, 4), "samples_per_s": round(samples / seconds, 1),
                          "checksum": round(checksum, 4)}), flush=True)
        del loader


if __name__ == "__main__":
    main()
