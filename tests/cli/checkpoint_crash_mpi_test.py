#!/usr/bin/env python3
"""A two-rank checkpoint save with one rank killed at its system calls in turn (strace's fault
injection under mpirun, the other rank untraced): rank 1 at each file it writes (its open, first
write, fsync, close) and just after its part, rank 0 at each call that changes a name on disk
(the step's directory, the marker, the renames of the step and of `latest`, the rotation's
removals). mpirun then ends the job (the survivor, waiting in a collective or past it, gets
SIGTERM then SIGKILL). After each kill: `latest` still names a whole checkpoint, a two-rank
`--resume` finishes, and its saves leave what a run never killed leaves. checkpoint_crash_test.py
kills a one-rank save at every call; this one adds what only two ranks have: a rank that dies
while the other writes or commits ([Note: a kill at any instant] in
checkpoint/checkpoint_save.cc).
Skipped (exit 77) where strace is missing or the machine forbids tracing.
Usage: checkpoint_crash_mpi_test.py PATH_TO_ZERORT MPIEXEC"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, merged, tiny_run, write_json  # noqa: E402
from strace_calls import CALLS, calls_of, kill_at, numbered, usable_strace  # noqa: E402

zerort, mpiexec = sys.argv[1], sys.argv[2]
checks = Checks("checkpoint_crash_mpi_test")
check = checks.check
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", GOMP_SPINCOUNT="1000")

strace = usable_strace()
if strace is None:
    print("checkpoint_crash_mpi_test: SKIPPED: strace is missing or cannot trace here")
    sys.exit(77)

ckpt = os.path.join(tmp, "ckpt")  # the run's directory: always this path, copied from `base`
base = os.path.join(tmp, "base")


def config(steps):
    c = merged(tiny_run(steps), {
        "model": {"n_layer": 1, "seq_len": 16},
        "train": {"eval_windows": 1, "device": "cpu"},
        "zero_optimization": {"stage": 3},
        "checkpoint": {"dir": ckpt, "interval": 1, "keep_last_n": 1},
        "logging": {"metrics_file": os.path.join(ckpt, "metrics.jsonl")},
    })
    return write_json(tmp, f"steps{steps}.json", c)


def train(cfg, *args, traced=None, wrap=()):
    """Two ranks (MPMD), `wrap` before rank `traced`'s zerort; the result and its seconds."""
    cmd = [mpiexec]
    for rank in (0, 1):
        if rank:
            cmd.append(":")
        cmd += ["-np", "1", "--oversubscribe", *(wrap if rank == traced else ()), zerort, "train",
                cfg, *args]
    start = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    return r, time.time() - start


def fresh():
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.copytree(base, ckpt, symlinks=True)


# Two steps saved (step_2 kept), then the run under test: one more step, its save and the
# rotation of step_2; the resumed run takes it to step 4.
r, _ = train(config(2), "--overwrite")
if not check("the first run trains 2 steps on 2 ranks", r.returncode == 0, r.stderr[-800:]):
    checks.finish()
shutil.move(ckpt, base)
killed_cfg, resume_cfg = config(3), config(4)

fresh()
r, _ = train(resume_cfg, "--resume")
check("a run never killed finishes", r.returncode == 0, r.stderr[-800:])
expected = sorted(os.listdir(ckpt))
check("... and holds step_4 alone", [n for n in expected if n.startswith("step_")] == ["step_4"],
      str(expected))


def kill_points(rank):
    """Rank `rank`'s calls to kill at, from a traced run of the save under test."""
    fresh()
    log = os.path.join(tmp, f"ref{rank}.strace")
    r, _ = train(killed_cfg, "--resume", traced=rank,
                 wrap=[strace, "-f", "-o", log, "-e", "trace=" + ",".join(CALLS)])
    check(f"rank {rank} traced: the run under test exits 0", r.returncode == 0, r.stderr[-800:])
    calls = numbered(calls_of(log))
    mine = [i for i, (_, _, args) in enumerate(calls)
            if "step_3" in args or "step_2" in args or "latest" in args]
    first = next((i for i in mine if "step_3.tmp" in calls[i][2]), None)
    check(f"rank {rank} traced: saves through step_3.tmp", first is not None, f"{len(calls)} calls")
    if first is None:
        return []
    points = []
    if rank == 1:  # each file it writes (to the last one's close), and the call after its part
        end = next((i for i in range(mine[-1], len(calls)) if calls[i][0] == "close"), mine[-1])
        for i in range(first, min(end + 2, len(calls))):
            name, _, _ = calls[i]
            if name != "write" or calls[i - 1][0] == "openat":
                points.append(calls[i])
    else:  # each change of a name on disk
        points = [calls[i] for i in mine if i >= first and
                  calls[i][0] in ("mkdir", "mkdirat", "rename", "renameat", "renameat2", "unlink",
                                  "unlinkat", "rmdir")]
    return points


total, missed = 0, []  # kill points whose call came fewer times than in the reference run
for rank, least in ((1, 12), (0, 8)):
    points = kill_points(rank)
    check(f"rank {rank}: at least {least} kill points", len(points) >= least, str(len(points)))
    total += len(points)
    for name, nth, args in points:
        what = f"rank {rank} killed at {name} #{nth} ({args[:80]})"
        fresh()
        log = os.path.join(tmp, "killed.strace")
        r, seconds = train(killed_cfg, "--resume", traced=rank, wrap=kill_at(strace, log, name, nth))
        if r.returncode == 0:  # the main thread made that call fewer times this run (MPI's own
            missed.append(what)  # writes and closes may vary): nothing was killed
            continue
        check(f"{what}: the job ends, naming the rank", r.returncode != 0 and
              f"process rank {rank}" in r.stderr and seconds < 60,
              f"rc={r.returncode} {seconds:.1f} s {r.stderr[-400:]}")
        i = subprocess.run([zerort, "checkpoint", "inspect", ckpt], capture_output=True, text=True,
                           env=env, timeout=60)
        check(f"{what}: latest is whole", i.returncode == 0 and "all ok" in i.stdout,
              i.stdout[-400:] + i.stderr[-400:])
        r, _ = train(resume_cfg, "--resume")
        check(f"{what}: --resume on 2 ranks finishes", r.returncode == 0, r.stderr[-800:])
        left = sorted(os.listdir(ckpt))
        check(f"{what}: nothing left behind", left == expected, f"{left} != {expected}")
        with open(os.path.join(ckpt, "latest")) as f:
            check(f"{what}: latest names step_4", f.read() == "step_4\n")

# The kills land: a run's calls before its save are the same but for MPI's own, so at most a few
# points may be missed.
check("at most a tenth of the kill points missed", len(missed) <= max(2, total // 10),
      "; ".join(missed))
print(f"checkpoint_crash_mpi_test: {total} kill points, {len(missed)} missed:", "; ".join(missed))
shutil.rmtree(tmp, ignore_errors=True)
checks.finish()
