#!/usr/bin/env python3
"""Python PyTorch peer: fasttrain's fully sharded training (dist.zero = 3) against DDP, on the CPU over Gloo.

The model, data and optimizer are bench/peer_gpt.py's (imported from it, not copied): fasttrain's byte-level
GPT (src/models/gpt.cpp) with GPT-2's init, the training documents of --path / --include (--val-fraction held
out by the hash of their path) concatenated into one uint8 tensor, random windows of --context + 1 bytes,
AdamW(lr, betas (0.9, beta2), eps 1e-8) with weight decay on the parameters of 2 or more dimensions only,
gradients clipped to --clip-norm, fasttrain's cosine learning rate (--lr-warmup-steps of linear warm-up, then
cosine from --lr to --min-lr over the rest of --steps).

Processes: under torchrun (or fasttrain launch: RANK and WORLD_SIZE in the environment, MASTER_ADDR and
MASTER_PORT too) each process is one rank; otherwise the script starts --world-size ranks itself
(torch.multiprocessing.spawn, MASTER_ADDR=127.0.0.1 and a free port). Every rank: init_process_group("gloo"),
the CPU, torch.set_num_threads(--threads) (default 1: with PyPI's torch the BLAS is MKL on the OpenMP
threads, so that is the rank's whole compute; --blas-threads N sets an OpenBLAS pool where torch has one).
The model is built under the same seed on every rank (the same weights), then, by --mode:
  fsdp2  torch.distributed.fsdp.fully_shard (FSDP2, per-parameter DTensor sharding on dim 0) on each Block,
         then on the root GPT (its embeddings, the tied head and the final norm), over a 1-D CPU DeviceMesh
         (init_device_mesh("cpu", (N,))), reshard_after_forward left at its default (True: a block's
         whole parameters are freed after its forward and all-gathered again for its backward; the root is
         not resharded after its forward, and is after its backward). Between steps each rank holds 1/N of
         every parameter, gradient and AdamW moment. The units are fasttrain's (one per block, plus the
         root); fasttrain's zero = 3 differs in keeping the root's parameters whole between steps too.
  ddp    torch.nn.parallel.DistributedDataParallel (whole parameters, gradients and optimizer state on every
         rank; the gradients all-reduced in buckets during backward).
--checkpoint-blocks: every block under torch.utils.checkpoint (peer_gpt's, use_reentrant=True).
--precision bf16: forward and loss under torch.autocast("cpu", dtype=torch.bfloat16), weights, gradients
and optimizer fp32 (as peer_gpt and fasttrain's train.precision = "bf16"; no FSDP2 MixedPrecisionPolicy).
Each rank draws --batch-size windows per step from its own generator (seeded --seed + 1 + rank), so a rank
sees the same batches in either mode and the two modes' losses can be compared step by step.

Measured per rank (one JSON line per rank on stdout, gathered and printed by rank 0, in rank order):
  parameter_bytes        bytes of the parameters this rank keeps between steps: FSDP2, each DTensor
                         parameter's local shard (p.to_local(); FSDP2 pads each parameter's dim 0 to a
                         multiple of N, and the padding is not counted); DDP, the whole parameters.
  full_parameter_bytes   the whole model's parameter bytes (the same in both modes).
  gradient_bytes         the bytes of p.grad (FSDP2: the local shard) after the last step's backward, before
                         the optimizer step and the next zero_grad. DDP's bucket buffers (another copy of the
                         gradients, gradient_as_bucket_view=False) are not counted.
  optimizer_state_bytes  every tensor in optimizer.state (DTensors: the local shard), after the last step:
                         AdamW's two moments plus a 4-byte step count per parameter.
  rss_before_model_bytes the resident set (VmRSS of /proc/self/status) after init_process_group, the corpus
                         loaded, the BLAS warmed up and both modes' modules imported (FSDP2, DeviceMesh, DDP:
                         about 40 MB), before the model exists. Just before reading it the kernel's peak
                         (VmHWM) is reset to the current resident set (writing 5 to /proc/self/clear_refs;
                         peak_reset: whether that was allowed), so the corpus load's transient copies do not
                         count in the peak. Importing torch 2.11 (+cu130) alone is about 480 MB of it.
  peak_rss_bytes         getrusage(RUSAGE_SELF).ru_maxrss x 1024 at the end (after the reset: the kernel's
                         VmHWM, read just before it as vm_hwm_bytes).
  peak_rss_increase_bytes peak_rss_bytes - rss_before_model_bytes: the model, its gradients, the optimizer, the
                         activations, the communication buffers, and whatever the allocator (glibc malloc
                         underneath PyTorch's CPU allocator, which keeps no statistics) holds on to.
                         With glibc's default dynamic mmap threshold, freed blocks of up to 32 MiB (FSDP2's
                         gathered blocks, the activations) come back from the heap and stay resident, which
                         hides most of the sharding's saving; --mmap-threshold 131072 fixes the threshold
                         (mallopt, per rank) so the resident set follows the live tensors (slower: every
                         large allocation maps and faults in fresh pages).
  tokens_per_s           this rank's --batch-size x --context target tokens per step over the steps after
                         --warmup-steps (clock: end of step --warmup-steps to the end of the last step, each
                         step's time including drawing its batch); global_tokens_per_s on rank 0's line sums
                         the ranks'.
  losses                 the rank's own training loss at each of the first 5 steps (its own batch; not
                         averaged over the ranks), final_loss the mean of the last --log-every steps.
Progress goes to stderr (rank 0) every --log-every steps.

Run with the pinned environment's Python (PyTorch 2.11):
  .venv/bin/python bench/peer_fsdp.py --mode fsdp2
  .venv/bin/python bench/peer_fsdp.py --mode ddp
  .venv/bin/python bench/peer_fsdp.py --mode fsdp2 --layers 8 --heads 8 --embed 512 --steps 12 [--mmap-threshold 131072]
  .venv/bin/torchrun --nproc-per-node 2 bench/peer_fsdp.py --mode fsdp2
"""
import argparse
import json
import math
import os
import resource
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from peer_gpt import GPT, add_corpus_and_model_args, add_recipe_args, set_threads_and_load_corpus, window_step  # noqa: E402  (the model and data of bench/peer_gpt.py)


