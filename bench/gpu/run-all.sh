#!/usr/bin/env bash
# On a GPU machine with PyTorch and no network, from the packages scripts/offline-deps downloaded
# (README "On a GPU machine"): builds fasttrain with CUDA and runs its *_CUDA tests
# (scripts/test-offline), then the GPU benchmarks side by side with the Python peers in this one run,
# then the whole suite with the time left. Prints the figures as a table at the end
# (bench/gpu/summarize.py); the logs and raw JSON go to $OUT/gpu-logs.tgz.
#   bench/gpu/run-all.sh                 # PYTHON (default python3) is the PyTorch to build against
# Benchmarks:
#   main job   configs/default.toml, seeds 0-2: fasttrain captured (train.cuda_graphs auto), eager
#              (false), captured with memory.warmup = true (cuBLAS/cuDNN first use and the cuDNN
#              search before fit()); the peer (bench/peer_gpu_speedrun.py) eager and CUDA-graph
#   gpt        12 layers x 768 (12 heads, T 1024, batch 16, bf16) on this clone's *.cpp files, 60 steps:
#              fasttrain captured and eager; the peer (bench/peer_gpt.py) eager, with the bf16 matmul ceiling
set -uo pipefail
script=run-all work=/tmp/fasttrain-gpu-work
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"

stage "build and the *_CUDA tests"
OUT="$work" FASTTRAIN_TEST_JOBS=8 timeout 330 scripts/test-offline -R _CUDA 2>&1 | tail -n 25
[ -x "$cli" ] || { tar czf "$out/gpu-logs.tgz" -C "$work" . 2>/dev/null; echo "run-all: no CLI built" >&2; exit 1; }
multiarch=$(gcc -print-multiarch)
export LD_LIBRARY_PATH="/opt/fasttrain-deps/usr/lib/$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

stage "main job: fasttrain eager and with memory.warmup (the captured runs were test-offline's)"
for seed in 0 1 2; do
  for variant in eager warm; do
    case $variant in
      eager) set_args=(--set train.cuda_graphs=false) ;;
      warm) set_args=(--set memory.warmup=true) ;;
    esac
    timeout 60 "$cli" train configs/default.toml --fresh --run-dir "$work/main-$variant-$seed" \
      --set train.seed=$seed --set log.progress=none "${set_args[@]}" >"$work/main-$variant-$seed.log" 2>&1
  done
done
stage "main job: the peer, CUDA graph and eager (one untimed warm-up run each, then seeds 0-2)"
# The peer reads the recipe from configs/default.toml, as fasttrain does.
data="--data-dir /usr/share/datasets/fashion-mnist --repeats 3 --json"
timeout 60 "$python" bench/peer_gpu_speedrun.py --mode graph $data >"$work/peer-graph.json" 2>"$work/peer-graph.log"
timeout 90 "$python" bench/peer_gpu_speedrun.py --mode eager $data >"$work/peer-eager.json" 2>"$work/peer-eager.log"
timeout 30 "$python" bench/peer_gpu_speedrun.py --mode graph --no-warmup-run --data-dir /usr/share/datasets/fashion-mnist \
  --repeats 1 --json >"$work/peer-graph-cold.json" 2>"$work/peer-graph-cold.log"

stage "gpt 12 x 768: fasttrain captured and eager, the peer eager"
gpt=("${gpt_model[@]}" --set train.max_steps=60 --set log.every_steps=10)
timeout 90 "$cli" train configs/gpt_text.toml --fresh --run-dir "$work/gpt-graph" "${gpt[@]}" >"$work/gpt-graph.log" 2>&1
timeout 90 "$cli" train configs/gpt_text.toml --fresh --run-dir "$work/gpt-eager" "${gpt[@]}" \
  --set train.cuda_graphs=false >"$work/gpt-eager.log" 2>&1
timeout 120 "$python" bench/peer_gpt.py "${gpt_peer[@]}" --steps 60 --warmup-steps 20 --log-every 10 \
  >"$work/peer-gpt.json" 2>"$work/peer-gpt.log"

stage "fasttrain profile on the GPU: the main job's Kineto trace (CUDA kernels and copies)"
timeout 60 "$cli" profile configs/default.toml --run-dir "$work/profile" --steps 10 --warmup-steps 5 \
  --set log.progress=none >"$work/profile.log" 2>&1
"$python" - "$work/profile/trace.json" <<'PY' >"$work/profile-trace-summary.txt" 2>&1
import collections, json, sys
events = json.load(open(sys.argv[1]))
events = events.get("traceEvents", events) if isinstance(events, dict) else events
cats = collections.Counter(e.get("cat", "?") for e in events if isinstance(e, dict))
print("events by category:", dict(cats.most_common(12)))
kernels = collections.Counter(e["name"][:80] for e in events if isinstance(e, dict) and e.get("cat") == "kernel")
for name, n in kernels.most_common(10): print(n, name)
PY
cat "$work/profile-trace-summary.txt"

stage "the whole suite"
left=$((540 - (SECONDS - start)))
[ $left -gt 30 ] && (cd build && timeout $left ctest -j 8 --output-on-failure >"$work/ctest-all.log" 2>&1)
grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout|Skipped" "$work/ctest-all.log" | tail -n 20

find "$work" -name '*.safetensors' -delete
find "$work" -path '*checkpoints*' -prune -exec rm -rf {} + 2>/dev/null
tar czf "$out/gpu-logs.tgz" -C "$work" . 2>/dev/null
"$python" bench/gpu/summarize.py "$work"
stage "done"
