#!/usr/bin/env python3
"""Flags at 0, negative and huge for `zerort estimate` and `zerort bench`, flags of another mode,
an option zerort does not have before the command, `eval --max-windows -3`, a `--set` value nested
30,000 deep or with a duplicate key, a batch size whose derived micro-batch does not fit: each is
exit 2 with a message naming what the user wrote, within seconds (about 0.2 s), never a crash, a
hang or an exit 0.
Usage: cli_flags_test.py PATH_TO_ZERORT CONFIGS_DIR"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from harness import Checks  # noqa: E402

zerort, configs = sys.argv[1], sys.argv[2]
checks = Checks("hostile_cli_flags_test")
check = checks.check
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
tiny = os.path.join(configs, "tiny-cpu.json")
bench_tiny = os.path.join(configs, "bench-tiny.json")
HUGE = "9223372036854775807"
tmp = tempfile.mkdtemp()
# train_batch_size 2^53 with no micro-batch: the derived micro-batch named with its derivation.
huge_batch = os.path.join(tmp, "huge-batch.json")
with open(huge_batch, "w") as f:
    json.dump({"train_batch_size": 9007199254740992,
               "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "seq_len": 32,
                         "vocab_size": 256},
               "train": {"steps": 1, "device": "cpu"}}, f)

cases = [
    # estimate: cold mode, shapes, layouts
    (["estimate", "--params", "-1", "--largest-layer-params", "10", "--gpus", "8"], "--params -1"),
    (["estimate", "--params", "1e16", "--largest-layer-params", "1e9", "--gpus", "8"],
     "must be in [1, 1e15]"),
    (["estimate", "--params", "1e15", "--largest-layer-params", "1", "--gpus", "8"],
     "not modelled"),
    (["estimate", "--params", "1e9", "--largest-layer-params", "2e9"], "--largest-layer-params"),
    (["estimate", "--params", "1e9", "--largest-layer-params", "-5", "--gpus", "8"],
     "--largest-layer-params"),
    (["estimate", "--model", "gpt2", "--gpus", "0"], "--gpus 0"),
    (["estimate", "--model", "gpt2", "--gpus", "-1"], "--gpus -1"),
    (["estimate", "--model", "gpt2", "--gpus", "2147483648"], "--gpus"),
    (["estimate", "--model", "gpt2", "--gpus", "65536", "--nodes", "65536"], "at most 2^20"),
    (["estimate", "--model", "gpt2", "--gpus", "1", "--nodes", "-1"], "--nodes -1"),
    (["estimate", "--layers", "100000000", "--hidden", "768", "--heads", "12", "--gpus", "1"],
     "--layers 100000000"),
    (["estimate", "--layers", "12", "--hidden", "100000000", "--heads", "1", "--gpus", "1"],
     "--hidden 100000000"),
    (["estimate", "--layers", "12", "--hidden", "768", "--heads", "0", "--gpus", "1"],
     "--heads 0"),
    (["estimate", "--layers", "12", "--hidden", "768", "--heads", "7", "--gpus", "1"],
     "--heads 7 does not divide --hidden 768"),
    (["estimate", "--layers", "-3", "--hidden", "768", "--heads", "12", "--gpus", "1"],
     "--layers -3"),
    (["estimate", "--layers", "0"], "--layers 0"),
    (["estimate", "--layers", "12"], "--hidden is missing"),
    (["estimate", "--model", "gpt2", "--layers", "12"], "both give the shape"),
    (["estimate", "--model", "gpt2", "--vocab", "0"], "--vocab 0"),
    (["estimate", "--model", "gpt2", "--gpus", "1", "--seq-len", "-5"], "--seq-len -5"),
    (["estimate", "--model", "gpt2", "--seq-len", "-1"], "--seq-len -1"),
    (["estimate", "--model", "gpt2", "--gpus", "1", "--seq-len", "2000000"], "--seq-len 2000000"),
    (["estimate", "--model", "gpt2", "--gpus", "1", "--micro-batch", "0"], "--micro-batch 0"),
    (["estimate", "--model", "gpt2", "--gpus", "1", "--micro-batch", "2147483647"],
     "--micro-batch 2147483647"),
    (["estimate", "--model", "gpt2", "--micro-batch", "100000", "--seq-len", "1024"],
     "at most 2^24 tokens"),
    (["estimate", "--model", "gpt2", "--world-size", "4"], "--world-size does not apply"),
    (["estimate", "--model", "gpt2", "--params", "1e9"], "--model does not apply"),
    (["estimate", tiny, "--gpus", "3"], "--gpus does not apply"),
    (["estimate", "--vocab", "100"], "give a run config"),
    (["estimate", "--layers", "4096", "--hidden", "262144", "--heads", "16384", "--vocab",
      "10000000", "--seq-len", "1048576", "--micro-batch", "16", "--gpus", "1"],
     "more than 8 PiB per rank"),
    (["estimate", "--model", "gpt2", "--gpus", "1", "--fit", "garbage"], "--fit garbage"),
    (["estimate", "--model", "gpt2", "--gpus", "1", "--fit", "-5GiB"], "--fit -5GiB"),
    (["estimate", "--model", "gpt2", "--fit", "1e400"], "--fit 1e400"),
    (["estimate", "--model", "gpt2", "--fit", "nan"], "--fit nan"),
    (["estimate", "--model", "nonexistent", "--gpus", "1"], "nonexistent"),
    (["estimate", tiny, "--world-size", "0"], "--world-size 0"),
    (["estimate", tiny, "--world-size", "-3"], "--world-size -3"),
    # bench
    (["bench", "adamw", "--params", "0"], "--params 0"),
    (["bench", "adamw", "--params", "-1"], "--params -1"),
    (["bench", "adamw", "--params", HUGE], "--params"),
    (["bench", "adamw", "--rounds", "0"], "--rounds 0"),
    (["bench", "adamw", "--rounds", "-1"], "--rounds -1"),
    (["bench", "adamw", "--overlap=maybe"], "--overlap"),
    (["bench", "model", "--config", bench_tiny, "--iters", "0"], "--iters 0"),
    (["bench", "model", "--config", bench_tiny, "--iters", "-1"], "--iters -1"),
    (["bench", "model", "--config", "/nonexistent.json"], "/nonexistent.json"),
    (["bench", "comm", "--rounds", "0"], "--rounds 0"),
    (["bench", "comm", "--rounds", "5000"], "--rounds 5000"),
    (["bench", "comm", "--ranks", "0"], "--ranks 0"),
    (["bench", "comm", "--ranks", "100000"], "--ranks 100000"),
    (["bench", "comm", "--seconds-per-round", "-1"], "--seconds-per-round -1"),
    (["bench", "attention", "--batch", "0"], "--batch 0"),
    (["bench", "attention", "--batch", "abc"], "--batch"),
    (["bench", "attention", "--seq", "-1"], "--seq -1"),
    (["bench", "attention", "--seq", HUGE], "--seq"),
    (["bench", "attention", "--heads", "0"], "--heads 0"),
    (["bench", "attention", "--kv-heads", "-3"], "--kv-heads -3"),
    (["bench", "attention", "--kv-heads", "5"], "--kv-heads 5 must divide --heads 12"),
    (["bench", "attention", "--head-size", "7"], "--head-size 7"),
    (["bench", "attention", "--head-size", "100000"], "--head-size 100000"),
    (["bench", "attention", "--rounds", "0"], "--rounds 0"),
    (["bench", "attention", "--device", ""], "--device ''"),
    (["bench", "attention", "--no-backward=maybe"], "--no-backward"),
    (["bench", "attention", "--batch", "1024", "--seq", "45", "--heads", "256", "--head-size",
      "512"], "more than 8 GiB"),
    (["bench", "model", "--config", bench_tiny, "--census=maybe"], "--census"),
    (["bench", "model", "--config", bench_tiny, "--timeline=maybe"], "--timeline"),
    (["bench", "attention", "--device", "tpu"], "--device 'tpu' must be cpu or cuda"),
    (["bench", "comm", "--min-bytes", "0"], "--min-bytes"),
    (["bench", "comm", "--max-bytes", "1TiB"], "--max-bytes 1TiB"),
    (["bench", "comm", "--max-bytes", "1e400"], "--max-bytes '1e400' is more than 1 EiB"),
    # the command line itself, eval, train
    (["--bogus"], "unknown option '--bogus'"),
    (["--log-level", "info", "--bogus", "train"], "unknown option '--bogus'"),
    (["trian"], "unknown command 'trian'"),
    (["eval", tiny, "--checkpoint", "/nonexistent", "--max-windows", "-3"], "--max-windows -3"),
    (["train", tiny, "--print-config", "--set",
      "model.x=" + "[" * 30000 + "]" * 30000], "--set model.x: nested more than 64 levels"),
    (["train", tiny, "--print-config", "--set", "model.x={\"a\": 1, \"a\": 2}"],
     "duplicate key 'a'"),
    (["train", huge_batch], "train_batch_size 9007199254740992 / data-parallel size 1"),
    (["bench", "comm", "--dtype", "f64"], "f64"),
    (["bench", "comm", "--ops", "foo"], "foo"),
    (["bench", "offload", "--path", "/tmp", "--size", "0"], "--size"),
    (["bench", "offload", "--path", "/tmp", "--rounds", "0"], "--rounds"),
    (["bench", "offload", "--path", "/tmp", "--queue-depth", "-1"], "--queue-depth"),
    (["bench", "offload", "--path", "/tmp", "--block-size", "1000"], "--block-size"),
    (["bench", "offload", "--path", "/nonexistent"], "/nonexistent"),
    (["bench", "offload", "--path", "/tmp", "--size", "99999999999999999"], "free"),
]
for args, says in cases:
    start = time.time()
    try:
        r = subprocess.run([zerort, *args], capture_output=True, text=True, env=env, timeout=30)
        code, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired:
        code, out = "timeout", ""
    seconds = time.time() - start
    what = " ".join(a if len(a) < 30 else "..." + a[-20:] for a in args)
    check(f"{what}: exit 2", code == 2, f"{code} {out[-500:]}")
    check(f"{what}: names {says}", says in out, out[-500:])
    # Said once, in words: no command prefix twice ("bench offload: bench offload: ..."), no
    # status code's name ("FAILED_PRECONDITION: ...").
    errors = [line.split("[error] ", 1)[1] for line in out.splitlines() if "[error] " in line]
    doubled = [e for e in errors if e.split(": ", 1)[0] + ": " + e.split(": ", 1)[0] + ": " in e]
    coded = [e for e in errors if re.search(r"\b[A-Z]+_[A-Z_]+: ", e)]
    check(f"{what}: said once, in words", not doubled and not coded, str(doubled + coded))
    # About 0.2 s in a release build; the bound leaves room for the sanitizer build under load.
    check(f"{what}: within 3 s", seconds < 3, f"{seconds:.2f} s")

sys.exit(checks.finish())
