#!/usr/bin/env bash
# On a GPU machine, with the CLI built elsewhere against the same wheel and carried (as prebuilt.sh):
# the 12 x 768 GPT of run-all.sh (T 1024, batch 16, bf16), fasttrain against its eager PyTorch peer:
# tokens/s of each (fasttrain captured and eager, the peer eager), then each one's CUDA kernels per step
# from a profile of 5 eager steps (fasttrain profile's Kineto trace, the peer's torch.profiler trace),
# side by side (bench/gpu/kernel_table.py). Logs and traces go to $OUT/gpt-kernels.tgz.
#   bench/gpu/gpt-kernels.sh          # PYTHON (default python3): the PyTorch the CLI was built against
# FASTTRAIN_GPT_VARIANTS and PEER_GPT_VARIANTS replace the runs timed (one "name args..." per line: --set
# options of fasttrain train, flags of bench/peer_gpt.py); GPT_PROFILE=0 skips the profiles, PEER_GPT_PROFILE=0
# the peer's; FASTTRAIN_GPT_PROFILE_SETS adds --set options to fasttrain's (model.gpu_kernels=fasttrain, say).
# fasttrain's tokens/s are over steps 21-60 (metrics.jsonl), as the peer's are after its 20 untimed steps.
# FASTTRAIN_BEFORE_CLI, another build of the CLI (an earlier commit's, carried), runs each fasttrain variant
# right after this one's, as NAME-before: an A/B in one lease.
set -uo pipefail
script=gpt-kernels work=/tmp/fasttrain-gpt-work
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"
unpack_prebuilt_deps >/dev/null || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

model=("${gpt_model[@]}")
peer=("${gpt_peer[@]}" --ceiling-flops -1)

fasttrain_variants="${FASTTRAIN_GPT_VARIANTS:-$'captured --set train.cuda_graphs=true\neager --set train.cuda_graphs=false'}"
peer_variants="${PEER_GPT_VARIANTS:-eager}"
stage "tokens/s: fasttrain (60 steps), the peer (60 steps, 20 untimed)"
clis=("$cli")
[ -n "${FASTTRAIN_BEFORE_CLI:-}" ] && clis+=("$FASTTRAIN_BEFORE_CLI")
while read -r variant extra; do
  [ -z "$variant" ] && continue
  for which in "${!clis[@]}"; do
    name="$variant"; [ "$which" -gt 0 ] && name="$variant-before"
    # shellcheck disable=SC2086  # $extra is a list of arguments
    timeout 120 "${clis[$which]}" train configs/gpt_text.toml --fresh --run-dir "$work/fasttrain-$name" \
      "${model[@]}" --set train.max_steps=60 --set log.every_steps=10 $extra >"$work/fasttrain-$name.log" 2>&1
    echo "fasttrain $name: $(PYTHONPATH=bench/gpu "$python" - "$work/fasttrain-$name" <<'PY' 2>&1
import json, os, sys
from summarize import fasttrain_tokens_per_s  # the median of the log intervals after step 20
d = sys.argv[1]
s = json.load(open(os.path.join(d, "summary.json")))
print(round(fasttrain_tokens_per_s(d)), "tokens/s over steps 21-60,", round(s["train_samples_per_s"]),
      "over the run; capture", s.get("graph_capture_s"), "s, peak", round(s["peak_memory_bytes"] / 2**30, 2), "GiB")
PY
)"
  done
done <<<"$fasttrain_variants"
while read -r name extra; do
  [ -z "$name" ] && continue
  # shellcheck disable=SC2086
  timeout 300 "$python" bench/peer_gpt.py "${peer[@]}" --steps 60 --warmup-steps 20 --log-every 10 $extra \
    >"$work/peer-$name.json" 2>"$work/peer-$name.log"
  echo "peer $name: $("$python" -c 'import json,sys; r=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print(round(r["tokens_per_s"]), "tokens/s, step", r["step_ms"], "ms, peak", round(r["peak_memory_bytes"] / 2**30, 2), "GiB")' "$work/peer-$name.json" 2>&1 | tail -n 1)"
done <<<"$peer_variants"

[ "${GPT_PROFILE:-1}" = 0 ] && { tar czf "$out/gpt-kernels.tgz" -C "$work" --exclude='*.safetensors' . 2>/dev/null; stage "done"; exit 0; }
stage "profiles: 5 eager steps each"
read -r -a profile_sets <<<"${FASTTRAIN_GPT_PROFILE_SETS:-}"
timeout 120 "$cli" profile configs/gpt_text.toml --run-dir "$work/profile" --steps 5 --warmup-steps 5 "${model[@]}" \
  "${profile_sets[@]}" >"$work/profile.log" 2>&1 || tail -n 5 "$work/profile.log"
"$python" bench/gpu/kernel_table.py "$work/profile/trace.json" --steps 5 --rows 40
if [ "${PEER_GPT_PROFILE:-1}" != 0 ]; then
  timeout 120 "$python" bench/peer_gpt.py "${peer[@]}" --steps 15 --warmup-steps 10 --log-every 0 --profile-steps 5 \
    --profile-trace "$work/peer-trace.json" >"$work/peer-profile.json" 2>"$work/peer-profile.log" || tail -n 5 "$work/peer-profile.log"
  "$python" bench/gpu/kernel_table.py "$work/peer-trace.json" --steps 5 --rows 40
fi
for f in "$work/profile/trace.json" "$work/peer-trace.json"; do
  "$python" bench/gpu/kernel_table.py "$f" --steps 5 --json >"$f.kernels.json" 2>/dev/null
done

find "$work" \( -name '*.safetensors' \) -delete
find "$work" -path '*checkpoints*' -prune -exec rm -rf {} + 2>/dev/null
gzip -f "$work/profile/trace.json" "$work/peer-trace.json" 2>/dev/null
tar czf "$out/gpt-kernels.tgz" -C "$work" . 2>/dev/null
stage "done"
