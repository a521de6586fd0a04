#!/usr/bin/env python3
"""A checkpoint is untrusted input: tampered file names (`..`, `/`, absolute), symbolic links to
files outside it and to /dev/zero, FIFOs and directories in place of shards, a `latest` that
points elsewhere, a metadata file that is a link to /dev/zero; metadata keys of the wrong type or
out of range, shapes negative or huge, pieces that overlap or leave a hole while their lengths add
up, a parameter named twice (in params or in a rank's pieces), an embedded config nested 100,000
deep, a 2 MiB name, duplicate keys. Every loader
(`train --resume`, `checkpoint inspect`, `checkpoint export`, `eval`) refuses each with exit 2 and
a message naming the file, within a few seconds, without reading outside the checkpoint, and
nothing is changed. Usage: checkpoint_test.py PATH_TO_ZERORT"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from harness import Checks  # noqa: E402

zerort = sys.argv[1]
checks = Checks("hostile_checkpoint_test")
check = checks.check
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
CONFIG = {
    "train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "seq_len": 32, "vocab_size": 256},
    "train": {"steps": 2, "eval_windows": 1, "sample_tokens": 0, "device": "cpu"},
}


def run(*args, timeout=60):
    start = time.time()
    r = subprocess.run([zerort, *args], capture_output=True, text=True, env=env, timeout=timeout)
    return r, time.time() - start


def digest(root):
    out = {}
    for d, dirs, files in os.walk(root):
        for name in files + dirs:
            path = os.path.join(d, name)
            rel = os.path.relpath(path, root)
            if name == ".zerort.lock":  # a loader's own lock, not the checkpoint's content
                continue
            if os.path.islink(path):
                out[rel] = "link:" + os.readlink(path)
            elif os.path.isfile(path) and not name.endswith(".fifo"):
                with open(path, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


# One good checkpoint, copied and tampered per case.
good = os.path.join(tmp, "good")
cfg_path = os.path.join(tmp, "run.json")
with open(cfg_path, "w") as f:
    json.dump(dict(CONFIG, checkpoint={"dir": good}), f)
r, _ = run("train", cfg_path)
check("the good checkpoint is written", r.returncode == 0, r.stderr[-1500:])
outside = os.path.join(tmp, "outside.bin")
with open(outside, "wb") as f:
    f.write(b"\0" * 4096)


def tamper(name, edit):
    """A copy of the good checkpoint directory with `edit(step_dir, metadata)` applied."""
    d = os.path.join(tmp, name)
    shutil.copytree(good, d, symlinks=True)
    step = os.path.join(d, "step_2")
    with open(os.path.join(step, "metadata.json")) as f:
        meta = json.load(f)
    if edit(d, step, meta) is not False:
        with open(os.path.join(step, "metadata.json"), "w") as f:
            json.dump(meta, f)
    return d


def rename_file(meta, new):
    meta["ranks"][0]["files"]["master"]["name"] = new


def replace_master(step, make):
    path = os.path.join(step, "dp0-tp0.master.bin")
    os.remove(path)
    make(path)


cases = [
    ("a file name with ..", lambda d, s, m: rename_file(m, "../../outside.bin"),
     "is not a plain name inside the checkpoint"),
    ("an absolute file name", lambda d, s, m: rename_file(m, outside),
     "is not a plain name inside the checkpoint"),
    ("a file name with /", lambda d, s, m: rename_file(m, "sub/dp0-tp0.master.bin"),
     "is not a plain name inside the checkpoint"),
    ("an empty file name", lambda d, s, m: rename_file(m, ""),
     "is not a plain name inside the checkpoint"),
    ("a shard that links outside",
     lambda d, s, m: replace_master(s, lambda p: os.symlink(outside, p)), "a symbolic link"),
    ("a shard that links to /dev/zero",
     lambda d, s, m: replace_master(s, lambda p: os.symlink("/dev/zero", p)), "a symbolic link"),
    ("a shard that is a FIFO", lambda d, s, m: replace_master(s, os.mkfifo),
     "not a regular file"),
    ("a shard that is a directory", lambda d, s, m: replace_master(s, os.mkdir),
     "not a regular file"),
    ("metadata that links to /dev/zero",
     lambda d, s, m: (os.remove(os.path.join(s, "metadata.json")),
                      os.symlink("/dev/zero", os.path.join(s, "metadata.json")), False)[-1],
     "a symbolic link"),
    ("latest naming ../", lambda d, s, m: (open(os.path.join(d, "latest"), "w").write("../good/step_2\n"), None)[-1],
     "does not name a step_<N> directory"),
    ("latest naming step_02", lambda d, s, m: (open(os.path.join(d, "latest"), "w").write("step_02\n"), None)[-1],
     "does not name a step_<N> directory"),
    ("a step directory that links elsewhere",
     lambda d, s, m: (shutil.move(s, os.path.join(d, "real_step")),
                      os.symlink(os.path.join(d, "real_step"), s), False)[-1],
     "not a directory"),
    ("latest that links to /dev/zero",
     lambda d, s, m: (os.remove(os.path.join(d, "latest")),
                      os.symlink("/dev/zero", os.path.join(d, "latest")), None)[-1],
     "a symbolic link"),
]


def meta_edit(change):
    def edit(d, s, m):
        change(m)
    return edit


def shift_length(m):
    # wte one short, the next piece one longer: the lengths (and the file) still add up.
    pieces = m["ranks"][0]["pieces"]
    pieces[0][2] -= 1
    pieces[1][2] += 1


def split_first_piece(m):
    # wte's piece as two pieces of the same parameter: the same bytes, still tiling it.
    pieces = m["ranks"][0]["pieces"]
    name, begin, length = pieces[0]
    pieces[0:1] = [[name, begin, 1], [name, begin + 1, length - 1]]


def shrink_ln_f_bias(m):
    p = next(p for p in m["params"] if p["name"] == "ln_f.bias")
    p["padded_shape"] = p["shape"]
    p["shape"] = [1]


def rename_ln_f_bias(m):
    next(p for p in m["params"] if p["name"] == "ln_f.bias")["name"] = "ln_f.bias2"
    for rank in m["ranks"]:
        for piece in rank["pieces"]:
            if piece[0] == "ln_f.bias":
                piece[0] = "ln_f.bias2"


# Metadata that is wrong in type, range or structure: one validator, shared by every loader and
# inspect, refuses it naming the JSON path.
cases += [
    ("step a string", meta_edit(lambda m: m.update(step="x")), "step = \"x\""),
    ("consumed sequences negative",
     meta_edit(lambda m: m["run_state"].update(consumed_sequences=-5)),
     "run_state.consumed_sequences = -5"),
    ("run step beyond 2^53", meta_edit(lambda m: m["run_state"].update(step=2**60)),
     "run_state.step"),
    ("loss scale negative", meta_edit(lambda m: m["run_state"]["loss_scaler"].update(scale=-1)),
     "run_state.loss_scaler.scale"),
    ("saved_with not an object", meta_edit(lambda m: m.update(saved_with=5)), "saved_with = 5"),
    ("no model in the config", meta_edit(lambda m: m["config"].pop("model")), "config.model"),
    ("params a string", meta_edit(lambda m: m.update(params="x")), "params = \"x\""),
    ("a negative shape", meta_edit(lambda m: m["params"][0].update(shape=[-1, 32])),
     "params[0].shape"),
    ("a 2^45-element shape", meta_edit(lambda m: m["params"][0].update(shape=[2**40, 32])),
     "params[0].shape"),
    # Products past 2^64: the count must not wrap around to a small number on its way.
    ("a 2^80-element shape", meta_edit(lambda m: m["params"][0].update(shape=[2**40, 2**40])),
     "params[0].shape"),
    ("a 2^64 + 2^33-element shape",
     meta_edit(lambda m: m["params"][0].update(shape=[2**33, 2**31 + 1])), "params[0].shape"),
    ("a negative piece offset", meta_edit(lambda m: m["ranks"][0]["pieces"][0].__setitem__(1, -7)),
     "ranks[0].pieces[0]"),
    ("a piece stored twice",
     meta_edit(lambda m: m["ranks"][0]["pieces"].append(list(m["ranks"][0]["pieces"][0]))),
     "metadata.json"),
    ("pieces whose lengths add up around a hole", meta_edit(shift_length), "metadata.json"),
    ("ranks an object", meta_edit(lambda m: m.update(ranks={})), "ranks = {}"),
    # 1-bit LAMB's scalars ([Note: 1-bit LAMB]): validated before any loader reads them.
    ("1-bit LAMB scalars of the wrong kind",
     meta_edit(lambda m: m["params"][0].update(onebit_lamb=[0.1, "x", 1.0])),
     "params[0].onebit_lamb"),
    ("1-bit LAMB scalars too few", meta_edit(lambda m: m["params"][0].update(onebit_lamb=[1])),
     "params[0].onebit_lamb"),
    ("1-bit LAMB scalars an object",
     meta_edit(lambda m: m["params"][0].update(onebit_lamb={"coeff_freeze": 1})),
     "params[0].onebit_lamb"),
    ("1-bit LAMB scalars negative",
     meta_edit(lambda m: m["params"][0].update(onebit_lamb=[0.1, -1.0, 1.0])),
     "params[0].onebit_lamb"),
    ("1-bit LAMB scalars huge",
     meta_edit(lambda m: m["params"][0].update(onebit_lamb=[1e300, 1.0, 1.0])),
     "params[0].onebit_lamb"),
    # A parameter named twice: export wrote it twice and exited 0.
    ("a parameter named twice in params",
     meta_edit(lambda m: m["params"].append(dict(m["params"][0]))),
     "parameter 'wte' is named twice in params (params[0] and params["),
    # A parameter's shape shrunk inside its padded shape: the pieces still tile the padded frame,
    # so only the saved config's model can say it is wrong (inspect said "all ok", export wrote
    # it; resume and eval refused it against their own model).
    ("a shape shrunk inside its padded shape", meta_edit(shrink_ln_f_bias),
     "parameter 'ln_f.bias' has shape 1"),
    ("a parameter the config's model does not have", meta_edit(rename_ln_f_bias),
     "'ln_f.bias"),  # inspect and export name ln_f.bias2, resume and eval the missing ln_f.bias
    ("a parameter named twice in a rank's pieces", meta_edit(split_first_piece),
     "parameter 'wte' is named twice in ranks[0].pieces (ranks[0].pieces[0] and "
     "ranks[0].pieces[1])"),
]


def nested_deep(key):
    """metadata.json with `key` a 100,000-deep array: every loader once crashed on such a config
    (SIGSEGV, recursion); an embedder's own JSON (`user`, any value) is refused the same way."""
    def case(d, s, m):
        text = json.dumps(dict(m, **{key: "DEEP"})).replace('"DEEP"', "[" * 100000 + "]" * 100000)
        with open(os.path.join(s, "metadata.json"), "w") as f:
            f.write(text)
        return False
    return case


