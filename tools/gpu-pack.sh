#!/usr/bin/env bash
# Packs a CUDA-enabled build (default: build/) for a GPU machine that has the CUDA driver, cuBLAS,
# NCCL and Open MPI but not Debian's development packages zerort builds against (docs/gpu.md):
# the build tree's programs, libraries and ctest files, and the Debian shared libraries they load,
# into .gpu/pack.tar.xz (about 18 MB), with eu-stack for the stacks of a hung command.
# tools/gpu-check.sh unpacks it there and runs the GPU tests.
# cuBLAS, NCCL, MPI and glibc are not packed: the GPU machine's own are used.
#   tools/gpu-pack.sh [BUILD] [--llmc DIR]
# --llmc DIR: llm.c's folder (the peers' README says where; it is never copied into zerort): its
# train_gpt2cu is built in a scratch folder for sm_90 without cuDNN, and with cuDNN's attention
# when DIR/../cudnn-frontend exists, and packed under peers/ for gpu-check.sh's side-by-side run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build llmc=
while (($#)); do
  case $1 in
    --llmc) llmc=$(cd "${2:?--llmc needs a folder}" && pwd); shift 2 ;;
    -*) echo "gpu-pack: unknown option $1" >&2; exit 2 ;;
    *) build=$(cd "$1" && pwd); shift ;;
  esac
done
[[ -x $build/tools/zerort ]] || { echo "gpu-pack: no $build/tools/zerort; build first" >&2; exit 1; }
[[ -x $build/tests/model_kernels_cuda_test ]] ||
  { echo "gpu-pack: $build was built without CUDA (no tests/model_kernels_cuda_test)" >&2; exit 1; }
out=$root/.gpu
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out" "$stage/build" "$stage/deps"

# The build tree without objects: programs, shared libraries, ctest files (absolute paths into
# $root and $build, which gpu-check.sh recreates as links there).
tar -C "$build" --exclude=CMakeFiles --exclude='*.o' --exclude='*.a' --exclude=install-test \
  --exclude=embed --exclude=embed_tp --exclude=hello_comm --exclude=embed-nvme --exclude=Testing \
  --exclude=gpu-check-logs -cf - . | tar -C "$stage/build" -xf -
printf '%s\n%s\n' "$root" "$build" >"$stage/paths"

# Shared libraries the programs load, except glibc, the compiler runtime, and what the GPU
# machine brings: the driver (libcuda), cuBLAS, NCCL, MPI and its runtime. (cudart is packed:
# gpu-check.sh uses the machine's own where it has one.)
skip='^(libc|libm|libdl|libpthread|librt|ld-linux-x86-64|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libnccl|libmpi|libopen-pal|libopen-rte|libpmix|libhwloc|libevent|linux-vdso)[.-]'
find "$build" -path "$build/CMakeFiles" -prune -o -type f -perm -u+x -print0 |
  xargs -0 ldd 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}' | sort -u >"$stage/ldd.txt" || true
while read -r name path; do
  if [[ ! $name =~ $skip && $path != "$build"/* ]]; then cp -L "$path" "$stage/deps/$name"; fi
done <"$stage/ldd.txt"
rm "$stage/ldd.txt"

# eu-stack (elfutils), where this machine has it: gpu-check.sh's guard prints every thread's
# stack of a command that outlives its time limit (a hang on a lent GPU is otherwise a silence).
if command -v eu-stack >/dev/null; then
  mkdir -p "$stage/debug" && cp -L "$(command -v eu-stack)" "$stage/debug/eu-stack"
  ldd "$stage/debug/eu-stack" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    if [[ ! $name =~ $skip && ! -e $stage/deps/$name ]]; then cp -L "$path" "$stage/deps/$name"; fi
  done
else
  echo "gpu-pack: no eu-stack here (apt-get install elfutils): a hung GPU command will show no stack"
fi

# llm.c, built from its own folder in a scratch copy (llm.c's Makefile builds in place).
if [[ -n $llmc ]]; then
  [[ -f $llmc/train_gpt2.cu ]] || { echo "gpu-pack: $llmc has no train_gpt2.cu" >&2; exit 2; }
  mkdir -p "$stage/peers"
  flags=(NO_MULTI_GPU=1 NO_USE_MPI=1 NO_NVML=1 GPU_COMPUTE_CAPABILITY=90 PRECISION=BF16)
  scratch=$stage/llmc-src
  cp -r "$llmc" "$scratch" && chmod -R u+w "$scratch"
  make -C "$scratch" train_gpt2cu "${flags[@]}" >"$stage/peers/build.log" 2>&1 ||
    { tail -30 "$stage/peers/build.log"; exit 1; }
  cp "$scratch/train_gpt2cu" "$stage/peers/train_gpt2cu"
  if [[ -d $llmc/../cudnn-frontend ]]; then
    # zerort's own cuDNN attention (model.attention_backend cudnn) is built from the same headers
    # when the build was configured with them.
    if ! grep -q '^ZR_CUDNN_FRONTEND:PATH=..*' "$build/CMakeCache.txt" 2>/dev/null; then
      echo "gpu-pack: $build has no cuDNN attention; for it: cmake -B $build" \
        "-DZR_CUDNN_FRONTEND=$(cd "$llmc/../cudnn-frontend" && pwd), rebuild, pack again"
    fi
    rm -f "$scratch/train_gpt2cu" && ln -s "$(cd "$llmc/../cudnn-frontend" && pwd)" "$scratch/cudnn-frontend"
    if make -C "$scratch" train_gpt2cu USE_CUDNN=1 "${flags[@]}" \
      NVCC_LDLIBS="-lnvrtc -L/usr/local/cuda/lib64/stubs -lcuda" >>"$stage/peers/build.log" 2>&1; then
      cp "$scratch/train_gpt2cu" "$stage/peers/train_gpt2cu-cudnn"
    else
      echo "gpu-pack: llm.c with cuDNN did not build (peers/build.log); packing it without"
    fi
  fi
  cat "$llmc/COMMIT" >"$stage/peers/COMMIT" 2>/dev/null || true
  rm -rf "$scratch"
  echo "gpu-pack: llm.c: $(cd "$stage/peers" && echo train_gpt2cu*)"
fi
tar -C "$stage" -cJf "$out/pack.tar.xz" .
echo "gpu-pack: $out/pack.tar.xz ($(du -h "$out/pack.tar.xz" | cut -f1)), $(find "$stage/deps" -type f | wc -l) libraries"
