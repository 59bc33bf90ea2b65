#!/usr/bin/env python3
"""Generates schedule_references.json: PyTorch's own LR (and momentum) sequences that
tests/optim/schedule_test.cpp compares fasttrain's schedules against.

Regenerate (needs PyTorch: the pinned .venv of scripts/install-deps, 2.11) from the repo root:

    .venv/bin/python tests/optim/make_schedule_references.py

(PyTorch 1.13 and 2.11 give the same 20 sequences to the last bit; the file records which one wrote it.)

It writes tests/optim/schedule_references.json next to this script; commit the result.

Entry k of "lr" is what scheduler.get_last_lr()[0] returns after k scheduler.step() calls, i.e. the
LR of the optimizer step that follows k completed steps; "momentum" is the SGD momentum or the Adam
beta1 of the param group at the same point (null when the schedule does not cycle it).
Each case's "options" uses the fasttrain ScheduleOptions names, so the C++ test maps them 1:1.
"""
import json
import math
import os
import warnings

import torch
from torch.optim import lr_scheduler

# SequentialLR calls scheduler.step(0) at its milestones, which warns about the epoch argument.
warnings.filterwarnings("ignore", category=UserWarning)


def make_optimizer(kind, lr, momentum):
    params = [torch.nn.Parameter(torch.zeros(2))]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(momentum, 0.999))
    raise ValueError(kind)


def current_momentum(optimizer):
    group = optimizer.param_groups[0]
    return group["betas"][0] if "betas" in group else group["momentum"]


def record(scheduler, optimizer, steps, with_momentum):
    lrs, momenta = [], []
    for step in range(steps):
        if step > 0:
            optimizer.step()  # keeps PyTorch from warning about the call order; grads are None
            scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
        momenta.append(current_momentum(optimizer))
    return lrs, (momenta if with_momentum else None)


def constant(max_lr, steps):
    optimizer = make_optimizer("sgd", max_lr, 0.9)
    scheduler = lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return record(scheduler, optimizer, steps, False)


def step_lr(max_lr, steps, step_size, gamma):
    optimizer = make_optimizer("sgd", max_lr, 0.9)
    scheduler = lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=gamma)
    return record(scheduler, optimizer, steps, False)


def cosine(max_lr, total_steps, warmup_steps, min_lr):
    """fasttrain's cosine: linear warm-up to max_lr, reaching it at step warmup_steps - 1
    (lr = max_lr * (step + 1) / warmup_steps), then CosineAnnealingLR from max_lr to min_lr over
    the remaining total_steps - warmup_steps steps."""
    optimizer = make_optimizer("sgd", max_lr, 0.9)
    if warmup_steps == 0:
        scheduler = lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps, eta_min=min_lr)
    else:
        warmup = lr_scheduler.LinearLR(optimizer, start_factor=1.0 / warmup_steps, end_factor=1.0,
                                       total_iters=warmup_steps - 1)
        anneal = lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps - warmup_steps, eta_min=min_lr)
        scheduler = lr_scheduler.SequentialLR(optimizer, [warmup, anneal], milestones=[warmup_steps])
    return record(scheduler, optimizer, total_steps, False)


def one_cycle(max_lr, total_steps, optimizer_kind, **options):
    optimizer = make_optimizer(optimizer_kind, max_lr, 0.9)
    scheduler = lr_scheduler.OneCycleLR(
        optimizer, max_lr=max_lr, total_steps=total_steps, pct_start=options["pct_start"],
        anneal_strategy=options["anneal"], cycle_momentum=options["cycle_momentum"],
        base_momentum=options["base_momentum"], max_momentum=options["max_momentum"],
        div_factor=options["div_factor"], final_div_factor=options["final_div_factor"],
        three_phase=options["three_phase"])
    return record(scheduler, optimizer, total_steps, options["cycle_momentum"])


def cyclic(max_lr, steps, **options):
    optimizer = make_optimizer("sgd", max_lr, 0.9)
    scheduler = lr_scheduler.CyclicLR(
        optimizer, base_lr=options["base_lr"], max_lr=max_lr, step_size_up=options["step_size_up"],
        step_size_down=options["step_size_down"] or None, mode="triangular",
        cycle_momentum=options["cycle_momentum"], base_momentum=options["base_momentum"],
        max_momentum=options["max_momentum"])
    return record(scheduler, optimizer, steps, options["cycle_momentum"])


