#!/usr/bin/env bash
# Runs what needs a GPU (docs/gpu.md): every gpu-labelled test (the CUDA kernels against their CPU
# twins, the CUDA allocator and communicators, the shard manager on the GPU, cuda_parity: training
# on cuda against cpu loss by loss), the MPI test that stages CUDA buffers through pinned memory,
# compute-sanitizer's memcheck over the kernel and shard-manager tests, then the measurements the
# docs record: a GPT-2 124M bf16 ZeRO-3 run (alone, with the optimizer on the host, and with pp 2
# where there are two GPUs), bench attention (with an ncu profile of the flash programs where the
# machine has ncu), bench model (with its timeline and launch census), bench adamw,
# estimate --measure, and GPT-2 124M against llm.c in the same run.
#   tools/gpu-check.sh [BUILD]
# GPU_CHECK_ONLY="tests memcheck train bench peers llama" runs only the sections it names (all
# by default), so that a lent machine's minutes can be split over several calls.
# GPU_CHECK_SET="KEY=VALUE ..." adds `--set KEY=VALUE` to every zerort run of a training config
# (train, bench model and its flash timeline, the side-by-side, the LLaMA run; not estimate
# --measure): e.g. model.flash_attention's block shapes. GPU_CHECK_SET=auto takes the block shapes
# the bench section's `bench attention` found faster (tools/flash_tiles_pick.py) for the runs
# after it (bench model, peers, llama; docs/gpu.md, "Running the GPU checks").
# With .gpu/pack.tar.xz (tools/gpu-pack.sh, made on a machine that builds zerort) it unpacks that
# build and uses the machine's CUDA, cuBLAS, NCCL and MPI; else it configures and builds BUILD
# (default build-gpu), which needs scripts/install-deps.sh's packages. Logs go to /tmp/gpu-check,
# packed into $OUT/gpu-check.tar.gz on exit when OUT is set (the device tool returns that folder;
# one archive, since it returns only a few files).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sections="tests memcheck train bench peers llama"
for s in ${GPU_CHECK_ONLY:-}; do  # a misspelt section would run nothing, silently
  [[ " $sections " == *" $s "* ]] ||
    { echo "gpu-check: GPU_CHECK_ONLY: no section '$s' (sections: $sections)" >&2; exit 2; }
done
logs=/tmp/gpu-check
sets=()
for kv in ${GPU_CHECK_SET:-}; do
  if [[ $kv == auto ]]; then  # the bench section's choice (below), alone
    [[ $GPU_CHECK_SET == auto ]] || { echo "gpu-check: GPU_CHECK_SET: auto goes alone" >&2; exit 2; }
    break
  fi
  [[ $kv == *=* ]] || { echo "gpu-check: GPU_CHECK_SET: '$kv' is not KEY=VALUE or auto" >&2; exit 2; }
  sets+=(--set "$kv")
