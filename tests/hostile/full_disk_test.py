#!/usr/bin/env python3
"""A full disk (a small tmpfs, mounted when this process may; skipped visibly otherwise): a
checkpoint save that runs out of space stops the run with exit 1 naming the file, removes its own
.tmp and leaves the previous checkpoint and `latest` intact; a trace file and an export that run
out of space are exit 1 naming the file with nothing partial left under their names; the metrics
file likewise.
Usage: full_disk_test.py PATH_TO_ZERORT"""
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from harness import Checks  # noqa: E402

zerort = sys.argv[1]
checks = Checks("hostile_full_disk_test")
check = checks.check
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
BASE = {
    "train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "seq_len": 32, "vocab_size": 256},
    "train": {"steps": 3, "eval_windows": 1, "sample_tokens": 0, "device": "cpu"},
}


def write(name, obj):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def mount(size):
    point = tempfile.mkdtemp(dir=tmp)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", point],
                       capture_output=True, text=True)
    return point if r.returncode == 0 else None


probe = mount("64k")
if probe is None:
    print("SKIPPED: full_disk_test needs to mount a tmpfs (not allowed here)")
    sys.exit(0)
subprocess.run(["umount", probe])
mounts = []
try:
    # A checkpoint directory with room for one checkpoint (3 files of 88 KiB) and not two.
    disk = mount("400k")
    mounts.append(disk)
    ckpt = os.path.join(disk, "ckpt")
    cfg = write("save.json", dict(BASE, checkpoint={"dir": ckpt, "interval": 1, "keep_last_n": 0},
                                  logging={"metrics_file": os.path.join(tmp, "save.jsonl")}))
    r = subprocess.run([zerort, "train", cfg], capture_output=True, text=True, env=env,
                       timeout=120)
    check("a save on a full disk: exit 1", r.returncode == 1, f"{r.returncode} {r.stderr[-800:]}")
    check("... names the file and the error", "step_2.tmp" in r.stderr and
          "No space left on device" in r.stderr, r.stderr[-800:])
    left = sorted(os.listdir(ckpt)) if os.path.exists(ckpt) else []
    check("... its .tmp removed, step_1 and latest intact",
          "step_2.tmp" not in left and "step_1" in left and "latest" in left, str(left))
    with open(os.path.join(ckpt, "latest")) as f:
        check("... latest still names step_1", f.read().strip() == "step_1")
    r = subprocess.run([zerort, "checkpoint", "inspect", ckpt], capture_output=True, text=True,
                       timeout=60)
    check("... and step_1 is whole (inspect: checksums all ok)", r.returncode == 0 and
          "checksums: all ok" in r.stdout, r.stdout[-800:] + r.stderr[-400:])

    # A trace file, a metrics file and an export on a disk with no room left.
    full = mount("64k")
    mounts.append(full)
    with open(os.path.join(full, "filler"), "wb") as f:
        try:
            f.write(os.urandom(1 << 20))
        except OSError:
            pass
    for what, logging in [("trace file", {"trace_file": os.path.join(full, "trace.json")}),
                          ("metrics file", {"metrics_file": os.path.join(full, "m.jsonl")})]:
        cfg = write("full.json", dict(BASE, logging=logging))
        r = subprocess.run([zerort, "train", cfg], capture_output=True, text=True, env=env,
                           timeout=120)
        name = list(logging.values())[0]
        check(f"{what} on a full disk: exit 1", r.returncode == 1,
              f"{r.returncode} {r.stderr[-800:]}")
        check(f"{what} on a full disk: names it", os.path.basename(name) in r.stderr and
              "No space left on device" in r.stderr, r.stderr[-800:])
        check(f"{what} on a full disk: nothing partial left",
              not glob.glob(glob.escape(name) + "*.tmp") and
              (not os.path.exists(name) or os.path.getsize(name) == 0), str(os.listdir(full)))
    good = os.path.join(tmp, "good")
    r = subprocess.run([zerort, "train", write("good.json", dict(BASE,
                                                                   checkpoint={"dir": good}))],
                       capture_output=True, text=True, env=env, timeout=120)
    out = os.path.join(full, "hf")
    r = subprocess.run([zerort, "checkpoint", "export", good, out], capture_output=True,
                       text=True, timeout=120)
    check("export on a full disk: exit 1", r.returncode == 1, f"{r.returncode} {r.stderr[-800:]}")
    check("export on a full disk: names the file", "model.safetensors.zerort-" in r.stderr and
          "No space left on device" in r.stderr, r.stderr[-800:])
    check("export on a full disk: nothing partial left",
          not os.path.exists(os.path.join(out, "model.safetensors")) and
          not glob.glob(os.path.join(glob.escape(out), "model.safetensors*")),
          str(os.listdir(out)) if os.path.exists(out) else "")
finally:
    for m in mounts:
        subprocess.run(["umount", m])

sys.exit(checks.finish())
