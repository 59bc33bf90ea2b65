#!/usr/bin/env bash
# On a GPU machine, with the CLI and test binaries built elsewhere against the same wheel and carried (as
# prebuilt.sh: .offline-deps, build/bin/fasttrain, build/tests/test_kernels, test_models, test_optim):
# fasttrain's own GPU kernels (model.gpu_kernels: the residual add + LayerNorm, the cuBLASLt MLP) against
# ATen's ops in their reference tests, then the 12 x 768 GPT with them on, in part and off, captured and
# eager, beside the peer eager (SDPA by cuDNN) and compiled (gpt-kernels.sh), and a profile of fasttrain's
# step with them. Test logs go to $OUT, the GPT's to $OUT/gpt-kernels.tgz. About 4 minutes of a lease.
#   bench/gpu/own-kernels.sh          # PYTHON (default python3): the PyTorch the binaries were built against
set -uo pipefail
script=own-kernels work=/tmp/fasttrain-own-kernels
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"
unpack_prebuilt_deps >/dev/null || exit 1
# The test binaries find the CLI and the data by the paths they were built with.
[ "$root" = /work/main ] || { mkdir -p /work && ln -sfn "$root" /work/main; }

stage "the kernels' reference tests on the GPU"
for check in "test_kernels Gpu*" "test_models *_CUDA" "test_optim *_CUDA" "test_train *_CUDA"; do
  read -r binary filter <<<"$check"
  [ -x "build/tests/$binary" ] || { echo "$binary: not carried"; continue; }
  (cd build && timeout 150 "tests/$binary" --gtest_filter="$filter" >"$work/$binary.log" 2>&1
   echo "$binary $filter: exit $?")
  grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|max \|error\||C\+\+ exception|what\(\)" "$work/$binary.log" | head -n 40
  cp "$work/$binary.log" "$out/"
done

stage "the GPT: model.gpu_kernels on, in part and off"
own="--set model.gpu_kernels=fasttrain"
export FASTTRAIN_GPT_VARIANTS="${FASTTRAIN_GPT_VARIANTS:-"captured-aten --set train.cuda_graphs=true
captured-own --set train.cuda_graphs=true $own
captured-norm-only --set train.cuda_graphs=true $own --set model.aten_kernels=[\"bias_gelu\"]
captured-mlp-only --set train.cuda_graphs=true $own --set model.aten_kernels=[\"layer_norm\"]
eager-aten --set train.cuda_graphs=false
eager-own --set train.cuda_graphs=false $own"}"
export PEER_GPT_VARIANTS="${PEER_GPT_VARIANTS:-$'cudnn --sdpa-backend cudnn\ncompile --compile --sdpa-backend auto'}"
export FASTTRAIN_GPT_PROFILE_SETS="$own" PEER_GPT_PROFILE=0
bash "$(dirname "$0")/gpt-kernels.sh"
