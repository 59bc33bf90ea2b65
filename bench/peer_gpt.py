#!/usr/bin/env python3
"""Python PyTorch peer: fasttrain's byte-level GPT (src/models/gpt.cpp), written the standard way.

Data, as fasttrain's text dataset (src/data/text.cpp): every file under --path (walked recursively,
symlinked directories not followed) whose name matches --include (fnmatch, case-sensitive), in sorted
path order (component by component, as std::filesystem::path compares), one document of raw bytes
each. A document goes to validation when the FNV-1a hash of its relative path, mod 1e9, is below
--val-fraction x 1e9 (never read here: the peer does not evaluate); the training documents are
concatenated with a 0 byte after each, N tokens, and a sample is a window at s uniform in
[0, N - T - 1]: tokens[s : s+T] the input, tokens[s+1 : s+T+1] the targets (vocabulary 256, the bytes).

Model, parameter for parameter the same as fasttrain's gpt: token embedding (256 x C) and position
embedding (T x C), dropout, L pre-norm blocks x = x + attn_proj(attention(qkv(ln1(x)))),
x = x + mlp_proj(gelu_tanh(fc(ln2(x)))) with causal attention over H heads of C/H
(F.scaled_dot_product_attention(is_causal=True) where torch has it, else the math path: q k^T / sqrt(D),
the strict upper triangle masked to -inf, softmax, @ v), a final LayerNorm, and logits through the
token embedding (tied). GPT-2's init: weights N(0, 0.02), biases 0, LayerNorms as constructed, the
residual projections (attn_proj, mlp_proj) N(0, 0.02 / sqrt(2L)). AdamW(lr, betas (0.9, beta2), eps 1e-8),
weight decay on the parameters of 2 or more dimensions only, gradients clipped to --clip-norm, cosine
learning rate (fasttrain's: --lr-warmup-steps of linear warm-up, then cosine from --lr to --min-lr over the
rest of --steps, computed each step).
--checkpoint-blocks runs every block under torch.utils.checkpoint (use_reentrant=True).
--precision bf16 runs the forward and the loss under torch.autocast("cpu", dtype=torch.bfloat16), as
fasttrain's train.precision = "bf16" does (weights and optimizer stay fp32). --blas-threads N sets
OpenBLAS's own pool (fasttrain's train.blas_threads; 0 leaves it at OpenBLAS's count).

Timing: the clock starts at the end of step --warmup-steps and stops at the end of the last step; each
step's time includes drawing its batch. tokens_per_s counts B x T target tokens per step; step_ms is the
median over the timed steps. final_loss is the mean training loss of the last --log-every steps.
peak_rss_bytes is the process's peak resident set (getrusage), not tensor bytes (PyTorch's CPU
allocator keeps no statistics); rss_at_train_start_bytes is the resident set just before step 1.
Progress goes to stderr every --log-every steps; stdout gets one JSON line at the end.

--matmul-ceiling instead measures this machine's torch.mm in --precision (fp32: OpenBLAS, at --threads
threads of its pool; bf16: oneDNN, on --threads OpenMP threads) : square matmuls of 512, 1024 and 2048 (2 n^3 flops each), warmed up, then repeated for at least 0.5 s and 3 times per size;
prints each size's median FLOP/s and the largest.

--compile runs the model under torch.compile (PyTorch 2.x); the same loop around it.

Run with the pinned environment's Python (scripts/install-deps: PyTorch 2.11) or /usr/bin/python3
(Debian's python3-torch, 1.13):
  .venv/bin/python bench/peer_gpt.py --steps 300 --warmup-steps 20 --threads 2 [--compile]
  .venv/bin/python bench/peer_gpt.py --matmul-ceiling --threads 2

--device cuda (or cuda:N) trains on a GPU; the CPU behaviour above is unchanged (--device cpu, the default).
On CUDA: the model is built and initialised on the CPU as above (same seed, same weights) and moved to the
GPU; the training tokens live on the GPU (uint8) and each batch is drawn there (torch.randint on the device,
seeded by --seed); --precision auto (the default) is bf16 autocast on CUDA (weights and optimizer fp32) and
fp32 on the CPU; fp32 on CUDA allows TF32 matmuls (fasttrain's train.tf32 = true); AdamW runs fused
(fused=True); clipping is clip_grad_norm_ (foreach, no host read); attention is
F.scaled_dot_product_attention(is_causal=True) restricted to --sdpa-backend (default on CUDA: flash, which
takes bf16/fp16 only, so fp32 runs take auto). Nothing reads the device inside a step: the losses stay on the
GPU and are read only at --log-every steps (as fasttrain reads them at log.every_steps; --log-every 0: never
before the end). Timing: a torch.cuda.synchronize() at the end of step --warmup-steps and at the end of the
last step bound the tokens/s clock (host wall time); step_ms is the median of the per-step times between CUDA
events recorded at each step's end on the stream (no synchronisation). peak_memory_bytes is
torch.cuda.max_memory_allocated() over training (peak_reserved_bytes: the caching allocator's reserve).
MFU = tokens/s x flops_per_token / ceiling, flops_per_token = 6 N + 12 L T C (N: the non-embedding
parameters, as bench/compare.py counts them), ceiling: --ceiling-flops when > 0, else measured after
training as --matmul-ceiling does on CUDA (< 0: no MFU). --matmul-ceiling on CUDA: torch.mm of random
(randn, not zeros: power draw and clocks depend on the data) square matrices of --ceiling-sizes (default
2048, 4096, 8192) in --precision (bf16; fp32 = TF32 tensor cores), warmed up (at least 0.3 s), then timed
with CUDA events, each sample enough back-to-back products for about 25 ms, at least 5 samples and 0.5 s per
size; each size's median FLOP/s and the largest (max_flop_per_s).
  /opt/torch/.venv/bin/python3 bench/peer_gpt.py --device cuda --path . --include '*.cpp' \
      --layers 12 --heads 12 --embed 768 --context 1024 --batch-size 16 --steps 60 --warmup-steps 10 [--compile]
  /opt/torch/.venv/bin/python3 bench/peer_gpt.py --device cuda --matmul-ceiling
"""
import argparse
import contextlib
import ctypes
import fnmatch
import json
import math
import os
import re
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

