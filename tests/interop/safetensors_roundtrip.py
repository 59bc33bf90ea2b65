#!/usr/bin/env python3
"""The `safetensors` package's side of tests/cli/interop_test.cpp's round trip.

  python tests/interop/safetensors_roundtrip.py write PATH   writes expected() with save_file
  python tests/interop/safetensors_roundtrip.py check PATH   opens PATH (written by fasttrain) with
                                                            load_file and safe_open; exit 1 on any
                                                            difference from expected(), naming it
The C++ test builds the same tensors with the same formulas.
"""
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

METADATA = {"format": "pt"}  # one key: save_file writes several in an order that varies per process


def expected():
    base = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4) * 0.375 - 4.0
    return {
        "f32": base.to(torch.float32),
        "f16": base.to(torch.float16),
        "bf16": base.to(torch.bfloat16),
        "i64": torch.arange(-6, 6, dtype=torch.int64) * 1_000_000_000_007,
        "scalar_f32": torch.tensor(2.5, dtype=torch.float32),
        "empty_f32": torch.zeros(0, 3, dtype=torch.float32),
    }


def check(path):
    want = expected()
    got = load_file(path)
    problems = []
    if sorted(got) != sorted(want):
        problems.append(f"names {sorted(got)}, expected {sorted(want)}")
    for name, tensor in want.items():
        if name not in got:
            continue
        if got[name].dtype != tensor.dtype or got[name].shape != tensor.shape:
            problems.append(f"{name}: {got[name].dtype} {tuple(got[name].shape)}, "
                            f"expected {tensor.dtype} {tuple(tensor.shape)}")
        elif not torch.equal(got[name], tensor):
            problems.append(f"{name}: values {got[name].flatten()[:6].tolist()}..., "
                            f"expected {tensor.flatten()[:6].tolist()}...")
    with safe_open(path, framework="pt") as f:
        if f.metadata() != METADATA:
            problems.append(f"metadata {f.metadata()}, expected {METADATA}")
    if problems:
        raise SystemExit(f"{path}: " + "; ".join(problems))
    print(f"{path}: {len(want)} tensors and the metadata as expected")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "write":
        save_file(expected(), sys.argv[2], metadata=METADATA)
    else:
        check(sys.argv[2])


if __name__ == "__main__":
    main()
