#!/usr/bin/env python3
"""Python PyTorch peer: the classic Fashion-MNIST CNN, written the standard way.

Model: conv3x3(1->32,pad 1) ReLU maxpool2, conv3x3(32->64,pad 1) ReLU maxpool2, flatten,
fc(64*7*7 -> 128) ReLU, fc(128 -> 10). Adam lr 1e-3, batch 64, shuffle, no augmentation,
inputs normalized with the train-set mean/std. torch.utils.data.DataLoader over a TensorDataset.

Timing (matches how fasttrain measures):
  - epoch train seconds: the pure training loop of one epoch, no evaluation.
  - time_to_target_s: wall time from the start of training (data already loaded into memory)
    until the end of the first evaluation whose test accuracy >= --target-accuracy.
    Evaluation time IS included in this clock (evaluations happen inside the run).

Throughput (train_samples_per_s in the JSON): samples per second of pure training over the
optimizer steps after the first --warmup-steps (5), evaluation excluded; _all_steps counts every step.
--max-steps N stops after N optimizer steps.

Distributed (started with WORLD_SIZE > 1 in the environment, e.g. by `fasttrain launch --nproc 2 --` or
torchrun): torch.distributed with backend gloo, init_method env://; a DistributedSampler(shuffle=True,
seed) shards the training set, --batch-size is per rank, the model is wrapped in
DDP(bucket_cap_mb=--bucket-cap-mb); --zero 1 (or 2) swaps Adam for ZeroRedundancyOptimizer(Adam)
(PyTorch has only stage 1, so --zero 2 runs the same and says so). No evaluation in this mode. Only
rank 0 prints; throughputs are global (every rank's samples over rank 0's clock). The JSON adds
world_size, ddp_logging (the avg_* entries of DDP's _get_ddp_logging_data(), nanoseconds),
optimizer_state_bytes (rank 0's; _per_rank: every rank's) and gradient_bytes.

--compile: torch.compile(model) (PyTorch 2.x), the same loop around it.

Run with the pinned environment's Python (scripts/install-deps: PyTorch 2.11), or /usr/bin/python3
(Debian's python3-torch, 1.13):
  .venv/bin/python bench/peer_classic.py --epochs 5 --json [--compile]
  fasttrain launch --nproc 2 -- .venv/bin/python bench/peer_classic.py --threads 1 --max-steps 300 \
      --target-accuracy 1.1 --json [--zero 1]
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

DATA_DIR = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


def read_idx_images(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[4:8], "big")
    rows = int.from_bytes(data[8:12], "big")
    cols = int.from_bytes(data[12:16], "big")
    return np.frombuffer(data, dtype=np.uint8, offset=16).reshape(n, 1, rows, cols)


def read_idx_labels(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    return np.frombuffer(data, dtype=np.uint8, offset=8).astype(np.int64)


class ClassicCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    correct = 0
    total = 0
    for x, y in loader:
        pred = model(x).argmax(1)
        correct += (pred == y).sum().item()
        total += y.numel()
    model.train()
    return correct / total


def state_bytes(optimizer):
    """Bytes of every tensor in an optimizer's state (Adam: exp_avg, exp_avg_sq, step)."""
    return sum(v.numel() * v.element_size()
               for per_param in optimizer.state.values() for v in per_param.values()
               if torch.is_tensor(v))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target-accuracy", type=float, default=0.91)
    p.add_argument("--eval-every-steps", type=int, default=0,
                   help="also evaluate every K training steps (0: only at epoch ends)")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--stop-at-target", action="store_true",
                   help="stop training as soon as the target accuracy is reached")
    p.add_argument("--max-steps", type=int, default=0, help="stop after N optimizer steps (0: no limit)")
    p.add_argument("--warmup-steps", type=int, default=5,
                   help="steps left out of train_samples_per_s (the first steps pay for allocations)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="distributed: DDP's bucket_cap_mb")
    p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2],
                   help="distributed: 1 or 2 = ZeroRedundancyOptimizer (PyTorch has only stage 1)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (PyTorch 2.x; its compilation counts in the first steps, "
                        "so train_samples_per_s, which leaves out the warm-up steps, is the steady rate)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.compile and not hasattr(torch, "compile"):
        p.error(f"--compile needs PyTorch 2.x; this is torch {torch.__version__}")

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    distributed = world_size > 1
    rank = 0
    if distributed:
        dist.init_process_group(backend="gloo", init_method="env://")
        rank = dist.get_rank()
    elif args.zero:
        p.error("--zero needs a distributed run (WORLD_SIZE > 1)")
    talk = rank == 0  # only rank 0 prints

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    wall0 = time.perf_counter()

    # ---- data into memory -------------------------------------------------------------
    xtr = read_idx_images(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz"))
    ytr = read_idx_labels(os.path.join(DATA_DIR, "train-labels-idx1-ubyte.gz"))
    xte = read_idx_images(os.path.join(DATA_DIR, "t10k-images-idx3-ubyte.gz"))
    yte = read_idx_labels(os.path.join(DATA_DIR, "t10k-labels-idx1-ubyte.gz"))
    xtr = torch.from_numpy(xtr.astype(np.float32) / 255.0)
    xte = torch.from_numpy(xte.astype(np.float32) / 255.0)
    mean, std = xtr.mean().item(), xtr.std().item()
    xtr = (xtr - mean) / std
    xte = (xte - mean) / std
    train_ds = TensorDataset(xtr, torch.from_numpy(ytr))
    test_ds = TensorDataset(xte, torch.from_numpy(yte))
    sampler = None
    if distributed:
        sampler = DistributedSampler(train_ds, shuffle=True, seed=args.seed, drop_last=False)
        train_loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler,
                                  num_workers=args.workers, drop_last=False)
    else:
        train_loader = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True,
                                  num_workers=args.workers, drop_last=False)
    test_loader = DataLoader(test_ds, batch_size=1000, shuffle=False, num_workers=args.workers)

    model = ClassicCNN()
    if args.compile:
        model = torch.compile(model)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    if args.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    # ---- training ---------------------------------------------------------------------
    epoch_seconds, samples_per_s, evals = [], [], []
    time_to_target = None
    step = 0
    train_start = time.perf_counter()
    train_time_total = 0.0  # pure training time, evaluation excluded

    # Throughput clock: from the end of step --warmup-steps to the end of the last step, less the
    # evaluations in between (the clock's mark moves past each evaluation).
    warmup = args.warmup_steps if args.max_steps == 0 or args.max_steps > args.warmup_steps else 0
    mark = train_start if warmup == 0 else None
    measured_s = 0.0
    measured_samples = 0
    all_samples = 0

    def do_eval(epoch_frac):
        nonlocal time_to_target
        acc = evaluate(model, test_loader)
        elapsed = time.perf_counter() - train_start
        evals.append({"epoch": round(epoch_frac, 4), "step": step, "test_accuracy": acc,
                      "elapsed_s": round(elapsed, 3)})
        if time_to_target is None and acc >= args.target_accuracy:
            time_to_target = elapsed
        if not args.json and talk:
            print(f"  eval epoch {epoch_frac:.3f} step {step}: test acc {acc:.4f} "
                  f"(t={elapsed:.1f}s)", flush=True)
        return acc

    steps_per_epoch = len(train_loader)
    stop = False
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        t0 = time.perf_counter()
        eval_seconds = 0.0
        seen = 0
        for i, (x, y) in enumerate(train_loader):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            seen += y.numel()
            all_samples += y.numel()
            if mark is not None:
                now = time.perf_counter()
                measured_s += now - mark
                measured_samples += y.numel()
                mark = now
            elif step == warmup:
                mark = time.perf_counter()
            if args.max_steps and step >= args.max_steps:
                stop = True
                break
            if (not distributed and args.eval_every_steps and step % args.eval_every_steps == 0
                    and i + 1 < steps_per_epoch):
                te = time.perf_counter()
                do_eval(epoch + (i + 1) / steps_per_epoch)
                eval_seconds += time.perf_counter() - te
                if mark is not None:
                    mark = time.perf_counter()
                if args.stop_at_target and time_to_target is not None:
                    stop = True
                    break
        dt = time.perf_counter() - t0 - eval_seconds
        train_time_total += dt
        epoch_seconds.append(round(dt, 3))
        samples_per_s.append(round(seen * world_size / dt, 1))
        if not args.json and talk:
            print(f"epoch {epoch + 1}: train {dt:.2f}s ({seen * world_size / dt:.0f} samples/s), "
                  f"last loss {loss.item():.4f}", flush=True)
        if stop and (distributed or args.max_steps == 0 or step < args.max_steps):
            break  # stopped at the target (or a distributed run at --max-steps): no further evaluation
        if distributed:
            continue  # no evaluation in distributed runs
        do_eval(epoch + 1)
        if mark is not None:
            mark = time.perf_counter()
        if stop or (args.stop_at_target and time_to_target is not None):
            break

    wall = time.perf_counter() - wall0
    # Global throughput: every rank's samples over rank 0's clock (DDP keeps the ranks in step).
    all_s = train_time_total
    dist_info = {}
    if distributed:
        counts = torch.tensor([measured_samples, all_samples], dtype=torch.int64)
        dist.all_reduce(counts)
        measured_samples, all_samples = int(counts[0]), int(counts[1])
        local_opt = opt.optim if args.zero else opt
        per_rank = [None] * world_size
        dist.all_gather_object(per_rank, state_bytes(local_opt))
        logging_data = model._get_ddp_logging_data()
        dist_info = {
            "world_size": world_size, "backend": dist.get_backend(), "zero": args.zero,
            "bucket_cap_mb": args.bucket_cap_mb,
            "ddp_logging": {k: v for k, v in logging_data.items() if k.startswith("avg_") and isinstance(v, int)},
            "optimizer_state_bytes": per_rank[0],
            "optimizer_state_bytes_per_rank": per_rank,
        }
        if args.zero == 2:
            dist_info["zero_stage_note"] = "PyTorch has only stage 1"
    else:
        dist_info = {"world_size": 1, "optimizer_state_bytes": state_bytes(opt)}
    dist_info["gradient_bytes"] = sum(q.grad.numel() * q.grad.element_size()
                                      for q in model.parameters() if q.grad is not None)
    result = {
        "peer": "classic", "torch": torch.__version__, "compiled": args.compile,
        "threads": args.threads, "workers": args.workers, "batch_size": args.batch_size,
        "seed": args.seed, "epochs_run": len(epoch_seconds),
        "epoch_train_s": epoch_seconds, "samples_per_s": samples_per_s,
        "evals": evals,
        "target_accuracy": args.target_accuracy,
        "time_to_target_s": None if time_to_target is None else round(time_to_target, 3),
        "time_to_target_includes_eval": True,
        "train_s_total": round(train_time_total, 3),
        "wall_s": round(wall, 3),
        "steps": step, "max_steps": args.max_steps, "warmup_steps": warmup,
        "train_samples_per_s": round(measured_samples / measured_s, 1) if measured_s else None,
        "train_samples_per_s_all_steps": round(all_samples / all_s, 1) if all_s else None,
        **dist_info,
    }
    if distributed:
        result["evals_note"] = "no evaluation in distributed runs"
    if talk:
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"time to {args.target_accuracy}: {result['time_to_target_s']} s; wall {wall:.1f}s; "
                  f"{result['train_samples_per_s']} samples/s after {warmup} warm-up steps", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
