#!/usr/bin/env python3
"""The bubble of a pipeline run, measured from its logging.trace_file: for each rank and each step
after the first, the window between the end of the previous optimizer step and the start of this
one, and the share of it not spent in forward/backward spans (idle: waiting for receives, the
bubble, plus the sends' and receives' own time). Prints the median over steps of the mean over
ranks, and the steady step time.
Usage: pipeline_bubble.py TRACE.json"""
import json
import statistics
import sys

with open(sys.argv[1]) as f:
    events = [e for e in json.load(f) if e.get("ph") == "X"]
ranks = sorted({e["pid"] for e in events})
bubbles, windows = [], []
steps = sorted({int(e["name"].split()[-1]) for e in events if e["name"].startswith("optimizer step")})
for step in steps[1:]:
    per_rank, per_window = [], []
    for r in ranks:
        mine = [e for e in events if e["pid"] == r]
        prev = next(e for e in mine if e["name"] == f"optimizer step {step - 1}")
        this = next(e for e in mine if e["name"] == f"optimizer step {step}")
        begin, end = prev["ts"] + prev["dur"], this["ts"]
        busy = sum(e["dur"] for e in mine if e["name"].split()[0] in ("forward", "backward")
                   and begin <= e["ts"] < end)
        per_rank.append(1 - busy / (end - begin))
        per_window.append(end - begin)
    bubbles.append(statistics.mean(per_rank))
    windows.append(max(per_window))
print(json.dumps({"bubble": statistics.median(bubbles), "step_us": statistics.median(windows),
                  "steps": len(bubbles), "ranks": len(ranks)}))
