#!/usr/bin/env python3
"""Checkpoints from the command line: `kill -9` during a run with a save every step leaves a
loadable checkpoint (`--resume` continues); SIGTERM saves, stops with exit 0, and `--resume`
finishes the run; a truncated or bit-flipped shard is refused (exit 2) naming the file; `zerort
checkpoint inspect`; `zerort checkpoint export` + `zerort eval` agree with the PyTorch reference
(tests/layers/gpt_reference.py) to 1e-5 when PyTorch is installed (that comparison is skipped,
visibly, without it).
Usage: checkpoint_cli_test.py PATH_TO_ZERORT"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

zerort = sys.argv[1]
checks = Checks("checkpoint_cli_test")
check = checks.check
here = os.path.dirname(os.path.abspath(__file__))
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")



def config(name, steps, ckpt, **extra):
    c = {
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "steps_per_print": 1000,
        "model": {"n_layer": 2, "n_head": 4, "d_model": 64, "seq_len": 64, "vocab_size": 256},
        "train": {"steps": steps, "eval_windows": 2, "sample_tokens": 0, "device": "cpu"},
        "checkpoint": {"dir": ckpt, "keep_last_n": 2},
        "logging": {"metrics_file": os.path.join(ckpt, "metrics.jsonl")},
    }
    c.update(extra)
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        json.dump(c, f)
    return path


def run(*args, **kw):
    return subprocess.run([zerort, *args], capture_output=True, text=True, env=env, timeout=300,
                          **kw)


def read_or_none(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def wait_until_changed(path, before, proc, what):
    """Waits until the file at `path` exists and differs from `before` (the run has made
    progress), however slow the machine (a sanitizer build on a busy CI machine starts in
    seconds, not the fraction of one a Release build takes)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        now = read_or_none(path)
        if now and now != before:
            return True
        time.sleep(0.05)
    log = getattr(proc, "log", None)
    said = open(log).read()[-1500:] if log else ""
    check(what, False, f"{path} did not change within 240 s (exit {proc.poll()}) {said}")
    return False


# kill -9 at arbitrary moments of a run that saves every step: each kill comes a different
# delay after the run's next save, so it lands within a step, a save or a rename.
ckpt = os.path.join(tmp, "killed")
cfg = config("killed.json", 100000, ckpt, checkpoint={"dir": ckpt, "interval": 1,
                                                      "keep_last_n": 2})
for attempt, delay in enumerate((0.0, 0.37, 0.71)):
    log = os.path.join(tmp, f"killed{attempt}.log")
    with open(log, "w") as err:
        p = subprocess.Popen([zerort, "train", cfg] + (["--resume"] if attempt else []),
                             stdout=subprocess.DEVNULL, stderr=err, env=env)
    p.log = log
    wait_until_changed(os.path.join(ckpt, "latest"), read_or_none(os.path.join(ckpt, "latest")),
                       p, f"run #{attempt + 1} saves a step")
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    p.wait()
    r = run("checkpoint", "inspect", ckpt)
    check(f"after kill -9 #{attempt + 1}, latest is intact", r.returncode == 0 and "all ok" in r.stdout,
          r.stdout + r.stderr[-500:])
latest = open(os.path.join(ckpt, "latest")).read().strip()
steps_done = int(latest.split("_")[1])
r = run("train", config("killed2.json", steps_done + 2, ckpt), "--resume")
check("resume after kill -9 exits 0", r.returncode == 0, r.stderr[-1000:])
check("resume after kill -9 logs the step", f"resumed from {ckpt}/{latest}" in r.stderr,
      r.stderr[-1000:])

# SIGTERM: save, stop, exit 0; --resume finishes.
ckpt = os.path.join(tmp, "term")
cfg = config("term.json", 100000, ckpt)
p = subprocess.Popen([zerort, "train", cfg], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     text=True, env=env)
wait_until_changed(os.path.join(ckpt, "metrics.jsonl"), None, p, "the SIGTERM run logs a step")
p.send_signal(signal.SIGTERM)
out, err = p.communicate(timeout=120)
check("SIGTERM exits 0", p.returncode == 0, err[-1000:])
check("SIGTERM saves", "stopping after step" in err and "checkpoint saved" in err, err[-1000:])
latest = open(os.path.join(ckpt, "latest")).read().strip()
stopped = int(latest.split("_")[1])
r = run("train", config("term2.json", stopped + 3, ckpt), "--resume")
check("resume after SIGTERM exits 0", r.returncode == 0, r.stderr[-1000:])
with open(os.path.join(ckpt, "metrics.jsonl")) as f:
    steps = [json.loads(line)["step"] for line in f]
check("metrics continue without a gap", steps == list(range(1, stopped + 4)), str(steps[-6:]))

# Damaged shards are refused by name; inspect reports them.
shard = os.path.join(ckpt, f"step_{stopped + 3}", "dp0-tp0.master.bin")
with open(shard, "rb") as f:
    original = f.read()
for label, data, needle in [("truncated", original[:-8], "truncated"),
                            ("bit-flipped", original[:100] + bytes([original[100] ^ 1]) +
                             original[101:], "corrupted")]:
    with open(shard, "wb") as f:
        f.write(data)
    r = run("train", config("damaged.json", stopped + 5, ckpt), "--resume")
    check(f"{label} shard: exit 2", r.returncode == 2, f"rc={r.returncode} {r.stderr[-500:]}")
    check(f"{label} shard: names the file", shard in r.stderr and needle in r.stderr,
          r.stderr[-500:])
    r = run("checkpoint", "inspect", ckpt)
    check(f"{label} shard: inspect says MISMATCH", r.returncode == 2 and "MISMATCH" in r.stdout,
          r.stdout)
with open(shard, "wb") as f:
    f.write(original)

# Export and eval, against the PyTorch reference when it is installed.
text = os.path.join(tmp, "text.txt")
with open(text, "w") as f:
    for i in range(300):
        f.write(f"Line {i}: the shard manager gathers unit {i % 7} and releases it.\n")
tokens = os.path.join(tmp, "tokens.bin")
check("data prepare", run("data", "prepare", text, tokens).returncode == 0)
r = run("eval", cfg, "--checkpoint", ckpt, "--data", tokens, "--max-windows", "16", "--json")
check("eval exits 0", r.returncode == 0, r.stderr[-500:])
ours = json.loads(r.stdout) if r.returncode == 0 else {}
check("eval counts tokens", ours.get("tokens") == 16 * 64, r.stdout)
export = os.path.join(tmp, "hf")
r = run("checkpoint", "export", ckpt, export)
check("export exits 0", r.returncode == 0, r.stderr[-500:])
check("export writes safetensors and config",
      os.path.exists(os.path.join(export, "model.safetensors")) and
      json.load(open(os.path.join(export, "config.json")))["model_type"] == "gpt2")
try:
    ref = subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True)
    have_torch = ref.returncode == 0
except FileNotFoundError:
    have_torch = False
if have_torch:
    r = subprocess.run(["/usr/bin/python3", os.path.join(here, "..", "layers", "gpt_reference.py"),
                        "--eval", export, tokens, "16"], capture_output=True, text=True)
    check("reference eval runs", r.returncode == 0, r.stderr[-1000:])
    theirs = json.loads(r.stdout) if r.returncode == 0 else {}
    rel = abs(ours.get("loss", 0) - theirs.get("loss", 1)) / abs(theirs.get("loss", 1))
    check("zerort eval == PyTorch on the exported weights (1e-5)", rel <= 1e-5,
          f"{ours} {theirs}")
else:
    print("SKIPPED: the PyTorch comparison of the export (python3-torch not installed)")

checks.finish()
