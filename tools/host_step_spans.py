#!/usr/bin/env python3
"""Each unit's host optimizer update in two `zerort train` traces (logging.trace_file), side by
side: tools/gpu-check.sh's train section gives it the run whose host step runs behind the next
forward ([Note: the host step behind the forward], sharding/sharded_optimizer.h) and the same run
with train.overlap_host_step=false. A unit's update is an "optimizer UNIT" span on the "host step"
track (overlapped) or the "host" track (serial); the steps are the "optimizer step N" spans.
Prints, for each trace, the seconds a step of all units' updates, then each unit's median
milliseconds in both and their ratio: where the thirteenth GPU run's 0.19 s a step against 0.04
(docs/gpu.md) comes from. Exit 2, naming the file, for one that is not a regular file, not a
trace, or a trace without unit spans.
  tools/host_step_spans.py OVERLAPPED_TRACE SERIAL_TRACE"""
import json
import os
import re
import statistics
import sys

STEP = re.compile(r"optimizer step \d+$")


def refuse(path, why):
    sys.stderr.write(f"host_step_spans: {path}: {why}\n")
    sys.exit(2)


def read(path):
    """{unit: [seconds...]}, steps"""
    if not os.path.isfile(path):  # a FIFO would block the read, a directory fail it
        refuse(path, "not a regular file")
    try:
        with open(path) as f:
            events = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        refuse(path, f"not a trace ({e})")
    if not isinstance(events, list):
        refuse(path, "not a trace (no event list)")
    units, steps = {}, 0
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name = str(e.get("name", ""))
        if STEP.match(name):
            steps += 1
        elif name.startswith("optimizer ") and e.get("cat") in ("host", "host step"):
            units.setdefault(name[len("optimizer "):], []).append(float(e.get("dur", 0)) / 1e6)
    if not units or steps == 0:
        refuse(path, "no host optimizer spans (a run with offload_optimizer.device cpu and "
               "logging.trace_file?)")
    return units, steps


def main():
    if len(sys.argv) != 3:
        sys.stderr.write(__doc__.splitlines()[-1] + "\n")
        sys.exit(2)
    (over, over_steps), (serial, serial_steps) = read(sys.argv[1]), read(sys.argv[2])
    for label, units, steps in (("overlapped", over, over_steps), ("serial", serial, serial_steps)):
        total = sum(sum(v) for v in units.values())
        print(f"{label:10s} {total / steps:.4f} s a step of unit updates ({steps} steps, "
              f"{len(units)} units)")
    print(f"{'unit':24s} {'overlapped ms':>14s} {'serial ms':>10s} {'ratio':>7s}")
    for unit in sorted(over, key=lambda u: -statistics.median(over[u])):
        a = statistics.median(over[unit]) * 1e3
        b = statistics.median(serial[unit]) * 1e3 if unit in serial else float("nan")
        ratio = a / b if b > 0 else float("nan")
        print(f"{unit:24s} {a:14.3f} {b:10.3f} {ratio:7.2f}")


if __name__ == "__main__":
    main()
