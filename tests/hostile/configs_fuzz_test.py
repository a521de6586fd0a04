#!/usr/bin/env python3
"""Configs a fuzzer writes: a small GPT-2 or LLaMA run with one or two keys changed, each key
taken from docs/config.md's tables (so a new key is fuzzed from the day it is documented), its
value mostly inside the documented type and range (so runs get past the parser into the
engine), sometimes hostile (a wrong type, 2^53, a negative, a 5,000-character string). Every run
must end as the README's exit codes say: 0 (it trained), 2 with an error line (refused), or 4 (a
documented stop on a non-finite loss); never a signal, an abort, exit 1 for a config, or a hang.
At least a fifth of the runs must train, or the fuzzer only exercises the parser.
Deterministic: ZR_FUZZ_SEED and ZR_FUZZ_TRIALS (default 2026 and 300) choose another sample.
Usage: configs_fuzz_test.py PATH_TO_ZERORT DOCS_CONFIG_MD"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from harness import Checks, tiny_run  # noqa: E402

zerort, reference = sys.argv[1], sys.argv[2]
seed = int(os.environ.get("ZR_FUZZ_SEED", "2026"))
trials = int(os.environ.get("ZR_FUZZ_TRIALS", "300"))
rng = random.Random(seed)
checks = Checks("hostile_configs_fuzz_test")
check = checks.check
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

# Every documented key: its dotted path, type and range ("1 .. 2^53", "a, b, c" or empty).
keys, section = [], ""
with open(reference) as f:
    for line in f:
        heading = re.match(r"### `([^`]+)`", line)
        if heading:
            section = "" if heading.group(1) == "(top level)" else heading.group(1) + "."
        row = re.match(r"\| `([^`]+)` \|", line)
        if row:
            cols = [c.strip() for c in line.split("|")]
            keys.append((section + row.group(1), cols[2], cols[4]))
check("docs/config.md lists the keys", len(keys) >= 100, str(len(keys)))

HOSTILE = [0, -1, 1.5, 1e30, 2**53, 2**63 - 1, -2**53, "", "x", "..", "/dev/zero", "a" * 5000,
           None, True, [], [1, 2, 3], {}, {"a": 1}]


def bound(text):
    return 2 ** int(text[2:]) if text.startswith("2^") else float(text)


def valid(kind, rng_text):
    """A value of the documented type, mostly inside the documented range."""
    if kind == "boolean":
        return rng.choice([True, False])
    if kind == "string":
        options = [o.strip() for o in rng_text.split(",")] if rng_text else ["x", "auto", ""]
        return rng.choice(options)
    lo, hi = 0, 8
    m = re.match(r"(-?[\d.e+]+|2\^\d+) \.\. (-?[\d.e+]+|2\^\d+)", rng_text)
    if m:
        lo, hi = bound(m.group(1)), bound(m.group(2))
    if kind == "integer":
        # The top of a range only where a run there is refused or small: a vocabulary of 2^24 is
        # a valid run of minutes, not a hostile input.
        top = [int(hi)] if hi <= 65536 or hi >= 2**30 else []
        options = [int(lo), int(lo) + 1, 2, 3, 4, 8, 16, int(min(hi, 64))] + top
        return rng.choice([o for o in options if lo <= o <= hi] or [int(lo)])
    if kind == "number":
        options = [lo, hi, (lo + hi) / 2, lo + (hi - lo) * 1e-3, 0.5, 1.0, 1e-3]
        return rng.choice([o for o in options if lo <= o <= hi])
    if kind.startswith("two numbers"):
        return [round(rng.random() * 0.99, 3), round(rng.random() * 0.99, 3)]
    if kind.startswith("list of integers"):
        return rng.choice([[1], [2, 2], [1, 3]])
    return rng.choice(HOSTILE)


def put(cfg, path, value):
    parts = path.split(".")
    for p in parts[:-1]:
        if not isinstance(cfg.get(p), dict):
            cfg[p] = {}
        cfg = cfg[p]
    cfg[parts[-1]] = value


def base(arch):
    cfg = tiny_run(2)
    cfg["train"]["device"] = "cpu"
    if arch == "llama":
        cfg["model"].update({"arch": "llama", "n_kv_head": 1, "intermediate_size": 64})
    return cfg


tmp = tempfile.mkdtemp()
outcomes = {}
started = time.time()
for trial in range(trials):
    cfg = base(rng.choice(["gpt2", "llama"]))
    changed = []
    for _ in range(rng.choice([1, 1, 1, 2])):
        key, kind, rng_text = rng.choice(keys)
        value = valid(kind, rng_text) if rng.random() < 0.9 else rng.choice(HOSTILE)
        if key == "train.steps" and type(value) is int and value > 3:
            value = 3  # 2^53 steps is a valid run that never ends, not a hostile input
        put(cfg, key, value)
        shown = value if not isinstance(value, str) or len(value) < 40 else f"<{len(value)} chars>"
        changed.append(f"{key}={json.dumps(shown)}")
    if not any(c.startswith("train.steps=") for c in changed):
        cfg["train"]["steps"] = 2  # a short run, whatever else changed
    work = os.path.join(tmp, "run")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with open(os.path.join(work, "c.json"), "w") as f:
        json.dump(cfg, f)
    what = f"trial {trial} ({', '.join(changed)})"
    t0 = time.monotonic()
    try:
        r = subprocess.run([zerort, "train", "c.json"], cwd=work, capture_output=True, text=True,
                           errors="replace", env=env, timeout=90)
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired:
        rc, err = "hang", ""
    seconds = time.monotonic() - t0
    outcomes[rc] = outcomes.get(rc, 0) + 1
    last = err.strip().splitlines()[-1][:300] if err.strip() else ""
    check(f"{what}: exit 0, 2 or 4", rc in (0, 2, 4), f"rc={rc} after {seconds:.1f} s: {last}")
    if rc in (2, 4):
        check(f"{what}: says why", "error" in err, err[-300:])
    check(f"{what}: no crash report",
          not re.search(r"terminate called|Assertion|Sanitizer|Segmentation|core dumped", err),
          err[-300:])
trained = outcomes.get(0, 0)
check("at least a fifth of the fuzzed runs train (the fuzzer reaches the engine)",
      trained * 5 >= trials, str(outcomes))
print(f"configs_fuzz_test: seed {seed}, {trials} configs in {time.time() - started:.0f} s; "
      f"exit codes {dict(sorted(outcomes.items(), key=str))}")
shutil.rmtree(tmp, ignore_errors=True)
checks.finish()
