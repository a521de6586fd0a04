#!/usr/bin/env python3
"""The host-optimizer steps against the device step, from `zerort train` metrics files
(logging.metrics_file, one JSON object a step): tools/gpu-check.sh's train section gives it the
device run first, then the runs with the optimizer on the host at the same micro-batches
(overlapped, serial, pinned, a partial offload, the gradient sums on the device). For each run:
the steps it counts (the first is left out: it records the gather order and fills the caches),
the median step time and tokens/s over them, the ratio of that step time to the first run's
(issue 48's target: at most 1.3), and the medians of the offload times a step that say where
the difference went (update wait: the forward waiting for the host's updates; grad wait and grad
add: the backward waiting for, and the worker adding, the host gradient slices; optimizer: the
host update's own time). Exit 2, naming the file, for one that is not a regular file, holds a
line that is not a metrics object, or has fewer than two steps.
  tools/offload_steps.py DEVICE_METRICS RUN_METRICS..."""
import json
import math
import os
import statistics
import sys

WAITS = ("update_wait", "grad_wait", "grad_add", "optimizer")


def refuse(path, why):
    sys.stderr.write(f"offload_steps: {path}: {why}\n")
    sys.exit(2)


def number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read(path):
    """[(step_time_s, tokens_per_s, {wait: s})] of the steps after the first, in step order."""
    if not os.path.isfile(path):  # a FIFO would block the read, a directory fail it
        refuse(path, "not a regular file")
    steps = []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    m = json.loads(line)
                except json.JSONDecodeError as e:
                    refuse(path, f"line {n} is not JSON ({e})")
                if not isinstance(m, dict) or not all(
                        number(m.get(k)) for k in ("step", "step_time_s", "tokens_per_s")):
                    refuse(path, f"line {n} is not a step's metrics (step, step_time_s, "
                                 "tokens_per_s)")
                times = m.get("offload_time_s")
                times = times if isinstance(times, dict) else {}
                waits = {k: times[k] for k in WAITS if number(times.get(k))}
                steps.append((m["step"], m["step_time_s"], m["tokens_per_s"], waits))
    except (OSError, UnicodeDecodeError) as e:
        refuse(path, f"unreadable ({e})")
    steps.sort(key=lambda s: s[0])
    if len(steps) < 2:
        refuse(path, f"{len(steps)} step(s): at least 2 are needed (the first is left out)")
    return [s[1:] for s in steps[1:]]


def name_of(path):
    """metrics-NAME.jsonl -> NAME"""
    base = os.path.basename(path)
    for suffix in (".jsonl", ".json"):
        if base.endswith(suffix):
            base = base[:-len(suffix)]
    return base[len("metrics-"):] if base.startswith("metrics-") and len(base) > 8 else base


def main(argv):
    if len(argv) < 2:
        sys.stderr.write(__doc__.split("\n  ")[-1] + "\n")
        return 2
    runs = [(name_of(p), read(p)) for p in argv]
    base = statistics.median(s[0] for s in runs[0][1])
    width = max(len(name) for name, _ in runs)
    print(f"{'run':<{width}} steps  step ms  tokens/s  x device  " +
          "  ".join(f"{w.replace('_', ' ')} ms" for w in WAITS))
    for name, steps in runs:
        step = statistics.median(s[0] for s in steps)
        tokens = statistics.median(s[1] for s in steps)
        waits = []
        for w in WAITS:
            values = [s[2][w] for s in steps if w in s[2]]
            waits.append(f"{statistics.median(values) * 1e3:>{len(w) + 3}.1f}" if values
                         else f"{'-':>{len(w) + 3}}")
        print(f"{name:<{width}} {len(steps):>5} {step * 1e3:>8.1f} {tokens:>9.0f} "
              f"{step / base:>9.3f}  " + "  ".join(waits))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
