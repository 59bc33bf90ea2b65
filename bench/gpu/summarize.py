#!/usr/bin/env python3
"""Prints the figures of bench/gpu/run-all.sh as Markdown tables: bench/gpu/summarize.py WORK_DIR."""
import glob
import json
import os
import statistics
import sys


def load(path):
    """A JSON file (summary.json), or the last line of a program's output that is one JSON object."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return json.loads(text.splitlines()[-1]) if text else None
    except ValueError:
        return None


def fasttrain_runs(work, prefix):
    runs = []
    for seed in (0, 1, 2):
        summary = load(os.path.join(work, f"{prefix}{seed}", "summary.json"))
        if summary:
            runs.append(summary)
    return runs


def median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def main_job(work):
    print("| main job (configs/default.toml) | time to 91% per seed (s) | median (s) | reached | samples/s (median) | steps |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, prefix in (("fasttrain, captured (cuda_graphs auto)", "main-"),
                          ("fasttrain, captured, memory.warmup = true", "main-warm-"),
                          ("fasttrain, eager (cuda_graphs = false)", "main-eager-")):
        runs = fasttrain_runs(work, prefix)
        times = [r.get("time_to_target_s") for r in runs]
        engines = sorted({r.get("step_engine") for r in runs})
        print(f"| {label} [{', '.join(map(str, engines))}] | {[round(t, 3) if t else None for t in times]} | "
              f"{median(times)} | {sum(t is not None for t in times)}/{len(runs)} | "
              f"{median([r.get('train_samples_per_s') for r in runs])} | {[r.get('steps') for r in runs]} |")
    for label, name in (("peer, CUDA graph (warm process)", "peer-graph.json"),
                        ("peer, CUDA graph (cold process: first run)", "peer-graph-cold.json"),
                        ("peer, eager (warm process)", "peer-eager.json")):
        peer = load(os.path.join(work, name))
        if not peer:
            print(f"| {label} | (no result) | | | | |")
            continue
        print(f"| {label} | {peer.get('time_to_target_s')} | {peer.get('median_time_to_target_s')} | "
              f"{peer.get('reached_target')}/{len(peer.get('time_to_target_s') or [])} | {peer.get('samples_per_s')} | "
              f"{[r.get('steps') for r in peer.get('runs', [])]} |")


def fasttrain_tokens_per_s(run_dir, after_step=20):
    rates = []
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            for line in f:
                record = json.loads(line)
                if record.get("kind") == "train" and record["step"] > after_step:
                    rates.append(record["samples_per_s"])
    except OSError:
        return None
    return statistics.median(rates) if rates else None


def gpt(work):
    peer = load(os.path.join(work, "peer-gpt.json")) or {}
    flops, ceiling = peer.get("flops_per_token"), peer.get("ceiling_flop_per_s")
    print()
    print(f"GPT 12 x 768, T 1024, batch 16, bf16; bf16 matmul ceiling {ceiling} FLOP/s (torch.mm, measured by the peer)")
    print()
    print("| gpt | tokens/s (median, steps 21-60) | MFU | peak memory (GiB) | engine |")
    print("| --- | --- | --- | --- | --- |")
    for label, name in (("fasttrain, captured", "gpt-graph"), ("fasttrain, eager", "gpt-eager")):
        rate = fasttrain_tokens_per_s(os.path.join(work, name))
        summary = load(os.path.join(work, name, "summary.json")) or {}
        mfu = round(rate * flops / ceiling, 4) if rate and flops and ceiling else None
        peak = summary.get("peak_memory_bytes")
        print(f"| {label} | {round(rate) if rate else None} | {mfu} | {round(peak / 2**30, 2) if peak else None} | "
              f"{summary.get('step_engine')} |")
    peak = peer.get("peak_memory_bytes")
    print(f"| peer, eager | {peer.get('tokens_per_s')} | {peer.get('mfu')} | {round(peak / 2**30, 2) if peak else None} | - |")


def main():
    work = sys.argv[1]
    main_job(work)
    gpt(work)
    for log in sorted(glob.glob(os.path.join(work, "*.log"))):
        with open(log, errors="replace") as f:
            text = f.read()
        if "error" in text.lower() and "main-" not in os.path.basename(log)[:5]:
            lines = [l for l in text.splitlines() if "error" in l.lower()][:3]
            print(f"\n{os.path.basename(log)}: " + " | ".join(lines))


if __name__ == "__main__":
    main()
