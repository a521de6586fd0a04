#!/usr/bin/env python3
"""tools/offload_steps.py, which tools/gpu-check.sh runs on the metrics of the device run and the
host-optimizer runs: on real metrics files of a device run and of a host-optimizer run (the
gradient sums on the device) it prints both, the device's ratio 1, the offload times of the host
run; a file that is not a regular file, not metrics, or of one step exits 2 naming it.
Usage: offload_steps_test.py PATH_TO_ZERORT REPO_ROOT"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, check_refuses, merged, tiny_train, unreadable_paths  # noqa: E402

zerort, root = sys.argv[1], sys.argv[2]
script = os.path.join(root, "tools", "offload_steps.py")
checks = Checks("offload_steps_test")
check = checks.check
tmp = tempfile.mkdtemp()


def metrics(name, extra, steps=3):
    """A run's metrics file; checks that the run succeeded."""
    path = os.path.join(tmp, f"metrics-{name}.jsonl")
    tiny_train(check, zerort, tmp, name, steps, merged({"logging": {"metrics_file": path}}, extra))
    return path


device = metrics("device", {})
host = metrics("host-sums", {"train": {"device_grad_sums": True},
                             "zero_optimization": {"offload_optimizer": {"device": "cpu"}}})
one_step = metrics("one-step", {}, steps=1)

r = subprocess.run([sys.executable, script, device, host], capture_output=True, text=True)
check("both files read", r.returncode == 0, r.stderr[-500:])
lines = r.stdout.splitlines()
check("a header and a row a run", len(lines) == 3 and lines[0].startswith("run"), r.stdout)
if len(lines) == 3:
    d, h = lines[1].split(), lines[2].split()
    check("the device run: 2 steps counted, ratio 1, no offload times",
          d[0] == "device" and d[1] == "2" and d[4] == "1.000" and d[5:] == ["-"] * 4, lines[1])
    # The tiny model's host update can take under 0.05 ms, which prints as 0.0: the check is
    # that the host run's optimizer time was read (a number, not "-"), not that it is large.
    check("the host run: 2 steps counted, a positive time and ratio, its host update read",
          h[0] == "host-sums" and h[1] == "2" and float(h[2]) > 0 and float(h[4]) > 0
          and len(h) == 9 and h[8] != "-" and float(h[8]) >= 0, lines[2])

# Hostile inputs: each exits 2 naming the file and why, at once (a FIFO is not opened).
garbage = os.path.join(tmp, "garbage.jsonl")
with open(garbage, "wb") as f:
    f.write(b"\xff\xfe{not json\n")
not_metrics = os.path.join(tmp, "list.jsonl")
with open(not_metrics, "w") as f:
    f.write('{"step": 1, "step_time_s": 0.1, "tokens_per_s": 10}\n[1, 2]\n')
nan = os.path.join(tmp, "nan.jsonl")
with open(nan, "w") as f:
    f.write('{"step": 1, "step_time_s": NaN, "tokens_per_s": 10}\n')
hostile = [("a one-step run", one_step, "at least 2 are needed"),
           ("bytes that are not text", garbage, "unreadable"),
           ("a line that is not a step's metrics", not_metrics, "line 2"),
           ("a NaN step time", nan, "line 1")]
for what, path, says in unreadable_paths(tmp, ".jsonl") + hostile:
    check_refuses(check, what, [sys.executable, script, device, path], path, says)
r = subprocess.run([sys.executable, script], capture_output=True, text=True)
check("no file: exits 2 with the usage", r.returncode == 2 and "offload_steps.py" in r.stderr,
      r.stderr)

checks.finish()
