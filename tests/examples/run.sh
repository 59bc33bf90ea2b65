#!/usr/bin/env bash
# Examples.BuildAgainstTheInstalledPackageAndRun: installs fasttrain from BUILD into a prefix, builds
# every example of examples/ against it with find_package(fasttrain), as a program outside the tree
# would, and runs each for a few steps, checking what it writes.
#   run.sh SOURCE_DIR BUILD_DIR CMAKE PYTHON [PREFIX_PATH]
# PYTHON has the PyTorch of the LibTorch under test (python_model scripts its network with it).
# PREFIX_PATH is the main build's CMAKE_PREFIX_PATH (':'-separated), where its dependencies were found (a GPU machine
# keeps Debian's packages in /opt/fasttrain-deps, not /usr): the package's find_dependency calls look there.
# Exits 77 (skipped) after the build when Debian's Fashion-MNIST, which the examples train on, is absent.
set -euo pipefail
source_dir="$1" build_dir="$2" cmake="$3" python="$4" dependency_prefixes="${5:-}"
work="$build_dir/examples-check"  # a fixed place: a rerun rebuilds only what changed
rm -rf "$work/prefix" "$work/runs"
mkdir -p "$work"
step() { echo "examples: $*"; }
fail() { echo "examples: FAILED: $*" >&2; exit 1; }

step "installing into $work/prefix"
"$cmake" --install "$build_dir" --prefix "$work/prefix" >"$work/install.log" || { cat "$work/install.log"; fail "install"; }
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
step "building examples/ against the installed package"
"$cmake" -S "$source_dir/tests/examples" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix${dependency_prefixes:+;${dependency_prefixes//:/;}}" \
  -DFASTTRAIN_EXAMPLES_DIR="$source_dir/examples" "${launcher[@]}" \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure"; }
"$cmake" --build "$work/build" -j "${FASTTRAIN_JOBS:-2}" >"$work/build.log" 2>&1 || { tail -n 60 "$work/build.log"; fail "build"; }

if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "examples: built; not run: they train on Debian's dataset-fashion-mnist, absent here" >&2
  exit 77
fi
runs="$work/runs"
expect() {  # expect FILE TEXT: FILE holds TEXT
  grep -qF -- "$2" "$1" || { cat "$1"; fail "$1 lacks '$2'"; }
}

step "autoencoder: 30 steps, then a second run that resumes from its checkpoint"
"$work/build/autoencoder/autoencoder" "$runs/autoencoder" 30 >"$work/ae1.log" 2>&1 || { cat "$work/ae1.log"; fail "autoencoder"; }
expect "$work/ae1.log" "test mse"
[ -f "$runs/autoencoder/final/model.safetensors" ] || fail "no final weights"
[ -d "$runs/autoencoder/checkpoints/step-30" ] || fail "no checkpoint at step 30"
"$work/build/autoencoder/autoencoder" "$runs/autoencoder" 40 >"$work/ae2.log" 2>&1 || { cat "$work/ae2.log"; fail "autoencoder resumed"; }
expect "$work/ae2.log" "resuming from $runs/autoencoder/checkpoints/step-30"
expect "$work/ae2.log" "after 40 steps"

step "two_inputs: 30 steps from a config, through train_run"
"$work/build/two_inputs/two_inputs" "$runs/pairs" --set train.max_steps=30 --set train.eval_every_steps=30 \
  --set data.workers=0 >"$work/pairs.log" 2>&1 || { cat "$work/pairs.log"; fail "two_inputs"; }
expect "$work/pairs.log" "test loss"
expect "$runs/pairs/config.toml" 'name = "classification"'
[ -f "$runs/pairs/summary.json" ] || fail "no summary.json"

step "doctor: on the example's own conv net"
"$work/build/doctor/doctor" "$runs/doctor" 4 0.2 >"$work/doctor.log" 2>&1 || { cat "$work/doctor.log"; fail "doctor"; }
expect "$work/doctor.log" "fasttrain doctor:"
expect "$work/doctor.log" "Drop the conv biases before BatchNorm"
[ -f "$runs/doctor/doctor.json" ] || fail "no doctor.json"
cli="$work/prefix/bin/fasttrain"
seattle=/usr/lib/python3/dist-packages/vega_datasets/_data/seattle-weather.csv
step "csv_regression: the installed CLI and a config only"
[ -f "$seattle" ] || fail "$seattle is absent: scripts/install-deps installs python3-vega-datasets"
"$cli" train "$source_dir/examples/csv_regression/regression.toml" --set train.epochs=3 --set log.progress=none \
  --run-dir "$runs/csv" >"$work/csv.log" 2>&1 || { cat "$work/csv.log"; fail "csv_regression"; }
expect "$work/csv.log" "validation 292 samples"
expect "$work/csv.log" " r2 "

step "python_model: scripted by $python's PyTorch, trained by the installed CLI, scored back in PyTorch"
export PYTHONDONTWRITEBYTECODE=1
"$python" "$source_dir/examples/python_model/model.py" "$work/net.pt" >"$work/script.log" 2>&1 ||
  { cat "$work/script.log"; fail "model.py"; }
"$cli" train "$source_dir/examples/python_model/train.toml" --set model.path="$work/net.pt" --set train.max_steps=40 \
  --set log.progress=none --run-dir "$runs/python_model" >"$work/python_model.log" 2>&1 ||
  { cat "$work/python_model.log"; fail "python_model training"; }
expect "$work/python_model.log" "model torchscript"
(cd "$source_dir/examples/python_model" && "$python" check.py "$runs/python_model") >"$work/check.log" 2>&1 ||
  { cat "$work/check.log"; fail "check.py"; }
expect "$work/check.log" "fasttrain reported"
step "all built against the installed package and ran"
