#!/usr/bin/env python3
"""The Python PyTorch peer of a fasttrain checkpoint: the default config's model and AdamW state
saved with torch.save the way a careful PyTorch script does it (temporary file, fsync, rename,
fsync of the directory), timed over --saves saves. Prints one JSON line.

  .venv/bin/python bench/checkpoint_peer.py [--saves 20] [--threads 2]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tomllib

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "interop"))
from safetensors_peer import Cnn  # noqa: E402  the same network, module for module


def durable_save(state, path):
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, "." + os.path.basename(path) + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--saves", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    opts = p.parse_args()
    torch.set_num_threads(opts.threads)
    with open(os.path.join(ROOT, "configs", "default.toml"), "rb") as f:
        config = tomllib.load(f)
    config["model"].setdefault("dropout", 0.0)
    model = Cnn(config, 1, 28, 28).to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=5e-4)
    x, y = torch.randn(128, 1, 28, 28).to(memory_format=torch.channels_last), torch.randint(0, 10, (128,))
    F.cross_entropy(model(x), y).backward()
    optimizer.step()  # the moments exist, as in a checkpoint taken mid-run

    times = []
    with tempfile.TemporaryDirectory() as directory:
        for i in range(opts.saves):
            start = time.perf_counter()
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "rng": torch.get_rng_state(), "step": i}
            durable_save(state, os.path.join(directory, f"step-{i}.pt"))
            times.append(time.perf_counter() - start)
        size = os.path.getsize(os.path.join(directory, f"step-{opts.saves - 1}.pt"))
    print(json.dumps({"save_ms_median": round(1000 * statistics.median(times), 2),
                      "save_ms_all": [round(1000 * t, 2) for t in times], "bytes": size,
                      "parameters": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    main()
