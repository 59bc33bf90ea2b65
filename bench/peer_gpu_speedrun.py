#!/usr/bin/env python3
"""Python PyTorch peer of fasttrain's main job (configs/default.toml) on a GPU, data resident on the device.

The job, as fasttrain runs it (each point read from its source). Its settings (batch size, steps, optimizer and
muon_exclude, lr, weight decay, the one-cycle's shape, label smoothing, the evaluation schedule and the target)
are read from --config (configs/default.toml), so the peer follows the config; a flag overrides one. The
figures below are the defaults of the flags where the config leaves a key out.
  data      Fashion-MNIST from --data-dir (IDX, gzip). Normalised as src/data/transforms.cpp does: the
            mean and population std of the training pixels (exact, from a histogram; src/data/dataset.cpp
            channel_statistics, about 0.2860 / 0.3530) in float32, and each pixel value v through the
            256-entry float32 table ((float(v) / 255) - mean) / std. Batch 128, reshuffled each epoch,
            drop_last (468 steps an epoch), no augmentation. The whole set lives on the device, as the
            normalised float32 images (--resident float, default) or as uint8 with the table applied to
            each gathered batch (--resident uint8); a batch is gathered on the device by index from a
            per-epoch torch.randperm (a seeded device generator).
  model     fasttrain's "cnn" (src/models/cnn.cpp) with widths [16, 32], batchnorm, pool_first and the
            config's hidden layers (--hidden; configs/default.toml's model.hidden = [256]):
            Conv2d(1, 16, 3, padding 1, no bias), MaxPool2d(2), BatchNorm2d(16), ReLU,
            Conv2d(16, 32, 3, padding 1, no bias), MaxPool2d(2), BatchNorm2d(32), ReLU, flatten,
            Linear(1568, 256), ReLU, Linear(256, 10). LibTorch's default init (the same as PyTorch's), built on
            the CPU after torch.manual_seed(seed) and then moved to the device, as fasttrain builds it;
            model and inputs channels_last (train.channels_last = true).
  optimizer --optimizer adamw: AdamW(lr 6e-3 (--lr; configs/default.toml's optim.lr), betas (0.9, 0.999), eps 1e-8), weight decay 5e-4 on the parameters with dim > 1 only
            (src/optim/optimizer.cpp make_optimizer: decay group first), the fused kernel on CUDA.
            --optimizer muon (configs/default.toml's optim.name, with its optim.muon_exclude): MuonAndAdamW
            below, in every mode (graph: the LR a device tensor, AdamW capturable).
  schedule  one-cycle exactly as src/optim/schedule.cpp computes it: pct_start 0.25, div_factor 25,
            final_div_factor 1e3, cos anneal, no momentum cycling, over max_steps 700; step k (0-based) trains
            at lr(k) (fasttrain's scheduled_lr(step)).
  loss      cross entropy with label smoothing 0.1 on float32 logits (src/task/classification.cpp: the same formula).
  ema       where the config's ema.enabled (configs/default.toml: decay 0.95, warm-up on): an EMA of the
            weights updated after every step from ema.after_step (default 0) on (starting at the weights, the
            warm-up counting every step) and evaluated in their place (class Ema below; every = 1, no lookahead).
  precision bf16 autocast where fasttrain's "auto" picks bf16: CUDA sm_80 and later, and CPUs with AVX512-BF16 or
            AMX-BF16 (FASTTRAIN_NATIVE_BF16=0/1 overrides, as for fasttrain); --precision fp32 for fp32, with
            TF32 allowed as fasttrain's train.tf32 = true); cudnn.benchmark on (train.cudnn_benchmark = true).
  eval      the 10k test set in batches of 1000 (data.eval_batch_size), eval mode, no_grad, under the same
            autocast, float32 logits, loss sum and correct count on the device, one host read at the end.
            When (src/train/fit_session.cpp): after every step s with s >= eval_from_step (500 in
            configs/default.toml) and s % eval_every_steps (25) == 0, i.e. at 500, 525, ..., and at the end
            of the run (700) and of an epoch past eval_from_step. The run stops
            at the first evaluation with accuracy >= 0.91 (stop_at_target).

Modes (--mode):
  eager    the plain loop; the LR of each step set in the param groups as a Python float; fused AdamW.
  compile  torch.compile(model) (default mode), otherwise as eager. One compiled model serves every run of the
           process (each run loads fresh weights into it), so only the first run compiles; see "Runs" below.
  graph    PyTorch's whole-network capture (torch.cuda.graphs): static index buffer; the step = gather the batch
           from the resident data by the static indices, forward under autocast (cache_enabled=False), loss,
           backward, the LR copied into the optimizer's CUDA LR tensor from a device table (float64, as
           fasttrain's LrTable; the fused kernel takes float32) indexed by a device step counter, fused
           capturable AdamW (or MuonAndAdamW), counter += 1. The first 3 steps run eagerly on a side stream (they train: they
           are steps 0, 1, 2, exactly as fasttrain's CUDA-graph engine), gradients then go to None, step 3 is
           captured (gradients allocated in the graph's pool, never set to None again) and replayed; every later
           step only copies its indices into the static buffer and replays. CUDA only.

Timing, as fasttrain's time_to_target_s: the wall clock from the start of training (data on the device, model
built, optimizer and LR table made; a torch.cuda.synchronize() first) to the end of the evaluation that reaches
the target (its accuracy read on the host is the synchronisation), evaluations included. Nothing else
synchronises inside a run. Per run also: the step and accuracy at the target, the steps run, eval_s (each
evaluation, CUDA events), first_step_s (start to the end of step 1 on the GPU's timeline: compile or the
eager warm-up shows here), capture_s (graph mode: the host time of the capture, in the clock), and the steady
throughput: steps/s and samples/s from the end of step --steady-from (50) to the end of the last step,
evaluations in that span subtracted (CUDA events on the stream, so host-bound stretches count as they are).

Runs: --repeats N timed runs (seeds --seed, --seed + 1, ...; same seed, same initial weights and batches).
--warmup-run (default on with CUDA, off on the CPU) first runs one whole untimed run in the same mode (seed
--seed), so that the CUDA context's first-use costs (cuBLAS/cuDNN handles, cudnn.benchmark's algorithm search
for every shape, kernel module loading), and in compile mode the compilation, are paid before the timed runs.
What was chosen here: the timed runs EXCLUDE those first-use costs. A fasttrain run pays them inside fit() unless
memory.warmup = true runs a step first (its default is false): compare against fasttrain's later repeats or
memory.warmup = true, or run the peer with --no-warmup-run (its first repeat then pays them, as fasttrain's
fit does). In compile mode the warm-up run is the cold one (before it, a short eager init, a few steps and
one evaluation of an uncompiled copy, pays the cuDNN/cuBLAS first-use costs, so that what remains is
compilation): compile_overhead_s = its first training step plus its first evaluation (where the training
and the eval-mode graphs compile) less the timed runs' median of the same; time_to_target_incl_compile_s =
its own time to target (None where it missed), time_to_target_incl_compile_estimate_s = the timed median +
compile_overhead_s, time_to_target_excl_compile_s = the timed median. With --no-warmup-run the first timed run
compiles (compiled_in says which). Inductor keeps compiled kernels and graphs on disk (/tmp/torchinductor_$USER,
or TORCHINDUCTOR_CACHE_DIR): a process after the first compiles in seconds instead of tens of seconds. For a
cold compilation give each process a fresh cache: TORCHINDUCTOR_CACHE_DIR=$(mktemp -d).

Output: progress on stderr; with --json one JSON line on stdout at the end (mode, device, torch, precision,
time_to_target_s per repeat and median, steady samples/s, accuracy, steps, per-run records).

On the GPU machine (PyTorch 2.11, no network; copy the dataset there and point --data-dir at it):
  /opt/torch/.venv/bin/python3 bench/peer_gpu_speedrun.py --mode eager   --repeats 5 --json
  /opt/torch/.venv/bin/python3 bench/peer_gpu_speedrun.py --mode compile --repeats 5 --json
  /opt/torch/.venv/bin/python3 bench/peer_gpu_speedrun.py --mode graph   --repeats 5 --json
A CPU smoke test (eager or compile; graph needs CUDA):
  .venv/bin/python bench/peer_gpu_speedrun.py --device cpu --max-steps 20 --eval-from 10 --eval-every 10 --json
"""
import argparse
import copy
import gc
import gzip
import json
import math
import os
import statistics
import sys
import time
import tomllib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "default.toml")


