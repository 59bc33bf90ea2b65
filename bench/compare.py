#!/usr/bin/python3
"""Runs fasttrain and its Python PyTorch peer side by side and reports the ratios (BENCHMARKS.md).

  /usr/bin/python3 bench/compare.py classic   [--epochs 2]   # (a) same model and recipe: epoch time
  /usr/bin/python3 bench/compare.py speedrun  [--repeats 3]  # (b) default config vs peer: time to 91%
  /usr/bin/python3 bench/compare.py ablation                 # each switch of the default config on/off
  /usr/bin/python3 bench/compare.py checkpoint [--repeats 3] # checkpoint save time vs torch.save
  /usr/bin/python3 bench/compare.py activations              # memory.checkpoint on a deep ResNet
  /usr/bin/python3 bench/compare.py find-batch               # batch finder vs the true largest batch
  /usr/bin/python3 bench/compare.py dist [--steps 300] [--repeats 1]  # 2 ranks x 1 thread vs 1 x 2: DDP, ZeRO
  /usr/bin/python3 bench/compare.py all

Needs a Release build in build/ (scripts/build) and /usr/bin/python3 with Debian's python3-torch.
Each run's raw JSON goes to bench/out/. Both sides use 2 intra-op threads (dist: 2 ranks x 1 thread
against 1 process x 2 threads). --repeats defaults to 3, to 1 for dist.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out")


def machine():
    model = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def run(cmd):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"command failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-3000:]}")
    return done.stdout


def fasttrain(build, config, run_name, overrides):
    run_dir = os.path.join(OUT, run_name)
    cmd = [os.path.join(build, "bin", "fasttrain"), "train", config, "--run-dir", run_dir, "--fresh",
           "--set", "log.progress=none"]
    for o in overrides:
        cmd += ["--set", o]
    run(cmd)
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def peer(args):
    out = run(["/usr/bin/python3", os.path.join(ROOT, "bench", "peer_classic.py"), "--json"] + args)
    return json.loads(out.strip().splitlines()[-1])


def classic(opts):
    """(a) The same model and recipe: epoch time and data wait, at 1 and 2 intra-op threads.
    fasttrain runs twice: as configured (NCHW) and with train.channels_last (same math)."""
    rows, raw = [], {}
    samples_per_epoch = 60000
    for threads in (1, 2):
        theirs = peer(["--epochs", str(opts.epochs), "--threads", str(threads), "--target-accuracy", "1.1"])
        theirs_epoch = statistics.mean(theirs["epoch_train_s"])
        raw[f"peer-{threads}"] = theirs
        for layout in ("nchw", "channels_last"):
            ours = fasttrain(opts.build, "configs/classic.toml", f"classic-{threads}-{layout}",
                             [f"train.epochs={opts.epochs}", f"train.threads={threads}",
                              f"train.channels_last={'true' if layout == 'channels_last' else 'false'}"])
            raw[f"fasttrain-{threads}-{layout}"] = ours
            ours_epoch = samples_per_epoch / ours["train_samples_per_s"]
            rows.append({
                "threads": threads, "fasttrain_layout": layout,
                "fasttrain_epoch_s": round(ours_epoch, 2), "peer_epoch_s": round(theirs_epoch, 2),
                "speedup": round(theirs_epoch / ours_epoch, 2),
                "fasttrain_data_wait_fraction": round(ours["data_wait_fraction"], 5),
                "fasttrain_test_accuracy": ours["test_accuracy"],
                "peer_test_accuracy": theirs["evals"][-1]["test_accuracy"] if theirs["evals"] else None,
            })
    return {"benchmark": "classic CNN epoch time (same model, Adam 1e-3, batch 64)", "rows": rows}, raw


def speedrun(opts):
    """(b) fasttrain's default config vs the classic peer: wall time to 91% test accuracy.
    The peer evaluates at every epoch end, as the classic recipe does, and stops at the target."""
    ours_runs = [fasttrain(opts.build, "configs/default.toml", f"speedrun-{i}", [f"train.seed={i}"])
                 for i in range(opts.repeats)]
    times = [r["time_to_target_s"] for r in ours_runs]
    reached = [t for t in times if t is not None]
    ours_time = statistics.median(reached) if len(reached) == len(times) else None
    peers, raw = {}, {"fasttrain": ours_runs}
    for threads in (1, 2):
        theirs = peer(["--epochs", "8", "--threads", str(threads), "--stop-at-target"])
        raw[f"peer-{threads}"] = theirs
        peers[threads] = theirs["time_to_target_s"]
    best_peer = min(t for t in peers.values() if t is not None)
    row = {
        "benchmark": "time to 91% test accuracy (fasttrain default config vs classic peer)",
        "fasttrain_time_to_target_s": [round(t, 2) if t else None for t in times],
        "fasttrain_median_s": round(ours_time, 2) if ours_time else None,
        "fasttrain_test_accuracy": [r["test_accuracy"] for r in ours_runs],
        "peer_time_to_target_s": {f"{k} threads": v for k, v in peers.items()},
        "speedup_vs_best_peer": round(best_peer / ours_time, 2) if ours_time else None,
    }
    return row, raw


ABLATIONS = [
    ("default config", []),
    ("train.precision = fp32", ["train.precision=fp32"]),
    ("train.channels_last = false", ["train.channels_last=false"]),
    ("model.pool_first = false", ["model.pool_first=false"]),
    ("train.threads = 1", ["train.threads=1"]),
    ("train.threads = 1, train.precision = fp32", ["train.threads=1", "train.precision=fp32"]),
    ("data.workers = 0 (batches built in the step's thread)", ["data.workers=0"]),
    ("ema.enabled = true (decay 0.99)", ["ema.enabled=true", "ema.decay=0.99"]),
    ("train.accumulation = 2 with data.batch_size = 64", ["train.accumulation=2", "data.batch_size=64"]),
    ("train.clip_norm = 1.0", ["train.clip_norm=1.0"]),
    ("data.crop_padding = 2, data.hflip = 0.5", ["data.crop_padding=2", "data.hflip=0.5"]),
    ("schedule.name = constant", ["schedule.name=constant"]),
]


def ablation(opts):
    """What each switch buys: the default config with one switch changed, run to the end (no stop at
    the target) so final accuracy and throughput are comparable."""
    rows, raw = [], {}
    for i, (label, overrides) in enumerate(ABLATIONS):
        summary = fasttrain(opts.build, "configs/default.toml", f"ablation-{i}",
                            ["train.stop_at_target=false"] + overrides)
        raw[label] = summary
        rows.append({"change": label, "time_to_target_s": summary["time_to_target_s"],
                     "final_test_accuracy": summary["test_accuracy"],
                     "train_samples_per_s": round(summary["train_samples_per_s"]),
                     "data_wait_fraction": round(summary["data_wait_fraction"], 5),
                     "wall_s": round(summary["wall_s"], 2)})
    return {"benchmark": "default config, one switch changed at a time", "rows": rows}, raw


def checkpointing(opts):
    """Run state: the time one checkpoint takes (fasttrain: model, AdamW moments, RNG, state.json
    and manifest, each fsynced, sha256-verified manifest, atomic rename) vs the peer's durable
    torch.save of the same state; and what checkpoint.every_steps = 50 costs the default config."""
    runs = {}
    for label, every in (("none", 0), ("every 50 steps", 50)):
        runs[label] = [fasttrain(opts.build, "configs/default.toml", f"checkpoint-{every}-{i}",
                                 ["train.stop_at_target=false", f"checkpoint.every_steps={every}",
                                  "checkpoint.keep=100", f"train.threads={opts.threads}"])
                       for i in range(opts.repeats)]
    saves = []
    for i in range(opts.repeats):
        with open(os.path.join(OUT, f"checkpoint-50-{i}", "metrics.jsonl")) as f:
            saves += [r["save_s"] for r in map(json.loads, f) if r["kind"] == "checkpoint"]
    step_dir = os.path.join(OUT, "checkpoint-50-0", "checkpoints", "step-50")
    ours_bytes = sum(os.path.getsize(os.path.join(step_dir, name)) for name in os.listdir(step_dir))
    theirs = json.loads(run(["/usr/bin/python3", os.path.join(ROOT, "bench", "checkpoint_peer.py"),
                             "--threads", str(opts.threads or 2)]).strip())
    ours_ms = 1000 * statistics.median(saves)
    wall = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    row = {
        "benchmark": "checkpoint save time and the cost of checkpoint.every_steps = 50",
        "fasttrain_save_ms_median": round(ours_ms, 2),
        "fasttrain_saves": len(saves),
        "fasttrain_checkpoint_bytes": ours_bytes,
        "peer_save_ms_median": theirs["save_ms_median"],
        "peer_checkpoint_bytes": theirs["bytes"],
        "save_time_ratio_peer_over_fasttrain": round(theirs["save_ms_median"] / ours_ms, 2),
        "default_config_wall_s_median": {k: round(v, 2) for k, v in wall.items()},
        "checkpoints_per_run": len(saves) // opts.repeats,
        "overhead_fraction": round(wall["every 50 steps"] / wall["none"] - 1, 4),
    }
    return row, {"fasttrain": runs, "peer": theirs}


DEEP_RESNET = ["model.name=resnet", "model.widths=[32, 64]", "model.blocks=8", "model.hidden=[]",
               "data.train_limit=8192", "data.eval_batch_size=100", "train.threads=1", "train.max_steps=40",
               "train.epochs=10", "optim.name=adamw", "schedule.name=constant", "data.workers=1"]


def activations(opts):
    """memory.checkpoint = blocks on a deep ResNet (2 stages x 8 basic blocks, batch 128, fp32, one
    thread): the activation memory it saves and the step time it costs, next to the peer's cost
    with torch.utils.checkpoint on the same network. Activation memory is the allocator peak of
    the run minus that of the same run at batch 1 (dataset, weights, gradients, AdamW moments)."""
    runs = {}
    for label, overrides in (("batch 1", ["data.batch_size=1", "memory.checkpoint=none"]),
                             ("none", ["data.batch_size=128", "memory.checkpoint=none"]),
                             ("blocks", ["data.batch_size=128", "memory.checkpoint=blocks"])):
        runs[label] = [fasttrain(opts.build, "configs/default.toml", f"activations-{label.replace(' ', '')}-{i}",
                                 DEEP_RESNET + ["train.precision=fp32", "train.channels_last=false",
                                                "train.stop_at_target=false"] + overrides)
                       for i in range(opts.repeats)]
    peak = {k: statistics.median(r["peak_memory_bytes"] for r in v) for k, v in runs.items()}
    sps = {k: statistics.median(r["train_samples_per_s"] for r in v) for k, v in runs.items()}
    theirs = json.loads(run(["/usr/bin/python3", os.path.join(ROOT, "bench", "activation_checkpoint_peer.py"),
                             "--widths", "32", "64", "--blocks", "8", "--batch", "128", "--threads", "1"]).strip())
    act_none, act_blocks = peak["none"] - peak["batch 1"], peak["blocks"] - peak["batch 1"]
    row = {
        "benchmark": "memory.checkpoint = blocks, ResNet 2x8 basic blocks, batch 128, fp32, 1 thread",
        "peak_memory_bytes": {k: int(v) for k, v in peak.items()},
        "activation_bytes_none": int(act_none),
        "activation_bytes_blocks": int(act_blocks),
        "activation_reduction": round(act_none / act_blocks, 2),
        "fasttrain_samples_per_s": {k: round(v, 1) for k, v in sps.items() if k != "batch 1"},
        "fasttrain_step_time_cost": round(sps["none"] / sps["blocks"] - 1, 4),
        "peer_ms_per_step": {"none": theirs["ms_per_step_none"], "blocks": theirs["ms_per_step_blocks"]},
        "peer_step_time_cost": theirs["step_time_cost"],
        "fasttrain_ms_per_step": {k: round(1000 * 128 / v, 2) for k, v in sps.items() if k != "batch 1"},
    }
    return row, {"fasttrain": runs, "peer": theirs}


def find_batch(opts):
    """The batch finder on the default config under memory.budget = 1GiB against the true largest
    batch: the largest size whose full training run (60 steps through the loader, then the
    evaluation) keeps summary.json's peak_memory_bytes within the budget, bisected to 1% with real
    runs between half and twice the finder's answer."""
    budget = "1GiB"
    budget_bytes = 1 << 30
    common = ["memory.budget=" + budget, f"train.threads={opts.threads or 2}"]
    cmd = [os.path.join(opts.build, "bin", "fasttrain"), "find-batch", "configs/default.toml"]
    for o in common:
        cmd += ["--set", o]
    start = time.perf_counter()
    table = run(cmd)
    finder_s = time.perf_counter() - start
    answer = int(table.strip().splitlines()[-1].rsplit(":", 1)[1])

    peaks = {}

    def fits(batch):
        summary = fasttrain(opts.build, "configs/default.toml", f"find-batch-{batch}",
                            common + [f"data.batch_size={batch}", "train.max_steps=60", "train.stop_at_target=false"])
        peaks[batch] = summary["peak_memory_bytes"]
        return summary["peak_memory_bytes"] <= budget_bytes

    lo, hi = answer // 2, answer * 2
    assert fits(lo), "half the finder's answer should fit"
    if fits(hi):
        sys.exit(f"twice the finder's answer ({hi}) fits too: the finder is far off")
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    if answer not in peaks:
        fits(answer)
    row = {
        "benchmark": "batch finder vs the true largest batch, default config, memory.budget = 1GiB",
        "finder_answer": answer,
        "true_largest": lo,
        "answer_over_true": round(answer / lo, 4),
        "finder_wall_s": round(finder_s, 1),
        "run_peak_at_answer_bytes": peaks[answer],
        "finder_table": table,
    }
    return row, {"peaks": peaks}


