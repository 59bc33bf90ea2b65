# shellcheck shell=bash disable=SC2034,SC2154  # sourced: `script` and `work` come from the caller, the rest goes to it
# Sourced by the GPU scripts beside it, after they set `script` (their name in progress lines) and `work`
# (their scratch folder, emptied here): the clone's root as the working directory, $out ($OUT: what
# comes back from a device call), $python (PYTHON, default python3: the PyTorch to run and link against),
# $cli, and stage, which prints "SCRIPT: what (at N s)". gpt_model and gpt_peer: the 12 x 768 GPT (12 heads,
# T 1024, batch 16, bf16 by auto, this clone's *.cpp files) as fasttrain's --set options of
# configs/gpt_text.toml and as bench/peer_gpt.py's flags on CUDA. unpack_prebuilt_deps, for CLIs built elsewhere
# against the same wheel: the Debian packages of .offline-deps into /opt/fasttrain-deps and the library
# path to them, the wheel's LibTorch and CUDA's.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 1
out="${OUT:-/tmp/fasttrain-gpu}"
rm -rf "$work" && mkdir -p "$work" "$out"
python="${PYTHON:-python3}"
cli=build/bin/fasttrain
start=$SECONDS
stage() { echo "$script: $1 (at $((SECONDS - start)) s)" >&2; }
gpt_model=(--set data.path="$root" --set 'data.include=*.cpp' --set model.layers=12 --set model.heads=12
  --set model.embed=768 --set model.context=1024 --set data.batch_size=16 --set data.eval_batch_size=16
  --set schedule.warmup_steps=10 --set train.eval_every_steps=0 --set log.progress=none
  --set train.threads=0 --set train.precision=auto)
gpt_peer=(--device cuda --path "$root" --include '*.cpp' --layers 12 --heads 12 --embed 768 --context 1024
  --batch-size 16 --lr-warmup-steps 10 --min-lr 1e-4)

unpack_prebuilt_deps() {
  local prefix=/opt/fasttrain-deps torch_lib multiarch
  scripts/offline-unpack "$prefix" || return 1
  torch_lib="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  multiarch="$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
  export LD_LIBRARY_PATH="$torch_lib:/usr/local/cuda/lib64:$prefix/usr/lib/$multiarch"
}