VOCAB = 256
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


# ---- data (as fasttrain's src/data/text.cpp) --------------------------------------------------
def corpus_files(root, pattern):
    """Files under root (symlinked directories not followed; symlinked files followed) whose name matches
    pattern, as paths relative to root, in std::filesystem::path's order (component by component)."""
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if fnmatch.fnmatchcase(name, pattern) and os.path.isfile(path):
                found.append(os.path.relpath(path, root))
    return sorted(found, key=lambda rel: tuple(os.fsencode(part) for part in rel.split(os.sep)))


def fnv1a(text):
    """FNV-1a, 64 bits, of a string's UTF-8 bytes: fasttrain's stable hash of a document's path."""
    h = 14695981039346656037
    for byte in os.fsencode(text):
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def load_corpus(root, pattern, val_fraction):
    """The training split's tokens (uint8 tensor: each training document's bytes, then a 0 byte) and the
    counts. A document is held out for validation when FNV-1a of its relative path, mod 1e9, is below
    val_fraction x 1e9 (fasttrain's split: fixed per path, so the same on every machine)."""
    if os.path.isfile(root):  # one file: the corpus is that document (named by its file name)
        root, name = os.path.split(root)
        root = root or "."
        files = [name] if fnmatch.fnmatchcase(name, pattern) else []
    else:
        files = corpus_files(root, pattern)
    if not files:
        sys.exit(f"no file named like '{pattern}' under {root}")
    threshold = int(val_fraction * 1e9)
    parts, corpus_bytes, documents = [], 0, {"train": 0, "validation": 0}
    for rel in files:
        with open(os.path.join(root, rel), "rb") as f:
            text = f.read()
        corpus_bytes += len(text) + 1
        if fnv1a(rel) % 1000000000 < threshold:
            documents["validation"] += 1
            continue
        documents["train"] += 1
        parts += [text, b"\0"]
    if not parts:
        sys.exit(f"--val-fraction {val_fraction} leaves no training document")
    data = bytearray(b"".join(parts))
    del parts
    return torch.frombuffer(data, dtype=torch.uint8), corpus_bytes, documents


# ---- model ------------------------------------------------------------------------------------
def causal_attention(q, k, v):  # [B, H, T, D] each
    if HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    length = q.size(2)
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(3)))  # [B, H, T, T]
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.matmul(torch.softmax(scores, -1), v)