def job_from_config(path):
    """The flags' defaults from a fasttrain config; a key it leaves out keeps the flag's own default. What this
    peer does not implement (another data set, model or schedule) is an error naming the key."""
    with open(path, "rb") as f:
        config = tomllib.load(f)

    def key(section, name):
        return config.get(section, {}).get(name)

    implemented = {("data", "dataset"): "fashion-mnist", ("model", "name"): "cnn", ("model", "widths"): [16, 32],
                   ("model", "batchnorm"): True, ("model", "pool_first"): True,
                   ("train", "channels_last"): True, ("schedule", "name"): "one-cycle",
                   ("schedule", "cycle_momentum"): False}
    for (section, name), value in implemented.items():
        if key(section, name) not in (None, value):
            sys.exit(f"{path}: {section}.{name} = {key(section, name)!r}, but this peer implements {value!r} only")
    if key("optim", "name") not in (None, "adamw", "muon"):
        sys.exit(f"{path}: optim.name = {key('optim', 'name')!r}, but this peer implements adamw and muon only")
    flags = {"batch_size": ("data", "batch_size"), "hidden": ("model", "hidden"), "max_steps": ("train", "max_steps"),
             "optimizer": ("optim", "name"), "muon_exclude": ("optim", "muon_exclude"), "lr": ("optim", "lr"),
             "weight_decay": ("optim", "weight_decay"), "pct_start": ("schedule", "pct_start"),
             "div_factor": ("schedule", "div_factor"), "final_div_factor": ("schedule", "final_div_factor"),
             "label_smoothing": ("task", "label_smoothing"), "eval_from": ("train", "eval_from_step"),
             "eval_every": ("train", "eval_every_steps"), "target": ("train", "target_accuracy")}
    job = {flag: key(*where) for flag, where in flags.items() if key(*where) is not None}
    if key("ema", "enabled"):
        if key("ema", "every") not in (None, 1) or key("ema", "lookahead"):
            sys.exit(f"{path}: [ema] every = {key('ema', 'every')!r}, lookahead = {key('ema', 'lookahead')!r}, but "
                     "this peer implements an EMA updated after every step only (every = 1, no lookahead)")
        job["ema_decay"] = key("ema", "decay") if key("ema", "decay") is not None else 0.999
        if key("ema", "warmup") is not None:
            job["ema_warmup"] = key("ema", "warmup")
        if key("ema", "after_step") is not None:
            job["ema_after_step"] = key("ema", "after_step")
    return job


