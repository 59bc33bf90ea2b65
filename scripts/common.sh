# Sourced by scripts/build, sanitize, fuzz and test: what every build shares. Needs $root set.

# The compiler cache lives outside the clone, so a fresh clone on the same machine (CI's) reuses it.
export CCACHE_DIR="${CCACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fasttrain-ccache}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
# Precompiled headers and ccache only work together with these.
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
# Clones in other directories compile the same sources: paths are hashed relative to the root.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
jobs="${FASTTRAIN_JOBS:-$(nproc)}"

# The pinned Python environment of scripts/install-deps: PyTorch 2.11, whose wheel is also the
# LibTorch 2.11 that fasttrain builds against first.
venv="${FASTTRAIN_VENV:-$root/.venv}"
venv_python="$venv/bin/python"

# torch_dir pip|debian: prints the Torch_DIR (the folder of TorchConfig.cmake) of that LibTorch, or
# says how to get it and fails. Passed to CMake explicitly, so a build directory configured against
# the other LibTorch before is moved over instead of keeping its cached one.
torch_dir() {
  case "$1" in
    pip)
      if ! [ -x "$venv_python" ] || ! "$venv_python" -c 'import torch' 2>/dev/null; then
        echo "fasttrain: no PyTorch in $venv: run scripts/install-deps first (or pass --libtorch debian)" >&2
        return 1
      fi
      echo "$("$venv_python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')/Torch" ;;
    debian)
      local dir="/usr/lib/$(gcc -print-multiarch)/cmake/Torch"
      [ -f "$dir/TorchConfig.cmake" ] || { echo "fasttrain: no $dir: apt-get install libtorch-dev (scripts/install-deps)" >&2; return 1; }
      echo "$dir" ;;
    *)
      echo "fasttrain: unknown LibTorch '$1' (use pip for PyTorch 2.11's, or debian for Debian's 1.13)" >&2
      return 2 ;;
  esac
}