def long_name(m):
    m["params"][0]["name"] = "w" * (2 << 20)


cases += [
    ("a config nested 100,000 deep", nested_deep("config"),
     "nested more than 64 levels deep at 'config[0]"),
    ("a user JSON nested 100,000 deep", nested_deep("user"),
     "nested more than 64 levels deep at 'user[0]"),
    # config: an object (zerort train's) or null (an embedder's, checkpoint/manager_checkpoint.h).
    ("config a string", meta_edit(lambda m: m.update(config="x")), "config = \"x\""),
    ("config an array", meta_edit(lambda m: m.update(config=[])), "config = []"),
    ("a 2 MiB parameter name", meta_edit(long_name), "a string of 2097152 bytes"),
    ("duplicate keys", lambda d, s, m: (open(os.path.join(s, "metadata.json"), "w").write(
        json.dumps(m)[:-1] + ', "step": 2}'), False)[-1], "duplicate key 'step'"),
    # A 300 MiB metadata file (sparse: no disk used) is refused by its size, never read.
    ("a 300 MiB metadata file", lambda d, s, m: (os.truncate(os.path.join(s, "metadata.json"),
                                                             300 << 20), False)[-1],
     "metadata.json: 314572800 bytes, more than the 268435456"),
]
for index, (what, edit, message) in enumerate(cases):
    d = tamper(f"case_{index}", edit)
    before = digest(d)
    outside_before = digest(tmp)["outside.bin"]
    resume_cfg = os.path.join(tmp, "resume.json")
    with open(resume_cfg, "w") as f:
        json.dump(dict(CONFIG, checkpoint={"dir": d}, train=dict(CONFIG["train"], steps=3)), f)
    for loader, args in [("train --resume", ["train", resume_cfg, "--resume"]),
                         ("checkpoint inspect", ["checkpoint", "inspect", d]),
                         ("checkpoint export", ["checkpoint", "export", d,
                                                os.path.join(tmp, "export_out")]),
                         ("eval", ["eval", resume_cfg, "--checkpoint", d])]:
        r, seconds = run(*args)
        code_ok = r.returncode == 2
        # inspect reports a damaged shard file in its table and exits 2; other loaders refuse.
        said = message in r.stderr or message in r.stdout
        check(f"{what}: {loader} exits 2", code_ok, f"{r.returncode} {r.stderr[-600:]}")
        check(f"{what}: {loader} says why", said, (r.stderr + r.stdout)[-600:])
        check(f"{what}: {loader} within a few seconds", seconds < 10, f"{seconds:.1f} s")
    check(f"{what}: nothing changed", digest(d) == before)
    check(f"{what}: the outside file untouched", digest(tmp)["outside.bin"] == outside_before)

