#!/usr/bin/env python3
"""Bytes per step within and across simulated nodes, measured beside the estimator's formula
(docs/benchmarks.md, "Beyond one node"): GPT-2 124M at 8 ranks as 2 nodes x 4
(ZERORT_RANKS_PER_NODE=4) for flat ZeRO-3, HSDP (shard groups of 4), hpZ 4, qwZ, qwZ + hpZ, qgZ, all of ZeRO++, flat and HSDP
ZeRO-2,
two steps each (the second's bytes: a steady-state step), each beside `zerort estimate CONFIG
--world-size 8 --ranks-per-node 4`; then the validation loss of the tiny GPT after 300 steps in
each layout (bf16, lr 1e-3, 64 validation windows). Prints a markdown table.
Then 1-bit Adam at ZeRO-0 beside plain ZeRO-0 data parallelism: GPT-2's stage-0 state (3.2 GB a
rank) fits 4 ranks in 24 GB, not 8, so the bytes are measured at 4 ranks as 2 x 2 (a compressed
step: freeze_step 0, the third step) beside the estimator's at 4 and at 8 ranks as 2 x 4; and the
tiny GPT at 8 ranks with freeze_step 100 beside the same algorithm uncompressed.
Usage: bench_nodes.py PATH_TO_ZERORT [MPIEXEC] [--steps 300] [--onebit-only] [--onebit-lr 3e-4]"""
import json
import os
import subprocess
import sys
import tempfile

zerort = os.path.abspath(sys.argv[1])
mpiexec = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else "mpirun"
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 300
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", ZERORT_RANKS_PER_NODE="4",
           OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none")
LAYOUTS = [
    ("flat ZeRO-3", {"zero_optimization": {"stage": 3}}),
    ("HSDP 4 (ZeRO-3)", {"zero_optimization": {"stage": 3}, "parallel": {"data_shard_size": 4}}),
    ("hpZ 4 (ZeRO-3)", {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4}}),
    ("qwZ (ZeRO-3)", {"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}),
    ("qwZ + hpZ 4 (ZeRO-3)", {"zero_optimization": {"stage": 3, "zero_quantized_weights": True,
                                                    "zero_hpz_partition_size": 4}}),
    ("qgZ (ZeRO-3)", {"zero_optimization": {"stage": 3, "zero_quantized_gradients": True}}),
    ("hpZ 4 + qwZ + qgZ (ZeRO++)", {"zero_optimization": {
        "stage": 3, "zero_hpz_partition_size": 4, "zero_quantized_weights": True,
        "zero_quantized_gradients": True}}),
    ("flat ZeRO-2", {"zero_optimization": {"stage": 2}}),
    ("HSDP 4 (ZeRO-2)", {"zero_optimization": {"stage": 2}, "parallel": {"data_shard_size": 4}}),
]


def merged(base, extra):
    out = json.loads(json.dumps(base))
    for key, value in extra.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(
            out.get(key), dict) else value
    return out


def train(name, config):
    path = os.path.join(tmp, name + ".json")
    metrics = os.path.join(tmp, name + ".jsonl")
    with open(path, "w") as f:
        json.dump(merged(config, {"logging": {"metrics_file": metrics}}), f)
    r = subprocess.run([mpiexec, "-np", "8", "--oversubscribe", "-x", "ZERORT_RANKS_PER_NODE",
                        zerort, "train", path], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}")
    with open(metrics) as f:
        return path, [json.loads(line) for line in f]


def estimate(path):
    r = subprocess.run([zerort, "estimate", path, "--world-size", "8", "--ranks-per-node", "4",
                        "--json"], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"estimate {path}: {r.stderr[-2000:]}")
    return json.loads(r.stdout)["comm"]


GPT2 = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "model": {"preset": "gpt2", "seq_len": 64},
        "train": {"steps": 2, "eval_windows": 1, "sample_tokens": 0, "device": "cpu",
                  "check_memory": False},
        "bf16": {"enabled": True}}
TINY = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        "model": {"n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 64, "vocab_size": 256},
        "train": {"steps": steps, "eval_windows": 64, "sample_tokens": 0, "device": "cpu"},
        "bf16": {"enabled": True},
        "zero_optimization": {"stage3_param_persistence_threshold": 0}}

print("| layout | MB in node (measured / formula) | MB across nodes (measured / formula) |"
      f" tiny GPT val loss after {steps} steps |")
print("|---|---|---|---|")
for i, (label, layout) in enumerate([] if "--onebit-only" in sys.argv else LAYOUTS):
    path, rec = train(f"gpt2_{i}", merged(GPT2, layout))
    formula = estimate(path)
    _, tiny_rec = train(f"tiny_{i}", merged(TINY, layout))
    val = [r["val_loss"] for r in tiny_rec if "val_loss" in r][-1]
    last = rec[-1]
    print(f"| {label} | {last['comm_bytes_intra_node'] / 1e6:.1f} / "
          f"{formula['intra_node_bytes'] / 1e6:.1f} | {last['comm_bytes_inter_node'] / 1e6:.1f} / "
          f"{formula['inter_node_bytes'] / 1e6:.1f} | {val:.4f} |", flush=True)


