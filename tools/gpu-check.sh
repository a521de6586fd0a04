#!/usr/bin/env bash
# Builds zerort for the GPU (or reuses a build passed as $1), runs every gpu-labelled test and the
# mpi-labelled ones (MPI with CUDA buffers staged through pinned memory runs there), and prints
# a summary table; then the GPU measurements the docs want: bench model (GPT-2 124M, bf16, MFU),
# bench adamw and estimate --measure, as JSON in $OUT. Logs go to $OUT when set (the device tool
# returns that folder).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
logs=${OUT:-$build/gpu-check-logs}
mkdir -p "$logs"

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZR_ENABLE_CUDA=ON \
    >"$logs/configure.log" 2>&1 || { tail -50 "$logs/configure.log"; exit 1; }
fi
cmake --build "$build" -j"$(nproc)" >"$logs/build.log" 2>&1 || { tail -80 "$logs/build.log"; exit 1; }
nvidia-smi >"$logs/nvidia-smi.txt" 2>&1 || true
"$build/tools/zerort" env >"$logs/env.txt" 2>&1; cat "$logs/env.txt"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "$build" -L 'gpu|mpi' --output-on-failure --output-junit "$logs/gpu-junit.xml" \
  >"$logs/ctest-gpu.log" 2>&1
rc=$?
echo
printf '%-70s %-8s %s\n' test result seconds
python3 - "$logs/gpu-junit.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
for case in root.iter("testcase"):
    status = case.get("status", "run")
    result = "FAIL" if case.find("failure") is not None else ("SKIP" if status == "notrun" or case.find("skipped") is not None else "PASS")
    print(f"{case.get('name')[:70]:<70} {result:<8} {float(case.get('time', 0)):.2f}")
PY
tail -3 "$logs/ctest-gpu.log"

# Measurements (not tests): each prints one JSON object, kept in $logs.
zr="$build/tools/zerort"
"$zr" bench model --config "$root/configs/bench-gpt2.json" --json >"$logs/bench-model-gpt2.json" \
  2>"$logs/bench-model-gpt2.log" && cat "$logs/bench-model-gpt2.json"
"$zr" bench adamw --json >"$logs/bench-adamw.json" 2>"$logs/bench-adamw.log" &&
  cat "$logs/bench-adamw.json"
"$zr" estimate "$root/configs/gpt2-124m-bf16-zero3.json" --device cuda --measure \
  >"$logs/estimate-measure.txt" 2>&1; cat "$logs/estimate-measure.txt"
exit $rc