# ---- data -------------------------------------------------------------------------------------
def read_idx(path):
    """An IDX file (gzip or plain) as a numpy array of its shape (uint8 data only)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if data[2] != 0x08:
        sys.exit(f"{path}: IDX data type {data[2]:#x}, expected unsigned byte (0x08)")
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def find_file(directory, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    sys.exit(f"{os.path.join(directory, stem)}[.gz] is missing (set --data-dir or FASHION_MNIST_DIR)")


def load_split(directory, prefix):
    images = read_idx(find_file(directory, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find_file(directory, f"{prefix}-labels-idx1-ubyte"))
    return images.reshape(images.shape[0], 1, images.shape[1], images.shape[2]), labels.astype(np.int64)


def channel_statistics(images):
    """fasttrain's channel_statistics (src/data/dataset.cpp): exact sums from a histogram, population std,
    both as float32, per channel (Fashion-MNIST has one)."""
    means, stds = [], []
    for c in range(images.shape[1]):
        histogram = np.bincount(images[:, c].reshape(-1), minlength=256).astype(np.float64)
        count = float(images.shape[0]) * images.shape[2] * images.shape[3]
        values = np.arange(256, dtype=np.float64)
        m = float((histogram * values).sum()) / count
        squares = float((histogram * (values - m) * (values - m)).sum())
        means.append(np.float32(m / 255.0))
        stds.append(np.float32(math.sqrt(squares / count) / 255.0))
    return means, stds


def normalisation_table(mean, std):
    """fasttrain's TransformPipeline table (src/data/transforms.cpp): ((float)v / 255.0f - mean) / std in float32."""
    x = np.arange(256, dtype=np.float32) / np.float32(255.0)
    return ((x - np.float32(mean)) / np.float32(std)).astype(np.float32)


class DeviceData:
    """Train and test sets resident on the device. train_x / test_x: normalised float32 [N, 1, 28, 28]
    channels_last (resident = "float"), or uint8 with `table` applied per batch (resident = "uint8")."""

    def __init__(self, directory, device, resident):
        train_images, train_labels = load_split(directory, "train")
        test_images, test_labels = load_split(directory, "t10k")
        if train_images.shape[1] != 1:
            sys.exit("expected one channel")
        means, stds = channel_statistics(train_images)
        self.mean, self.std = float(means[0]), float(stds[0])
        self.table = torch.from_numpy(normalisation_table(means[0], stds[0])).to(device)  # [256] float32
        self.resident = resident
        self.num_classes = int(max(train_labels.max(), test_labels.max())) + 1

        def put(images):
            u8 = torch.from_numpy(images.copy()).to(device)  # [N, 1, H, W] uint8
            if resident == "uint8":
                return u8.contiguous(memory_format=torch.channels_last)
            return self.table[u8.long()].contiguous(memory_format=torch.channels_last)

        self.train_x, self.test_x = put(train_images), put(test_images)
        self.train_y = torch.from_numpy(train_labels.copy()).to(device)
        self.test_y = torch.from_numpy(test_labels.copy()).to(device)
        self.train_n, self.test_n = self.train_x.size(0), self.test_x.size(0)

    def inputs(self, images):
        """Gathered images (float32 already, or uint8 through the table), channels_last."""
        if self.resident == "uint8":
            images = self.table[images.long()]
        return images.contiguous(memory_format=torch.channels_last)

    def gather(self, idx):
        return self.inputs(self.train_x.index_select(0, idx)), self.train_y.index_select(0, idx)


# ---- model, optimizer, schedule ---------------------------------------------------------------
class Cnn(nn.Module):
    """fasttrain's cnn (src/models/cnn.cpp) with pool_first and batchnorm: features then classifier."""

    def __init__(self, widths=(16, 32), hidden=(256,), in_channels=1, size=28, num_classes=10):
        super().__init__()
        layers, channels = [], in_channels
        for width in widths:
            layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.MaxPool2d(2),
                       nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
            channels, size = width, size // 2
        self.features = nn.Sequential(*layers)
        head, features = [], channels * size * size
        for h in hidden:
            head += [nn.Linear(features, h), nn.ReLU(inplace=True)]
            features = h
        head.append(nn.Linear(features, num_classes))
        self.classifier = nn.Sequential(*head)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def one_cycle_lrs(max_lr, total_steps, pct_start, div_factor, final_div_factor):
    """src/optim/schedule.cpp OneCycleSchedule::lr for steps 0..total_steps (two phases, cos anneal), in
    the same double operations; steps at or past total_steps hold the last LR."""
    initial_lr = max_lr / div_factor
    min_lr = initial_lr / final_div_factor
    pct_steps = pct_start * float(total_steps)
    phases = [(pct_steps - 1, initial_lr, max_lr), (float(total_steps - 1), max_lr, min_lr)]

    def lr(step):
        s = float(min(step, total_steps - 1))
        start = 0.0
        for i, (end_step, start_lr, end_lr) in enumerate(phases):
            if s <= end_step or i + 1 == len(phases):
                pct = (s - start) / (end_step - start)
                return end_lr + (start_lr - end_lr) / 2.0 * (math.cos(math.pi * pct) + 1)
            start = end_step
        raise AssertionError

    return [lr(step) for step in range(total_steps + 1)]