class Block(nn.Module):
    def __init__(self, embed, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(embed)
        self.qkv = nn.Linear(embed, 3 * embed)
        self.attn_proj = nn.Linear(embed, embed)
        self.ln2 = nn.LayerNorm(embed)
        self.fc = nn.Linear(embed, 4 * embed)
        self.mlp_proj = nn.Linear(4 * embed, embed)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):  # [B, T, C]
        batch, length, embed = x.shape
        qkv = self.qkv(self.ln1(x)).view(batch, length, 3, self.heads, embed // self.heads)
        # unbind, whose backward stacks the three gradients in one pass (as fasttrain's ATen path does); three
        # selects would each fill a zero tensor of qkv's size in backward and add them.
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # [B, H, T, D]
        attended = causal_attention(q, k, v).transpose(1, 2).reshape(batch, length, embed)
        x = x + self.dropout(self.attn_proj(attended))
        hidden = F.gelu(self.fc(self.ln2(x)), approximate="tanh")  # [B, T, 4C]
        return x + self.dropout(self.mlp_proj(hidden))


class GPT(nn.Module):
    def __init__(self, layers, heads, embed, context, dropout=0.0, checkpoint_blocks=False):
        super().__init__()
        assert embed % heads == 0, "embed must be a multiple of heads"
        self.context = context
        self.checkpoint_blocks = checkpoint_blocks
        self.token_embedding = nn.Embedding(VOCAB, embed)
        self.position_embedding = nn.Embedding(context, embed)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[Block(embed, heads, dropout) for _ in range(layers)])
        self.final_norm = nn.LayerNorm(embed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "ln" in name or "norm" in name:
                    continue
                if p.dim() == 1:
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02)
            for block in self.blocks:
                for w in (block.attn_proj.weight, block.mlp_proj.weight):
                    w.normal_(0.0, 0.02 / math.sqrt(2.0 * layers))

    def forward(self, tokens):  # [B, T] int64 -> logits [B * T, 256]
        positions = torch.arange(tokens.size(1), dtype=torch.long, device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True) if self.checkpoint_blocks else block(x)
        x = self.final_norm(x)
        logits = torch.matmul(x, self.token_embedding.weight.t())  # tied
        return logits.reshape(-1, VOCAB)


