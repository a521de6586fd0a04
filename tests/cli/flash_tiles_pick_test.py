#!/usr/bin/env python3
"""tools/flash_tiles_pick.py, which chooses model.flash_attention's block shapes for
tools/gpu-check.sh from `zerort bench attention --json` lines: it reads what the real command
prints (the CPU's, which has no variants: the defaults), and from results with variants at known
rates it takes a variant only when it is the margin faster in every head-size-64 shape (head size
128 does not vote), the backward variant whose slowest shape gains most; input that is not bench
attention's fails naming the line.
Usage: flash_tiles_pick_test.py PATH_TO_ZERORT REPO_ROOT"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

zerort, root = sys.argv[1], sys.argv[2]
script = os.path.join(root, "tools", "flash_tiles_pick.py")
checks = Checks("flash_tiles_pick_test")
check = checks.check
tmp = tempfile.mkdtemp()


def pick(lines, *args):
    path = os.path.join(tmp, "bench.jsonl")
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))
    return subprocess.run([sys.executable, script, path, *args], capture_output=True, text=True)


def last(r):
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""


# The real command's output (the CPU: no block-shape variants).
real = subprocess.run([zerort, "--log-level", "off", "bench", "attention", "--seq", "64",
                       "--heads", "2", "--head-size", "64", "--rounds", "1", "--json"],
                      capture_output=True, text=True)
check("bench attention --json runs", real.returncode == 0, real.stderr[-500:])
r = pick([real.stdout.strip()])
check("the real output is read; no variant, so the defaults (an empty GPU_CHECK_SET)",
      r.returncode == 0 and last(r) == "GPU_CHECK_SET=" and "hs 64" in r.stdout, r.stdout + r.stderr)


def result(hs, forward, backward, **variants):
    row = {"bench": "attention", "batch": 8, "seq": 1024, "heads": 12, "kv_heads": 12,
           "head_size": hs, "flash_forward_tflops": forward, "flash_backward_tflops": backward}
    row.update({f"flash_{k}_tflops": v for k, v in variants.items()})
    return json.dumps(row)


# 128q faster in one head-size-64 shape only; 128k and 128k c32 faster in both, 128k c32's
# slower shape gaining more; c32 slower. Head size 128 (no variants) shows but does not vote.
lines = [result(64, 100, 50, forward_128q=110, backward_c32=45, backward_128k=60,
                backward_128k_c32=58),
         result(128, 170, 80),
         result(64, 150, 50, forward_128q=149, backward_c32=49, backward_128k=55,
                backward_128k_c32=57)]
r = pick(lines)
check("the backward variant whose slowest head-size-64 shape gains most; no forward variant",
      r.returncode == 0 and last(r) == "GPU_CHECK_SET=model.flash_attention.backward_block_keys=128 "
      "model.flash_attention.backward_query_chunk=32", r.stdout + r.stderr)
check("... each variant printed against its default", "128q 110.0 (1.10x)" in r.stdout
      and "backward_128k 60.0 (1.20x)" in r.stdout, r.stdout)
lines[2] = result(64, 150, 50, forward_128q=160, backward_c32=49, backward_128k=55,
                  backward_128k_c32=50.5)
r = pick(lines)
check("a forward variant faster in every shape is taken; 128k c32's slowest shape now gains 1%:"
      " 128k (10%) instead",
      r.returncode == 0 and last(r) == "GPU_CHECK_SET=model.flash_attention.backward_block_keys=128 "
      "model.flash_attention.forward_block_queries=128", r.stdout + r.stderr)
# Two forward variants faster in every head-size-64 shape: the one whose slower shape gains more
# (128 queries on 8 warps), both its keys; head size 128's forward variant does not vote.
fwd = [result(64, 100, 50, forward_128q=110, forward_128q_8w=120),
       result(128, 170, 80, forward_128q=150),
       result(64, 150, 50, forward_128q=170, forward_128q_8w=175)]
r = pick(fwd)
check("of two forward variants the one whose slowest shape gains most, with both its keys",
      r.returncode == 0 and last(r) == "GPU_CHECK_SET=model.flash_attention.forward_block_queries="
      "128 model.flash_attention.forward_warps=8" and "hs 128" in r.stdout
      and "128q 150.0 (0.88x)" in r.stdout, r.stdout + r.stderr)
r = pick(lines, "--margin", "0.25")
check("with a 25% margin nothing qualifies: the defaults", r.returncode == 0
      and last(r) == "GPU_CHECK_SET=", r.stdout + r.stderr)
# A variant 1% faster in one shape: under the default 2% margin, taken at 0.5%.
slight = [result(64, 100, 50, backward_c32=60), result(64, 100, 50, backward_c32=50.5)]
r = pick(slight)
check("a 1% gain in one shape is under the 2% margin", r.returncode == 0
      and last(r) == "GPU_CHECK_SET=", r.stdout + r.stderr)
r = pick(slight, "--margin", "0.005")
check("... and over a 0.5% one", r.returncode == 0
      and last(r) == "GPU_CHECK_SET=model.flash_attention.backward_query_chunk=32", r.stdout + r.stderr)
# A variant timed in one head-size-64 shape but not the other does not qualify.
r = pick([result(64, 100, 50, backward_128k=70), result(64, 100, 50)])
check("a variant missing from a head-size-64 shape is not taken", r.returncode == 0
      and last(r) == "GPU_CHECK_SET=", r.stdout + r.stderr)
# A variant that computes wrongly (bench attention's differences against the materialised path)
# is not taken however fast; one within the tolerance is.
def differing(hs, default_fwd, default_bwd, **diffs):
    row = json.loads(result(hs, 100, 50, forward_128q=130, backward_128k=70))
    row.update({"max_abs_difference": default_fwd, "max_abs_difference_backward": default_bwd})
    row.update({f"flash_{k}_max_abs_difference": v for k, v in diffs.items()})
    return json.dumps(row)


r = pick([differing(64, 0.01, 0.03, forward_128q=0.01, backward_128k=0.04),
          differing(64, 0.02, 0.03, forward_128q=0.02, backward_128k=1e30)])
check("a backward variant that differs by 1e30 in one shape is not taken; a forward variant "
      "with the default's difference is", r.returncode == 0
      and last(r) == "GPU_CHECK_SET=model.flash_attention.forward_block_queries=128"
      and "backward_128k is not taken" in r.stdout and "1e+30" in r.stdout, r.stdout + r.stderr)
r = pick([differing(64, 0.01, 0.03, forward_128q=0.011, backward_128k=0.04)])
check("a forward variant whose difference is not the default's (every forward form computes "
      "the same bits) is not taken; a backward one within max(2x, +0.02) is",
      r.returncode == 0 and last(r) == "GPU_CHECK_SET=model.flash_attention.backward_block_keys=128"
      and "128q is not taken" in r.stdout, r.stdout + r.stderr)
for value in (-1, "0.1", None):
    r = pick([differing(64, 0.01, 0.03, backward_128k=value)])
    check(f"a difference of {value!r}: exit 2 naming it", r.returncode == 2
          and "flash_backward_128k_max_abs_difference" in r.stderr, r.stderr)
r = pick([result(64, 100, 50), "{not json"])
check("a line that is not JSON: exit 2 naming it", r.returncode == 2 and "bench.jsonl:2" in r.stderr,
      r.stderr)
r = pick([json.dumps({"bench": "model"})])
check("another bench's result: exit 2", r.returncode == 2 and "not a bench attention result"
      in r.stderr, r.stderr)
r = pick([json.dumps({"bench": "attention", "batch": 8})])
check("a result without its rates: exit 2 naming the field", r.returncode == 2
      and "no seq" in r.stderr, r.stderr)
bad = json.loads(result(64, 100, 50, backward_128k=70))
for value in ("70", None, 0, float("nan")):
    bad["flash_backward_128k_tflops"] = value
    r = pick([json.dumps(bad)])
    check(f"a rate of {value!r}: exit 2 naming it", r.returncode == 2
          and "flash_backward_128k_tflops" in r.stderr, r.stderr)
r = pick(["[1, 2]"])
check("a JSON array: exit 2", r.returncode == 2 and "not a bench attention result" in r.stderr,
      r.stderr)
r = pick([])
check("no result: exit 2", r.returncode == 2 and "no bench attention result" in r.stderr, r.stderr)
r = subprocess.run([sys.executable, script, tmp], capture_output=True, text=True)
check("a directory where the file should be: exit 2", r.returncode == 2
      and "flash_tiles_pick" in r.stderr, r.stderr)
r = subprocess.run([sys.executable, script, os.path.join(tmp, "missing.jsonl")],
                   capture_output=True, text=True)
check("a missing file: exit 2", r.returncode == 2 and "missing.jsonl" in r.stderr, r.stderr)
checks.finish()
