#!/usr/bin/python3
"""Scratch recipe explorer for Fashion-MNIST on CPU (2 threads). Not part of the product.

In-memory tensors, randperm batching (fasttrain's loader is ~free), configurable model/opt/sched.
Prints one JSON line: per-eval accuracy (fractional epochs), train seconds per epoch, eval seconds,
and time_to_target = train time + eval time up to the first eval >= target.
"""
import argparse, gzip, json, math, os, time, copy
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

D = "/usr/share/datasets/fashion-mnist"
CACHE = "/tmp/fmnist_cache.pt"


def load():
    if os.path.exists(CACHE):
        return torch.load(CACHE)
    def img(p):
        b = gzip.open(p).read(); n = int.from_bytes(b[4:8], "big")
        return np.frombuffer(b, np.uint8, offset=16).reshape(n, 1, 28, 28)
    def lab(p):
        return np.frombuffer(gzip.open(p).read(), np.uint8, offset=8).astype(np.int64)
    xtr = torch.from_numpy(img(f"{D}/train-images-idx3-ubyte.gz").astype(np.float32) / 255)
    xte = torch.from_numpy(img(f"{D}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255)
    m, s = xtr.mean().item(), xtr.std().item()
    d = dict(xtr=(xtr - m) / s, ytr=torch.from_numpy(lab(f"{D}/train-labels-idx1-ubyte.gz")),
             xte=(xte - m) / s, yte=torch.from_numpy(lab(f"{D}/t10k-labels-idx1-ubyte.gz")))
    torch.save(d, CACHE)
    return d


def act(name):
    return nn.GELU() if name == "gelu" else nn.ReLU(inplace=True)


class Res(nn.Module):
    def __init__(self, c, a):
        super().__init__()
        self.b = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), act(a),
                               nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))
        self.a = act(a)

    def forward(self, x):
        return self.a(x + self.b(x))


