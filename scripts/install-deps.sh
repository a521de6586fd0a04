#!/usr/bin/env bash
# Installs the Debian packages zerort builds against, skipping those already present.
# CUDA, cuBLAS and NCCL come from the CUDA Toolkit under /usr/local/cuda when it is there;
# nothing is fetched from outside Debian's archive.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache
  libabsl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev
  libopenmpi-dev openmpi-bin
  liburing-dev libopenblas-dev libopenblas-openmp-dev libxxhash-dev fio
  libpcre2-dev libutf8proc-dev libsentencepiece-dev
  gnuplot-nox clang-format strace shellcheck
  qemu-user  # tools/cpu_levels.py: the tests on emulated x86-64 CPUs of other vector widths
  python3
)

# `--peers`: also what `make bench-peers` and `make bench-gemm` compare against (PyTorch, BLIS,
# oneDNN, libxsmm from Debian).
if [[ "${1:-}" == "--peers" ]]; then
  packages+=(python3-torch libblis-openmp-dev libdnnl-dev libxsmm-dev)
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} Debian packages present"
else
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "install-deps: installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "install-deps: CUDA Toolkit found: $(/usr/local/cuda/bin/nvcc --version | tail -n 1)"
else
  echo "install-deps: no CUDA Toolkit under /usr/local/cuda; building CPU-only"
fi