# A GPT checkpoint with its config nulled is read as an embedder's (checkpoint/manager_checkpoint.h):
# inspect prints it (exit 0); export and train --resume refuse it saying why (exit 2); nothing
# changes.
d = tamper("embedder", meta_edit(lambda m: m.update(config=None, user={"note": "\u00e9" * 400})))
before = digest(d)
resume_cfg = os.path.join(tmp, "resume_embedder.json")
with open(resume_cfg, "w") as f:
    json.dump(dict(CONFIG, checkpoint={"dir": d}, train=dict(CONFIG["train"], steps=3)), f)
for loader, args, code, message in [
        ("checkpoint inspect", ["checkpoint", "inspect", d], 0, "embeds zerort (no model config)"),
        ("checkpoint export", ["checkpoint", "export", d, os.path.join(tmp, "export_embedder")],
         2, "no model config"),
        ("train --resume", ["train", resume_cfg, "--resume"], 2, "embeds zerort (no run config)")]:
    r, seconds = run(*args)
    check(f"an embedder's checkpoint: {loader} exits {code}", r.returncode == code,
          f"{r.returncode} {r.stderr[-600:]}")
    check(f"an embedder's checkpoint: {loader} says so", message in r.stderr + r.stdout,
          (r.stderr + r.stdout)[-600:])
check("an embedder's checkpoint: nothing changed", digest(d) == before)

sys.exit(checks.finish())
