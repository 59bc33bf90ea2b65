#!/usr/bin/python3
"""Best recipe found (scratch exploration, 2-core CPU, torch 1.13) for >= 91% Fashion-MNIST test
accuracy in minimum wall time. Self-contained; mirrors what fasttrain's main job should do.

Model (409,082 params; memory format channels_last for the model AND the input batches):
  conv3x3(1->16, pad 1, no bias) maxpool2 BN ReLU      28x28 -> 14x14
  conv3x3(16->32, pad 1, no bias) maxpool2 BN ReLU     14x14 -> 7x7
  ("pool-first": max-pool right after the conv, so BN and ReLU (and their backward) run on 4x
   fewer elements. Cheaper per step AND more accurate than conv-BN-ReLU-pool here.)
  flatten (32*7*7 = 1568) -> linear 256 -> ReLU -> linear 10
  (channels_last + mkldnn makes the train step ~1.8x cheaper on this CPU than NCHW.)
Data: train-set mean/std normalization, no augmentation, reshuffled every epoch, batch 128
  (469 steps/epoch, last batch 96).
Optimizer: AdamW (betas 0.9/0.999, eps 1e-8), weight decay 5e-4 on conv/linear weights only
  (none on BN params and biases).
Schedule: one-cycle over 2 epochs (938 steps), max lr 3e-3, pct_start 0.25, cosine anneal,
  initial lr = max/25, final lr = initial/1e3; no momentum cycling.
Loss: cross-entropy with label smoothing 0.1.
Runner-up (more margin, ~1.4x the time): --c1 24 --c2 48 --epochs 1.5 --eval-from 1.25.
Eval: on the 10k test set at epochs 1.5, 1.75, 2.0 (steps 704, 821, 938);
  stop at the first eval >= 0.91. time_to_target includes eval time.
"""
import argparse, gzip, json, math, os, time
import numpy as np
import torch
import torch.nn as nn

D = "/usr/share/datasets/fashion-mnist"


def load():
    def img(p):
        b = gzip.open(p).read(); n = int.from_bytes(b[4:8], "big")
        return np.frombuffer(b, np.uint8, offset=16).reshape(n, 1, 28, 28)
    def lab(p):
        return np.frombuffer(gzip.open(p).read(), np.uint8, offset=8).astype(np.int64)
    xtr = torch.from_numpy(img(f"{D}/train-images-idx3-ubyte.gz").astype(np.float32) / 255)
    xte = torch.from_numpy(img(f"{D}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255)
    m, s = xtr.mean().item(), xtr.std().item()
    return ((xtr - m) / s, torch.from_numpy(lab(f"{D}/train-labels-idx1-ubyte.gz")),
            (xte - m) / s, torch.from_numpy(lab(f"{D}/t10k-labels-idx1-ubyte.gz")))


def model(c1=16, c2=32, fc=256):
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1, bias=False), nn.MaxPool2d(2), nn.BatchNorm2d(c1), nn.ReLU(inplace=True),
        nn.Conv2d(c1, c2, 3, padding=1, bias=False), nn.MaxPool2d(2), nn.BatchNorm2d(c2), nn.ReLU(inplace=True),
        nn.Flatten(), nn.Linear(c2 * 49, fc), nn.ReLU(inplace=True), nn.Linear(fc, 10))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)  # 1 beat 2 on this VM, see report
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=float, default=2.0)
    p.add_argument("--c1", type=int, default=16)
    p.add_argument("--c2", type=int, default=32)
    p.add_argument("--fc", type=int, default=256)
    p.add_argument("--bs", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--target", type=float, default=0.91)
    p.add_argument("--eval-from", type=float, default=1.5)
    p.add_argument("--evals-per-epoch", type=int, default=4)
    p.add_argument("--no-stop", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr, xte, yte = load()
    net = model(a.c1, a.c2, a.fc).to(memory_format=torch.channels_last)
    cl = torch.channels_last
    xte = xte.contiguous(memory_format=cl)
    decay = [q for q in net.parameters() if q.ndim > 1]
    no_decay = [q for q in net.parameters() if q.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 5e-4},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr)
    N = xtr.shape[0]; spe = math.ceil(N / a.bs); total = int(round(a.epochs * spe))
    sch = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=total, pct_start=0.25,
                                              div_factor=25, final_div_factor=1e3,
                                              anneal_strategy="cos", cycle_momentum=False)
    lossf = nn.CrossEntropyLoss(label_smoothing=0.1)
    evals_at = {int(round(j * spe / a.evals_per_epoch))
                for j in range(1, int(math.ceil(a.epochs * a.evals_per_epoch)) + 1)}
    evals_at = {s for s in evals_at if s <= total and s / spe >= a.eval_from - 1e-9} | {total}

    def evaluate():
        net.eval(); c = 0
        with torch.no_grad():
            for i in range(0, xte.shape[0], 1000):
                c += (net(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
        net.train(); return c / xte.shape[0]

    evals, epoch_s, ttt = [], [], None
    step, train_s = 0, 0.0
    t_start = time.perf_counter()
    done = False
    while step < total and not done:
        perm = torch.randperm(N); te = time.perf_counter(); ev_s = 0.0
        for b in range(spe):
            if step >= total: break
            idx = perm[b * a.bs:(b + 1) * a.bs]
            loss = lossf(net(xtr[idx].contiguous(memory_format=cl)), ytr[idx])
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sch.step()
            step += 1
            if step in evals_at:
                t1 = time.perf_counter(); acc = evaluate(); ev_s += time.perf_counter() - t1
                el = time.perf_counter() - t_start
                evals.append({"epoch": round(step / spe, 3), "acc": acc, "elapsed_s": round(el, 2)})
                if not a.json: print(f"epoch {step / spe:.3f}: test acc {acc:.4f}  t={el:.1f}s", flush=True)
                if ttt is None and acc >= a.target:
                    ttt = el
                    if not a.no_stop: done = True; break
        epoch_s.append(round(time.perf_counter() - te - ev_s, 2))
    res = {"recipe": "best", "seed": a.seed, "threads": a.threads, "evals": evals,
           "epoch_train_s": epoch_s, "time_to_target_s": None if ttt is None else round(ttt, 2),
           "wall_s": round(time.perf_counter() - t_start, 2)}
    print(json.dumps(res) if a.json else f"time to {a.target}: {res['time_to_target_s']} s", flush=True)


if __name__ == "__main__":
    main()
