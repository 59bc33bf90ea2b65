#!/usr/bin/env bash
# On a GPU machine, with no build there: the CLI and test_cli built on another machine against the same
# PyTorch wheel (build/ from scripts/build; LibTorch 2.11.0+cu130 both sides) travel with the clone and
# .offline-deps/. A build takes 3 minutes of a lease; this script spends its minutes on measuring:
#   main job   configs/default.toml with memory.warmup = true, seeds 0-2, captured: the default recipe
#              (Muon), AdamW, and Muon cold (memory.warmup = false); FASTTRAIN_VARIANTS replaces that list
#              (one "name --set key=value ..." per line), and FASTTRAIN_BEFORE_CLI, a second CLI (an
#              earlier commit's build, carried), runs each variant right after this one: an A/B in one
#              lease. Then one run with memory.snapshot = true (its summary and the report's line), and
#              the peer's hand-written CUDA-graph step (bench/peer_gpu_speedrun.py --mode graph), which
#              reads the same recipe from the config: Muon and AdamW warm, and Muon cold
#   tests      test_cli's bit-identical resume tests on the GPU (CliResume.*, TorchScriptCli.*), then the
#              *_CUDA tests of every other test binary carried (build/tests/test_profile, say: the
#              working tree travels up to 64 MiB, so carry the binaries the lease is for)
# Logs go to $OUT/prebuilt-logs.tgz; the figures are printed.
#   bench/gpu/prebuilt.sh            # PYTHON (default python3) is the PyTorch the binaries were built against
set -uo pipefail
script=prebuilt work=/tmp/fasttrain-gpu-work
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"
budget="${FASTTRAIN_GPU_BUDGET_S:-220}"  # the tests get what is left of this

stage "the packages and data sets into /opt/fasttrain-deps"
unpack_prebuilt_deps || exit 1
# test_cli scripts its TorchScript models with the Python whose path was compiled in (FASTTRAIN_TORCH_PYTHON):
# a wrapper there (a symbolic link would lose the virtual environment the interpreter belongs to).
if [ ! -e .venv/bin/python ]; then
  mkdir -p .venv/bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v "$python")" >.venv/bin/python
  chmod +x .venv/bin/python
fi
if ldd "$cli" | grep -q "not found"; then ldd "$cli" | grep "not found"; exit 1; fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$python" -c "import torch; print('torch', torch.__version__)"

stage "main job: fasttrain captured, memory.warmup = true, seeds 0-2"
# FASTTRAIN_BEFORE_CLI: another build of the CLI (an earlier commit's, carried beside this one) run with the
# same variant right after each run of this one: an A/B pair in one lease.
clis=("$cli")
[ -n "${FASTTRAIN_BEFORE_CLI:-}" ] && clis+=("$FASTTRAIN_BEFORE_CLI")
variants=("muon" "adamw --set optim.name=adamw" "muon-cold --set memory.warmup=false")
[ -n "${FASTTRAIN_VARIANTS:-}" ] && mapfile -t variants <<<"$FASTTRAIN_VARIANTS"
for variant in "${variants[@]}"; do
  [ -z "${variant// /}" ] && continue  # a blank line of FASTTRAIN_VARIANTS
  read -r name extra <<<"$variant"
  for seed in 0 1 2; do
    for which in "${!clis[@]}"; do
      tag="$name"; [ "$which" -gt 0 ] && tag="$name-before"
      # shellcheck disable=SC2086  # $extra is a list of arguments
      timeout 60 "${clis[$which]}" train configs/default.toml --fresh --run-dir "$work/$tag-$seed" \
        --set train.seed=$seed --set log.progress=none --set memory.warmup=true $extra >"$work/$tag-$seed.log" 2>&1
      echo "fasttrain $tag seed $seed: $(grep -hE "reached accuracy|did not reach|error" "$work/$tag-$seed.log" | head -1)" \
        "$(grep -oE '"graph_capture_s": ?[0-9.e-]+' "$work/$tag-$seed/summary.json" 2>/dev/null)"
    done
  done
done

stage "memory.snapshot on the main job"
timeout 60 "$cli" train configs/default.toml --fresh --run-dir "$work/snapshot" --set log.progress=none \
  --set memory.snapshot=true --set memory.warmup=true >"$work/snapshot.log" 2>&1
echo "snapshot run: $(grep -hE "reached accuracy|did not reach|error" "$work/snapshot.log" | head -1)"
cat "$work/snapshot/memory_snapshot.json" 2>/dev/null; echo
ls -l "$work/snapshot/memory_snapshot.pickle" 2>/dev/null
"$cli" report "$work/snapshot" --out "$work/snapshot/report.html" >/dev/null 2>&1 &&
  grep -o "The CUDA caching allocator's history[^<]*<code>[^<]*</code>[^<]*" "$work/snapshot/report.html"

stage "main job: the peer's CUDA-graph step, same recipe (a warm-up run, then seeds 0-2)"
for optimizer in muon adamw; do
  timeout 90 "$python" bench/peer_gpu_speedrun.py --mode graph --optimizer $optimizer \
    --data-dir /usr/share/datasets/fashion-mnist --repeats 3 --json \
    >"$work/peer-graph-$optimizer.json" 2>"$work/peer-graph-$optimizer.log"
  "$python" - "$work/peer-graph-$optimizer.json" "$optimizer" <<'PY' || tail -n 5 "$work/peer-graph-$optimizer.log"
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"peer graph {sys.argv[2]}: time to 91% {r['time_to_target_s']}, steps {r['steps']}, "
      f"samples/s {r['samples_per_s']}, accuracy {r['accuracy']}")
PY
done

# Cold: a fresh process, nothing warmed before the clock (fasttrain's muon-cold above).
timeout 60 "$python" bench/peer_gpu_speedrun.py --mode graph --optimizer muon --no-warmup-run \
  --data-dir /usr/share/datasets/fashion-mnist --repeats 1 --json >"$work/peer-graph-cold.json" 2>"$work/peer-graph-cold.log"
echo "peer graph muon cold: $(tail -n 1 "$work/peer-graph-cold.json" | grep -oE '"time_to_target_s": [^]]*]')"

left=$((budget - (SECONDS - start)))
stage "test_cli's resume tests on the GPU (${left} s left)"
[ $left -gt 20 ] && (cd build && timeout $left tests/test_cli --gtest_filter='CliResume.*:TorchScriptCli.*' \
  >"$work/test_cli.log" 2>&1; echo "test_cli exit $?")
grep -E "^\[  (FAILED|PASSED|  OK) |Failure|differs" "$work/test_cli.log" | head -n 30
for binary in build/tests/test_*; do
  if [ ! -x "$binary" ] || [ "$binary" = build/tests/test_cli ]; then continue; fi
  left=$((budget - (SECONDS - start)))
  [ $left -gt 10 ] || break
  name="$(basename "$binary")"
  (cd build && timeout $left "tests/$name" --gtest_filter='*_CUDA' >"$work/$name.log" 2>&1; echo "$name *_CUDA exit $?")
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure" "$work/$name.log" | head -n 10
done

find "$work" \( -name '*.safetensors' -o -name '*.pickle' \) -delete
find "$work" -path '*checkpoints*' -prune -exec rm -rf {} + 2>/dev/null
tar czf "$out/prebuilt-logs.tgz" -C "$work" . 2>/dev/null
stage "done"
