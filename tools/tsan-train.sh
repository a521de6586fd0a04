#!/usr/bin/env bash
# zerort itself under ThreadSanitizer (make test-tsan): short `zerort train` runs of a 2-layer
# model on the asynchronous CPU device with jitter, so every stream's thread, the watchdog, the
# NVMe engine and the host gradients in flight run together: one process with the optimizer and
# parameters on NVMe, then two MPI ranks (host offload, and with the gradient sums on the device;
# tensor and sequence parallelism; ZeRO-2 buckets in bf16; ZeRO-1 with fp16 and LAMB; 1-bit Adam
# and 0/1 Adam compressing), then four (ZeRO-3 gathering by broadcast: the compute and comm
# streams share one communicator, [Note: one communicator, one order]). Any report fails the run
# (halt_on_error).
#   tools/tsan-train.sh ZERORT_BUILT_WITH_TSAN
# Open MPI's TCP transport takes its own locks in both orders while it connects its peers (a
# lock-order report inside mca_btl_tcp, not zerort's), so the ranks use shared memory only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
zerort=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
common=(--overwrite --set train.device=cpu-async --set train.async_jitter_seed=5
        --set train.steps=3 --set train.eval_interval=0 --set train.sample_tokens=0
        --set checkpoint.interval=3 --set model.n_layer=2 --set model.d_model=64
        --set checkpoint.dir="$work/ckpt" --set logging.metrics_file="$work/metrics.jsonl")
run() {  # NAME NP ARGS...
  local name=$1 np=$2
  shift 2
  local cmd=("$zerort" train "$root/configs/tiny-cpu.json" "${common[@]}" "$@")
  if ((np > 1)); then
    # shellcheck disable=SC2054  # "self,vader" is one argument, Open MPI's list of transports
    cmd=(mpirun --oversubscribe -np "$np" --mca btl self,vader -x TSAN_OPTIONS -x OMP_NUM_THREADS
         -x OPENBLAS_NUM_THREADS "${cmd[@]}")
  fi
  if ! timeout 300 "${cmd[@]}" >"$work/$name.log" 2>&1 || grep -q "ThreadSanitizer" "$work/$name.log"; then
    echo "tsan-train: $name FAILED"
    grep -A40 -m1 "ThreadSanitizer" "$work/$name.log" || tail -40 "$work/$name.log"
    exit 1
  fi
  echo "tsan-train: $name ok"
}
mkdir -p "$work/nvme"
run nvme-offload-accumulation 1 --set zero_optimization.offload_optimizer.device=nvme \
  --set zero_optimization.offload_param.device=nvme \
  --set zero_optimization.offload_optimizer.nvme_path="$work/nvme" \
  --set zero_optimization.offload_param.nvme_path="$work/nvme" \
  --set gradient_accumulation_steps=2 --set bf16.enabled=true
if ! command -v mpirun >/dev/null; then
  echo "tsan-train: no mpirun: the two-rank runs are skipped"
  exit 0
fi
run np2-host-offload 2 --set zero_optimization.offload_optimizer.device=cpu
# [Note: gradient sums on the device]: the staged sums the host step's worker reads after the
# copy's event. (Not under a pipeline: its links' sends and receives on their own threads meet
# in Open MPI's ompi_sync_wait_mt, whose two locks TSan reports in both orders.)
run np2-host-grad-sums 2 --set zero_optimization.offload_optimizer.device=cpu \
  --set zero_optimization.stage=1 --set train.device_grad_sums=true \
  --set gradient_accumulation_steps=2
run np2-tensor-sequence-parallel 2 --set parallel.tensor_parallel_size=2 \
  --set parallel.sequence_parallel=true
run np2-stage2-buckets-bf16 2 --set zero_optimization.stage=2 \
  --set zero_optimization.reduce_bucket_size=5000 --set bf16.enabled=true
run np2-stage1-fp16-lamb 2 --set zero_optimization.stage=1 --set fp16.enabled=true \
  --set optimizer.type=Lamb
run np2-onebit-adam 2 --set zero_optimization.stage=0 --set optimizer.type=OneBitAdam \
  --set optimizer.params.freeze_step=1
run np2-zero-one-adam 2 --set zero_optimization.stage=0 --set optimizer.type=ZeroOneAdam \
  --set optimizer.params.var_freeze_step=1
run np2-onebit-lamb 2 --set zero_optimization.stage=0 --set optimizer.type=OneBitLamb \
  --set optimizer.params.freeze_step=1
run np4-stage3-broadcast-gathers 4 --set zero_optimization.stage=3 \
  --set zero_optimization.allgather_partitions=false --set zero_optimization.reduce_scatter=false
