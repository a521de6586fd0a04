#!/usr/bin/env python3
"""tools/host_step_spans.py, which tools/gpu-check.sh runs on the traces of two host-optimizer runs
(the step behind the next forward, and train.overlap_host_step=false): on real traces of both
(the asynchronous CPU device defers the step as CUDA does) it prints both steps' totals and every
unit's update in both; a trace without host optimizer spans (no offload) exits 2 naming it.
Usage: host_step_spans_test.py PATH_TO_ZERORT REPO_ROOT"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Checks, check_refuses, merged, tiny_train,  # noqa: E402
                     unreadable_paths, write_json)

zerort, root = sys.argv[1], sys.argv[2]
script = os.path.join(root, "tools", "host_step_spans.py")
checks = Checks("host_step_spans_test")
check = checks.check
tmp = tempfile.mkdtemp()


def trace(name, extra):
    """A 3-step run's trace file; checks that the run succeeded."""
    path = os.path.join(tmp, name + ".json")
    tiny_train(check, zerort, tmp, name, 3, merged(
        {"train": {"device": "cpu-async"}, "logging": {"trace_file": path}}, extra))
    return path


offload = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
over = trace("overlapped", offload)
serial = trace("serial", merged(offload, {"train": {"overlap_host_step": False}}))
plain = trace("device", {})

r = subprocess.run([sys.executable, script, over, serial], capture_output=True, text=True)
check("both traces read", r.returncode == 0, r.stderr[-500:])
lines = r.stdout.splitlines()
check("a step's total for each run",
      len(lines) > 2 and lines[0].startswith("overlapped") and lines[1].startswith("serial")
      and "3 steps" in lines[0] and "3 steps" in lines[1], r.stdout)
units = {line.split()[0] for line in lines[3:]}
check("every unit of the 2-layer model in the table",
      {"embeddings", "blocks.0", "blocks.1", "final_norm"} <= units, r.stdout)
for line in lines[3:]:
    fields = line.split()
    check(f"{fields[0]}: two positive times and their ratio",
          len(fields) == 4 and all(float(x) > 0 for x in fields[1:]), line)

# Hostile inputs: each exits 2 naming the file and why, at once (a FIFO is not opened).
garbage = os.path.join(tmp, "garbage.json")
with open(garbage, "wb") as f:
    f.write(b"\xff\xfe{not json")
not_list = write_json(tmp, "object.json", {"traceEvents": []})
hostile = [("a trace without host optimizer spans", plain, "no host optimizer spans"),
           ("not JSON", garbage, "not a trace"),
           ("a JSON object", not_list, "not a trace (no event list)")]
for what, path, says in unreadable_paths(tmp, ".json") + hostile:
    check_refuses(check, what, [sys.executable, script, path, serial], path, says)

checks.finish()
