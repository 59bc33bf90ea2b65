#!/usr/bin/env python3
"""Steps (and time) to a test-accuracy target over seeds: what a recipe switch buys (BENCHMARKS.md).

Runs `fasttrain train CONFIG` once per seed with evaluations every --every steps from --from (the run
does not stop at the target, so every evaluation is seen), and prints, per seed, the first evaluation
at or above the target and the best accuracy; then how many seeds reached it and the median step.

  .venv/bin/python bench/steps_to_target.py --label baseline
  .venv/bin/python bench/steps_to_target.py --label muon --set optim.name=muon
  .venv/bin/python bench/steps_to_target.py --build build-debian --seeds 0 1 2 3 4 --set train.eval_flip=true

Every --set is passed on to fasttrain. Evaluations cost time, so the times here are not the run's time
to target; `bench/compare.py speedrun` measures that. Each run's metrics stay in runs/steps-<label>-<seed>/.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_seed(opts, seed):
    name = f"steps-{opts.label}-{seed}"
    command = [os.path.join(ROOT, opts.build, "bin", "fasttrain"), "train", opts.config, "--set",
               f"train.seed={seed}", "--set", "train.stop_at_target=false", "--set",
               f"train.eval_every_steps={opts.every}", "--set", f"train.eval_from_step={opts.eval_from}",
               "--set", f"run.name={name}", "--set", "log.progress=none", "--fresh"]
    for setting in opts.set:
        command += ["--set", setting]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"seed {seed}: fasttrain failed ({done.returncode}):\n{done.stderr[-3000:]}")
    evals = []
    with open(os.path.join(ROOT, "runs", name, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if record.get("kind") == "eval":
                evals.append((record["step"], record["test_accuracy"], record["elapsed_s"]))
    reached = next((e for e in evals if e[1] >= opts.target), None)
    return {"seed": seed, "reached_step": reached[0] if reached else None, "best": max(e[1] for e in evals),
            "final": evals[-1][1], "evals": evals}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/default.toml")
    p.add_argument("--build", default="build")
    p.add_argument("--label", default="run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--target", type=float, default=0.91)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--from", dest="eval_from", type=int, default=300)
    p.add_argument("--set", action="append", default=[])
    opts = p.parse_args()
    results = [run_seed(opts, seed) for seed in opts.seeds]
    for r in results:
        print(f"{opts.label} seed {r['seed']}: reached at {r['reached_step']}, best {r['best']:.4f}, "
              f"final {r['final']:.4f}")
    steps = [r["reached_step"] for r in results if r["reached_step"] is not None]
    median = statistics.median(steps) if steps else None
    print(f"{opts.label}: {len(steps)} of {len(results)} seeds reached {opts.target}; median step {median}; "
          f"steps {[r['reached_step'] for r in results]}; best {[round(r['best'], 4) for r in results]}; "
          f"settings {opts.set}")
    out = os.path.join(ROOT, "bench", "out", f"steps_to_target-{opts.label}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"label": opts.label, "settings": opts.set, "build": opts.build, "results": results}, f)


if __name__ == "__main__":
    main()