def param_groups(model, weight_decay):
    """make_optimizer's groups: dim > 1 decays, the rest (biases, BatchNorm scales and shifts) does not."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() <= 1]
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


class MuonAndAdamW(torch.optim.Optimizer):
    """fasttrain's optim.name = "muon" (src/optim/muon.cpp) with its defaults: torch.optim.Muon's own
    functions (_zeropower_via_newtonschulz, _adjust_lr "match_rms_adamw") on each parameter with dim > 1, a
    conv kernel as [out, in * kh * kw] (torch.optim.Muon itself takes 2-d parameters only), momentum 0.95,
    Nesterov, 5 iterations, decoupled weight decay; AdamW (betas (0.9, 0.999), eps 1e-8, no decay) for the
    rest at the same lr, and for the matrices whose names contain one of `exclude` (optim.muon_exclude).
    Group 0 is muon's matrices, group 1 the rest: the loop sets each group's lr."""

    def __init__(self, model, lr, weight_decay, exclude=(), capturable=False):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        matrices = [p for n, p in named if p.dim() > 1 and not any(e in n for e in exclude)]
        excluded = [p for n, p in named if p.dim() > 1 and any(e in n for e in exclude)]
        rest = [p for n, p in named if p.dim() <= 1]
        super().__init__([{"params": matrices, "weight_decay": weight_decay},
                          {"params": excluded + rest, "weight_decay": 0.0}], {"lr": lr})
        # optim.muon_exclude's matrices keep their weight decay under AdamW (muon.cpp splits each group).
        self.adamw = torch.optim.AdamW([{"params": excluded, "weight_decay": weight_decay},
                                        {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.999),
                                       eps=1e-8, foreach=True, capturable=capturable)

    @torch.no_grad()
    def step(self, closure=None):
        from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz
        matrices, rest = self.param_groups
        lr, wd, momentum = matrices["lr"], matrices["weight_decay"], 0.95
        for p in matrices["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - momentum)
            update = p.grad.lerp(buf, momentum)  # Nesterov
            flat = update.reshape(update.shape[0], -1)
            ortho = _zeropower_via_newtonschulz(flat, (3.4445, -4.7750, 2.0315), 5, 1e-7).reshape(p.shape)
            p.mul_(1 - lr * wd)
            step_size = _adjust_lr(lr, "match_rms_adamw", flat.shape)
            if isinstance(step_size, torch.Tensor):  # graph mode: the LR is a device tensor written in the graph
                p.sub_(ortho.mul_(step_size))
            else:
                p.add_(ortho, alpha=-step_size)
        for group in self.adamw.param_groups:
            group["lr"] = rest["lr"]
        self.adamw.step()

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none=set_to_none)


# ---- timing -----------------------------------------------------------------------------------
class Marks:
    """Points on the device's timeline: CUDA events recorded on the current stream (no synchronisation), or
    host times on the CPU (where every op has finished when it returns)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, a, b):  # call after a synchronisation
        if self.cuda:
            return a.elapsed_time(b) / 1000.0
        return b - a


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- EMA ---------------------------------------------------------------------------------------
class Ema:
    """fasttrain's Ema (src/optim/ema.cpp), every = 1: after each optimizer step every parameter's average
    becomes decay_t * average + (1 - decay_t) * parameter, decay_t = min(decay, (1 + t) / (10 + t)) with the
    warm-up (t: the updates before this one), else decay; the evaluation runs with the averages copied into
    the model's parameters and the live values copied back after (BatchNorm's buffers are the live ones: with
    an update after every step, fasttrain's copies of them equal them at every evaluation). On the host
    (eager, compile) decay_t is a Python float and each average one lerp, as fasttrain does on the CPU; in
    graph mode the count is a device tensor and the update is captured with the step, as fasttrain does on
    a GPU, where the updates up to after_step run with decay_t = 0 (the averages stay the weights)."""

    def __init__(self, model, decay, warmup, on_device, after_step=0):
        self.parameters = list(model.parameters())
        self.averages = [p.detach().clone() for p in self.parameters]
        self.decay, self.warmup, self.on_device, self.after_step = decay, warmup, on_device, after_step
        self.updates = 0  # counted through after_step too: the warm-up's t runs from the first step
        self.device_updates = torch.zeros((), dtype=torch.float64, device=self.averages[0].device)

    def averaging(self):
        # In graph mode the count lives on the device; until after_step the averages equal the weights.
        return self.on_device or self.updates > self.after_step

    @torch.no_grad()
    def update(self):
        if self.on_device:
            decay = torch.full((), self.decay, dtype=torch.float64, device=self.device_updates.device)
            if self.warmup:
                decay = torch.minimum(decay, (1 + self.device_updates) / (10 + self.device_updates))
            if self.after_step > 0:  # up to the first update after it, decay_t = 0: the averages are the weights
                decay = torch.where(self.device_updates <= self.after_step, torch.zeros_like(decay), decay)
            torch._foreach_mul_(self.averages, decay.float())
            torch._foreach_add_(self.averages, torch._foreach_mul(self.parameters, (1 - decay).float()))
            self.device_updates.add_(1)
            return
        t = self.updates
        self.updates += 1
        if not self.averaging():
            return
        if t == self.after_step and t > 0:  # the first update after the delay starts at the weights
            torch._foreach_copy_(self.averages, self.parameters)
        decay = min(self.decay, (1 + t) / (10 + t)) if self.warmup else self.decay
        torch._foreach_lerp_(self.averages, self.parameters, 1 - decay)

    @torch.no_grad()
    def swap(self):
        if not self.averaging():  # before after_step the evaluation sees the weights themselves
            return
        for parameter, average in zip(self.parameters, self.averages):
            live = parameter.clone()
            parameter.copy_(average)
            average.copy_(live)


