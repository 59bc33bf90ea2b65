# Sourced by the GPU scripts beside it, after they set `script` (their name in progress lines) and `work`
# (their scratch folder, emptied here): the clone's root as the working directory, $out ($OUT: what
# comes back from a device call), $python (PYTHON, default python3: the PyTorch to run and link against),
# $cli, and stage, which prints "SCRIPT: what (at N s)". unpack_prebuilt_deps, for CLIs built elsewhere
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

unpack_prebuilt_deps() {
  local prefix=/opt/fasttrain-deps torch_lib multiarch
  scripts/offline-unpack "$prefix" || return 1
  torch_lib="$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  multiarch="$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
  export LD_LIBRARY_PATH="$torch_lib:/usr/local/cuda/lib64:$prefix/usr/lib/$multiarch"
}