def blas():
    """The BLAS that torch.mm reaches (Debian's torch: libblas.so.3, by default OpenBLAS's pthread build),
    and OpenBLAS's handle, or None. torch.set_num_threads does not reach OpenBLAS's own threads (which
    default to every core, or OPENBLAS_NUM_THREADS); fasttrain's train.threads does not either."""
    library = None
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if re.search(r"/lib(open)?blas[^/]*\.so", path):
                library = os.path.realpath(path)
                break
    try:
        handle = ctypes.CDLL("libopenblas.so.0", mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
        handle.openblas_get_num_threads.restype = ctypes.c_int
    except (OSError, AttributeError):
        handle = None
    return library, handle


def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ---- the two modes ----------------------------------------------------------------------------
def cuda_flop_ceiling(device, precision, sizes):
    """torch.mm FLOP/s on a CUDA device: random square matrices of each size in bf16 (or fp32, TF32 allowed),
    warmed up, then timed with CUDA events. Returns {size: {median_flop_per_s, ...}}."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    result = {}
    for n in sizes:
        generator = torch.Generator(device=device)
        generator.manual_seed(n)
        a = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
        c = torch.empty(n, n, device=device, dtype=dtype)
        flops = 2.0 * n ** 3
        start, products = time.perf_counter(), 0
        while True:  # warm-up: at least 3 products and 0.3 s (clocks and power settle)
            torch.mm(a, b, out=c)
            products += 1
            if products >= 3:
                torch.cuda.synchronize(device)
                if time.perf_counter() - start >= 0.3:
                    break
        each = (time.perf_counter() - start) / products
        inner = max(1, math.ceil(0.025 / max(each, 1e-7)))  # products per sample: about 25 ms
        rates, spent = [], 0.0
        while spent < 0.5 or len(rates) < 5:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(inner):
                torch.mm(a, b, out=c)
            end.record()
            end.synchronize()
            seconds = begin.elapsed_time(end) / 1000.0
            spent += seconds
            rates.append(inner * flops / seconds)
        result[str(n)] = {"median_flop_per_s": statistics.median(rates), "max_flop_per_s": max(rates),
                          "samples": len(rates), "products_per_sample": inner, "seconds": round(spent, 3)}
        del a, b, c
    return result


def cuda_device(name):
    device = torch.device(name)
    if not torch.cuda.is_available():
        sys.exit(f"--device {name}: this torch ({torch.__version__}) sees no CUDA device")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = True  # fasttrain's train.tf32 = true (fp32 matmuls on tensor cores)
    torch.backends.cudnn.allow_tf32 = True
    return device


def matmul_ceiling(args):
    if args.device != "cpu":
        device = cuda_device(args.device)
        sizes = cuda_flop_ceiling(device, args.precision, args.ceiling_sizes)
        print(json.dumps({
            "peer": "matmul-ceiling", "device": str(device), "gpu": torch.cuda.get_device_name(device),
            "dtype": "bfloat16" if args.precision == "bf16" else "float32 (TF32 allowed)", "op": "torch.mm",
            "torch": torch.__version__, "cuda": torch.version.cuda, "sizes": sizes,
            "max_flop_per_s": max(s["median_flop_per_s"] for s in sizes.values()),
        }), flush=True)
        return
    torch.set_num_threads(args.threads)
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))  # loads the BLAS
    library, openblas = blas()
    if openblas is not None:  # at --threads threads, OpenBLAS's own pool included
        openblas.openblas_set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    sizes = {}
    for n in (512, 1024, 2048):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        c = torch.empty(n, n, dtype=dtype)
        flops = 2.0 * n ** 3
        start = time.perf_counter()
        while True:  # warm-up: at least 2 products and 0.1 s
            for _ in range(2):
                torch.mm(a, b, out=c)
            if time.perf_counter() - start >= 0.1:
                break
        rates, spent = [], 0.0
        while spent < 0.5 or len(rates) < 3:
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            dt = time.perf_counter() - t0
            spent += dt
            rates.append(flops / dt)
        sizes[str(n)] = {"median_flop_per_s": statistics.median(rates), "repeats": len(rates),
                         "seconds": round(spent, 3)}
    print(json.dumps({
        "peer": "matmul-ceiling", "dtype": str(dtype).replace("torch.", ""), "op": "torch.mm", "threads": args.threads,
        "torch": torch.__version__, "blas_library": library,
        "blas_threads": openblas.openblas_get_num_threads() if openblas is not None else None,
        "sizes": sizes, "max_flop_per_s": max(s["median_flop_per_s"] for s in sizes.values()),
    }), flush=True)


def sdpa_context(name):
    """A context restricting F.scaled_dot_product_attention to one backend (torch.nn.attention.sdpa_kernel),
    or nothing for "auto"."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]
    return sdpa_kernel([backend])


def cuda_loop(args, model, params, optimizer, lr_at, train_tokens, offsets, device):
    """The training loop on a GPU: batches drawn on the device, bf16 autocast, no host read inside a step.
    Returns (losses as floats, per-step seconds of the timed steps, timed seconds, the loss curve)."""
    T, B, warmup = args.context, args.batch_size, args.warmup_steps
    amp = args.precision == "bf16"
    events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
    device_losses, curve = [], []
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    mark = time.perf_counter() if warmup == 0 else None
    log_start = time.perf_counter()
    events[0].record()
    profiler = None
    with sdpa_context(args.sdpa_backend):
        for step in range(args.steps):
            if args.profile_steps and step == warmup:
                profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                              torch.profiler.ProfilerActivity.CUDA])
                profiler.__enter__()
            starts = torch.randint(0, train_tokens.numel() - T, (B,), device=device)
            window = train_tokens[starts[:, None] + offsets].long()  # [B, T + 1]
            x, y = window[:, :-1], window[:, 1:]
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(model(x), y.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if args.clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, args.clip_norm, foreach=True)
            optimizer.step()
            device_losses.append(loss.detach())
            events[step + 1].record()
            if profiler is not None and step + 1 == warmup + args.profile_steps:
                torch.cuda.synchronize(device)
                profiler.__exit__(None, None, None)
                if args.profile_trace:
                    profiler.export_chrome_trace(args.profile_trace)
                print_operator_profile(profiler, args.profile_steps)
                profiler = None
            if step + 1 == warmup:
                torch.cuda.synchronize(device)
                mark = time.perf_counter()
            if args.log_every and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
                since = (step // args.log_every) * args.log_every
                mean = torch.stack(device_losses[since:]).float().mean().item()  # synchronises, as fasttrain's log
                now = time.perf_counter()
                curve.append([step + 1, round(mean, 4)])
                print(f"step {step + 1}: loss {mean:.4f}, {1000 * (now - log_start) / (step + 1 - since):.1f} ms/step",
                      file=sys.stderr, flush=True)
                log_start = now
    torch.cuda.synchronize(device)
    measured_s = time.perf_counter() - mark
    step_s = [events[i].elapsed_time(events[i + 1]) / 1000.0 for i in range(warmup, args.steps)]
    losses = torch.stack(device_losses).float().tolist()
    return losses, step_s, measured_s, curve


def window_step(model, optimizer, params, train_tokens, offsets, lr, args, generator=None, after_backward=None):
    """One eager optimizer step on --batch-size random windows of --context tokens (drawn with
    `generator`): the LR set, the loss under autocast when --precision bf16, backward, `after_backward()`,
    clipping at --clip-norm, the step. Returns the loss tensor."""
    T, B = args.context, args.batch_size
    starts = torch.randint(0, train_tokens.numel() - T, (B,), generator=generator)
    window = train_tokens[starts[:, None] + offsets].long()  # [B, T + 1]
    x, y = window[:, :-1], window[:, 1:]
    for group in optimizer.param_groups:
        group["lr"] = lr
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
        loss = F.cross_entropy(model(x), y.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if after_backward is not None:
        after_backward()
    if args.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, args.clip_norm)
    optimizer.step()
    return loss


def print_operator_profile(profiler, steps, rows=25):
    """The operators by self time per step (ms), as `fasttrain profile` lists its own: to stderr."""
    events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    print(f"operators by self time over {steps} steps (ms per step; all: {total / 1000 / steps:.2f}):",
          file=sys.stderr)
    for e in events[:rows]:
        print(f"  {e.key:<48} {e.self_cpu_time_total / 1000 / steps:8.3f} ms  {e.count / steps:6.1f} calls",
              file=sys.stderr)


def set_threads_and_load_corpus(args):
    """--threads intra-op threads, OpenBLAS's pool at --blas-threads, the training split of the corpus
    (long enough for one window): what every peer of the GPT does first."""
    torch.set_num_threads(args.threads)
    torch.mm(torch.ones(8, 8), torch.ones(8, 8))  # loads the BLAS
    if args.blas_threads > 0:
        _, openblas = blas()
        if openblas is None:
            sys.exit(f"--blas-threads {args.blas_threads} needs OpenBLAS, and this torch's BLAS is another")
        openblas.openblas_set_num_threads(args.blas_threads)
    train_tokens, corpus_bytes, documents = load_corpus(args.path, args.include, args.val_fraction)
    if train_tokens.numel() < args.context + 1:
        sys.exit(f"the training split has {train_tokens.numel()} tokens, fewer than context + 1 = "
                 f"{args.context + 1}")
    return train_tokens, corpus_bytes, documents


def train(args):
    torch.manual_seed(args.seed)
    train_tokens, corpus_bytes, documents = set_threads_and_load_corpus(args)
    T, B = args.context, args.batch_size
    cuda = args.device != "cpu"
    device = cuda_device(args.device) if cuda else torch.device("cpu")
    if cuda:
        train_tokens = train_tokens.to(device)  # uint8, resident on the GPU
    offsets = torch.arange(T + 1, device=device)

    model = GPT(args.layers, args.heads, args.embed, args.context, args.dropout, args.checkpoint_blocks)
    if cuda:
        model.to(device)  # initialised on the CPU (the same weights as a CPU run), then moved
    model.train()
    params = list(model.parameters())
    if args.compile:
        model = torch.compile(model)  # same parameters; forward and backward compiled on the first step
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, args.beta2), eps=1e-8, **({"fused": True} if cuda else {}))
    parameters = sum(p.numel() for p in params)
    non_embedding = parameters - model.position_embedding.weight.numel()

    def lr_at(step):  # fasttrain's cosine: linear warm-up to --lr, then cosine down to --min-lr
        if step < args.lr_warmup_steps:
            return args.lr * (step + 1) / args.lr_warmup_steps
        t = (step - args.lr_warmup_steps) / (args.steps - args.lr_warmup_steps)
        return args.min_lr + (args.lr - args.min_lr) * (1 + math.cos(math.pi * t)) / 2

    warmup = args.warmup_steps
    if warmup >= args.steps:
        sys.exit(f"--warmup-steps ({warmup}) must be below --steps ({args.steps})")
    rss_start = resident_bytes()
    if cuda:
        losses, step_s, measured_s, curve = cuda_loop(args, model, params, optimizer, lr_at, train_tokens, offsets,
                                                      device)
    else:
        step_s, losses, curve = [], [], []
        mark = time.perf_counter() if warmup == 0 else None
        measured_s = 0.0
        profiler = None
        for step in range(args.steps):
            if args.profile_steps and step == warmup:
                profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                profiler.__enter__()
            t0 = time.perf_counter()
            loss = window_step(model, optimizer, params, train_tokens, offsets, lr_at(step), args)
            if profiler is not None and step + 1 == warmup + args.profile_steps:
                profiler.__exit__(None, None, None)
                print_operator_profile(profiler, args.profile_steps)
                profiler = None
            losses.append(loss.item())
            now = time.perf_counter()
            if step + 1 > warmup:
                step_s.append(now - t0)
            if mark is not None and step + 1 > warmup:
                measured_s = now - mark
            elif step + 1 == warmup:
                mark = now
            if args.log_every and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
                since = (step // args.log_every) * args.log_every
                mean = statistics.fmean(losses[since:])
                curve.append([step + 1, round(mean, 4)])
                print(f"step {step + 1}: loss {mean:.4f}, {1000 * (now - t0):.1f} ms", file=sys.stderr, flush=True)

    library, openblas = blas()
    tail = losses[-args.log_every:] if args.log_every else losses[-1:]
    timed_steps = args.steps - warmup
    if cuda:
        peak_allocated = torch.cuda.max_memory_allocated(device)
        peak_reserved = torch.cuda.max_memory_reserved(device)
    result = {
        "peer": "gpt",
        "tokens_per_s": round(timed_steps * B * T / measured_s, 1),
        "step_ms": round(1000 * statistics.median(step_s), 3),
        "final_loss": round(statistics.fmean(tail), 4),
        "first_loss": round(losses[0], 4),
        "loss_curve": curve,
        "parameters": parameters,
        "non_embedding_parameters": non_embedding,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_at_train_start_bytes": rss_start,
        "torch": torch.__version__,
        "compiled": args.compile,
        "threads": args.threads,
        "precision": args.precision,
        "blas_threads": openblas.openblas_get_num_threads() if openblas is not None else None,
        "attention": "sdpa" if HAS_SDPA else "math",
        "checkpoint_blocks": args.checkpoint_blocks,
        "corpus_bytes": corpus_bytes,
        "train_tokens": train_tokens.numel(),
        "documents": documents["train"] + documents["validation"],
        "train_documents": documents["train"],
        "layers": args.layers, "heads": args.heads, "embed": args.embed, "context": T, "batch_size": B,
        "steps": args.steps, "warmup_steps": warmup, "timed_s": round(measured_s, 3), "seed": args.seed,
    }
    if cuda:
        tokens_per_s = timed_steps * B * T / measured_s
        flops_per_token = 6 * non_embedding + 12 * args.layers * T * args.embed
        if args.ceiling_flops > 0:
            ceiling, ceiling_from = args.ceiling_flops, "--ceiling-flops"
        elif args.ceiling_flops == 0:
            del optimizer  # the GPU's memory back for the matmuls (the model's weights stay)
            torch.cuda.empty_cache()
            sizes = cuda_flop_ceiling(device, args.precision, args.ceiling_sizes)
            ceiling = max(v["median_flop_per_s"] for v in sizes.values())
            ceiling_from = {"measured": "torch.mm", "sizes": sizes}
        else:
            ceiling, ceiling_from = None, None
        result.update({
            "device": str(device), "gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda,
            "sdpa_backend": args.sdpa_backend, "fused_adamw": True, "tf32": torch.backends.cuda.matmul.allow_tf32,
            "peak_memory_bytes": peak_allocated, "peak_reserved_bytes": peak_reserved,
            "step_ms_mean": round(1000 * statistics.fmean(step_s), 3),
            "flops_per_token": flops_per_token,
            "model_flop_per_s": tokens_per_s * flops_per_token,
            "ceiling_flop_per_s": ceiling, "ceiling": ceiling_from,
            "mfu": round(tokens_per_s * flops_per_token / ceiling, 4) if ceiling else None,
        })
    print(json.dumps(result), flush=True)


def add_corpus_and_model_args(p):
    """The corpus and the GPT's shape: the flags every peer of the GPT shares."""
    p.add_argument("--path", default="/usr/lib/python3.11")
    p.add_argument("--include", default="*.py", help="fnmatch pattern on the file name")
    p.add_argument("--val-fraction", type=float, default=0.05,
                   help="documents held out (by a hash of their path, as fasttrain splits); 0: none")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embed", type=int, default=128)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)


def add_recipe_args(p):
    """AdamW with fasttrain's cosine schedule, clipping, the seed, checkpointed blocks: shared by the peers."""
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-warmup-steps", type=int, default=0, help="schedule.warmup_steps")
    p.add_argument("--min-lr", type=float, default=0.0, help="schedule.min_lr")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--clip-norm", type=float, default=1.0, help="0: no clipping")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-blocks", action="store_true", help="torch.utils.checkpoint around each block")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_and_model_args(p)
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup-steps", type=int, default=20, help="steps before the throughput clock starts")
    p.add_argument("--threads", type=int, default=2)
    add_recipe_args(p)
    p.add_argument("--profile-steps", type=int, default=0,
                   help="record this many steps after the warm-up with torch.profiler and print the "
                        "operators by self time (stderr); the throughput then includes the profiler's cost")
    p.add_argument("--profile-trace", default="",
                   help="CUDA: also write the recorded steps' Chrome trace here (bench/gpu/kernel_table.py "
                        "lists its kernels)")
    p.add_argument("--log-every", type=int, default=10, help="steps per progress line (stderr); 0: none")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                   help="bf16: autocast to bfloat16 (training), bf16 torch.mm (--matmul-ceiling); "
                        "auto: fp32 on the CPU, bf16 on CUDA")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--sdpa-backend", choices=["default", "auto", "flash", "efficient", "cudnn", "math"],
                   default="default", help="CUDA: the SDPA backend (default: flash with bf16, else auto)")
    p.add_argument("--ceiling-flops", type=float, default=0.0,
                   help="CUDA: the FLOP/s that MFU divides by; 0: measure torch.mm after training; < 0: no MFU")
    p.add_argument("--ceiling-sizes", default="2048,4096,8192",
                   help="CUDA: square matmul sizes of the ceiling (comma-separated)")
    p.add_argument("--blas-threads", type=int, default=0, help="OpenBLAS's own threads (0: its count)")
    p.add_argument("--matmul-ceiling", action="store_true", help="measure torch.mm FLOP/s instead of training")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (PyTorch 2.x; the warm-up steps pay for the compilation)")
    args = p.parse_args()
    on_cuda = args.device != "cpu"
    if on_cuda and not args.device.startswith("cuda"):
        p.error(f"--device must be cpu or cuda[:N], got {args.device}")
    if args.precision == "auto":
        args.precision = "bf16" if on_cuda else "fp32"
    if args.sdpa_backend == "default":
        args.sdpa_backend = "flash" if on_cuda and args.precision == "bf16" else "auto"
    if not on_cuda and args.sdpa_backend != "auto":
        p.error("--sdpa-backend is for --device cuda")
    try:
        args.ceiling_sizes = [int(n) for n in args.ceiling_sizes.split(",") if n.strip()]
    except ValueError:
        p.error(f"--ceiling-sizes: comma-separated integers, got {args.ceiling_sizes!r}")
    if args.compile and not hasattr(torch, "compile"):
        p.error(f"--compile needs PyTorch 2.x; this is torch {torch.__version__}")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    if args.matmul_ceiling:
        matmul_ceiling(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
