#!/usr/bin/env python3
"""Generates muon_references.json: torch.optim.Muon's (and, for the 1-d parameters, torch.optim.AdamW's)
parameters after each of three steps, which tests/optim/muon_test.cpp compares fasttrain's "muon" with.

Regenerate (needs PyTorch 2.9 or later for torch.optim.Muon: the pinned .venv of scripts/install-deps,
2.11) from the repo root:

    .venv/bin/python tests/optim/make_muon_references.py

Parameters: a tall matrix [6, 4], a wide one [3, 7], conv kernels [4, 2, 3, 3] and [12, 1, 2, 2]
(torch.optim.Muon takes 2-d parameters only, so it steps them as [4, 18] and [12, 4], which is how
fasttrain orthogonalises them), and a bias [5] that muon leaves to AdamW without weight decay. Gradients and the learning rate change every
step; the matrices decay with weight_decay 0.1.
"""
import json
import os

import torch

SHAPES = {"tall.weight": [6, 4], "wide.weight": [3, 7], "conv.weight": [4, 2, 3, 3], "tallconv.weight": [12, 1, 2, 2],
          "head.bias": [5]}
LRS = [0.02, 0.01, 0.015]
CASES = [
    {"muon_adjust_lr": "original", "muon_nesterov": True, "muon_momentum": 0.95, "muon_ns_steps": 5},
    {"muon_adjust_lr": "match_rms_adamw", "muon_nesterov": False, "muon_momentum": 0.9, "muon_ns_steps": 3},
]
WEIGHT_DECAY = 0.1


def as_list(t):
    return t.detach().double().flatten().tolist()


def run(case, initial, grads):
    params = {name: torch.tensor(initial[name], dtype=torch.float32).reshape(shape) for name, shape in SHAPES.items()}
    matrices = {name: p.reshape(p.shape[0], -1).clone().requires_grad_() for name, p in params.items() if p.dim() >= 2}
    bias = params["head.bias"].clone().requires_grad_()
    muon = torch.optim.Muon(list(matrices.values()), lr=LRS[0], weight_decay=WEIGHT_DECAY,
                            momentum=case["muon_momentum"], nesterov=case["muon_nesterov"],
                            ns_steps=case["muon_ns_steps"], adjust_lr_fn=case["muon_adjust_lr"])
    adamw = torch.optim.AdamW([bias], lr=LRS[0], weight_decay=0.0)
    after = []
    for step, lr in enumerate(LRS):
        for name, p in matrices.items():
            p.grad = torch.tensor(grads[step][name], dtype=torch.float32).reshape(p.shape)
        bias.grad = torch.tensor(grads[step]["head.bias"], dtype=torch.float32)
        for opt in (muon, adamw):
            opt.param_groups[0]["lr"] = lr
            opt.step()
        state = {name: as_list(p) for name, p in matrices.items()}
        state["head.bias"] = as_list(bias)
        after.append(state)
    buffers = {name: as_list(muon.state[p]["momentum_buffer"]) for name, p in matrices.items()}
    return after, buffers


def main():
    generator = torch.Generator().manual_seed(0)
    numel = lambda shape: int(torch.tensor(shape).prod())
    initial = {name: torch.randn(numel(s), generator=generator).mul(0.3).tolist() for name, s in SHAPES.items()}
    grads = [{name: torch.randn(numel(s), generator=generator).tolist() for name, s in SHAPES.items()}
             for _ in LRS]
    cases = []
    for case in CASES:
        after, buffers = run(case, initial, grads)
        cases.append({"options": case, "after": after, "momentum_buffers": buffers})
    out = {"torch_version": torch.__version__, "shapes": SHAPES, "lrs": LRS, "weight_decay": WEIGHT_DECAY,
           "initial": initial, "grads": grads, "cases": cases}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "muon_references.json")
    with open(path, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(f"wrote {path} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
