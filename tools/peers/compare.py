#!/usr/bin/env python3
"""make bench-peers: zerort's training step against PyTorch's on the same machine, in one run.

For each shape (docs/benchmarks.md: tiny, small 30M, GPT-2 124M at seq 256; and the LLaMA
family's at the small and 124M-class sizes, llama-small and llama-124m), three
rounds, interleaved: `zerort bench model --phases --json` (forward + backward + AdamW step, ZeRO-0,
one process) and tools/peers/pytorch_gpt.py (Debian's PyTorch), each side in every setting that
can make it faster, each side's best setting compared:

- OpenBLAS's kernel set, for both sides (both use Debian's OpenBLAS 0.3.21): the environment's
  OPENBLAS_CORETYPE when one is set (this project's machines set Haswell, the AVX2 kernels), the
  set OpenBLAS detects itself (the variable removed), and SkylakeX (its AVX-512 kernels) where the
  CPU has AVX-512;
- for PyTorch, also OMP_WAIT_POLICY: its default (its OpenMP threads spin, against OpenBLAS's) and
  PASSIVE (they sleep).

Every side gets the same number of threads. Prints markdown tables of medians: each side's best
tokens/s and which setting gave it, zerort's ratio to PyTorch's best, zerort's PaLM FLOP/s against
the same run's sgemm 2048^3 rate (in the same setting), then every setting's median.

usage: compare.py ZERORT [--threads 2] [--rounds 3] [--shapes tiny,small,gpt2,llama-small,llama-124m]
                  [--python PY]
(PY: the interpreter with Debian's python3-torch, /usr/bin/python3 by default)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = {  # layers, d, heads, seq, batch, vocab, measured iterations
    "tiny": (4, 128, 4, 128, 8, 256, 10),
    "small": (6, 384, 6, 256, 4, 50257, 3),
    "gpt2": (12, 768, 12, 256, 2, 50257, 3),
    "llama-small": (6, 384, 6, 256, 4, 32000, 3),
    "llama-124m": (12, 768, 12, 256, 2, 32000, 3),
}
# The LLaMA shapes' own keys: key/value heads, SwiGLU width (about 8/3 d, as LLaMA's).
LLAMA = {"llama-small": (2, 1024), "llama-124m": (4, 2048)}


def run_json(command, env):
    r = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"compare.py: {' '.join(command)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    lines = r.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        sys.exit(f"compare.py: {' '.join(command)} printed no JSON line: {r.stdout[-500:]!r}")


def write_config(folder, name):
    """The shape's zerort config (ZeRO-0, AdamW, the CPU) in `folder`; returns its path."""
    layers, d, heads, seq, batch, vocab, _ = SHAPES[name]
    config = os.path.join(folder, name + ".json")
    with open(config, "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": batch,
                   "zero_optimization": {"stage": 0},
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}},
                   "model": dict({"n_layer": layers, "n_head": heads, "d_model": d,
                                  "seq_len": seq, "vocab_size": vocab},
                                 **({"arch": "llama", "n_kv_head": LLAMA[name][0],
                                     "intermediate_size": LLAMA[name][1]}
                                    if name in LLAMA else {})),
                   "train": {"device": "cpu"}}, f)
    return config


