#!/usr/bin/env python3
"""The zerort CLI as a user meets it: env and bench comm output (text and --json with the keys
DESIGN.md section 9 asks of every benchmark), and exit code 2 with a clear message for bad
input. Usage: cli_test.py PATH_TO_ZERORT"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

zerort = sys.argv[1]
checks = Checks("cli_test")
check = checks.check


def run(*args):
    return subprocess.run([zerort, *args], capture_output=True, text=True, timeout=120)



r = run("env", "--json")
check("env exits 0", r.returncode == 0, r.stderr)
env = json.loads(r.stdout)
for key in ("version", "build", "cuda", "nccl", "mpi", "openblas", "launch"):
    check(f"env has {key}", key in env, r.stdout)
check("env launch is single process", env["launch"]["world_size"] == 1, r.stdout)
check("library logs go to stderr, not stdout", "[rank" not in r.stdout, r.stdout)

r = run("env")
check("env text names OpenBLAS", "OpenBLAS:" in r.stdout, r.stdout)

r = run("bench", "comm", "--backend", "loopback", "--ranks", "3", "--min-bytes", "4KiB",
        "--max-bytes", "64KiB", "--rounds", "1", "--json")
check("bench comm exits 0", r.returncode == 0, r.stderr)
bench = json.loads(r.stdout)
for key in ("bench", "baseline", "ratio"):
    check(f"bench json has {key}", key in bench, r.stdout)
check("bench name", bench.get("bench") == "comm", r.stdout)
check("bench ratio positive", bench.get("ratio", 0) > 0, r.stdout)
ops = {row["op"] for row in bench["results"]}
check("bench covers the three collectives", ops == {"all_gather", "reduce_scatter", "all_reduce"},
      str(ops))
check("bench sizes 4, 16, 64 KiB per op", len(bench["results"]) == 9, r.stdout)


configs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs")
r = run("bench", "model", "--config", os.path.join(configs, "bench-tiny.json"), "--iters", "1",
        "--cpu", "--json")
check("bench model exits 0", r.returncode == 0, r.stderr)
model = json.loads(r.stdout) if r.returncode == 0 else {}
for key in ("bench", "baseline", "ratio", "tokens_per_s", "achieved_tflops", "flops_per_token"):
    check(f"bench model json has {key}", key in model, r.stdout)
check("bench model counts tiny's parameters", model.get("params") == 120576, r.stdout)
check("bench model ratio positive", model.get("ratio", 0) > 0, r.stdout)

tmp = tempfile.mkdtemp()
bad_heads = os.path.join(tmp, "bad-heads.json")
with open(bad_heads, "w") as f:
    json.dump({"model": {"preset": "tiny", "n_head": 5}}, f)
bad_preset = os.path.join(tmp, "bad-preset.json")
with open(bad_preset, "w") as f:
    json.dump({"model": {"preset": "gpt9"}}, f)

for args, needle in [
    (["bench", "model", "--config", bad_heads], "does not divide"),
    (["bench", "model", "--config", bad_preset], "gpt9"),
    (["bench", "model", "--config", os.path.join(tmp, "missing.json")], "missing.json"),
    (["bench", "comm", "--backend", "carrier-pigeon"], "carrier-pigeon"),
    (["bench", "comm", "--max-bytes", "12QB"], "12QB"),
    (["bench", "comm", "--ops", "all_to_all"], "all_to_all"),
    (["bench", "comm", "--min-bytes", "1MiB", "--max-bytes", "1KiB"], "--min-bytes"),
    (["train", "no-such-run.json"], "no-such-run.json: cannot be read"),
    (["estimate", "run.json"], "not available"),
    (["no-such-command"], "no-such-command"),
]:
    r = run(*args)
    check(f"{' '.join(args)} exits 2", r.returncode == 2, f"rc={r.returncode} {r.stderr}")
    check(f"{' '.join(args)} names the problem", needle in r.stderr + r.stdout, r.stderr)

checks.finish()