DIST_WARMUP_STEPS = 5  # left out of the steady-state throughput, on both sides
DIST_LAYOUTS = [  # (key, label, ranks, threads per rank, zero)
    ("1x2", "1 process x 2 threads, batch 128", 1, 2, None),
    ("2x1-ddp", "2 ranks x 1 thread, DDP, batch 64 per rank", 2, 1, 0),
    ("2x1-zero1", "2 ranks x 1 thread, ZeRO-1, batch 64 per rank", 2, 1, 1),
    ("2x1-zero2", "2 ranks x 1 thread, ZeRO-2, batch 64 per rank", 2, 1, 2),
]
PEER_ZERO2_NOTE = "PyTorch's ZeroRedundancyOptimizer has only stage 1: no peer run"


def fasttrain_steady_samples_per_s(run_dir, global_batch, warmup):
    """Steady-state global samples/s from metrics.jsonl's train records (log.every_steps = warmup):
    the records whose interval starts at or after step `warmup`. Each record's interval time is its
    samples over its samples_per_s (evaluations are already taken out of the interval by the
    trainer). Assumes full batches (true while the run stays inside the first epoch's full batches)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = sorted((r for r in map(json.loads, f) if r["kind"] == "train"), key=lambda r: r["step"])
    samples = seconds = 0.0
    previous = 0
    for r in records:
        if previous >= warmup:
            n = (r["step"] - previous) * global_batch
            samples += n
            seconds += n / r["samples_per_s"]
        previous = r["step"]
    return samples / seconds if seconds else None


def dist_bench(opts):
    """Data-parallel training on one machine (c10d Gloo): the classic config (Adam 1e-3, constant LR)
    for --steps optimizer steps at a global batch of 128, as 1 process x 2 intra-op threads (batch
    128) and as 2 ranks x 1 thread (batch 64 per rank) with DDP, ZeRO-1 and ZeRO-2; the peer
    (bench/peer_classic.py: torch DDP, ZeroRedundancyOptimizer) the same ways, both launched by
    `fasttrain launch --nproc 2`. samples/s: global, over the steps after the first 5 (fasttrain: its
    metrics records at log.every_steps = 5; the peer: its own clock), and over every step (fasttrain:
    summary.json's train_samples_per_s, which also holds the final checkpoint save). Overlap: DDP's
    avg_backward_compute_comm_overlap_time / avg_backward_comm_time (c10d::Logger on both sides, sampled
    iterations). Bytes sent per step: fasttrain's count; the peer's ring all-reduce analytic figure
    2 (N-1)/N x gradient bytes. Optimizer state: rank 0's bytes, and their ratio to DDP's."""
    fasttrain_bin = os.path.join(opts.build, "bin", "fasttrain")
    launch = [fasttrain_bin, "launch", "--nproc", "2", "--"]
    global_batch = 128
    epochs = opts.steps * global_batch // 60000 + 2  # enough epochs for --steps; train.max_steps stops it
    ours = {key: [] for key, *_ in DIST_LAYOUTS}
    theirs = {key: [] for key, *_ in DIST_LAYOUTS}
    for i in range(opts.repeats):
        for key, _, ranks, threads, zero in DIST_LAYOUTS:
            batch = global_batch // ranks
            run_dir = os.path.join(OUT, f"dist-{key}-{i}")
            cmd = [fasttrain_bin, "train", "configs/classic.toml", "--run-dir", run_dir, "--fresh"]
            for o in ["log.progress=none", f"log.every_steps={DIST_WARMUP_STEPS}", f"train.threads={threads}",
                      f"data.batch_size={batch}", f"train.max_steps={opts.steps}", f"train.epochs={epochs}",
                      f"train.seed={i}"] + (
                          [f"dist.zero={zero}"] if zero is not None else []):
                cmd += ["--set", o]
            run(launch + cmd if ranks > 1 else cmd)
            with open(os.path.join(run_dir, "summary.json")) as f:
                summary = json.load(f)
            summary["steady_samples_per_s"] = fasttrain_steady_samples_per_s(run_dir, global_batch,
                                                                             DIST_WARMUP_STEPS)
            ours[key].append(summary)
            if zero == 2:
                continue
            peer_cmd = ["/usr/bin/python3", os.path.join(ROOT, "bench", "peer_classic.py"), "--json",
                        "--threads", str(threads), "--batch-size", str(batch), "--max-steps", str(opts.steps),
                        "--warmup-steps", str(DIST_WARMUP_STEPS), "--epochs", str(epochs),
                        "--target-accuracy", "1.1", "--seed", str(i)] + (["--zero", str(zero)] if zero else [])
            out = run(launch + peer_cmd if ranks > 1 else peer_cmd)
            theirs[key].append(json.loads([line for line in out.splitlines() if line.startswith("{")][-1]))

    def med(runs, get):
        values = [get(r) for r in runs]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    def ratio(a, b, digits=3):
        return round(a / b, digits) if a is not None and b else None

    def rounded(v, digits=1):
        return None if v is None else round(v, digits)

    rows = []

    def row(metric, ft, pr, compare=True, **extra):
        r = {"metric": metric, "fasttrain": ft, "peer": pr}
        if compare:
            r["fasttrain_over_peer"] = ratio(ft, pr)
        r.update(extra)
        rows.append(r)

    steady, whole = {}, {}
    for key, label, ranks, threads, zero in DIST_LAYOUTS:
        steady[key] = (med(ours[key], lambda r: r["steady_samples_per_s"]),
                       med(theirs[key], lambda r: r["train_samples_per_s"]))
        whole[key] = (med(ours[key], lambda r: r["train_samples_per_s"]),
                      med(theirs[key], lambda r: r["train_samples_per_s_all_steps"]))
    for key, label, *_ in DIST_LAYOUTS:
        ft, pr = steady[key]
        row(f"samples/s after {DIST_WARMUP_STEPS} warm-up steps: {label}", rounded(ft), rounded(pr),
            **({"note": PEER_ZERO2_NOTE} if key == "2x1-zero2" else {}))
    for key, label, *_ in DIST_LAYOUTS:
        ft, pr = whole[key]
        row(f"samples/s over every step: {label}", rounded(ft), rounded(pr),
            **({"note": PEER_ZERO2_NOTE} if key == "2x1-zero2" else {}))
    for key in ("2x1-ddp", "2x1-zero1", "2x1-zero2"):
        row(f"scaling {key} over 1x2 (samples/s after warm-up)", ratio(steady[key][0], steady["1x2"][0]),
            ratio(steady[key][1], steady["1x2"][1]), compare=False)

    def overlap(timings):
        return ratio(timings.get("avg_backward_compute_comm_overlap_time"), timings.get("avg_backward_comm_time"))

    ft_timings = {k: med(ours["2x1-ddp"], lambda r: r["dist"]["ddp_timings_ns"].get(k))
                  for k in ours["2x1-ddp"][0]["dist"]["ddp_timings_ns"]}
    pr_timings = {k: med(theirs["2x1-ddp"], lambda r: r["ddp_logging"].get(k))
                  for k in theirs["2x1-ddp"][0]["ddp_logging"]}
    row("share of all-reduce hidden behind backward, DDP (overlap / comm time)", overlap(ft_timings),
        overlap(pr_timings), compare=False,
        detail_ns={"fasttrain": ft_timings, "peer": pr_timings})

    grad_bytes = med(theirs["2x1-ddp"], lambda r: r["gradient_bytes"])
    analytic = 2 * (2 - 1) / 2 * grad_bytes
    for key, label, *_ in DIST_LAYOUTS[1:]:
        ddp = key == "2x1-ddp"
        row(f"bytes sent per step, rank 0, {key}" + (" (peer: ring all-reduce, 2(N-1)/N x gradient bytes)" if ddp
                                                      else " (peer: not measured)"),
            med(ours[key], lambda r: r["dist"]["bytes_sent_per_step"]),
            int(analytic) if ddp else None, compare=ddp, **({"gradient_bytes": grad_bytes} if ddp else {}))

    state = {key: (med(ours[key], lambda r: r["dist"]["optimizer_state_bytes"]),
                   med(theirs[key], lambda r: r["optimizer_state_bytes"]))
             for key, *_ in DIST_LAYOUTS[1:]}
    for key, label, *_ in DIST_LAYOUTS[1:]:
        per_rank = theirs[key][0]["optimizer_state_bytes_per_rank"] if theirs[key] else None
        row(f"optimizer state bytes, rank 0, {key}", state[key][0], state[key][1], compare=False,
            **({"peer_per_rank": per_rank} if per_rank else {}))
    for key in ("2x1-zero1", "2x1-zero2"):
        peer_max = (max(theirs[key][0]["optimizer_state_bytes_per_rank"]) if theirs[key] else None)
        row(f"optimizer state {key} / DDP, rank 0 (target 1/N = 0.5)", ratio(state[key][0], state["2x1-ddp"][0]),
            ratio(state[key][1], state["2x1-ddp"][1]), compare=False,
            peer_largest_rank_over_ddp=ratio(peer_max, state["2x1-ddp"][1]))
    bench = {"benchmark": f"data parallel, classic CNN, {opts.steps} steps, global batch 128: 2 ranks x 1 thread "
                          f"(Gloo) vs 1 process x 2 threads; DDP, ZeRO-1, ZeRO-2 (median of {opts.repeats})",
             "rows": rows}
    return bench, {"fasttrain": ours, "peer": theirs}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("which", choices=["classic", "speedrun", "ablation", "checkpoint", "activations", "find-batch",
                                     "dist", "all"])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=None, help="runs per measurement (default 3; dist: 1)")
    p.add_argument("--steps", type=int, default=300, help="dist: optimizer steps per run")
    p.add_argument("--threads", type=int, default=0, help="checkpoint: intra-op threads (0 = the config's)")
    opts = p.parse_args()
    os.makedirs(OUT, exist_ok=True)
    benches = {"classic": classic, "speedrun": speedrun, "ablation": ablation, "checkpoint": checkpointing,
               "activations": activations, "find-batch": find_batch, "dist": dist_bench}
    chosen = list(benches) if opts.which == "all" else [opts.which]
    repeats = opts.repeats
    for name in chosen:
        opts.repeats = repeats if repeats is not None else (1 if name == "dist" else 3)
        row, raw = benches[name](opts)
        row["machine"] = machine()
        with open(os.path.join(OUT, f"{name}.json"), "w") as f:
            json.dump({"result": row, "raw": raw}, f, indent=2)
        print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