ONE_CYCLE_DEFAULTS = dict(pct_start=0.3, anneal="cos", cycle_momentum=True, base_momentum=0.85,
                          max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False)
CYCLIC_DEFAULTS = dict(base_lr=1e-4, step_size_up=2000, step_size_down=0, cycle_momentum=True,
                       base_momentum=0.85, max_momentum=0.95)


def main():
    cases = []

    def add(name, schedule, max_lr, total_steps, options, result, optimizer="sgd"):
        lrs, momenta = result
        cases.append(dict(name=name, schedule=schedule, optimizer=optimizer, max_lr=max_lr,
                          total_steps=total_steps, options=options, lr=lrs, momentum=momenta))

    add("constant", "constant", 0.1, 50, {}, constant(0.1, 50))

    for name, max_lr, steps, step_size, gamma in [("step-10-half", 0.1, 60, 10, 0.5),
                                                   ("step-7-tenth", 0.3, 50, 7, 0.1),
                                                   ("step-every", 0.05, 50, 1, 0.9)]:
        add(name, "step", max_lr, steps, dict(step_size=step_size, gamma=gamma),
            step_lr(max_lr, steps, step_size, gamma))

    for name, max_lr, total, warmup, min_lr in [("cosine-no-warmup", 0.1, 100, 0, 0.0),
                                                 ("cosine-warmup-10", 0.2, 120, 10, 1e-4),
                                                 ("cosine-warmup-1", 0.05, 50, 1, 1e-3),
                                                 ("cosine-long-warmup", 1.0, 60, 25, 0.0)]:
        add(name, "cosine", max_lr, total, dict(warmup_steps=warmup, min_lr=min_lr),
            cosine(max_lr, total, warmup, min_lr))

    one_cycle_cases = [
        ("one-cycle-default-sgd", 0.1, 100, "sgd", {}),
        ("one-cycle-linear-sgd", 0.4, 150, "sgd",
         dict(pct_start=0.25, anneal="linear", div_factor=10.0, final_div_factor=100.0)),
        ("one-cycle-three-phase-sgd", 0.05, 200, "sgd", dict(three_phase=True)),
        ("one-cycle-adam-betas", 3e-3, 80, "adam", dict(pct_start=0.4, base_momentum=0.8, max_momentum=0.9)),
        ("one-cycle-adam-three-phase-linear", 1e-3, 120, "adam",
         dict(three_phase=True, anneal="linear", pct_start=0.2)),
        ("one-cycle-no-momentum", 0.1, 50, "sgd", dict(cycle_momentum=False)),
        ("one-cycle-fractional-phase", 0.1, 97, "sgd", dict(pct_start=0.33)),
        ("one-cycle-tiny", 0.1, 7, "sgd", dict(pct_start=0.3)),
    ]
    for name, max_lr, total, kind, overrides in one_cycle_cases:
        options = dict(ONE_CYCLE_DEFAULTS, **overrides)
        add(name, "one-cycle", max_lr, total, options, one_cycle(max_lr, total, kind, **options), kind)

    cyclic_cases = [
        ("cyclic-symmetric-momentum", 0.1, 100, dict(base_lr=1e-3, step_size_up=10, base_momentum=0.8,
                                                     max_momentum=0.9)),
        ("cyclic-asymmetric-momentum", 0.05, 120, dict(base_lr=5e-3, step_size_up=7, step_size_down=13)),
        ("cyclic-no-momentum", 1.0, 80, dict(base_lr=0.1, step_size_up=5, step_size_down=15,
                                             cycle_momentum=False)),
        ("cyclic-unit-steps", 0.01, 50, dict(base_lr=1e-4, step_size_up=1, step_size_down=1)),
    ]
    for name, max_lr, steps, overrides in cyclic_cases:
        options = dict(CYCLIC_DEFAULTS, **overrides)
        add(name, "cyclic", max_lr, steps, options, cyclic(max_lr, steps, **options))

    for case in cases:
        assert all(math.isfinite(v) for v in case["lr"]), case["name"]

    out = dict(generated_by="tests/optim/make_schedule_references.py", torch_version=torch.__version__,
               cases=cases)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schedule_references.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
