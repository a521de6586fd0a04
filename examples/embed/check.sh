#!/bin/sh
# make test-install's checks of examples/embed against the installed package:
#   check.sh EMBED_MLP ZERORT SCRATCH MPIRUN...
# the manual-scope trainer (4 loopback ranks; 2 MPI ranks; NVMe, leaving nothing behind); the
# layer driver equal to it bitwise at 1 and 2 ranks, with and without NVMe; the driver's
# checkpoints resumed bitwise, read by `zerort checkpoint inspect`, and loaded at another world
# size; and each misuse failing with a message that names the unit.
# shellcheck disable=SC2086  # $mpirun (the launcher and its options) and $flag split on purpose
set -eu
embed=$1 zerort=$2 scratch=$3
shift 3
mpirun="$*"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
rm -rf "$scratch" && mkdir -p "$scratch"
passed=0
ok() { passed=$((passed + 1)); echo "embed check: $1"; }
final() { grep '^final loss' "$1"; }
same() {  # same FILE FILE WHAT: the exact final loss and gradient norm
  if [ "$(final "$1")" != "$(final "$2")" ]; then
    echo "embed check FAILED: $3: $(final "$1") vs $(final "$2")" >&2
    exit 1
  fi
  ok "$3: $(final "$1")"
}

"$embed" > "$scratch/manual4.txt" && ok "manual scopes, 4 loopback ranks"
"$embed" --ranks 1 > "$scratch/manual1.txt"
"$embed" --driver > "$scratch/driver1.txt"
same "$scratch/manual1.txt" "$scratch/driver1.txt" "layer driver = manual scopes, 1 rank"
$mpirun -np 2 "$embed" > "$scratch/manual2.txt"
$mpirun -np 2 "$embed" --driver > "$scratch/driver2.txt"
same "$scratch/manual2.txt" "$scratch/driver2.txt" "layer driver = manual scopes, 2 ranks"
for who in manual driver; do
  flag=
  if [ "$who" = driver ]; then flag=--driver; fi
  mkdir -p "$scratch/nvme-$who"
  $mpirun -np 2 "$embed" $flag --nvme "$scratch/nvme-$who" > "$scratch/nvme-$who.txt"
  test -z "$(ls -A "$scratch/nvme-$who")"
done
same "$scratch/nvme-manual.txt" "$scratch/nvme-driver.txt" "layer driver = manual scopes, 2 ranks, NVMe"
same "$scratch/nvme-driver.txt" "$scratch/driver2.txt" "NVMe placement = in memory, 2 ranks"

# Checkpoints: 80 steps, then resumed to 150, equal to 150 straight; then at one process.
$mpirun -np 2 "$embed" --driver --steps 80 --checkpoint "$scratch/ckpt" > /dev/null
$mpirun -np 2 "$embed" --driver --checkpoint "$scratch/ckpt" > "$scratch/resumed.txt"
same "$scratch/driver2.txt" "$scratch/resumed.txt" "checkpoint at step 80 resumed to 150 (2 ranks)"
"$zerort" checkpoint inspect "$scratch/ckpt" > "$scratch/inspect.txt"
grep -q "step 150" "$scratch/inspect.txt"
grep -q "embeds zerort (no model config)" "$scratch/inspect.txt"
grep -q "checksums: all ok" "$scratch/inspect.txt" && ok "zerort checkpoint inspect reads it"
"$embed" --driver --steps 170 --checkpoint "$scratch/ckpt" > "$scratch/one.txt"
grep -q "1 ranks, ZeRO-3; steps 150-170" "$scratch/one.txt" && ok "saved at 2 ranks, resumed at 1"

# Misuse: a clear error naming the unit (exit 1), or the watchdog's report (exit 3).
expect() {  # expect NAME CODE TEXT COMMAND...
  name=$1 code=$2 text=$3
  shift 3
  set +e
  "$@" > "$scratch/$name.txt" 2>&1
  rc=$?
  set -e
  if [ $rc -ne "$code" ] || ! grep -q "$text" "$scratch/$name.txt"; then
    echo "embed check FAILED: $name: exit $rc (want $code), output:" >&2
    tail -20 "$scratch/$name.txt" >&2
    exit 1
  fi
  ok "$name: exit $rc, \"$text\""
}
expect skip-backward 1 "unit 'fc1' had a Forward scope and no Backward scope" \
  "$embed" --ranks 2 --mistake skip-backward
expect rank-shape 1 "unit 'fc0': fc0.weight \[16, 64\].* on rank 1" \
  "$embed" --ranks 2 --mistake rank-shape
expect rank-init 1 "parameter 'fc0.weight' of unit 'fc0' has different initial values" \
  "$embed" --ranks 2 --mistake rank-init
expect rank-skips-backward 3 "TIMED-OUT .*reduce-scatter fc1" \
  $mpirun -np 2 "$embed" --mistake rank-skips-backward --collective-timeout 2
# The rank that skipped names the unit it went on to: its next gather met rank 0's reduction. It
# then waits 5 s for the others (EndAfterError) before ending the job, so rank 0's watchdog, at
# 2 s, reports first.
grep -q "rank 1/2 in group 'world' (mpi), all_gather of 4352 bytes (gather fc0)" \
  "$scratch/rank-skips-backward.txt" || {
  echo "embed check FAILED: rank-skips-backward: rank 1 did not name its unit" >&2
  tail -20 "$scratch/rank-skips-backward.txt" >&2
  exit 1
}
ok "rank-skips-backward: rank 1 names the gather of fc0 it was in"
expect stale-view 134 "a view of unit 'fc0' (Forward scope, data-parallel rank [01]/2) (f32 \[[0-9, ]*\]) was used after its scope's End()" \
  "$embed" --ranks 2 --mistake stale-view
expect late-grad-write 134 "a view of unit 'fc1' (Backward scope, data-parallel rank [01]/2) (f32 \[64\]) was used after its scope's End()" \
  "$embed" --ranks 2 --mistake late-grad-write
expect stale-pointer 1 "step 1: the loss is -*nan (a released buffer read" \
  "$embed" --ranks 2 --mistake stale-pointer
expect fp16-unsaid 1 "Backward() under fp16 dynamic loss scaling: seed the loss's gradient with loss_scale() (now 65536)" \
  "$embed" --driver --fp16 --mistake fp16-unsaid
# fp16 with dynamic loss scaling: the layer driver equal to the manual scopes bitwise, and the
# final loss within 10% of the fp32 run's (fp16's rounding of the weights and activations).
"$embed" --ranks 1 --fp16 > "$scratch/fp16-manual.txt"
"$embed" --driver --fp16 > "$scratch/fp16-driver.txt"
same "$scratch/fp16-manual.txt" "$scratch/fp16-driver.txt" "fp16: layer driver = manual scopes"
python3 - "$scratch/fp16-driver.txt" "$scratch/driver1.txt" <<'PY' && ok "fp16's final loss within 10% of fp32's"
import re, sys
loss = [float(re.search(r"-> ([0-9.]+)", open(f).read()).group(1)) for f in sys.argv[1:]]
print(f"fp16 final loss {loss[0]:.5f}, fp32 {loss[1]:.5f}")
sys.exit(0 if abs(loss[0] - loss[1]) <= 0.1 * loss[1] else 1)
PY
expect default-threshold 0 "every unit stays gathered on every rank" \
  "$embed" --ranks 2 --default-threshold
echo "embed checks: $passed passed"
