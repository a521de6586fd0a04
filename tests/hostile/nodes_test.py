#!/usr/bin/env python3
"""The inputs issue 31 added, as untrusted input: ZERORT_RANKS_PER_NODE, parallel.data_shard_size,
zero_optimization.mics_shard_size, 1-bit Adam's and 0/1 Adam's optimizer.params (freeze_step,
cuda_aware, comm_backend_name, var_freeze_step, var_update_scaler, local_step_scaler,
local_step_clipper), `zerort env --tp/--pp/--data-shard-size` and `zerort estimate
--ranks-per-node/--data-shard-size/--intra-gbps/--inter-gbps`, each given a wrong type, a value out
of range, a huge or empty value. Each is exit 2 within seconds naming the key, flag or variable,
writes nothing, and never hangs or crashes. (Under mpirun: tests/cli/nodes_cli_test.py.)
Usage: nodes_test.py PATH_TO_ZERORT"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from harness import Checks, merged, tiny_run  # noqa: E402

zerort = os.path.abspath(sys.argv[1])
checks = Checks("hostile_nodes_test")
check = checks.check
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def run(args, extra_env=None):
    start = time.time()
    try:
        r = subprocess.run([zerort, *args], capture_output=True, timeout=60, cwd=tmp,
                           env=dict(env, **(extra_env or {})))
        return r.returncode, r.stderr.decode("utf-8", "replace"), time.time() - start
    except subprocess.TimeoutExpired:
        return "timeout", "", time.time() - start


def expect(what, args, says, extra_env=None):
    code, err, seconds = run(args, extra_env)
    check(f"{what}: exit 2", code == 2, f"{code} {err[-400:]}")
    check(f"{what}: names it", says in err, f"wanted '{says}' in: {err[-400:]}")
    check(f"{what}: within seconds", seconds < 10, f"{seconds:.1f} s")
    check(f"{what}: writes nothing", set(os.listdir(tmp)) == configs, str(os.listdir(tmp)))


configs = set()  # the files the test wrote


def config(name, extra):
    run_config = merged(merged(tiny_run(2), {"train": {"device": "cpu"},
                                             "logging": {"metrics_file": "m.jsonl"},
                                             "checkpoint": {"dir": "ckpt"}}), extra)
    with open(os.path.join(tmp, name), "w") as f:
        json.dump(run_config, f)
    configs.add(name)
    return name


# The variable: not a number, zero, negative, huge, empty; and a size the world does not divide.
for value, says in (("x", "is not a positive integer"), ("0", "is not a positive integer"),
                    ("-2", "is not a positive integer"), ("", "is not a positive integer"),
                    ("99999999999999999999", "is not a positive integer"),
                    ("2", "ZERORT_RANKS_PER_NODE=2 does not divide the world size 1")):
    ok = config("ok.json", {})
    expect(f"ZERORT_RANKS_PER_NODE='{value}' (train)", ["train", ok], says,
           {"ZERORT_RANKS_PER_NODE": value})
    expect(f"ZERORT_RANKS_PER_NODE='{value}' (env)", ["env"], says,
           {"ZERORT_RANKS_PER_NODE": value})

# The config keys: wrong types, out of range, and rules.
for name, extra, says in (
        ("shard_str.json", {"parallel": {"data_shard_size": "2"}}, "parallel.data_shard_size"),
        ("shard_neg.json", {"parallel": {"data_shard_size": -1}}, "parallel.data_shard_size"),
        ("shard_huge.json", {"parallel": {"data_shard_size": 1e12}}, "parallel.data_shard_size"),
        ("shard_float.json", {"parallel": {"data_shard_size": 1.5}}, "parallel.data_shard_size"),
        ("shard_world.json", {"parallel": {"data_shard_size": 2}},
         "parallel.data_shard_size = 2 does not divide the data-parallel size 1"),
        ("shard_stage0.json", {"parallel": {"data_shard_size": 1}, "zero_optimization": {"stage": 0}},
         "zero_optimization.stage 0 shards nothing"),
        ("mics_str.json", {"zero_optimization": {"mics_shard_size": [2]}},
         "zero_optimization.mics_shard_size"),
        ("mics_low.json", {"zero_optimization": {"mics_shard_size": -5}},
         "zero_optimization.mics_shard_size"),
        ("mics_stage1.json", {"zero_optimization": {"stage": 1, "mics_shard_size": 1}},
         "is MiCS, which DeepSpeed runs at zero_optimization.stage 3 only"),
        ("mics_world.json", {"zero_optimization": {"mics_shard_size": 4}},
         "zero_optimization.mics_shard_size = 4 does not divide the data-parallel size 1")):
    expect(f"train {name}", ["train", config(name, extra)], says)

# 1-bit Adam's parameters ([Note: 1-bit Adam]): wrong types, out of range, huge; and the stage.
ONEBIT = {"zero_optimization": {"stage": 0}, "optimizer": {"type": "OneBitAdam"}}
for name, params, says in (
        ("freeze_str.json", {"freeze_step": "10"}, "optimizer.params.freeze_step"),
        ("freeze_neg.json", {"freeze_step": -1}, "optimizer.params.freeze_step"),
        ("freeze_float.json", {"freeze_step": 2.5}, "optimizer.params.freeze_step"),
        ("freeze_huge.json", {"freeze_step": 1e300}, "optimizer.params.freeze_step"),
        ("cuda_aware_str.json", {"cuda_aware": "yes"}, "optimizer.params.cuda_aware"),
        ("backend_int.json", {"comm_backend_name": 7}, "optimizer.params.comm_backend_name"),
        ("backend_bad.json", {"comm_backend_name": "gloo"}, "optimizer.params.comm_backend_name"),
        ("backend_empty.json", {"comm_backend_name": ""}, "optimizer.params.comm_backend_name"),
        ("onebit_lr_str.json", {"lr": "fast"}, "optimizer.params.lr")):
    expect(f"train {name}", ["train", config(name, merged(ONEBIT, {"optimizer": {"params": params}}))],
           says)
# 1-bit LAMB's parameters ([Note: 1-bit LAMB]) and what it refuses.
ONEBIT_LAMB = {"zero_optimization": {"stage": 0}, "optimizer": {"type": "OneBitLamb"}}
for name, extra, says in (
        ("coeff_beta_str.json", {"coeff_beta": "0.9"}, "optimizer.params.coeff_beta"),
        ("coeff_beta_one.json", {"coeff_beta": 1.0}, "optimizer.params.coeff_beta"),
        ("coeff_beta_neg.json", {"coeff_beta": -0.1}, "optimizer.params.coeff_beta"),
        ("factor_max_zero.json", {"factor_max": 0}, "optimizer.params.factor_max"),
        ("factor_min_zero.json", {"factor_min": 0}, "optimizer.params.factor_min = 0: 1-bit LAMB's"),
        ("factor_max_huge.json", {"factor_max": 1e300}, "optimizer.params.factor_max"),
        ("factor_min_nan.json", {"factor_min": "NaN"}, "optimizer.params.factor_min"),
        ("factor_min_above.json", {"factor_min": 5, "factor_max": 4},
         "optimizer.params.factor_min = 5 is above optimizer.params.factor_max = 4"),
        ("factor_threshold_neg.json", {"factor_threshold": -0.5},
         "optimizer.params.factor_threshold"),
        ("factor_threshold_big.json", {"factor_threshold": 2}, "optimizer.params.factor_threshold"),
        ("lamb_freeze_bool.json", {"freeze_step": True}, "optimizer.params.freeze_step"),
        ("lamb_max_coeff_list.json", {"max_coeff": [1]}, "optimizer.params.max_coeff"),
        ("lamb_var_freeze.json", {"var_freeze_step": 3},
         "optimizer.params.var_freeze_step is a ZeroOneAdam parameter")):
    expect(f"train {name}",
           ["train", config(name, merged(ONEBIT_LAMB, {"optimizer": {"params": extra}}))], says)
for name, extra, says in (
        ("lamb_stage1.json", {"zero_optimization": {"stage": 1}},
         'optimizer.type = "OneBitLamb" with zero_optimization.stage = 1'),
        ("lamb_tp.json", {"parallel": {"tensor_parallel_size": 2}},
         'optimizer.type = "OneBitLamb" with parallel.tensor_parallel_size > 1'),
        ("lamb_pp.json", {"parallel": {"pipeline_parallel_size": 2}},
         'optimizer.type = "OneBitLamb" with parallel.pipeline_parallel_size > 1'),
        ("coeff_beta_adam.json", {"optimizer": {"type": "AdamW", "params": {"coeff_beta": 0.5}}},
         "optimizer.params.coeff_beta is a OneBitLamb parameter, but optimizer.type is AdamW")):
    expect(f"train {name}", ["train", config(name, merged(ONEBIT_LAMB, extra))], says)
ZERO_ONE = {"zero_optimization": {"stage": 0}, "optimizer": {"type": "ZeroOneAdam"}}
for name, params, says in (
        ("var_freeze_str.json", {"var_freeze_step": "10"}, "optimizer.params.var_freeze_step"),
        ("var_scaler_zero.json", {"var_update_scaler": 0}, "optimizer.params.var_update_scaler"),
        ("local_scaler_neg.json", {"local_step_scaler": -3}, "optimizer.params.local_step_scaler"),
        ("local_clipper_huge.json", {"local_step_clipper": 1e300},
         "optimizer.params.local_step_clipper"),
        ("zero_one_freeze_step.json", {"freeze_step": 5},
         "optimizer.params.freeze_step is a OneBitAdam or OneBitLamb parameter")):
    expect(f"train {name}",
           ["train", config(name, merged(ZERO_ONE, {"optimizer": {"params": params}}))], says)
expect("train onebit_stage2.json",
       ["train", config("onebit_stage2.json", merged(ONEBIT, {"zero_optimization": {"stage": 2}}))],
       'optimizer.type = "OneBitAdam" with zero_optimization.stage = 2')

# The flags: wrong types, out of range, huge, empty, a flag of another mode.
ok = config("ok.json", {})
for args, says in ((["env", "--tp", "3"], "--tp 3 x --pp 1 does not divide the world size 1"),
                   (["env", "--pp", "0"], "--pp"), (["env", "--tp", "x"], "--tp"),
                   (["env", "--data-shard-size", "2"], "--data-shard-size 2 does not divide"),
                   (["env", "--data-shard-size", "-1"], "--data-shard-size"),
                   (["estimate", ok, "--ranks-per-node", "-1"], "--ranks-per-node -1"),
                   (["estimate", ok, "--ranks-per-node", "5"], "--ranks-per-node 5"),
                   (["estimate", ok, "--intra-gbps", "-3"], "--intra-gbps"),
                   (["estimate", ok, "--inter-gbps", "nan"], "--inter-gbps"),
                   (["estimate", ok, "--inter-gbps", "1e300"], "--inter-gbps"),
                   (["estimate", ok, "--data-shard-size", "2"], "--data-shard-size does not apply"),
                   (["estimate", "--model", "gpt2", "--gpus", "4", "--data-shard-size", "3"],
                    "--data-shard-size 3 does not divide the data-parallel size 4"),
                   (["estimate", "--model", "gpt2", "--gpus", "4", "--ranks-per-node", "2"],
                    "--ranks-per-node does not apply"),
                   (["estimate", "--model", "gpt2", "--gpus", "4", "--intra-gbps", "inf"],
                    "--intra-gbps"),
                   (["estimate", ok, "--onebit"], "--onebit does not apply with a run config"),
                   (["estimate", "--params", "1e9", "--largest-layer-params", "1e7", "--gpus",
                     "8", "--onebit"], "--onebit does not apply"),
                   (["estimate", "--model", "gpt2", "--gpus", "4", "--hpz", "3"],
                    "--hpz 3 does not divide the shard group size 4"),
                   (["estimate", "--model", "gpt2", "--gpus", "4", "--hpz", "0"], "--hpz 0"),
                   (["estimate", "--model", "gpt2", "--gpus", "4", "--hpz", "x"], "--hpz"),
                   (["estimate", "--model", "gpt2", "--gpus", "4", "--qgz", "--data-shard-size",
                     "2"], "--qgz with --data-shard-size is not implemented"),
                   (["estimate", ok, "--qwz"], "--qwz does not apply"),
                   # Huge values: refused by range, never allocated or looped over.
                   (["env", "--tp", "99999999999"], "--tp"),
                   (["env", "--data-shard-size", "1000000"], "--data-shard-size"),
                   (["estimate", ok, "--ranks-per-node", "99999999999"], "--ranks-per-node"),
                   (["estimate", ok, "--ranks-per-node", ""], "--ranks-per-node"),
                   (["estimate", "--model", "gpt2", "--gpus", "4", "--hpz", "1000000000"],
                    "--hpz 1000000000 does not divide"),
                   (["estimate", "--model", "gpt2", "--gpus", "4", "--data-shard-size",
                     "99999999999"], "--data-shard-size")):
    expect(" ".join(args), args, says)

checks.finish()