def bench_command(zerort, config, iters):
    """zerort's full step (forward, backward, AdamW) on `config`, as one JSON line."""
    return [zerort, "bench", "model", "--config", config, "--cpu", "--iters", str(iters),
            "--phases", "--json"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("zerort")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", default="tiny,small,gpt2")
    p.add_argument("--python", default="/usr/bin/python3")
    a = p.parse_args()
    unknown = [s for s in a.shapes.split(",") if s not in SHAPES]
    if unknown or a.threads < 1 or a.rounds < 1:
        p.error(f"--shapes takes {', '.join(SHAPES)} (got {', '.join(unknown)})" if unknown
                else "--threads and --rounds must be at least 1")
    base = dict(os.environ)
    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        base.pop(k, None)
    threads = str(a.threads)
    base.update(OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    cores = {}  # setting name -> environment
    if "OPENBLAS_CORETYPE" in base:
        cores["OPENBLAS_CORETYPE=" + base["OPENBLAS_CORETYPE"]] = dict(base)
    detected = {k: v for k, v in base.items() if k != "OPENBLAS_CORETYPE"}
    cores["OpenBLAS detects"] = detected
    with open("/proc/cpuinfo") as f:
        avx512 = " avx512f " in f.read().replace("\n", " ")
    if avx512 and base.get("OPENBLAS_CORETYPE", "").lower() != "skylakex":
        cores["OPENBLAS_CORETYPE=SkylakeX"] = dict(detected, OPENBLAS_CORETYPE="SkylakeX")
    first = next(iter(cores))
    pt_settings = {"default, " + first: cores[first]}
    pt_settings.update({"PASSIVE, " + k: dict(e, OMP_WAIT_POLICY="PASSIVE")
                        for k, e in cores.items()})
    med = statistics.median
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.shapes.split(","):
            layers, d, heads, seq, batch, vocab, iters = SHAPES[name]
            zerort = bench_command(a.zerort, write_config(tmp, name), iters)
            peer = [a.python, os.path.join(HERE, "pytorch_gpt.py"), "--layers", str(layers),
                    "--d", str(d), "--heads", str(heads), "--seq", str(seq), "--batch",
                    str(batch), "--vocab", str(vocab), "--iters", str(iters), "--threads",
                    threads]
            if name in LLAMA:
                peer += ["--llama", "--kv-heads", str(LLAMA[name][0]), "--ffn",
                         str(LLAMA[name][1])]
            z = {k: [] for k in cores}
            z_sgemm = {k: [] for k in cores}
            pt = {k: [] for k in pt_settings}
            for _ in range(a.rounds):
                for k, e in cores.items():
                    r = run_json(zerort, e)
                    z[k].append(r["step_tokens_per_s"])
                    z_sgemm[k].append(r["step_ratio_to_sgemm"])
                for k, e in pt_settings.items():
                    pt[k].append(run_json(peer, e)["tokens_per_s"])
            z_best = max(z, key=lambda k: med(z[k]))
            pt_best = max(pt, key=lambda k: med(pt[k]))
            rows.append(dict(name=name, shape=f"L{layers} d{d} H{heads} T{seq} B{batch} V{vocab}",
                             z=z, z_sgemm=z_sgemm, pt=pt, z_best=z_best, pt_best=pt_best))
    print(f"threads {threads} per side, {a.rounds} interleaved rounds, medians (tokens/s of a "
          "full training step: forward, backward, AdamW); each side in its fastest setting\n")
    print("| shape | | zerort | its setting | PyTorch | its setting | zerort / PyTorch | "
          "zerort PaLM FLOP/s / sgemm 2048^3 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        zb, pb = r["z_best"], r["pt_best"]
        print(f"| {r['name']} | {r['shape']} | {med(r['z'][zb]):,.0f} | {zb} | "
              f"{med(r['pt'][pb]):,.0f} | {pb} | {med(r['z'][zb]) / med(r['pt'][pb]):.2f} | "
              f"{med(r['z_sgemm'][zb]):.2f} |")
    print("\nevery setting (medians; zerort's sgemm ratio in brackets):\n")
    print("| shape | side | setting | tokens/s | rounds |")
    print("|---|---|---|---|---|")
    for r in rows:
        for k, v in r["z"].items():
            print(f"| {r['name']} | zerort | {k} | {med(v):,.0f} ({med(r['z_sgemm'][k]):.2f}) | "
                  f"{', '.join(str(round(x)) for x in v)} |")
        for k, v in r["pt"].items():
            print(f"| {r['name']} | PyTorch | {k} | {med(v):,.0f} | "
                  f"{', '.join(str(round(x)) for x in v)} |")


if __name__ == "__main__":
    main()
