#!/usr/bin/env python3
"""The CUDA kernels of a Chrome trace (Kineto's: `fasttrain profile`'s trace.json, or torch.profiler's
export_chrome_trace) by total GPU time per step, to compare fasttrain's step with its PyTorch peer's.

    python3 bench/gpu/kernel_table.py RUN/trace.json --steps 5 [--rows 30] [--json]

Kernels are events of category "kernel"; memory copies and sets ("gpu_memcpy", "gpu_memset") are counted
apart. Each kernel's name is shortened to what tells kernels apart (the template's outer name, the
first 90 characters). --steps divides the totals: the number of steps the trace recorded.
"""
import argparse
import collections
import json
import re
import sys


def short_name(name):
    name = re.sub(r"^void ", "", name).replace("(anonymous namespace)::", "")
    return re.sub(r"\(.*$", "", name)[:120]


def table(path, steps):
    with open(path) as f:
        data = json.load(f)
    events = data.get("traceEvents", data) if isinstance(data, dict) else data
    kernels = collections.defaultdict(lambda: [0.0, 0])
    other = collections.Counter()
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        if cat == "kernel":
            k = kernels[short_name(e.get("name", "?"))]
            k[0] += float(e.get("dur", 0))
            k[1] += 1
        elif cat in ("gpu_memcpy", "gpu_memset"):
            other[cat + " us"] += float(e.get("dur", 0))
            other[cat + " count"] += 1
    rows = sorted(((name, t / steps, n / steps) for name, (t, n) in kernels.items()), key=lambda r: -r[1])
    return rows, {k: v / steps for k, v in other.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--steps", type=int, required=True, help="steps the trace recorded")
    p.add_argument("--rows", type=int, default=30)
    p.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    args = p.parse_args()
    rows, other = table(args.trace, args.steps)
    total_us = sum(r[1] for r in rows)
    launches = sum(r[2] for r in rows)
    if args.json:
        print(json.dumps({"kernel_us_per_step": total_us, "kernels_per_step": launches, "other": other,
                          "kernels": [{"name": n, "us": round(t, 2), "count": round(c, 2)} for n, t, c in rows]}))
        return
    print(f"{args.trace}: {total_us / 1000:.3f} ms of kernels a step in {launches:.0f} launches; "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(other.items())))
    for name, t, c in rows[:args.rows]:
        print(f"  {t:9.1f} us {c:6.1f}x  {100 * t / max(total_us, 1e-9):5.1f}%  {name}")


if __name__ == "__main__":
    sys.exit(main())