# ---- one training run -------------------------------------------------------------------------
class Job:
    def __init__(self, args, device, data):
        self.args, self.device, self.data = args, device, data
        self.amp = args.precision == "bf16"
        self.lrs = one_cycle_lrs(args.lr, args.max_steps, args.pct_start, args.div_factor, args.final_div_factor)
        self.batches_per_epoch = data.train_n // args.batch_size  # drop_last
        self.model = self.build_model(args.seed)
        self.net = torch.compile(self.model) if args.mode == "compile" else self.model
        self.side_stream = torch.cuda.Stream(device=device) if args.mode == "graph" else None

    def build_model(self, seed):
        torch.manual_seed(seed)  # fasttrain: torch::manual_seed(train.seed), the model built on the CPU, then moved
        model = Cnn(hidden=self.args.hidden, num_classes=self.data.num_classes)
        return model.to(self.device).to(memory_format=torch.channels_last).train()

    def autocast(self, cache_enabled=None):
        kwargs = {} if cache_enabled is None else {"cache_enabled": cache_enabled}
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp, **kwargs)

    def loss_of(self, net, x, y, cache_enabled=None):
        with self.autocast(cache_enabled):
            logits = net(x)
            return F.cross_entropy(logits.float(), y, label_smoothing=self.args.label_smoothing)

    @torch.no_grad()
    def evaluate(self, net, module):
        """Test accuracy and mean loss of `net` (module, or its compiled wrapper), module in eval mode."""
        d, batch = self.data, self.args.eval_batch_size
        module.eval()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.long, device=self.device)
        with self.autocast():
            for start in range(0, d.test_n, batch):
                x, y = d.inputs(d.test_x[start:start + batch]), d.test_y[start:start + batch]
                logits = net(x).float()
                loss_sum += F.cross_entropy(logits, y, reduction="sum")
                correct += logits.argmax(1).eq(y).sum()
        module.train()
        totals = torch.stack([loss_sum, correct.double()]).cpu()  # the one host read: synchronises
        return totals[1].item() / d.test_n, totals[0].item() / d.test_n

    def eval_due(self, step, loop_ends):
        """FitSession::periodic_eval_due after every step; epoch_end_eval_due where an epoch or the run ends."""
        a = self.args
        periodic = a.eval_every > 0 and step >= a.eval_from and step % a.eval_every == 0
        return periodic or (loop_ends and (step >= a.eval_from or step >= a.max_steps))

    def optimizer(self, lr, capturable=False):
        if self.args.optimizer == "muon":
            return MuonAndAdamW(self.model, lr, self.args.weight_decay, self.args.muon_exclude, capturable)
        fused = self.device.type == "cuda" or self.args.fused_cpu
        extra = {"capturable": True} if capturable else {}
        if fused:
            extra["fused"] = True
        return torch.optim.AdamW(param_groups(self.model, self.args.weight_decay), lr=lr, betas=(0.9, 0.999),
                                 eps=1e-8, **extra)

    def reset(self, seed):
        """Fresh initial weights (those of a model built with `seed`) loaded into the one model in place:
        the compiled module and its guards stay valid."""
        torch.manual_seed(seed)
        fresh = Cnn(hidden=self.args.hidden, num_classes=self.data.num_classes)
        self.model.load_state_dict(fresh.state_dict())
        self.model.train()
        for p in self.model.parameters():
            p.grad = None

    def run(self, seed, label):
        a, d, dev, B = self.args, self.data, self.device, self.args.batch_size
        gc.collect()  # the last run's optimizer and CUDA graph, where a reference cycle still holds them
        self.reset(seed)
        graph_mode = a.mode == "graph"
        if graph_mode:
            lr_table = torch.tensor(self.lrs, dtype=torch.float64, device=dev)  # fasttrain's LrTable
            lr_tensor = torch.tensor(self.lrs[0], dtype=torch.float32, device=dev)
            optimizer = self.optimizer(lr_tensor, capturable=True)
            for group in optimizer.param_groups:  # one LR tensor, written in the graph, read by every group
                group["lr"] = lr_tensor
            device_step = torch.zeros((), dtype=torch.long, device=dev)
            static_idx = torch.zeros(B, dtype=torch.long, device=dev)
            side = self.side_stream  # the eager warm-up steps (one stream for every run: a new stream would get
            # its own cuBLAS workspaces, 65 MiB a stream on an H100, kept for the stream's life)
        else:
            optimizer = self.optimizer(self.lrs[0])
        ema = (Ema(self.model, a.ema_decay, a.ema_warmup, on_device=graph_mode, after_step=a.ema_after_step)
               if a.ema_decay > 0 else None)
        generator = torch.Generator(device=dev)
        generator.manual_seed(seed)
        loss_sum = torch.zeros((), dtype=torch.float32, device=dev)  # the training loss, kept on the device
        marks = Marks(dev)
        evals, result = [], {"label": label, "seed": seed}
        target_step = target_acc = time_to_target = None
        graph, capture_s = None, None
        steady_mark = first_step_mark = None

        def graph_step():
            # Everything a captured step does; the warm-up steps run the same code eagerly.
            x, y = d.gather(static_idx)
            loss = self.loss_of(self.net, x, y, cache_enabled=False)
            loss.backward()
            lr_tensor.copy_(lr_table.index_select(0, device_step.clamp_max(a.max_steps).view(1)).view(()))
            optimizer.step()
            if ema is not None:
                ema.update()
            device_step.add_(1)
            loss_sum.add_(loss.detach())

        sync(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        start_mark = marks.mark()
        step, epoch, stop = 0, 0, False
        while step < a.max_steps and not stop:
            perm = torch.randperm(d.train_n, generator=generator, device=dev)
            batch = 0
            while step < a.max_steps and batch < self.batches_per_epoch:
                idx = perm[batch * B:(batch + 1) * B]
                if not graph_mode:
                    x, y = d.gather(idx)
                    for group in optimizer.param_groups:
                        group["lr"] = self.lrs[step]
                    loss = self.loss_of(self.net, x, y)
                    loss.backward()
                    optimizer.step()
                    if ema is not None:
                        ema.update()
                    optimizer.zero_grad(set_to_none=True)
                    loss_sum.add_(loss.detach())
                elif graph is not None:
                    static_idx.copy_(idx)
                    graph.replay()
                elif step < a.graph_warmup_steps:
                    # fasttrain's engine: eager steps on a side stream that waits for the current one, and
                    # the current one for it; they train (steps 0, 1, 2), gradients to None after each.
                    side.wait_stream(torch.cuda.current_stream(dev))
                    with torch.cuda.stream(side):
                        static_idx.copy_(idx)
                        graph_step()
                        optimizer.zero_grad(set_to_none=True)
                    torch.cuda.current_stream(dev).wait_stream(side)
                else:
                    c0 = time.perf_counter()
                    static_idx.copy_(idx)
                    optimizer.zero_grad(set_to_none=True)  # gradients are allocated in the graph's pool
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):  # captures on its own side stream; runs nothing
                        graph_step()
                    capture_s = time.perf_counter() - c0
                    graph.replay()  # this step's training
                step += 1
                batch += 1
                if step == 1:
                    first_step_mark = marks.mark()
                if step == a.steady_from:
                    steady_mark = marks.mark()
                loop_ends = batch == self.batches_per_epoch or step == a.max_steps  # epoch or run ends
                if self.eval_due(step, loop_ends):
                    before = marks.mark()
                    if ema is not None:
                        ema.swap()
                    acc, test_loss = self.evaluate(self.net, self.model)  # synchronises
                    if ema is not None:
                        ema.swap()
                    after = marks.mark()
                    now = time.perf_counter() - t0
                    evals.append({"step": step, "accuracy": acc, "loss": round(test_loss, 5), "at_s": now,
                                  "_marks": (before, after)})
                    print(f"[{label}] step {step}: test accuracy {acc:.4f}, loss {test_loss:.4f}, {now:.3f} s",
                          file=sys.stderr, flush=True)
                    if a.target > 0 and time_to_target is None and acc >= a.target:
                        time_to_target, target_step, target_acc = now, step, acc
                        stop = a.stop_at_target
                        if stop:
                            break
            epoch += 1
        end_mark = marks.mark()
        sync(dev)
        wall = time.perf_counter() - t0
        last_step = step

        # steady throughput: from the end of step steady_from to the end of the run, the evaluations after
        # steady_from (all of them inside that span) taken out
        steady = None
        if steady_mark is not None and last_step > a.steady_from:
            span = marks.seconds(steady_mark, end_mark)
            span -= sum(marks.seconds(*e["_marks"]) for e in evals if e["step"] >= a.steady_from)
            steps = last_step - a.steady_from
            steady = {"steps": steps, "seconds": round(span, 6), "steps_per_s": round(steps / span, 2),
                      "samples_per_s": round(steps * B / span, 1)}
        for e in evals:
            e["seconds"] = round(marks.seconds(*e.pop("_marks")), 6)
            e["at_s"] = round(e["at_s"], 6)
        result.update({
            "time_to_target_s": None if time_to_target is None else round(time_to_target, 6),
            "target_step": target_step, "target_accuracy_reached": target_acc,
            "final_accuracy": evals[-1]["accuracy"] if evals else None,
            "steps": last_step, "epochs_started": epoch, "wall_s": round(wall, 6),
            "first_step_s": round(marks.seconds(start_mark, first_step_mark), 6) if first_step_mark else None,
            "eval_s": round(sum(e["seconds"] for e in evals), 6), "evals": evals,
            "train_samples_per_s": round(last_step * B / max(marks.seconds(start_mark, end_mark)
                                                             - sum(e["seconds"] for e in evals), 1e-9), 1),
            "steady": steady,
            "mean_train_loss": round(loss_sum.item() / max(last_step, 1), 5),
            "peak_memory_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None,
        })
        if graph_mode:
            result["capture_s"] = round(capture_s, 6) if capture_s is not None else None
            result["device_step"] = int(device_step.item())
            # the LR the last replayed step trained at, against the host schedule (float32, as the kernel takes it)
            result["last_lr"] = lr_tensor.item()
            result["lr_matches_schedule"] = lr_tensor.item() == float(np.float32(self.lrs[last_step - 1]))
            del graph
        return result