def build(spec, bn, a, fc, drop, head):
    """spec like '32,64' (conv+pool per stage), 'c16' adds conv without pool, 'r32' residual block."""
    layers, c = [], 1
    for tok in spec.split(","):
        if tok.startswith("r"):
            layers.append(Res(c, a)); continue
        if tok.startswith("p"):  # conv -> maxpool -> BN -> act (pool first: 4x less BN/act work)
            w = int(tok[1:])
            layers += [nn.Conv2d(c, w, 3, padding=1, bias=not bn), nn.MaxPool2d(2)]
            if bn: layers.append(nn.BatchNorm2d(w))
            layers.append(act(a)); c = w; continue
        pool = not tok.startswith("c")
        w = int(tok.lstrip("c"))
        layers.append(nn.Conv2d(c, w, 3, padding=1, bias=not bn))
        if bn: layers.append(nn.BatchNorm2d(w))
        layers.append(act(a))
        if pool: layers.append(nn.MaxPool2d(2))
        c = w
    if head == "gap":
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        feat = c
    else:
        layers.append(nn.Flatten())
        with torch.no_grad():
            feat = nn.Sequential(*layers)(torch.zeros(2, 1, 28, 28)).shape[1]
    if fc > 0:
        if drop > 0: layers.append(nn.Dropout(drop))
        layers += [nn.Linear(feat, fc), act(a)]
        feat = fc
    if drop > 0: layers.append(nn.Dropout(drop))
    layers.append(nn.Linear(feat, 10))
    return nn.Sequential(*layers)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--spec", default="32,64")
    p.add_argument("--bn", type=int, default=1)
    p.add_argument("--act", default="relu")
    p.add_argument("--fc", type=int, default=128)
    p.add_argument("--drop", type=float, default=0.0)
    p.add_argument("--head", default="flat")
    p.add_argument("--bs", type=int, default=128)
    p.add_argument("--opt", default="adamw")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--wd", type=float, default=5e-4)
    p.add_argument("--mom", type=float, default=0.9)
    p.add_argument("--sched", default="onecycle")  # onecycle|const|cos
    p.add_argument("--pct", type=float, default=0.25)
    p.add_argument("--div", type=float, default=25.0)
    p.add_argument("--fdiv", type=float, default=1e3)
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--evals-per-epoch", type=int, default=4)
    p.add_argument("--eval-from", type=float, default=0.0, help="skip evals before this epoch")
    p.add_argument("--ls", type=float, default=0.0)
    p.add_argument("--ema", type=float, default=0.0)
    p.add_argument("--aug", default="none")  # none|flip|cropflip
    p.add_argument("--cl", type=int, default=0)  # channels_last
    p.add_argument("--mkldnn", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.91)
    p.add_argument("--stop", type=int, default=0)
    p.add_argument("--tag", default="")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.backends.mkldnn.enabled = bool(a.mkldnn)
    torch.manual_seed(a.seed)
    d = load()
    xtr, ytr, xte, yte = d["xtr"], d["ytr"], d["xte"], d["yte"]
    mf = torch.channels_last if a.cl else torch.contiguous_format
    if a.cl:
        xte = xte.contiguous(memory_format=mf)
    model = build(a.spec, a.bn, a.act, a.fc, a.drop, a.head).to(memory_format=mf)
    nparams = sum(p.numel() for p in model.parameters())
    N = xtr.shape[0]
    spe = math.ceil(N / a.bs)
    total = int(round(a.epochs * spe))
    decay, no_decay = [], []
    for n_, p_ in model.named_parameters():
        (no_decay if p_.ndim <= 1 else decay).append(p_)
    groups = [{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}]
    if a.opt == "sgd":
        opt = torch.optim.SGD(groups, lr=a.lr, momentum=a.mom, nesterov=True)
    elif a.opt == "adam":
        opt = torch.optim.Adam(groups, lr=a.lr)
    else:
        opt = torch.optim.AdamW(groups, lr=a.lr)
    if a.sched == "onecycle":
        sch = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=total, pct_start=a.pct,
                                                  div_factor=a.div, final_div_factor=a.fdiv,
                                                  cycle_momentum=(a.opt == "sgd"),
                                                  anneal_strategy="cos")
    elif a.sched == "cos":
        warm = max(1, int(a.pct * total))
        f = lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm)))
        sch = torch.optim.lr_scheduler.LambdaLR(opt, f)
    elif a.sched == "linear":  # linear warmup then linear decay to 0
        warm = max(1, int(a.pct * total))
        f = lambda s: (s + 1) / warm if s < warm else max(0.0, (total - s) / max(1, total - warm))
        sch = torch.optim.lr_scheduler.LambdaLR(opt, f)
    else:
        sch = None
    ema = None
    if a.ema > 0:
        ema = copy.deepcopy(model)
        for q in ema.parameters(): q.requires_grad_(False)
    lossf = nn.CrossEntropyLoss(label_smoothing=a.ls)

    def evaluate(m):
        m.eval(); c = 0
        with torch.no_grad():
            for i in range(0, xte.shape[0], 1000):
                c += (m(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum().item()
        m.train()
        return c / xte.shape[0]

    eval_steps = set()
    k = a.evals_per_epoch
    for j in range(1, int(math.ceil(a.epochs * k)) + 1):
        s = int(round(j * spe / k))
        if s <= total and s / spe >= a.eval_from - 1e-9: eval_steps.add(s)
    eval_steps.add(total)

    step, train_s, eval_s = 0, 0.0, 0.0
    epoch_train = []
    evals = []
    ttt = None
    ep_t = 0.0
    done = False
    while step < total and not done:
        perm = torch.randperm(N)
        for bi in range(spe):
            if step >= total: break
            t0 = time.perf_counter()
            idx = perm[bi * a.bs:(bi + 1) * a.bs]
            x, y = xtr[idx], ytr[idx]
            if a.aug in ("flip", "cropflip"):
                fl = torch.rand(x.shape[0]) < 0.5
                x = torch.where(fl[:, None, None, None], x.flip(3), x)
            if a.aug == "cropflip":
                xp = F.pad(x, (2, 2, 2, 2), value=float(xtr.min()))
                ox = torch.randint(0, 5, (x.shape[0],)); oy = torch.randint(0, 5, (x.shape[0],))
                ar = torch.arange(28)
                rows = oy[:, None] + ar[None, :]
                cols = ox[:, None] + ar[None, :]
                x = xp[:, 0][torch.arange(x.shape[0])[:, None, None], rows[:, :, None], cols[:, None, :]][:, None]
            if a.cl: x = x.contiguous(memory_format=mf)
            out = model(x)
            loss = lossf(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sch: sch.step()
            if ema is not None:
                with torch.no_grad():
                    dec = min(a.ema, (1 + step) / (10 + step))
                    for pe, pm in zip(ema.parameters(), model.parameters()):
                        pe.mul_(dec).add_(pm.detach(), alpha=1 - dec)
                    for be, bm in zip(ema.buffers(), model.buffers()):
                        be.copy_(bm)
            step += 1
            dt = time.perf_counter() - t0
            train_s += dt; ep_t += dt
            if step % spe == 0:
                epoch_train.append(round(ep_t, 2)); ep_t = 0.0
            if step in eval_steps:
                t1 = time.perf_counter()
                acc = evaluate(ema if ema is not None else model)
                eval_s += time.perf_counter() - t1
                evals.append((round(step / spe, 3), round(acc, 4)))
                if ttt is None and acc >= a.target:
                    ttt = round(train_s + eval_s, 2)
                    if a.stop: done = True; break
    if ep_t > 0: epoch_train.append(round(ep_t, 2))
    frac_ep = step / spe
    res = dict(tag=a.tag, args={k_: v for k_, v in vars(a).items() if k_ != "tag"}, params=nparams,
               evals=evals, epoch_train_s=epoch_train, s_per_epoch=round(train_s / frac_ep, 2),
               eval_s_each=round(eval_s / max(1, len(evals)), 2), time_to_target=ttt,
               final=evals[-1][1] if evals else None)
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
