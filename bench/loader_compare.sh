#!/usr/bin/env bash
# Loader throughput, fasttrain vs torch.utils.data.DataLoader, side by side.
#
#   bench/loader_compare.sh [BIN_DIR] [extra args for both, e.g. --epochs 2 --workers 0,2]
#
# BIN_DIR holds loader_bench (default: build/bin, built against PyTorch 2.11's LibTorch). The peer
# runs with $PYTHON: by default the pinned .venv of scripts/install-deps (PyTorch 2.11); for Debian's
# 1.13 on both sides: PYTHON=/usr/bin/python3 bench/loader_compare.sh build-debian/bin.
# Prints both JSON lines per worker count, then a ratio table.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin_dir="${1:-build/bin}"
shift || true
python="${PYTHON:-$here/../.venv/bin/python}"

if [[ ! -x "$bin_dir/loader_bench" ]]; then
  echo "error: $bin_dir/loader_bench not found; build the bench target (complete build) or pass its directory" >&2
  exit 1
fi

ours="$("$bin_dir/loader_bench" "$@")"
theirs="$("$python" "$here/loader_peer.py" "$@")"
echo "$ours"
echo "$theirs"

OURS="$ours" THEIRS="$theirs" "$python" - <<'EOF'
import json
import os

def rows(text):
    return {r["workers"]: r for r in (json.loads(line) for line in text.splitlines() if line.strip())}

ours, theirs = rows(os.environ["OURS"]), rows(os.environ["THEIRS"])
print()
print(f"{'workers':>7}  {'fasttrain samples/s':>20}  {'torch samples/s':>16}  {'ratio':>7}")
for workers in sorted(set(ours) | set(theirs)):
    a, b = ours.get(workers), theirs.get(workers)
    fa = f"{a['samples_per_s']:>20,.0f}" if a else f"{'-':>20}"
    fb = f"{b['samples_per_s']:>16,.0f}" if b else f"{'-':>16}"
    ratio = f"{a['samples_per_s'] / b['samples_per_s']:>6.1f}x" if a and b else f"{'-':>7}"
    print(f"{workers:>7}  {fa}  {fb}  {ratio}")
EOF