def status_bytes(field):
    """A field of /proc/self/status in bytes (VmRSS, VmHWM: reported in kB)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def reset_peak_rss():
    """Resets the kernel's peak resident set (VmHWM) to the current one; False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def local(t):
    """A tensor's local part: a DTensor's shard on this rank, else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def tensor_bytes(t):
    t = local(t)
    return t.numel() * t.element_size()


def set_mmap_threshold(size):
    """glibc's M_MMAP_THRESHOLD (mallopt): allocations of at least `size` bytes get their own mapping, returned
    to the kernel when freed. Setting it also turns off glibc's dynamic threshold (which otherwise rises to
    each freed mapping's size, up to 32 MiB, after which such blocks come from the heap and stay resident)."""
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    if libc.mallopt(-3, ctypes.c_int(size)) != 1:  # M_MMAP_THRESHOLD
        sys.exit(f"mallopt(M_MMAP_THRESHOLD, {size}) failed")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(rank, world_size, args):
    if args.mmap_threshold > 0:
        set_mmap_threshold(args.mmap_threshold)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    train_tokens, _, _ = set_threads_and_load_corpus(args)
    T, B = args.context, args.batch_size
    offsets = torch.arange(T + 1)
    # Both modes' modules imported before the baseline (about 40 MB of Python modules), so it is the same for both.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel
    dist.barrier()
    peak_reset = reset_peak_rss()
    rss_before_model = status_bytes("VmRSS")

    torch.manual_seed(args.seed)  # the same weights on every rank
    model = GPT(args.layers, args.heads, args.embed, args.context, args.dropout, args.checkpoint_blocks)
    model.train()
    full_parameter_bytes = sum(tensor_bytes(p) for p in model.parameters())
    parameters = sum(p.numel() for p in model.parameters())
    if args.mode == "fsdp2":
        mesh = init_device_mesh("cpu", (world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        trained = model
    else:
        trained = DistributedDataParallel(model)
    params = list(model.parameters())  # FSDP2: the DTensor parameters that replaced the whole ones
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, args.beta2), eps=1e-8)
    parameter_bytes = sum(tensor_bytes(p) for p in params)

    def lr_at(step):  # fasttrain's cosine: linear warm-up to --lr, then cosine down to --min-lr
        if step < args.lr_warmup_steps:
            return args.lr * (step + 1) / args.lr_warmup_steps
        t = (step - args.lr_warmup_steps) / (args.steps - args.lr_warmup_steps)
        return args.min_lr + (args.lr - args.min_lr) * (1 + math.cos(math.pi * t)) / 2

    generator = torch.Generator().manual_seed(args.seed + 1 + rank)  # this rank's windows
    warmup = args.warmup_steps
    losses, step_s = [], []
    gradient_bytes = 0
    mark, measured_s = (time.perf_counter() if warmup == 0 else None), 0.0
    for step in range(args.steps):
        t0 = time.perf_counter()

        def count_gradients():
            nonlocal gradient_bytes
            if step + 1 == args.steps:
                gradient_bytes = sum(tensor_bytes(p.grad) for p in params if p.grad is not None)

        loss = window_step(trained, optimizer, params, train_tokens, offsets, lr_at(step), args, generator,
                           count_gradients)
        losses.append(loss.item())
        now = time.perf_counter()
        if step + 1 > warmup:
            step_s.append(now - t0)
            measured_s = now - mark
        elif step + 1 == warmup:
            mark = now
        if rank == 0 and args.log_every and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
            since = (step // args.log_every) * args.log_every
            print(f"step {step + 1}: loss {statistics.fmean(losses[since:]):.4f}, {1000 * (now - t0):.1f} ms",
                  file=sys.stderr, flush=True)

    optimizer_state_bytes = sum(tensor_bytes(v) for state in optimizer.state.values() for v in state.values()
                                if torch.is_tensor(v))
    vm_hwm = status_bytes("VmHWM")
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tail = losses[-args.log_every:] if args.log_every else losses[-1:]
    timed_steps = args.steps - warmup
    result = {
        "peer": "fsdp", "rank": rank, "mode": args.mode, "world_size": world_size, "backend": "gloo",
        "parameter_bytes": parameter_bytes,
        "full_parameter_bytes": full_parameter_bytes,
        "optimizer_state_bytes": optimizer_state_bytes,
        "gradient_bytes": gradient_bytes,
        "rss_before_model_bytes": rss_before_model,
        "peak_rss_bytes": peak_rss,
        "peak_rss_increase_bytes": peak_rss - rss_before_model,
        "vm_hwm_bytes": vm_hwm,
        "peak_reset": peak_reset,
        "tokens_per_s": round(timed_steps * B * T / measured_s, 1),
        "step_ms": round(1000 * statistics.median(step_s), 3),
        "final_loss": round(statistics.fmean(tail), 4),
        "losses": [round(v, 6) for v in losses[:5]],
        "parameters": parameters,
        "layers": args.layers, "heads": args.heads, "embed": args.embed, "context": T, "batch_size": B,
        "steps": args.steps, "warmup_steps": warmup, "timed_s": round(measured_s, 3),
        "threads": args.threads, "mmap_threshold": args.mmap_threshold, "precision": args.precision,
        "checkpoint_blocks": args.checkpoint_blocks,
        "seed": args.seed, "torch": torch.__version__,
    }
    results = [None] * world_size
    dist.all_gather_object(results, result)
    if rank == 0:
        total = round(sum(r["tokens_per_s"] for r in results), 1)
        for r in results:
            if r["rank"] == 0:
                r["global_tokens_per_s"] = total
            print(json.dumps(r), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def spawned(rank, world_size, args):
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world_size)
    os.environ["LOCAL_RANK"] = str(rank)
    train(rank, world_size, args)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["fsdp2", "ddp"], default="fsdp2")
    p.add_argument("--world-size", type=int, default=2,
                   help="ranks to start when not already under a launcher (RANK / WORLD_SIZE unset)")
    add_corpus_and_model_args(p)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step per rank")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup-steps", type=int, default=5, help="steps before the throughput clock starts")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    p.add_argument("--blas-threads", type=int, default=0, help="OpenBLAS's own threads per rank (0: its count)")
    add_recipe_args(p)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--mmap-threshold", type=int, default=0,
                   help="glibc mallopt(M_MMAP_THRESHOLD) per rank, in bytes (e.g. 131072: the resident set then "
                        "follows the live tensors); 0: glibc's default dynamic threshold")
    p.add_argument("--log-every", type=int, default=10, help="steps per progress line (stderr); 0: none")
    args = p.parse_args()
    if args.warmup_steps >= args.steps:
        p.error(f"--warmup-steps ({args.warmup_steps}) must be below --steps ({args.steps})")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun, fasttrain launch, srun wrappers
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    if args.world_size < 1:
        p.error("--world-size must be >= 1")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    import torch.multiprocessing as mp
    mp.spawn(spawned, args=(args.world_size, args), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
