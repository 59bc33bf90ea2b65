#!/usr/bin/env python3
"""Where the peer's GPT step goes: bench/peer_gpt.py's model (configs/gpt_text.toml's sizes: L=4,
H=4, C=128, T=128, batch 32) timed around forward + loss, backward, and clipping + AdamW, on one
fixed random batch, --steps steps after --warmup; prints ms per step of each. The counterpart is
fasttrain's step_phases_s in summary.json (forward, backward, optimizer).

  .venv/bin/python bench/peer_gpt_phases.py --threads 1
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_gpt  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = peer_gpt.GPT(4, 4, 128, 128, 0.0, False)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (32, 128))
    y = torch.randint(0, 256, (32, 128))
    forward = backward = step = 0.0
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y.reshape(-1))
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        t3 = time.perf_counter()
        if i >= args.warmup:
            forward, backward, step = forward + t1 - t0, backward + t2 - t1, step + t3 - t2
    n = args.steps
    print(f"peer per step: forward {1000 * forward / n:.1f} ms, backward {1000 * backward / n:.1f} ms, "
          f"clip + AdamW {1000 * step / n:.1f} ms")


if __name__ == "__main__":
    main()
