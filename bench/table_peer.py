"""The Python peer of fasttrain's CSV loading (compare.py csv): the same table read into tensors the way a
PyTorch user would, then standardised with the training rows' statistics.

    python table_peer.py FILE.csv --reader numpy|pandas --targets y [--json]

Prints the seconds of the read alone and of read + standardise + torch tensors (this process's own clock,
after its imports), and the shapes.
"""
import argparse
import json
import time

import numpy as np


def read_numpy(path, targets):
    header = open(path).readline().strip().split(",")
    table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float32)
    columns = {name: i for i, name in enumerate(header)}
    target_idx = [columns[t] for t in targets]
    feature_idx = [i for i in range(len(header)) if i not in target_idx]
    return table[:, feature_idx], table[:, target_idx]


def read_pandas(path, targets):
    import pandas as pd
    frame = pd.read_csv(path, dtype=np.float32, engine="c")
    return frame.drop(columns=targets).to_numpy(), frame[targets].to_numpy()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--reader", choices=["numpy", "pandas"], default="numpy")
    p.add_argument("--targets", nargs="+", default=["y"])
    p.add_argument("--val-fraction", type=float, default=0.2)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    import torch
    start = time.perf_counter()
    features, targets = (read_numpy if args.reader == "numpy" else read_pandas)(args.path, args.targets)
    read_s = time.perf_counter() - start
    generator = np.random.default_rng(0)
    order = generator.permutation(len(features))
    held = int(round(args.val_fraction * len(features)))
    train, test = order[held:], order[:held]
    mean, std = features[train].mean(0), features[train].std(0)
    std[std == 0] = 1
    x_train = torch.from_numpy((features[train] - mean) / std)
    x_test = torch.from_numpy((features[test] - mean) / std)
    y_train, y_test = torch.from_numpy(targets[train]), torch.from_numpy(targets[test])
    total_s = time.perf_counter() - start
    result = {"reader": args.reader, "rows": len(features), "read_s": round(read_s, 3),
              "read_split_standardise_s": round(total_s, 3), "train": list(x_train.shape),
              "test": list(x_test.shape), "targets": list(y_train.shape[1:])}
    print(json.dumps(result) if args.json else result)


if __name__ == "__main__":
    main()