def eager_init(job):
    """cuDNN/cuBLAS handles, cudnn.benchmark's search and kernel loading, on an uncompiled throwaway copy:
    a few training steps at the run's shapes and one evaluation."""
    model = copy.deepcopy(job.model).train()
    fused = {"fused": True} if job.device.type == "cuda" else {}
    optimizer = torch.optim.AdamW(param_groups(model, 0.0), lr=1e-4, **fused)
    idx = torch.arange(job.args.batch_size, device=job.device)
    for _ in range(3):
        x, y = job.data.gather(idx)
        job.loss_of(model, x, y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    job.evaluate(model, model)
    sync(job.device)


def cpu_native_bf16():
    """fasttrain's rule for train.precision = "auto" on the CPU (src/util/hardware.cpp): bf16 where the CPU has
    AVX512-BF16 or AMX-BF16, FASTTRAIN_NATIVE_BF16=0/1 overriding it."""
    forced = os.environ.get("FASTTRAIN_NATIVE_BF16", "")
    if forced not in ("", "0", "1"):
        sys.exit(f"FASTTRAIN_NATIVE_BF16 must be 0 (treat this CPU as without native bfloat16) or 1, got {forced!r}")
    if forced:
        return forced == "1"
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["eager", "compile", "graph"], default="eager")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                   help="auto: fasttrain's auto, bf16 on CUDA sm_80+ and on CPUs with AVX512-BF16 or AMX, "
                        "else fp32")
    p.add_argument("--data-dir", default=DATA_DIR, help="Fashion-MNIST IDX files (env FASHION_MNIST_DIR)")
    p.add_argument("--resident", choices=["float", "uint8"], default="float",
                   help="the data on the device: normalised float32, or uint8 normalised per batch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-run", dest="warmup_run", action="store_true", default=None,
                   help="one untimed whole run first (default on CUDA)")
    p.add_argument("--no-warmup-run", dest="warmup_run", action="store_false")
    p.add_argument("--json", action="store_true", help="one JSON line on stdout at the end")
    # the job: from --config, where these defaults are overridden by the config's keys; change only for smoke tests
    p.add_argument("--config", default=DEFAULT_CONFIG, help="the fasttrain config whose job this runs")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--hidden", type=int, nargs="+", default=[256], help="model.hidden: the hidden layers' widths")
    p.add_argument("--eval-batch-size", type=int, default=1000)
    p.add_argument("--max-steps", type=int, default=700)
    p.add_argument("--optimizer", choices=["adamw", "muon"], default="adamw",
                   help="optim.name: muon as fasttrain's (MuonAndAdamW; eager and compile modes)")
    p.add_argument("--muon-exclude", nargs="*", default=[], help="optim.muon_exclude (names, e.g. classifier.0)")
    p.add_argument("--lr", type=float, default=6e-3)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--pct-start", type=float, default=0.25)
    p.add_argument("--div-factor", type=float, default=25.0)
    p.add_argument("--final-div-factor", type=float, default=1e3)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--ema-decay", type=float, default=0.0,
                   help="ema.decay where ema.enabled: evaluate with an EMA of the weights (0: none)")
    p.add_argument("--no-ema-warmup", dest="ema_warmup", action="store_false", help="ema.warmup = false")
    p.add_argument("--ema-after-step", type=int, default=0,
                   help="ema.after_step: the EMA averages from the step after this many on (0: from the first)")
    p.add_argument("--eval-from", type=int, default=560, help="train.eval_from_step")
    p.add_argument("--eval-every", type=int, default=45, help="train.eval_every_steps")
    p.add_argument("--target", type=float, default=0.91, help="train.target_accuracy")
    p.add_argument("--no-stop-at-target", dest="stop_at_target", action="store_false")
    p.add_argument("--steady-from", type=int, default=50, help="the steady throughput is measured after this step")
    p.add_argument("--graph-warmup-steps", type=int, default=3, help="graph mode: eager steps before the capture")
    p.add_argument("--threads", type=int, default=0, help="CPU: torch.set_num_threads (0: leave)")
    p.add_argument("--fused-cpu", action="store_true", help="CPU: the fused AdamW kernel (default: foreach)")
    p.add_argument("--sync-debug", action="store_true",
                   help="CUDA: torch.cuda.set_sync_debug_mode('warn') during the timed runs (reports host syncs)")
    p.set_defaults(**job_from_config(p.parse_known_args()[0].config))
    args = p.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: this torch sees no CUDA device (use --device cpu for a smoke test)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if args.mode == "graph" and device.type != "cuda":
        sys.exit("--mode graph captures a CUDA graph: it needs --device cuda (eager and compile also run on the CPU)")
    if args.mode == "graph" and args.graph_warmup_steps < 1:
        p.error("--graph-warmup-steps must be >= 1 (capture needs warmed-up kernels and optimizer state)")
    if args.graph_warmup_steps >= args.max_steps and args.mode == "graph":
        p.error("--max-steps must exceed --graph-warmup-steps")
    if args.precision == "auto":
        if device.type == "cuda":
            bf16_ok = torch.cuda.get_device_capability(device)[0] >= 8
        else:
            bf16_ok = cpu_native_bf16()
        args.precision = "bf16" if bf16_ok else "fp32"
    if args.warmup_run is None:
        args.warmup_run = device.type == "cuda"
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True          # train.cudnn_benchmark = true
        torch.backends.cuda.matmul.allow_tf32 = True   # train.tf32 = true (fp32 only)
        torch.backends.cudnn.allow_tf32 = True

    t = time.perf_counter()
    data = DeviceData(args.data_dir, device, args.resident)
    sync(device)
    load_s = time.perf_counter() - t
    print(f"data: {data.train_n} + {data.test_n} images on {device} ({args.resident}), mean {data.mean:.6f} "
          f"std {data.std:.6f}, {load_s:.2f} s", file=sys.stderr, flush=True)
    job = Job(args, device, data)

    warm, init_s = None, None
    if args.warmup_run:
        if args.mode == "compile":
            t = time.perf_counter()
            eager_init(job)
            init_s = round(time.perf_counter() - t, 3)
        warm = job.run(args.seed, "warm-up run")
    if args.sync_debug and device.type == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
    runs = [job.run(args.seed + r, f"run {r + 1}/{args.repeats}") for r in range(args.repeats)]
    if args.sync_debug and device.type == "cuda":
        torch.cuda.set_sync_debug_mode("default")

    times = [r["time_to_target_s"] for r in runs]
    reached = [t for t in times if t is not None]
    steady = [r["steady"]["samples_per_s"] for r in runs if r["steady"]]
    median = statistics.median(reached) if reached else None  # over the runs that reached the target
    out = {
        "peer": "gpu_speedrun", "mode": args.mode, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "precision": args.precision, "resident": args.resident, "config": os.path.normpath(args.config),
        "optimizer": args.optimizer,
        "time_to_target_s": times, "median_time_to_target_s": median, "reached_target": len(reached),
        "median_wall_s": statistics.median(r["wall_s"] for r in runs) if runs else None,
        "samples_per_s": statistics.median(steady) if steady else None,
        "steps_per_s": statistics.median(r["steady"]["steps_per_s"] for r in runs if r["steady"]) if steady else None,
        "accuracy": [r["final_accuracy"] for r in runs],
        "steps": [r["steps"] for r in runs],
        "target_step": [r["target_step"] for r in runs],
        "first_step_s": [r["first_step_s"] for r in runs],
        "target": args.target, "max_steps": args.max_steps, "batch_size": args.batch_size,
        "repeats": args.repeats, "seed": args.seed, "warmup_run": args.warmup_run,
        "data_mean": data.mean, "data_std": data.std, "data_load_s": round(load_s, 3),
        "runs": runs,
    }
    if args.mode == "graph":
        out["capture_s"] = [r["capture_s"] for r in runs]
    if args.mode == "compile":
        # Inductor's on-disk caches make a later process's compilation much shorter than the first one's
        out["inductor_cache_dir"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "(default: /tmp/torchinductor_$USER)")
        # where the compilation was paid: the warm-up run, or (--no-warmup-run) the first timed run
        out["compiled_in"] = "warm-up run" if warm is not None else "run 1"
        if warm is None and len(runs) > 1 and runs[0]["time_to_target_s"] is not None:
            rest = [t for t in times[1:] if t is not None]
            out["time_to_target_incl_compile_s"] = runs[0]["time_to_target_s"]
            out["time_to_target_excl_compile_s"] = statistics.median(rest) if rest else None
    if warm is not None:
        out["warmup"] = warm
        if args.mode == "compile":
            out["eager_init_s"] = init_s
            # compilation happens in the first training step (forward and backward graphs) and the first
            # evaluation (the eval-mode graph): its cost is what those two took in the cold run beyond what they
            # take in the warm ones
            def first_costs(r):
                return r["first_step_s"] + (r["evals"][0]["seconds"] if r["evals"] else 0.0)

            overhead = first_costs(warm) - statistics.median(first_costs(r) for r in runs) if runs else None
            out["compile_overhead_s"] = None if overhead is None else round(overhead, 3)
            out["first_step_incl_compile_s"] = warm["first_step_s"]
            out["first_eval_incl_compile_s"] = warm["evals"][0]["seconds"] if warm["evals"] else None
            # measured: the cold run's own time to target (None where it missed the target)
            out["time_to_target_incl_compile_s"] = warm["time_to_target_s"]
            out["time_to_target_excl_compile_s"] = median
            if median is not None and overhead is not None:
                out["time_to_target_incl_compile_estimate_s"] = round(median + overhead, 3)
    summary = (f"{args.mode} {args.precision} on {out['device_name']}: time to {args.target} "
               f"{', '.join('-' if t is None else f'{t:.3f}' for t in times)} s (median "
               f"{'-' if median is None else f'{median:.3f}'} over the {len(reached)} of {len(runs)} that reached it), "
               f"steady {out['samples_per_s']} samples/s")
    print(summary, file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
