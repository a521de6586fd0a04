#!/usr/bin/env python3
"""Hostile and careless launches under mpirun: ranks that run different configs (an MPMD job, a
--set on one rank) exit 2 on every rank naming the first differing key and both values, before
any training collective and before anything is written; a rank that fails alone mid-run ends the
job with its own error and exit code, not the others' collective timeout.
Usage: mpi_test.py PATH_TO_ZERORT MPIEXEC"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from harness import Checks  # noqa: E402

zerort, mpiexec = sys.argv[1], sys.argv[2]
checks = Checks("hostile_mpi_test")
check = checks.check
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
BASE = {
    "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "seq_len": 32, "vocab_size": 256},
    "train": {"steps": 2, "eval_windows": 1, "sample_tokens": 0, "device": "cpu"},
}


def write(name, obj):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def mpmd(*ranks, env_of=lambda rank: []):
    cmd = [mpiexec]
    for i, args in enumerate(ranks):
        if i:
            cmd.append(":")
        cmd += ["-np", "1", "--oversubscribe", *env_of(i), zerort, "train", *args]
    start = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    return r, time.time() - start


ckpt = os.path.join(tmp, "ckpt")
a = write("a.json", dict(BASE, checkpoint={"dir": ckpt}))
b = write("b.json", dict(BASE, checkpoint={"dir": ckpt},
                         model=dict(BASE["model"], n_head=4)))
cases = [
    ("another n_head on rank 1", [[a], [b]], "at model.n_head rank 0 has 2, rank 1 has 4",
     "at model.n_head rank 1 has 4, rank 0 has 2"),
    ("a --set on rank 1 only", [[a], [a, "--set", "train.steps=3"]],
     "at train.steps rank 0 has 2, rank 1 has 3", "at train.steps rank 1 has 3, rank 0 has 2"),
    ("rank 2 of 3 differs", [[a], [a], [a, "--set", "optimizer.params.lr=0.01"]],
     "at optimizer.params.lr rank 0 has 0.001, rank 2 has 0.01",
     "at optimizer.params.lr rank 2 has 0.01, rank 0 has 0.001"),
]
for what, ranks, says0, says_other in cases:
    r, seconds = mpmd(*ranks)
    check(f"{what}: exit 2", r.returncode == 2, f"{r.returncode} {r.stderr[-1500:]}")
    check(f"{what}: rank 0 names the key and both values", says0 in r.stderr, r.stderr[-1500:])
    check(f"{what}: the differing rank too", says_other in r.stderr, r.stderr[-1500:])
    check(f"{what}: within a few seconds", seconds < 20, f"{seconds:.1f} s")
    check(f"{what}: nothing written", not os.path.exists(os.path.join(ckpt, "latest")),
          str(os.listdir(ckpt)) if os.path.exists(ckpt) else "")
r, _ = mpmd([a, "--set", "train.steps=2"], [a])  # the same resolved config both ways
check("the same config reached two ways runs", r.returncode == 0, r.stderr[-1500:])

# A rank that fails alone mid-run (an injected NVMe write error on rank 1 only): the job ends
# with that rank's error and exit code ([Note: leaving after an error]), not 60 s later with
# rank 0's collective timeout (exit 3), which is what happened before.
nvme = os.path.join(tmp, "nvme")
os.makedirs(nvme)
f = write("fault.json", dict(BASE, train=dict(BASE["train"], steps=20),
                             parallel={"collective_timeout_s": 60},
                             zero_optimization={"stage": 3, "offload_optimizer": {
                                 "device": "nvme", "nvme_path": nvme}}))
r, seconds = mpmd([f], [f], env_of=lambda rank: ["-x", "ZERORT_FAIL_NVME_REQUEST=40"] if rank else [])
check("rank 1 fails alone: exit 1 (its I/O error), not 3", r.returncode == 1,
      f"{r.returncode} {r.stderr[-2000:]}")
check("rank 1 fails alone: its error is reported", "[rank 1/2]" in r.stderr and
      "Input/output error" in r.stderr, r.stderr[-2000:])
check("rank 1 fails alone: it ends the job saying why", "ending the job now" in r.stderr,
      r.stderr[-2000:])
check("rank 1 fails alone: no collective timeout", "timed out" not in r.stderr, r.stderr[-2000:])
print(f"hostile_mpi_test: a rank failing alone ended the job in {seconds:.1f} s")

# A NaN in model.init_from's weights that only one rank fills (the embedding, on the first
# pipeline stage): every rank leaves at once with exit 2, that rank naming the tensor and the
# other saying another rank refused ([Note: weights that are not numbers]).
golden = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "layers", "golden")
hf_nan = os.path.join(tmp, "hf_nan")
shutil.copytree(os.path.join(golden, "llama_tiny_hf"), hf_nan)
with open(os.path.join(hf_nan, "config.json")) as fh:
    hf = json.load(fh)
with open(os.path.join(hf_nan, "model.safetensors.index.json")) as fh:
    shard = os.path.join(hf_nan, json.load(fh)["weight_map"]["model.embed_tokens.weight"])
with open(shard, "r+b") as fh:
    (size,) = struct.unpack("<Q", fh.read(8))
    begin = json.loads(fh.read(size))["model.embed_tokens.weight"]["data_offsets"][0]
    fh.seek(8 + size + begin)
    fh.write(struct.pack("<f", float("nan")))
tokens = os.path.join(tmp, "tokens.bin")
with open(tokens, "wb") as fh:
    fh.write(struct.pack("<4096H", *[i * 7 % 23 for i in range(4096)]))
n = write("nan.json", dict(
    BASE, data={"path": tokens, "format": "uint16"}, parallel={"pipeline_parallel_size": 2},
    model={"arch": "llama", "n_layer": hf["num_hidden_layers"],
           "n_head": hf["num_attention_heads"], "n_kv_head": hf["num_key_value_heads"],
           "d_model": hf["hidden_size"], "intermediate_size": hf["intermediate_size"],
           "rope_theta": hf["rope_theta"], "rms_norm_eps": hf["rms_norm_eps"],
           "seq_len": hf["max_position_embeddings"], "vocab_size": hf["vocab_size"],
           "init_from": hf_nan}))
r, seconds = mpmd([n], [n])
check("a NaN weight on one stage: exit 2", r.returncode == 2, f"{r.returncode} {r.stderr[-1500:]}")
check("a NaN weight on one stage: its rank names the tensor",
      "[rank 0/2] [error] model.init_from: " in r.stderr and
      "tensor 'model.embed_tokens.weight' holds nan at element 0" in r.stderr, r.stderr[-1500:])
check("a NaN weight on one stage: the other rank says another refused",
      "[rank 1/2] [error] another rank refused to start the run: model.init_from" in r.stderr,
      r.stderr[-1500:])
check("a NaN weight on one stage: within a few seconds", seconds < 20, f"{seconds:.1f} s")

sys.exit(checks.finish())
