#!/usr/bin/env python3
"""The bubble of a pipeline run, measured from its logging.trace_file, for each step after the
first (median over steps):
- "bubble": Megatron's measure, the pipeline's compute window (the first forward's start to the
  last backward's end over all ranks of the step) minus a rank's own forward/backward time, over
  that compute time, mean over ranks: (p-1)/m for GPipe and 1F1B, (p-1)/(v m) interleaved, with
  uniform costs and free communication;
- "idle_share": the same idle time over the compute window: (p-1)/(m+p-1) in theory;
- "step_idle_share": the share of the whole window between two optimizer steps not spent in
  forward/backward spans (also the loss and evaluation all-reduces, the data loading);
- "step_us" and "compute_window_us": the slowest rank's step window and the compute window.
Usage: pipeline_bubble.py TRACE.json"""
import json
import re
import statistics
import sys

ACTION = re.compile(r"^(forward|backward) \d+\.\d+$")

with open(sys.argv[1]) as f:
    events = [e for e in json.load(f) if e.get("ph") == "X"]
ranks = sorted({e["pid"] for e in events})
steps = sorted({int(e["name"].split()[-1]) for e in events if e["name"].startswith("optimizer step")})
out = {"bubble": [], "idle_share": [], "step_idle_share": [], "step_us": [],
       "compute_window_us": []}
for step in steps[1:]:
    busy, step_idle, windows, computes = {}, [], [], []
    for r in ranks:
        mine = [e for e in events if e["pid"] == r]
        prev = next(e for e in mine if e["name"] == f"optimizer step {step - 1}")
        this = next(e for e in mine if e["name"] == f"optimizer step {step}")
        begin, end = prev["ts"] + prev["dur"], this["ts"]
        # The executor's actions ("forward 3.0": micro-batch 3, chunk 0), not the units' spans
        # inside them ("forward blocks.3").
        compute = [e for e in mine if ACTION.match(e["name"]) and begin <= e["ts"] < end]
        busy[r] = sum(e["dur"] for e in compute)
        step_idle.append(1 - busy[r] / (end - begin))
        windows.append(end - begin)
        computes += compute
    window = max(e["ts"] + e["dur"] for e in computes) - min(e["ts"] for e in computes)
    out["bubble"].append(statistics.mean((window - busy[r]) / busy[r] for r in ranks))
    out["idle_share"].append(statistics.mean((window - busy[r]) / window for r in ranks))
    out["step_idle_share"].append(statistics.mean(step_idle))
    out["step_us"].append(max(windows))
    out["compute_window_us"].append(window)
result = {k: statistics.median(v) for k, v in out.items()}
result.update({"steps": len(out["bubble"]), "ranks": len(ranks)})
print(json.dumps(result))
