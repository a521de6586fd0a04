#!/usr/bin/env python3
"""A checkpoint save killed at each of its system calls in turn. `strace` injects SIGKILL at the
N-th call of one file system call, for every call the run makes from its save's first touch of
the checkpoint directory to its exit (mkdir, openat, write, fsync, rename, unlink, rmdir, close:
the save's step_<N>.tmp, its shards, metadata, marker, renames, `latest` and the rotation of the
previous step). After each kill: `latest` still names a whole checkpoint (`checkpoint inspect`
says all ok), `--resume` finishes the run, and its saves clear whatever the killed one left, so
the directory holds what a run never killed holds. checkpoint_cli_test.py kills at moments a
clock picks; this one at every instant a save has. [Note: a kill at any instant] in
checkpoint/checkpoint_save.cc.
Skipped (exit 77) where strace is missing or the machine forbids tracing.
Usage: checkpoint_crash_test.py PATH_TO_ZERORT"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, merged, tiny_run, write_json  # noqa: E402
from strace_calls import CALLS, calls_of, kill_at, numbered, usable_strace  # noqa: E402

zerort = sys.argv[1]
checks = Checks("checkpoint_crash_test")
check = checks.check
tmp = tempfile.mkdtemp()
# GOMP_SPINCOUNT set: zerort does not re-execute itself (kernels/openmp_waits.h), one image.
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", GOMP_SPINCOUNT="1000")

strace = usable_strace()
if strace is None:
    print("checkpoint_crash_test: SKIPPED: strace is missing or cannot trace here")
    sys.exit(77)

ckpt = os.path.join(tmp, "ckpt")  # the run's directory: always this path, copied from `base`
base = os.path.join(tmp, "base")


def config(steps):
    c = merged(tiny_run(steps), {
        "model": {"n_layer": 1, "seq_len": 16},
        "train": {"eval_windows": 1, "device": "cpu"},
        "checkpoint": {"dir": ckpt, "interval": 1, "keep_last_n": 1},
        "logging": {"metrics_file": os.path.join(ckpt, "metrics.jsonl")},
    })
    return write_json(tmp, f"steps{steps}.json", c)


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True, env=env, timeout=120)


def fresh():
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.copytree(base, ckpt, symlinks=True)


# Two steps saved (step_2 kept), then the run under test: one more step, its save and the
# rotation of step_2; the resumed run takes it to step 4.
r = run(zerort, "train", config(2), "--overwrite")
check("the first run trains 2 steps", r.returncode == 0, r.stderr[-800:])
shutil.move(ckpt, base)
killed_cfg, resume_cfg = config(3), config(4)

fresh()
ref_log = os.path.join(tmp, "ref.strace")
r = run(strace, "-f", "-o", ref_log, "-e", "trace=" + ",".join(CALLS), zerort, "train",
        killed_cfg, "--resume")
check("the run under test, traced, exits 0", r.returncode == 0, r.stderr[-800:])
r = run(zerort, "train", resume_cfg, "--resume")
check("a run never killed finishes", r.returncode == 0, r.stderr[-800:])
expected = sorted(os.listdir(ckpt))
check("... and holds step_4 alone", [n for n in expected if n.startswith("step_")] == ["step_4"],
      str(expected))

reference = calls_of(ref_log)
first = next((i for i, (_, args) in enumerate(reference) if "step_3.tmp" in args), None)
check("the traced run saves step_3 through step_3.tmp", first is not None, f"{len(reference)} calls")
# (call, its number among the main thread's calls of that name, its arguments)
points = numbered(reference)[first:] if first is not None else []
check("at least 40 kill points", len(points) >= 40, str(len(points)))

elsewhere = []  # the kills that landed on another call than the reference's
for name, nth, args in points:
    what = f"kill at {name} #{nth} ({args[:90]})"
    fresh()
    log = os.path.join(tmp, "killed.strace")  # (--seccomp-bpf would be faster, but injects none)
    r = run(*kill_at(strace, log, name, nth), zerort, "train", killed_cfg, "--resume")
    if not check(f"{what}: killed", r.returncode == -signal.SIGKILL,
                 f"rc={r.returncode} {r.stderr[-300:]}"):
        continue
    last = calls_of(log)[-1:] or [("", "")]
    if last[0] != (name, args):
        elsewhere.append(f"{name} #{nth}: {last[0][1][:60]} for {args[:60]}")
    r = run(zerort, "checkpoint", "inspect", ckpt)
    check(f"{what}: latest is whole", r.returncode == 0 and "all ok" in r.stdout,
          r.stdout[-400:] + r.stderr[-400:])
    r = run(zerort, "train", resume_cfg, "--resume")
    check(f"{what}: --resume finishes", r.returncode == 0, r.stderr[-800:])
    left = sorted(os.listdir(ckpt))
    check(f"{what}: nothing left behind", left == expected, f"{left} != {expected}")
    with open(os.path.join(ckpt, "latest")) as f:
        check(f"{what}: latest names step_4", f.read() == "step_4\n")

# The kills land where the reference run made the same call (a log line's numbers may differ).
check("most kills land on the reference's call", len(elsewhere) <= 0.1 * len(points),
      "; ".join(elsewhere))
print(f"checkpoint_crash_test: {len(points)} kill points, {len(elsewhere)} elsewhere:",
      "; ".join(elsewhere))
shutil.rmtree(tmp, ignore_errors=True)
checks.finish()