# 1-bit Adam and 1-bit LAMB ([Note: 1-bit Adam], [Note: 1-bit LAMB]) against ZeRO-0's fp32
# gradient all-reduce.
env4 = dict(env, ZERORT_RANKS_PER_NODE="2")
ONEBIT_LR = float(sys.argv[sys.argv.index("--onebit-lr") + 1]) if "--onebit-lr" in sys.argv else 3e-4
ONEBIT = {"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-4, "freeze_step": 0}},
          "zero_optimization": {"stage": 0}, "train": {"steps": 3}}
print()
print("| ZeRO-0, GPT-2 124M | MB across nodes at 4 ranks as 2 x 2 (measured / formula) |"
      " MB across nodes at 8 ranks as 2 x 4 (formula) |")
print("|---|---|---|")
ONEBIT_LAMB = merged(ONEBIT, {"optimizer": {"type": "OneBitLamb"}})
for i, (label, layout) in enumerate((
        ("AdamW (fp32 gradient all-reduce)", {"zero_optimization": {"stage": 0}}),
        ("1-bit Adam after freeze_step", ONEBIT), ("1-bit LAMB after freeze_step", ONEBIT_LAMB))):
    name = f"z0_{i}"
    path = os.path.join(tmp, name + ".json")
    metrics = os.path.join(tmp, name + ".jsonl")
    with open(path, "w") as f:
        json.dump(merged(merged(GPT2, layout), {"logging": {"metrics_file": metrics}}), f)
    r = subprocess.run([mpiexec, "-np", "4", "--oversubscribe", "-x", "ZERORT_RANKS_PER_NODE",
                        zerort, "train", path], capture_output=True, text=True, env=env4)
    if r.returncode != 0:
        sys.exit(f"{label}: exit {r.returncode}\n{r.stderr[-3000:]}")
    with open(metrics) as f:
        last = [json.loads(line) for line in f][-1]
    four = subprocess.run([zerort, "estimate", path, "--world-size", "4", "--ranks-per-node", "2",
                           "--json"], capture_output=True, text=True, env=env)
    print(f"| {label} | {last['comm_bytes_inter_node'] / 1e6:.2f} / "
          f"{json.loads(four.stdout)['comm']['inter_node_bytes'] / 1e6:.2f} | "
          f"{estimate(path)['inter_node_bytes'] / 1e6:.2f} |", flush=True)

# The tiny GPT at 8 ranks (fp32 and bf16, lr 1e-3, no gradient clipping, freeze_step 100) beside
# the uncompressed run of the same algorithm: one rank accumulating the same global batch (its
# variance frozen at the same step; DeepSpeed compresses only with more than one rank).
print()
print(f"| tiny GPT, {steps} steps | AdamW, 8 ranks | 1-bit Adam uncompressed (1 rank x 8"
      " accumulation) | 1-bit Adam, 8 ranks as 2 x 4 | compression's cost |")
print("|---|---|---|---|---|")
for bf16 in (False, True):
    base = merged(TINY, {"bf16": {"enabled": bf16}, "gradient_clipping": 0.0,
                         "zero_optimization": {"stage": 0}})
    onebit = merged(base, {"optimizer": {"type": "OneBitAdam",
                                         "params": {"lr": ONEBIT_LR, "freeze_step": 100}}})
    vals = []
    for name, config, ranks in (("adamw", base, 8), ("one", onebit, 1), ("eight", onebit, 8)):
        if ranks == 1:
            config = merged(config, {"gradient_accumulation_steps": 8})
        tag = f"tiny_{name}_{bf16}"
        path = os.path.join(tmp, tag + ".json")
        metrics = os.path.join(tmp, tag + ".jsonl")
        with open(path, "w") as f:
            json.dump(merged(config, {"logging": {"metrics_file": metrics}}), f)
        r = subprocess.run([mpiexec, "-np", str(ranks), "--oversubscribe", "-x",
                            "ZERORT_RANKS_PER_NODE", zerort, "train", path], capture_output=True,
                           text=True, env=dict(env, ZERORT_RANKS_PER_NODE=str(min(ranks, 4))))
        if r.returncode != 0:
            sys.exit(f"{tag}: exit {r.returncode}\n{r.stderr[-3000:]}")
        with open(metrics) as f:
            vals.append([json.loads(x)["val_loss"] for x in f if "val_loss" in x][-1])
    print(f"| {'bf16' if bf16 else 'fp32'} | {vals[0]:.4f} | {vals[1]:.4f} | {vals[2]:.4f} | "
          f"{100 * (vals[2] - vals[1]) / vals[1]:+.2f}% |", flush=True)
