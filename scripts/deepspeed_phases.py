#!/usr/bin/env python3
"""The wall_clock_breakdown table of docs/benchmarks.md: the tiny model at ZeRO-3 on one process,
fp32 / bf16 / fp16 AdamW and fp32 LAMB, 30 steps each, medians over steps 6-30 and 3 interleaved
repeats. Usage: deepspeed_phases.py [ZERORT] (default build/tools/zerort). Time it on an idle
machine."""
import json, subprocess, statistics, os, sys, tempfile
zerort = sys.argv[1] if len(sys.argv) > 1 else "build/tools/zerort"
work = tempfile.mkdtemp()
base = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "wall_clock_breakdown": True, "steps_per_print": 1000, "seed": 3,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "model": {"n_layer": 4, "n_head": 4, "d_model": 128, "seq_len": 128, "vocab_size": 256},
        "train": {"steps": 30, "sample_tokens": 0, "eval_windows": 1, "device": "cpu"}}
variants = {"fp32 AdamW": {}, "bf16 AdamW": {"bf16": {"enabled": True}},
            "fp16 AdamW": {"fp16": {"enabled": True}},
            "fp32 LAMB": {"optimizer": {"type": "Lamb", "params": {"lr": 1e-2}}}}
res = {k: [] for k in variants}
env = dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2")
for rep in range(3):
    for name, extra in variants.items():
        c = json.loads(json.dumps(base)); c.update(extra)
        m = os.path.join(work, f"{rep}.jsonl")
        c["logging"] = {"metrics_file": m}
        json.dump(c, open(os.path.join(work, "c.json"), "w"))
        if os.path.exists(m): os.remove(m)
        subprocess.run([zerort, "train", os.path.join(work, "c.json")], capture_output=True, env=env, check=True)
        rows = [json.loads(l) for l in open(m)][5:]
        res[name].append({"tok": statistics.median(r["tokens_per_s"] for r in rows),
                          **{k: statistics.median(r["wall_clock_s"][k] for r in rows) * 1e3 for k in rows[0]["wall_clock_s"]},
                          "step": statistics.median(r["step_time_s"] for r in rows) * 1e3})
for name, reps in res.items():
    med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
    print(f"| {name} | {med['tok']:.0f} | {med['step']:.1f} | {med['forward']:.1f} | {med['backward']:.1f} | {med['reduce']:.2f} | {med['optimizer']:.2f} | {med['gather']:.2f} | {med['other']:.2f} |")
