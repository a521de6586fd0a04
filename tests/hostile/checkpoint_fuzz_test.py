#!/usr/bin/env python3
"""Checkpoints a fuzzer damages: a GPT-2 and a LLaMA checkpoint of a tiny run, each mutant with
one or two values of its metadata.json changed at a random place (its saved run config included,
which `checkpoint inspect` and `export` now build the model from): a value of another type, an
extreme number, a neighbouring number, a key or element removed, an element doubled, a parameter
name swapped for another. Every mutant goes through `checkpoint inspect` and `checkpoint export`,
and some through `eval` and `train --resume`; and the Hugging Face directories the two export
to, their config.json or safetensors header damaged, through `checkpoint import` and some
through `train` with model.init_from. Each must end as the README's exit codes say, 0 or
2 with an error line (never a signal, an abort, exit 1 or a hang), within seconds, and leave the
saved step's files and a file beside them as they were. Deterministic: ZR_FUZZ_SEED and
ZR_CHECKPOINT_FUZZ_TRIALS (default 2026 and 40; ZR_CHECKPOINT_FUZZ_HF_TRIALS, default two thirds
of it) choose another sample.
Usage: checkpoint_fuzz_test.py PATH_TO_ZERORT"""
import copy
import hashlib
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

zerort = sys.argv[1]
seed = int(os.environ.get("ZR_FUZZ_SEED", "2026"))
trials = int(os.environ.get("ZR_CHECKPOINT_FUZZ_TRIALS", "40"))
hf_trials = int(os.environ.get("ZR_CHECKPOINT_FUZZ_HF_TRIALS", str(trials * 2 // 3)))
rng = random.Random(seed)
checks = Checks("hostile_checkpoint_fuzz_test")
check = checks.check
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
tmp = tempfile.mkdtemp()

HOSTILE = [0, -1, 1, 2, 1.5, -0.5, 1e300, 2**31, 2**53, 2**63 - 1, -2**63, "", "x", "..",
           "/dev/zero", "a" * 5000, None, True, False, [], [1, 2], [[0, 1]], {}, {"a": 1}]


def run(args, timeout=60):
    t0 = time.monotonic()
    try:
        r = subprocess.run([zerort, *args], cwd=tmp, capture_output=True, text=True,
                           errors="replace", env=env, timeout=timeout)
        return r.returncode, r.stderr + r.stdout, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        return "hang", "", time.monotonic() - t0


def digest(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        if not os.path.isfile(os.path.join(folder, name)):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def config(arch, ckpt, steps):
    cfg = tiny_run(steps)
    cfg["train"]["device"] = "cpu"
    cfg["checkpoint"] = {"dir": ckpt, "interval": 2}
    if arch == "llama":
        cfg["model"].update({"arch": "llama", "n_kv_head": 1, "intermediate_size": 64})
    return cfg


# The two checkpoints every mutant starts from (step_2 of a 2-step run).
bases = {}
for arch in ["gpt2", "llama"]:
    ckpt = os.path.join(tmp, f"base_{arch}")
    path = os.path.join(tmp, f"{arch}.json")
    with open(path, "w") as f:
        json.dump(config(arch, ckpt, 2), f)
    rc, out, _ = run(["train", path])
    check(f"{arch}: the base checkpoint trains", rc == 0, out[-400:])
    with open(os.path.join(ckpt, "step_2", "metadata.json")) as f:
        bases[arch] = (ckpt, json.load(f))


def places(node, path=()):
    """Every value's path in a JSON tree (the root excluded)."""
    out = []
    items = node.items() if isinstance(node, dict) else \
        enumerate(node) if isinstance(node, list) else []
    for key, child in items:
        out.append(path + (key,))
        out.extend(places(child, path + (key,)))
    return out


def mutate(meta, names):
    """One change at a random place of `meta`; a description of it."""
    path = rng.choice(places(meta))
    parent = meta
    for key in path[:-1]:
        parent = parent[key]
    key, value = path[-1], parent[path[-1]]
    where = ".".join(str(k) for k in path)
    kind = rng.random()
    if kind < 0.15:
        del parent[key]
        return f"{where} removed"
    if kind < 0.25 and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(value))
        return f"{where} doubled"
    if kind < 0.5 and isinstance(value, (int, float)) and not isinstance(value, bool):
        new = rng.choice([value + 1, value - 1, value * 2, -value, 0, value // 2 if
                          isinstance(value, int) else value / 2])
    elif kind < 0.6 and isinstance(value, str):
        new = rng.choice(names)
    else:
        new = rng.choice(HOSTILE)
    parent[key] = new
    shown = new if not isinstance(new, str) or len(new) < 40 else f"<{len(new)} chars>"
    return f"{where}={json.dumps(shown)}"


def remove(*path):
    def change(meta):
        parent = meta
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        return ".".join(path) + " removed"
    return change


# Mutants a fuzzer found, run first whatever the seed: export read the saved config's model
# section as the file had it, and a LLaMA checkpoint without rope_theta aborted it (seed 2, 500).
REGRESSIONS = [("llama", remove("config", "model", "rope_theta")),
               ("gpt2", remove("config", "model", "seq_len"))]

def exercise(what, name, args):
    """One command on a mutant: exit 0 or 2 with a message (an error line, or inspect's
    MISMATCH), no crash report, within seconds."""
    rc, out, seconds = run(args)
    outcomes[(name, rc)] = outcomes.get((name, rc), 0) + 1
    last = out.strip().splitlines()[-1][:300] if out.strip() else ""
    check(f"{what}: {name} exits 0 or 2", rc in (0, 2), f"rc={rc}: {last}")
    if rc == 2:
        check(f"{what}: {name} says why", "error" in out or "MISMATCH" in out, out[-300:])
    check(f"{what}: {name} no crash report",
          not re.search(r"terminate called|Assertion|Sanitizer|Segmentation|core dumped|"
                        r"runtime error", out), out[-300:])
    check(f"{what}: {name} within seconds", seconds < 20, f"{seconds:.1f} s")


outside = os.path.join(tmp, "outside.bin")
with open(outside, "wb") as f:
    f.write(b"keep me\n")
outcomes = {}
started = time.time()
for trial in range(len(REGRESSIONS) + trials):
    regression = REGRESSIONS[trial] if trial < len(REGRESSIONS) else None
    arch = regression[0] if regression else rng.choice(list(bases))
    base_dir, base_meta = bases[arch]
    meta = copy.deepcopy(base_meta)
    names = [p["name"] for p in base_meta["params"]]
    changes = [regression[1](meta)] if regression else \
        [mutate(meta, names) for _ in range(rng.choice([1, 1, 2]))]
    work = os.path.join(tmp, "mutant")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base_dir, work)
    step = os.path.join(work, "step_2")
    with open(os.path.join(step, "metadata.json"), "w") as f:
        json.dump(meta, f)
    before, kept = digest(step), digest(tmp)["outside.bin"]
    what = f"trial {trial} ({arch}: {'; '.join(changes)})"
    commands = [("inspect", ["checkpoint", "inspect", work]),
                ("export", ["checkpoint", "export", work, os.path.join(tmp, "export")])]
    if trial % 4 == 0:
        cfg = config(arch, work, 3)
        with open(os.path.join(tmp, "resume.json"), "w") as f:
            json.dump(cfg, f)
        commands += [("eval", ["eval", "resume.json", "--checkpoint", work, "--max-windows", "2"]),
                     ("resume", ["train", "resume.json", "--resume"])]
    for name, args in commands:
        exercise(what, name, args)
        shutil.rmtree(os.path.join(tmp, "export"), ignore_errors=True)
    check(f"{what}: the saved step unchanged", digest(step) == before)
    check(f"{what}: the file beside it unchanged", digest(tmp)["outside.bin"] == kept)

# Hugging Face directories (each base checkpoint exported: config.json and model.safetensors)
# with config.json or the safetensors header (JSON after an 8-byte length) damaged the same
# way, or the header's length itself: `checkpoint import` reads every mutant, a quarter also
# trains from it (model.init_from). Exit 0 or 2; the directory unchanged.
hf_bases = {}
for arch, (base_dir, _) in bases.items():
    out = os.path.join(tmp, f"hf_{arch}")
    rc, text, _ = run(["checkpoint", "export", base_dir, out])
    check(f"{arch}: the base checkpoint exports", rc == 0, text[-400:])
    with open(os.path.join(out, "config.json")) as f:
        hf_config = json.load(f)
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        blob = f.read()
    length = int.from_bytes(blob[:8], "little")
    hf_bases[arch] = (hf_config, json.loads(blob[8:8 + length]), blob[8 + length:])
for trial in range(hf_trials):
    arch = rng.choice(list(hf_bases))
    hf_config, header, data = copy.deepcopy(hf_bases[arch])
    names = list(header)
    target = rng.choice(["config.json", "header", "header", "length"])
    if target == "config.json":
        changes = [mutate(hf_config, names) for _ in range(rng.choice([1, 1, 2]))]
    elif target == "header":
        changes = [mutate(header, names) for _ in range(rng.choice([1, 1, 2]))]
    head = json.dumps(header).encode()
    length = len(head)
    if target == "length":
        length = rng.choice([0, 1, length - 1, length + 1, len(head) + len(data) + 8, 2**40,
                             2**64 - 1])
        changes = [f"header length {length}"]
    work = os.path.join(tmp, "hf_mutant")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with open(os.path.join(work, "config.json"), "w") as f:
        json.dump(hf_config, f)
    with open(os.path.join(work, "model.safetensors"), "wb") as f:
        f.write(length.to_bytes(8, "little") + head + data)
    before, kept = digest(work), digest(tmp)["outside.bin"]
    what = f"hf trial {trial} ({arch} {target}: {'; '.join(changes)})"
    commands = [("import", ["checkpoint", "import", work, os.path.join(tmp, "imported")])]
    if trial % 4 == 0:
        cfg = config(arch, os.path.join(tmp, "init_ckpt"), 1)
        cfg["model"]["init_from"] = work
        with open(os.path.join(tmp, "init.json"), "w") as f:
            json.dump(cfg, f)
        commands.append(("init_from", ["train", "init.json"]))
    for name, args in commands:
        exercise(what, name, args)
        for left in ["imported", "init_ckpt"]:
            shutil.rmtree(os.path.join(tmp, left), ignore_errors=True)
    check(f"{what}: the directory unchanged", digest(work) == before)
    check(f"{what}: the file beside it unchanged", digest(tmp)["outside.bin"] == kept)
print(f"checkpoint_fuzz_test: seed {seed}, {trials} checkpoint and {hf_trials} Hugging Face "
      f"mutants in {time.time() - started:.0f} s; "
      f"exit codes {dict(sorted(outcomes.items(), key=str))}")
shutil.rmtree(tmp, ignore_errors=True)
checks.finish()