done
# The archive is rewritten after each section too: a call killed at its time limit (no EXIT trap
# runs then) still returns the sections it finished.
save_logs() {
  [[ -n ${OUT:-} ]] || return 0
  mkdir -p "$OUT" && tar -C /tmp -czf "$OUT/gpu-check.tar.gz.part" gpu-check &&
    mv "$OUT/gpu-check.tar.gz.part" "$OUT/gpu-check.tar.gz"
}
trap save_logs EXIT
mkdir -p "$logs"
t0=$(date +%s)
exec 3>&1  # the check's own output, where a guarded command's is redirected
step() { echo "[$(($(date +%s) - t0)) s] $*" >&3; }
stack=  # eu-stack, from the pack
# guard SECONDS NAME COMMAND...: runs COMMAND; one still running after SECONDS is a hang, not a
# measurement: every thread's stack of it and of its child processes (eu-stack, where the pack
# has it), each thread's kernel wait channel and nvidia-smi go to $logs/hang-NAME.txt, and it is
# killed (status 124). A lent machine's minutes are not spent waiting on it, and the hang is seen.
guard() {
  local limit=$1 name=$2
  shift 2
  "$@" &
  local pid=$! end=$((SECONDS + limit))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= end)); then
      local pids=("$pid") i=0 p
      while ((i < ${#pids[@]})); do  # the process and its descendants (mpirun's ranks, python's)
        for p in $(ps -o pid= --ppid "${pids[i]}" 2>/dev/null); do pids+=("$p"); done
        i=$((i + 1))
      done
      {
        echo "$name: still running after $limit s: $*"
        for p in "${pids[@]}"; do
          echo "== process $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
          for t in /proc/"$p"/task/*; do
            echo "thread ${t##*/} $(cat "$t/comm" 2>/dev/null) wait channel $(cat "$t/wchan" 2>/dev/null)"
          done
          [[ -n $stack ]] && "$stack" -p "$p"
        done
        nvidia-smi
      } >"$logs/hang-$name.txt" 2>&1
      kill -9 "${pids[@]}" 2>/dev/null
      wait "$pid" 2>/dev/null
      step "$name: killed after $limit s; stacks in hang-$name.txt"
      grep -A12 '^TID' "$logs/hang-$name.txt" | head -40 >&3
      return 124
    fi
    sleep 0.2
  done
  wait "$pid"
}

if [[ -f $root/.gpu/pack.tar.xz ]]; then
  x=$(mktemp -d)
  tar -C "$x" -xJf "$root/.gpu/pack.tar.xz"
  src=$(sed -n 1p "$x/paths") build=$(sed -n 2p "$x/paths")
  # The ctest files and run paths name the packing machine's paths: make them reach this checkout.
  if [[ ! -e $src ]]; then mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; fi
  [[ $(cd "$src" && pwd -P) == $(cd "$root" && pwd -P) ]] ||
    { echo "gpu-check: $src exists here and is not this checkout" >&2; exit 1; }
  mkdir -p "$build" && cp -a "$x/build/." "$build/"
  # The Python the CLI tests were configured with, where this machine has another.
  py=$(sed -n 's/^_*Python3_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt" | head -1)
  if [[ -n $py && ! -x $py ]]; then mkdir -p "$(dirname "$py")" && ln -sf "$(command -v python3)" "$py"; fi
  mkdir -p "$x/use"
  for f in "$x"/deps/*; do  # only what this machine lacks
    ldconfig -p | grep -q " $(basename "$f") " || cp "$f" "$x/use/"
  done
  cublas=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.1[0-9]*' 2>/dev/null | head -1)
  nccl=$(find /usr/local /opt /usr/lib -name 'libnccl.so.2*' 2>/dev/null | head -1)
  export LD_LIBRARY_PATH=$x/use${cublas:+:$(dirname "$cublas")}${nccl:+:$(dirname "$nccl")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  [[ -x $x/debug/eu-stack ]] && stack=$x/debug/eu-stack
  step "unpacked $build; cuBLAS ${cublas:-not found}, NCCL ${nccl:-not found}"
  missing=$(ldd "$build/tools/zerort" | grep "not found")
  [[ -z $missing ]] || { echo "gpu-check: zerort cannot load: $missing" >&2; exit 1; }
else
  build=${1:-$root/build-gpu}
  if [[ ! -f "$build/CMakeCache.txt" ]]; then
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZR_ENABLE_CUDA=ON \
      >"$logs/configure.log" 2>&1 || { tail -50 "$logs/configure.log"; exit 1; }
  fi
  cmake --build "$build" -j"$(nproc)" >"$logs/build.log" 2>&1 || { tail -80 "$logs/build.log"; exit 1; }
  step "built $build"
fi
nvidia-smi >"$logs/nvidia-smi.txt" 2>&1 || true
zr="$build/tools/zerort"
# Whether this build has cuDNN's attention (CMake's ZR_CUDNN_FRONTEND; model.attention_backend
# cudnn): the bench and peers sections then time it beside zerort's flash kernels.
cudnn_attention=$("$zr" env --json 2>/dev/null | python3 -c \
  'import json,sys; print(int(json.load(sys.stdin)["build"].get("cudnn_attention", False)))' 2>/dev/null || echo 0)
"$zr" env >"$logs/env.txt" 2>&1; grep -E '^(build|CUDA|device|NCCL|MPI):' "$logs/env.txt"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
want() { [[ -z ${GPU_CHECK_ONLY:-} || " $GPU_CHECK_ONLY " == *" $1 "* ]]; }
# GPU_CHECK_SET=auto in a call without the bench section takes what an earlier call's bench
# section chose on this machine (flash-tiles-chosen.txt in the logs), so that the checks can be
# split over two calls (docs/gpu.md, "Running the GPU checks"); else the default block shapes.
if [[ ${GPU_CHECK_SET:-} == auto ]] && ! want bench; then
  if [[ -f $logs/flash-tiles-chosen.txt ]]; then
    while read -r kv; do [[ -n $kv ]] && sets+=(--set "$kv"); done <"$logs/flash-tiles-chosen.txt"
    step "GPU_CHECK_SET=auto: an earlier call's choice: ${sets[*]:-the default block shapes}"
  else
    step "GPU_CHECK_SET=auto without the bench section: the default block shapes"
  fi
fi
rc=0
if want tests; then
  # A hung test must not eat a lent machine's minutes: ctest's own limit is each test's 300 s.
  timeout 240 ctest --test-dir "$build" -L gpu -V --output-junit "$logs/gpu-junit.xml" \
    >"$logs/ctest-gpu.log" 2>&1 || rc=1
  ctest --test-dir "$build" -R '^mpi_communicator_test_np2$' --output-on-failure \
    --output-junit "$logs/mpi-junit.xml" >"$logs/ctest-mpi.log" 2>&1 || rc=1
  step "tests done"
  printf '%-70s %-8s %s\n' test result seconds
  python3 - "$logs/gpu-junit.xml" "$logs/mpi-junit.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
for path in sys.argv[1:]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"{path}: {e}")
        continue
    for case in root.iter("testcase"):
        status = case.get("status", "run")
        result = "FAIL" if case.find("failure") is not None else (
            "SKIP" if status == "notrun" or case.find("skipped") is not None else "PASS")
        print(f"{case.get('name')[:70]:<70} {result:<8} {float(case.get('time', 0)):.2f}")
PY
  grep -h -E '^[a-z0-9-]+ +max relative loss difference' "$logs/ctest-gpu.log"

  save_logs
fi
if want memcheck; then
  # compute-sanitizer's memcheck: out-of-bounds and misaligned accesses, leaks of device memory.
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [[ -n $sanitizer ]]; then
    for t in model_kernels_cuda_test kernel_fast_paths_cuda_test llama_kernels_cuda_test \
      flash_attention_cuda_test shard_manager_cuda_test; do
      timeout 300 "$sanitizer" --tool memcheck --error-exitcode 3 "$build/tests/$t" \
        >"$logs/memcheck-$t.log" 2>&1 || rc=1
      step "memcheck $t: $(grep -h 'ERROR SUMMARY' "$logs/memcheck-$t.log")"
    done
  fi

  save_logs
fi
if want train; then
  # Measurements (not tests): each prints one JSON object or table, kept in $logs.
  guard 150 train-gpt2 "$zr" train "$root/configs/gpt2-124m-bf16-zero3.json" --overwrite "${sets[@]}" --set train.steps=12 \
    --set train.eval_interval=12 --set checkpoint.dir=/tmp/gpu-check-ckpt \
    --set logging.metrics_file="$logs/metrics-device.jsonl" >"$logs/train-gpt2.log" 2>&1 || rc=1
  grep -E '^step +(1|12)/' "$logs/train-gpt2.log"
  # The offload runs time steps: no text sample, one evaluation window (the run above does both).
  quick=(--set train.sample_tokens=0 --set train.eval_windows=1)
  # The same with the optimizer on the host (ZeRO-Offload): master weights, moments and the AdamW
  # step in host memory, gradients copied down and parameters up every step.
  guard 150 train-gpt2-offload "$zr" train "$root/configs/gpt2-124m-bf16-zero3.json" --overwrite "${sets[@]}" --set train.steps=6 \
    --set train.eval_interval=6 --set checkpoint.dir=/tmp/gpu-check-ckpt-offload \
    --set zero_optimization.offload_optimizer.device=cpu "${quick[@]}" \
    --set logging.metrics_file="$logs/metrics-offload.jsonl" \
    --set logging.trace_file="$logs/trace-offload.json" \
    >"$logs/train-gpt2-offload.log" 2>&1 || rc=1
  grep -E '^step +(1|6)/' "$logs/train-gpt2-offload.log"
  # The same with the host step ending before the next forward ([Note: the host step behind the
  # forward] off): what its overlap gains, in the same run (issue 48: the host step within 1.3x
  # of the device step).
  guard 150 train-gpt2-offload-serial "$zr" train "$root/configs/gpt2-124m-bf16-zero3.json" --overwrite "${sets[@]}" --set train.steps=6 \
    --set train.eval_interval=6 --set checkpoint.dir=/tmp/gpu-check-ckpt-offload-serial \
    --set zero_optimization.offload_optimizer.device=cpu "${quick[@]}" --set train.overlap_host_step=false \
    --set logging.metrics_file="$logs/metrics-offload-serial.jsonl" \
    --set logging.trace_file="$logs/trace-offload-serial.json" \
    >"$logs/train-gpt2-offload-serial.log" 2>&1 || rc=1
  grep -E '^step +6/' "$logs/train-gpt2-offload-serial.log"
  # Each unit's host update on the step worker (overlapped) against the serial step's, from the
  # two traces' "optimizer <unit>" spans (the thirteenth run: 0.19 s a step against 0.04).
  python3 "$root/tools/host_step_spans.py" "$logs/trace-offload.json" "$logs/trace-offload-serial.json" |
    tee "$logs/host-step-spans.txt"
  # The same with the host tier pinned (offload_optimizer.pin_memory, false by default as in
  # DeepSpeed): the step's copies are through pinned staging either way.
  guard 150 train-gpt2-offload-pinned "$zr" train "$root/configs/gpt2-124m-bf16-zero3.json" --overwrite "${sets[@]}" --set train.steps=6 \
    --set train.eval_interval=6 --set checkpoint.dir=/tmp/gpu-check-ckpt-offload-pinned \
    --set zero_optimization.offload_optimizer.device=cpu "${quick[@]}" \
    --set zero_optimization.offload_optimizer.pin_memory=true \
    --set logging.metrics_file="$logs/metrics-offload-pinned.jsonl" \
    >"$logs/train-gpt2-offload-pinned.log" 2>&1 || rc=1
  grep -E '^step +6/' "$logs/train-gpt2-offload-pinned.log"
  # Half the units' optimizer state on the host (offload_optimizer.ratio, DeepSpeed's Twin-Flow:
  # the last units there): the host's bytes a step halve ([Note: partial optimizer offload]).
  guard 150 train-gpt2-offload-half "$zr" train "$root/configs/gpt2-124m-bf16-zero3.json" --overwrite "${sets[@]}" --set train.steps=6 \
    --set train.eval_interval=6 --set checkpoint.dir=/tmp/gpu-check-ckpt-offload-half \
    --set zero_optimization.offload_optimizer.device=cpu "${quick[@]}" \
    --set zero_optimization.offload_optimizer.ratio=0.5 \
    --set logging.metrics_file="$logs/metrics-offload-half.jsonl" \
    >"$logs/train-gpt2-offload-half.log" 2>&1 || rc=1
  grep -E '^step +6/' "$logs/train-gpt2-offload-half.log"
  # The micro-batches' gradients summed on the device, each unit's sum copied to the host once a
  # step (train.device_grad_sums: [Note: gradient sums on the device]).
  guard 150 train-gpt2-offload-sums "$zr" train "$root/configs/gpt2-124m-bf16-zero3.json" --overwrite "${sets[@]}" --set train.steps=6 \
    --set train.eval_interval=6 --set checkpoint.dir=/tmp/gpu-check-ckpt-offload-sums \
    --set zero_optimization.offload_optimizer.device=cpu "${quick[@]}" \
    --set train.device_grad_sums=true \
    --set logging.metrics_file="$logs/metrics-offload-sums.jsonl" \
    >"$logs/train-gpt2-offload-sums.log" 2>&1 || rc=1
  grep -E '^step +6/' "$logs/train-gpt2-offload-sums.log"
  # The device step and the host-optimizer step again at 16 micro-batches a step (131,072 tokens):
  # the host's bytes a step grow with the parameters and the micro-batches, the device's time with
  # the tokens (docs/gpu.md, "The host step's bytes"), so the ratio is measured at both.
  for where in device cpu cpu-sums; do
    off=()
    [[ $where == cpu* ]] && off=(--set zero_optimization.offload_optimizer.device=cpu)
    [[ $where == cpu-sums ]] && off+=(--set train.device_grad_sums=true)
    guard 150 "train-gpt2-ga16-$where" "$zr" train "$root/configs/gpt2-124m-bf16-zero3.json" --overwrite "${sets[@]}" \
      --set train.steps=5 --set train.eval_interval=5 --set gradient_accumulation_steps=16 "${off[@]}" "${quick[@]}" \
      --set checkpoint.dir="/tmp/gpu-check-ckpt-ga16-$where" \
      --set logging.metrics_file="$logs/metrics-ga16-$where.jsonl" \
      >"$logs/train-gpt2-ga16-$where.log" 2>&1 || rc=1
    grep -E '^step +5/' "$logs/train-gpt2-ga16-$where.log"
  done
  # Each host-optimizer run's step against the device run's at the same micro-batches (issue 48:
  # within 1.3x), and where the difference went (docs/gpu.md, "The host step's bytes").
  # A run that failed has no metrics: the others are compared without it.
  offload_steps() {  # DEVICE_METRICS RUN_METRICS...
    local f runs=()
    [[ -f $1 ]] || { echo "offload_steps: no device run ($1)"; return 0; }
    for f in "${@:2}"; do [[ -f $f ]] && runs+=("$f"); done
    python3 "$root/tools/offload_steps.py" "$1" "${runs[@]}"
  }
  m="$logs/metrics"
  { offload_steps "$m-device.jsonl" "$m-offload.jsonl" "$m-offload-serial.jsonl" \
      "$m-offload-pinned.jsonl" "$m-offload-half.jsonl" "$m-offload-sums.jsonl"
    offload_steps "$m-ga16-device.jsonl" "$m-ga16-cpu.jsonl" "$m-ga16-cpu-sums.jsonl"
  } | tee "$logs/offload-steps.txt" || rc=1
  # Pipeline parallelism over NCCL (pp 2, 1F1B, ZeRO-1; one rank per GPU: NCCL refuses two ranks
  # of a communicator on one device), on machines with two GPUs or more.
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if ((gpus >= 2)); then
    guard 150 train-gpt2-pp2 mpirun -np 2 --bind-to none "$zr" train "$root/configs/gpt2-124m-bf16-zero3.json" --overwrite "${sets[@]}" \
      --set train.steps=6 --set train.eval_interval=6 --set zero_optimization.stage=1 \
      --set parallel.pipeline_parallel_size=2 --set checkpoint.dir=/tmp/gpu-check-ckpt-pp \
      --set logging.metrics_file=/tmp/gpu-check-metrics-pp.jsonl >"$logs/train-gpt2-pp2.log" 2>&1 || rc=1
    grep -E '^step +(1|6)/' "$logs/train-gpt2-pp2.log"
  else
    step "pp 2 run skipped: $gpus GPU here, NCCL needs one per rank"
  fi
  save_logs
fi
if want bench; then
  # zerort's flash attention against the materialised CUDA path (bf16; FlashAttention-2 reaches
  # about 229 TFLOP/s forward on an H100, issue 48's target is 200). First: seconds of the
  # device's time, and the numbers the kernel work is judged by, whatever hangs after them.
  # Each of the kernels' other block shapes too (at head size 128 only the forward's 128-query
  # blocks); tools/flash_tiles_pick.py says which are faster in both head-size-64 shapes
  # (GPU_CHECK_SET=auto: the runs below take them).
  for shape in "--head-size 64 --heads 12 --seq 1024 --batch 8" "--head-size 128 --heads 16 --seq 4096 --batch 1" \
    "--head-size 64 --heads 32 --kv-heads 8 --seq 2048 --batch 2"; do
    # shellcheck disable=SC2086
    guard 60 bench-attention "$zr" bench attention --device cuda $shape --rounds 5 --json >>"$logs/bench-attention.jsonl" \
      2>>"$logs/bench-attention.log" || { rc=1 attention_failed=1; }
  done
  python3 "$root/tools/flash_tiles_pick.py" "$logs/bench-attention.jsonl" | tee "$logs/flash-tiles.txt"
  # Why the flash programs run at the rate they do (in the twelfth run the forward's schedulers
  # issued in about a third of their cycles, by its SASS count over its time): Nsight Compute's
  # launch, occupancy, throughput, scheduler and warp-state sections, with every stall reason's
  # cycles an issued instruction, for the first five flash launches at GPT-2's shape, which bench
  # attention makes in this order as it compares them: the 128-query forwards (two row groups on
  # 4 warps, one on 8), the default forward, the default backward's main program, the 32-query
  # one. Where the machine has ncu;
  # an ncu without --print-details (older than the CUDA 13 one) runs again without it.
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
  if [[ -n $ncu ]]; then
    # The names whole: the materialised path's CausalSoftmaxBackwardKernel runs first, and a
    # plain 'BackwardKernel' would take its launch for one of the five.
    ncu_args=(--kernel-name 'regex:(^|[^A-Za-z])(Forward|Backward)Kernel($|<)' --launch-count 5 --section LaunchStats
      --section Occupancy --section SpeedOfLight --section SchedulerStats --section WarpStateStats
      --section ComputeWorkloadAnalysis --metrics 'regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$')
    ncu_bench=("$zr" bench attention --device cuda --head-size 64 --heads 12 --seq 1024 --batch 8 --rounds 1)
    guard 120 ncu-flash "$ncu" "${ncu_args[@]}" --print-details all "${ncu_bench[@]}" >"$logs/ncu-flash.txt" 2>&1
    ncu_rc=$?
    if ((ncu_rc != 0 && ncu_rc != 124)) && grep -q -- '--print-details' "$logs/ncu-flash.txt"; then
      guard 120 ncu-flash "$ncu" "${ncu_args[@]}" "${ncu_bench[@]}" >"$logs/ncu-flash.txt" 2>&1
      ncu_rc=$?
    fi
    ((ncu_rc == 0)) || rc=1
    grep -E 'Kernel<|Duration|Registers Per Thread|Occupancy|Block Limit|Waves Per SM|Issue|Eligible|Warp Cycles|Throughput|stall' \
      "$logs/ncu-flash.txt" | head -120
    step "ncu of the flash programs: ncu-flash.txt"
  else
    step "ncu of the flash programs skipped: no ncu here"
  fi
  # A shape whose bench failed (a variant's kernel among the suspects) leaves the choice to fewer
  # shapes than planned: then the defaults.
  if [[ ${GPU_CHECK_SET:-} == auto && -n ${attention_failed:-} ]]; then
    : >"$logs/flash-tiles-chosen.txt"
    step "GPU_CHECK_SET=auto: a bench attention call failed (bench-attention.log), the default block shapes"
  elif [[ ${GPU_CHECK_SET:-} == auto ]]; then
    sets=()
    read -ra picked <<<"$(sed -n 's/^GPU_CHECK_SET=//p' "$logs/flash-tiles.txt")"
    for kv in "${picked[@]}"; do sets+=(--set "$kv"); done
    printf '%s\n' "${picked[@]}" >"$logs/flash-tiles-chosen.txt"  # for a later call's auto
    step "GPU_CHECK_SET=auto: ${sets[*]:-the default block shapes}"
  fi
  guard 90 bench-model-gpt2 "$zr" bench model --config "$root/configs/bench-gpt2.json" "${sets[@]}" --json >"$logs/bench-model-gpt2.json" \
    2>"$logs/bench-model-gpt2.log"
  bench_model=$?
  if ((bench_model == 0)); then cat "$logs/bench-model-gpt2.json"; else rc=1; fi
  # Where the step's time goes (issue 48's timeline), GPT-2 124M at micro-batch 8 x 1024: each
  # kernel call of one micro-batch timed with CUDA events, by kind and GEMM shape, the gaps between
  # calls, and the launch census; with the materialised attention (the "before"), zerort's flash
  # kernels, and cuDNN's where the build has it.
  # (Skipped when the plain run above hung: the same program would hang twice more.)
  ((bench_model == 124)) && step "timelines skipped: bench model hung"
  backends=(materialised flash)
  ((cudnn_attention)) && backends+=(cudnn)
  for backend in "${backends[@]}"; do
    ((bench_model == 124)) && break
    # (model.flash_attention's keys are refused with the materialised program: not passed to it.)
    [[ $backend == flash ]] && tsets=("${sets[@]}") || tsets=()
    guard 90 "timeline-$backend" "$zr" bench model --config "$root/configs/gpt2-124m-bf16-zero3.json" --census --timeline \
      "${tsets[@]}" --set "model.attention_backend=$backend" >"$logs/bench-model-gpt2-timeline-$backend.txt" 2>&1 ||
      rc=1
    echo "== attention_backend $backend"; cat "$logs/bench-model-gpt2-timeline-$backend.txt"
  done
  guard 60 bench-adamw "$zr" bench adamw --json >"$logs/bench-adamw.json" 2>"$logs/bench-adamw.log" &&
    cat "$logs/bench-adamw.json"
  # Could a device lane take part of the host step's update (docs/gpu.md "A device lane for the
  # host step?"): the update split between the CPU and pinned copies through the GPU.
  guard 60 bench-adamw-lane "$zr" bench adamw --lane >"$logs/bench-adamw-lane.txt" 2>&1
  cat "$logs/bench-adamw-lane.txt"
  guard 120 estimate-measure "$zr" estimate "$root/configs/gpt2-124m-bf16-zero3.json" --device cuda --measure \
    >"$logs/estimate-measure.txt" 2>&1; grep -E 'TOTAL|RESERVED' "$logs/estimate-measure.txt"
  save_logs
fi
if want peers; then
  # zerort against llm.c in this run (issue 48): GPT-2 124M from random weights, 8 x 1024 x 4
  # tokens a step, one token file in llm.c's format, tokens/s and MFU by one count
  # (tools/peers/llmc_side_by_side.py). llm.c comes built in the pack (tools/gpu-pack.sh --llmc
  # DIR), or is built here from LLMC=DIR (llm.c's folder) where this machine has nvcc.
  llmc_bins=()
  if [[ -n ${x:-} && -x $x/peers/train_gpt2cu ]]; then
    llmc_bins=("$x/peers/train_gpt2cu:no-cudnn")
    if [[ -x $x/peers/train_gpt2cu-cudnn ]]; then
      if missing=$(ldd "$x/peers/train_gpt2cu-cudnn" | grep "not found"); then
        step "llm.c with cuDNN skipped, it cannot load here: $(echo "$missing" | awk '{print $1}' | xargs)"
      else
        llmc_bins+=("$x/peers/train_gpt2cu-cudnn:cudnn")
      fi
    fi
  elif [[ -n ${LLMC:-} ]] && command -v nvcc >/dev/null; then
    rm -rf /tmp/gpu-check-llmc && cp -r "$LLMC" /tmp/gpu-check-llmc && chmod -R u+w /tmp/gpu-check-llmc
    make -C /tmp/gpu-check-llmc train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 NO_NVML=1 \
      GPU_COMPUTE_CAPABILITY=90 PRECISION=BF16 >"$logs/llmc-build.log" 2>&1 &&
      llmc_bins=("/tmp/gpu-check-llmc/train_gpt2cu:no-cudnn")
  fi
  if ((${#llmc_bins[@]})); then
    args=(--zerort "$zr" --config "$root/configs/gpt2-124m-bf16-zero3.json" --work /tmp/gpu-check-sbs "${sets[@]}")
    for b in "${llmc_bins[@]}"; do args+=(--llmc "$b"); done
    guard 300 side-by-side python3 "$root/tools/peers/llmc_side_by_side.py" "${args[@]}" --json "$logs/side-by-side.json" \
      >"$logs/side-by-side.txt" 2>&1 || rc=1
    cp /tmp/gpu-check-sbs/*.log "$logs/" 2>/dev/null
    # The same zerort run at ZeRO-0: ZeRO-3's gathers and frees should cost nothing at one rank.
    guard 150 side-by-side-zero0 python3 "$root/tools/peers/llmc_side_by_side.py" --zerort "$zr" --work /tmp/gpu-check-sbs0 \
      --config "$root/configs/gpt2-124m-bf16-zero3.json" "${sets[@]}" --set zero_optimization.stage=0 \
      --json "$logs/side-by-side-zero0.json" >"$logs/side-by-side-zero0.txt" 2>&1 || rc=1
    tail -4 "$logs/side-by-side.txt"; tail -1 "$logs/side-by-side-zero0.txt"
    # With cuDNN's attention, where the build has it (model.flash_attention's keys, zerort's
    # kernels' block shapes, are refused with it: not passed).
    if ((cudnn_attention)); then
      guard 150 side-by-side-cudnn python3 "$root/tools/peers/llmc_side_by_side.py" --zerort "$zr" --work /tmp/gpu-check-sbs-cudnn \
        --config "$root/configs/gpt2-124m-bf16-zero3.json" --set model.attention_backend=cudnn \
        --json "$logs/side-by-side-cudnn.json" >"$logs/side-by-side-cudnn.txt" 2>&1 || rc=1
      tail -1 "$logs/side-by-side-cudnn.txt"
    fi
  else
    step "side-by-side skipped: no llm.c (tools/gpu-pack.sh --llmc DIR, or LLMC=DIR with nvcc)"
  fi
  save_logs
fi
if want llama; then
  # A LLaMA-3.2-1B-shaped model (16 layers, d 2048, 32 query heads on 8 key/value heads, head size
  # 64: the flash kernels) at ZeRO-3, 4 x 2048 x 4 tokens a step: issue 48's 45% MFU target.
  guard 180 train-llama-1b "$zr" train "$root/configs/llama-1b-bf16-zero3.json" --overwrite "${sets[@]}" --set train.steps=8 \
    --set train.eval_interval=8 --set train.eval_windows=1 --set steps_per_print=1 \
    --set logging.metrics_file=/tmp/gpu-check-metrics-llama.jsonl >"$logs/train-llama-1b.log" 2>&1 ||
    rc=1
  grep -E '^step +[0-9]+/' "$logs/train-llama-1b.log" | tail -3
  if ((cudnn_attention)); then  # the same with cuDNN's attention (6 steps)
    guard 150 train-llama-1b-cudnn "$zr" train "$root/configs/llama-1b-bf16-zero3.json" --overwrite --set train.steps=6 \
      --set model.attention_backend=cudnn --set train.eval_interval=6 --set train.eval_windows=1 --set steps_per_print=1 \
      --set logging.metrics_file=/tmp/gpu-check-metrics-llama-cudnn.jsonl >"$logs/train-llama-1b-cudnn.log" 2>&1 || rc=1
    grep -E '^step +[0-9]+/' "$logs/train-llama-1b-cudnn.log" | tail -2
  fi
  save_logs
fi
step "done, exit $rc"
exit "$rc"
