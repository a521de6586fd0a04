#!/usr/bin/env python3
"""make bench-peers: zerort's training step against PyTorch's on the same machine, in one run.

For each shape (the three of docs/benchmarks.md: tiny, small 30M, GPT-2 124M at seq 256), three
rounds, interleaved: `zerort bench model --phases --json` (forward + backward + AdamW step, ZeRO-0,
one process) and tools/peers/pytorch_gpt.py in PyTorch's default setting and with
OMP_WAIT_POLICY=PASSIVE (its OpenMP threads sleep instead of spinning), and passive with
OPENBLAS_CORETYPE=SkylakeX where the CPU has AVX-512 (OpenBLAS 0.3.21, which Debian's PyTorch
uses, picks its AVX2 kernels on AMD's AVX-512 CPUs). Every side gets the same number of threads. Prints a markdown table of medians: tokens/s per side, zerort's ratio to the
best PyTorch setting, and zerort's PaLM FLOP/s against the same run's sgemm 2048^3 rate.

usage: compare.py ZERORT [--threads 2] [--rounds 3] [--shapes tiny,small,gpt2] [--python PY]
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
}


def run_json(command, env):
    r = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"compare.py: {' '.join(command)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


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
    env = dict(base, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    passive = dict(env, OMP_WAIT_POLICY="PASSIVE")
    with open("/proc/cpuinfo") as f:
        avx512 = " avx512f " in f.read().replace("\n", " ")
    passive512 = dict(passive, OPENBLAS_CORETYPE="SkylakeX") if avx512 else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.shapes.split(","):
            layers, d, heads, seq, batch, vocab, iters = SHAPES[name]
            config = os.path.join(tmp, name + ".json")
            with open(config, "w") as f:
                json.dump({"train_micro_batch_size_per_gpu": batch,
                           "zero_optimization": {"stage": 0},
                           "optimizer": {"type": "AdamW",
                                         "params": {"lr": 1e-4, "weight_decay": 0.1}},
                           "model": {"n_layer": layers, "n_head": heads, "d_model": d,
                                     "seq_len": seq, "vocab_size": vocab},
                           "train": {"device": "cpu"}}, f)
            peer = [a.python, os.path.join(HERE, "pytorch_gpt.py"), "--layers", str(layers),
                    "--d", str(d), "--heads", str(heads), "--seq", str(seq), "--batch",
                    str(batch), "--vocab", str(vocab), "--iters", str(iters), "--threads",
                    threads]
            z, pt, pt_passive, pt_512, ratio_sgemm = [], [], [], [], []
            for _ in range(a.rounds):
                r = run_json([a.zerort, "bench", "model", "--config", config, "--cpu", "--iters",
                              str(iters), "--phases", "--json"], env)
                z.append(r["step_tokens_per_s"])
                ratio_sgemm.append(r["step_ratio_to_sgemm"])
                pt.append(run_json(peer, env)["tokens_per_s"])
                pt_passive.append(run_json(peer, passive)["tokens_per_s"])
                if passive512:
                    pt_512.append(run_json(peer, passive512)["tokens_per_s"])
            med = statistics.median
            p512 = med(pt_512) if pt_512 else float("nan")
            best = max(med(pt), med(pt_passive), p512 if pt_512 else 0)
            rows.append((name, f"L{layers} d{d} H{heads} T{seq} B{batch} V{vocab}", med(z), med(pt),
                         med(pt_passive), p512, med(z) / best, med(ratio_sgemm), z, pt,
                         pt_passive, pt_512))
    print(f"threads {threads} per side, {a.rounds} interleaved rounds, medians (tokens/s of a "
          "full training step: forward, backward, AdamW)\n")
    print("| shape | | zerort | PyTorch default | PyTorch OMP_WAIT_POLICY=PASSIVE | "
          "PyTorch passive + OPENBLAS_CORETYPE=SkylakeX | zerort / best PyTorch | "
          "zerort PaLM FLOP/s / sgemm 2048^3 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, shape, z, pt, ptp, p512, ratio, sg, *_ in rows:
        print(f"| {name} | {shape} | {z:,.0f} | {pt:,.0f} | {ptp:,.0f} | {p512:,.0f} | "
              f"{ratio:.2f} | {sg:.2f} |")
    print("\nrounds:", json.dumps({r[0]: {"zerort": [round(x) for x in r[8]],
                                          "pytorch": [round(x) for x in r[9]],
                                          "pytorch_passive": [round(x) for x in r[10]],
                                          "pytorch_passive_skylakex": [round(x) for x in r[11]]}
                                   for r in rows}))


if __name__ == "__main__":
    main()
