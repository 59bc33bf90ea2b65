"""Loads what fasttrain trained back into model.py's Net with load_state_dict(strict=True), scores it on
the Fashion-MNIST test set in PyTorch, and compares with the accuracy fasttrain reported.

    python check.py RUN_DIR [DATASET_DIR]     # exits 1 when the two disagree by more than 0.5 point
"""
import gzip
import json
import os
import struct
import sys

import torch

from model import Net


def load_safetensors(path):
    """safetensors.torch.load_file where the package is installed; else the format read by hand (an
    8-byte header length, a JSON header, the tensors' bytes)."""
    try:
        from safetensors.torch import load_file
        return load_file(path)
    except ImportError:
        pass
    dtypes = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16,
              "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8, "BOOL": torch.bool}
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.uint8)
        tensors[name] = raw.view(dtypes[info["dtype"]]).reshape(info["shape"])
    return tensors


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def main(run_dir, dataset_dir="/usr/share/datasets/fashion-mnist"):
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    # With EMA on, fasttrain evaluates (and reports) the averaged weights.
    ema = os.path.join(run_dir, "final", "model_ema.safetensors")
    weights = ema if os.path.exists(ema) else os.path.join(run_dir, "final", "model.safetensors")
    net = Net()
    net.load_state_dict(load_safetensors(weights), strict=True)
    net.eval()

    # fasttrain's normalisation: the training images' mean and (population) std, in [0, 1] units.
    train = read_idx(os.path.join(dataset_dir, "train-images-idx3-ubyte.gz")).double() / 255
    mean, std = train.mean().item(), train.std(unbiased=False).item()
    images = (read_idx(os.path.join(dataset_dir, "t10k-images-idx3-ubyte.gz")).float() / 255 - mean) / std
    labels = read_idx(os.path.join(dataset_dir, "t10k-labels-idx1-ubyte.gz")).long()
    with torch.no_grad():
        predictions = torch.cat([net(batch.unsqueeze(1)).argmax(1) for batch in images.split(1000)])
    accuracy = (predictions == labels).double().mean().item()
    reported = summary["test_accuracy"]
    print(f"PyTorch: {accuracy:.4f} test accuracy with {os.path.basename(weights)}; fasttrain reported {reported:.4f}")
    if abs(accuracy - reported) > 0.005:
        print("check.py: the two disagree by more than 0.5 point", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
