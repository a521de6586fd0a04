#!/usr/bin/env python3
"""The asynchronous CPU device (train.device "cpu-async", docs/async-device.md) trains bitwise like
the synchronous one: for each configuration the same steps run on "cpu" and on "cpu-async" with a
seeded jitter, and every checkpoint shard file (fp32 masters, moments) must be byte-identical.
The matrix covers ZeRO 0-3 with prefetch, reuse-distance keeps and small buckets, gradient
accumulation, bf16 and fp16, optimizer and parameter offload to host memory and to NVMe, LAMB,
tensor and sequence parallelism, pipeline parallelism (1F1B, and interleaved with dp 2), 1, 2
and 4 ranks, host offload with the gradient sums on the device (bitwise the device run's files
too), and a checkpoint saved on cpu-async and resumed there. It also checks the device's config rules (exit 2, naming the key).
Usage: async_parity_test.py PATH_TO_ZERORT MPIEXEC"""
import filecmp
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, merged, tiny_run  # noqa: E402

zerort, mpiexec = sys.argv[1], sys.argv[2]
checks = Checks("async_parity_test")
check = checks.check
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
STEPS = 6

BASE = tiny_run(STEPS)
JITTER = {"async_jitter_seed": 17, "async_jitter_max_us": 200}


def train(name, config, np, extra_args=()):
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    cmd = [zerort, "train", path, "--overwrite", *extra_args]
    if np > 1:
        cmd = [mpiexec, "-np", str(np), "--oversubscribe", *cmd]
    # Undecodable bytes are shown escaped in the failure rather than failing the script.
    return subprocess.run(cmd, capture_output=True, text=True, errors="backslashreplace", env=env,
                          timeout=300)


def shard_files(step_dir):
    if not os.path.isdir(step_dir):
        return []
    return sorted(f for f in os.listdir(step_dir) if f.endswith(".bin"))


def check_exposed(what, metrics, np, device):
    """[Note: exposed communication] (engine/comm_spans.h): on the synchronous device every
    collective is on the critical path (exposed == comm); on the asynchronous one exposed is the
    compute stream's own collectives plus its waits while collectives ran on the stream it waited
    for: never more than all communication; with two ranks there is some."""
    if not os.path.exists(metrics):
        check(f"{what}: metrics written", False)
        return
    with open(metrics) as f:
        steps = [json.loads(line) for line in f]
    if not steps:
        check(f"{what}: metrics written", False, "no step in " + metrics)
        return
    comm = [s["comm_s"] for s in steps]
    exposed = [s["exposed_comm_s"] for s in steps]
    check(f"{what}: exposed communication is not negative", min(exposed) >= 0, f"{exposed}")
    check(f"{what}: exposed communication is at most all of it",
          all(e <= c + 1e-6 for c, e in zip(comm, exposed)), f"{comm} {exposed}")
    if device == "cpu":
        check(f"{what}: on the synchronous device all of it is exposed",
              all(abs(c - e) <= 1e-9 for c, e in zip(comm, exposed)), f"{comm} {exposed}")
    if np > 1:
        check(f"{what}: collectives timed", sum(comm) > 0, f"{comm}")


def run_pair(name, np, extra):
    """Trains `extra` on cpu and on cpu-async with jitter; the checkpoints must be identical."""
    dirs = {}
    for device in ("cpu", "cpu-async"):
        d = os.path.join(tmp, name, device)
        nvme = os.path.join(tmp, name, device + "-nvme")
        os.makedirs(nvme, exist_ok=True)
        metrics = os.path.join(tmp, name, device + ".jsonl")
        config = merged(merged(BASE, extra), {
            "train": dict({"device": device}, **(JITTER if device == "cpu-async" else {})),
            "checkpoint": {"dir": d},
            "logging": {"metrics_file": metrics},
        })
        for section in ("offload_optimizer", "offload_param"):
            off = config["zero_optimization"].get(section)
            if off and off.get("device") == "nvme":
                off["nvme_path"] = nvme
        r = train(f"{name}-{device}", config, np)
        check(f"{name} (np {np}) on {device} exits 0", r.returncode == 0,
              (r.stdout + r.stderr)[-1500:])
        check_exposed(f"{name} (np {np}) on {device}", metrics, np, device)
        dirs[device] = os.path.join(d, f"step_{STEPS}")
    a, b = dirs["cpu"], dirs["cpu-async"]
    if not (os.path.isdir(a) and os.path.isdir(b)):
        check(f"{name}: both runs saved step {STEPS}", False)
        return
    files = shard_files(a)
    check(f"{name}: the same shard files", files == shard_files(b) and files, f"{files}")
    for f in files:
        check(f"{name}: {f} is bitwise the synchronous device's",
              filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False))


CASES = [
    ("stage0", 1, {"zero_optimization": {"stage": 0}}),
    ("stage1", 2, {"zero_optimization": {"stage": 1, "allgather_bucket_size": 3000}}),
    ("stage2-accumulation", 2, {"zero_optimization": {"stage": 2, "reduce_bucket_size": 5000},
                                "gradient_accumulation_steps": 3}),
    ("stage3-prefetch-keep", 2, {"zero_optimization": {
        "stage3_prefetch_bucket_size": 30000, "stage3_max_reuse_distance": 1000000000,
        "reduce_bucket_size": 5000}, "gradient_accumulation_steps": 2}),
    ("stage3-np4-broadcast", 4, {"zero_optimization": {
        "allgather_partitions": False, "reduce_scatter": False, "overlap_comm": False}}),
    ("bf16", 2, {"bf16": {"enabled": True}}),
    ("fp16", 2, {"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}),
    ("stage2-unit-buckets", 2, {"zero_optimization": {"stage": 2, "reduce_bucket_size": 1},
                                "model": {"n_layer": 4}}),
    ("lamb", 2, {"optimizer": {"type": "Lamb"}, "model": {"d_model": 64}}),
    ("offload-host-lamb", 2, {"optimizer": {"type": "Lamb"}, "train_micro_batch_size_per_gpu": 8,
                              "model": {"d_model": 128, "seq_len": 64},
                              "zero_optimization": {"offload_optimizer": {"device": "cpu"},
                                                    "offload_param": {"device": "cpu"}}}),
    ("offload-nvme", 2, {"zero_optimization": {"offload_optimizer": {"device": "nvme"},
                                               "offload_param": {"device": "nvme"},
                                               "sub_group_size": 4000},
                         "gradient_accumulation_steps": 2}),
    ("offload-host-stage1", 2, {"zero_optimization": {"stage": 1,
                                                      "offload_optimizer": {"device": "cpu"}}}),
    ("tensor-parallel", 2, {"parallel": {"tensor_parallel_size": 2}}),
    # The pipeline's transfers run on each link's own queued stream, ordered against the compute
    # stream by events ([Note: pipeline transfers on streams of their own]).
    ("pipeline-1f1b", 2, {"parallel": {"pipeline_parallel_size": 2},
                          "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 1}}),
    # [Note: gradient sums on the device]: the host-tier units' gradients summed on the device
    # and staged to the host before each update (on cpu-async behind the forward, the worker
    # waiting for the copy's event), the tied embedding's all-reduce on the compute stream.
    ("pipeline-1f1b-host-grad-sums", 2, {"parallel": {"pipeline_parallel_size": 2},
                                         "gradient_accumulation_steps": 4,
                                         "train": {"device_grad_sums": True},
                                         "zero_optimization": {
                                             "stage": 1, "offload_optimizer": {"device": "cpu"}}}),
    ("pipeline-interleaved-dp2", 4, {"parallel": {"pipeline_parallel_size": 2,
                                                  "pipeline_schedule": "interleaved",
                                                  "virtual_pipeline_stages": 2},
                                     "gradient_accumulation_steps": 4, "model": {"n_layer": 4},
                                     "zero_optimization": {"stage": 2}}),
    ("tensor-sequence-parallel", 4, {"parallel": {"tensor_parallel_size": 2,
                                                  "sequence_parallel": True},
                                     "model": {"activation_checkpointing": True},
                                     "zero_optimization": {"stage": 1}}),
]
for name, np, extra in CASES:
    run_pair(name, np, extra)

# The sums on the device are a placement, not another computation: the same bytes as the run that
# keeps the optimizer on the device.
device_dir = os.path.join(tmp, "pipeline-1f1b", "cpu", f"step_{STEPS}")
sums_dir = os.path.join(tmp, "pipeline-1f1b-host-grad-sums", "cpu", f"step_{STEPS}")
files = shard_files(device_dir)
check("host offload with gradient sums on the device: the device run's shard files",
      files and files == shard_files(sums_dir), f"{files} {shard_files(sums_dir)}")
for f in files:
    check(f"host offload with gradient sums on the device: {f} is bitwise the device run's",
          filecmp.cmp(os.path.join(device_dir, f), os.path.join(sums_dir, f), shallow=False))

# A checkpoint saved on cpu-async and resumed there equals the straight synchronous run.
half = merged(BASE, {"train": dict({"device": "cpu-async", "steps": STEPS // 2}, **JITTER),
                     "checkpoint": {"dir": os.path.join(tmp, "resume", "ckpt")}})
r = train("resume-first", half, 2)
check("cpu-async run saving a checkpoint exits 0", r.returncode == 0, r.stderr[-1500:])
rest = merged(half, {"train": {"steps": STEPS}})
with open(os.path.join(tmp, "resume-rest.json"), "w") as f:
    json.dump(rest, f)
r = subprocess.run([mpiexec, "-np", "2", "--oversubscribe", zerort, "train",
                    os.path.join(tmp, "resume-rest.json"), "--resume"], capture_output=True,
                   text=True, errors="backslashreplace", env=env, timeout=300)
check("cpu-async run resumed from it exits 0", r.returncode == 0, r.stderr[-1500:])
straight = os.path.join(tmp, "stage3-np2")
r = train("straight", merged(BASE, {"train": {"device": "cpu"},
                                    "checkpoint": {"dir": straight}}), 2)
check("the straight synchronous run exits 0", r.returncode == 0, r.stderr[-1500:])
resumed = os.path.join(tmp, "resume", "ckpt", f"step_{STEPS}")
straight_files = shard_files(os.path.join(straight, f"step_{STEPS}"))
check("the straight run and the resumed one saved the same shard files",
      straight_files and straight_files == shard_files(resumed))
for f in straight_files:
    check(f"resumed on cpu-async: {f} is bitwise the straight run's",
          filecmp.cmp(os.path.join(straight, f"step_{STEPS}", f), os.path.join(resumed, f),
                      shallow=False))

# The device's rules: exit 2 naming the key.
for name, extra, expect in [
    ("jitter-without-async", {"train": {"device": "cpu", "async_jitter_seed": 3}},
     "train.async_jitter_seed = 3"),
    ("unknown-device", {"train": {"device": "gpu"}}, "train.device"),
]:
    r = train(name, merged(BASE, extra), 1)
    check(f"{name}: exit 2", r.returncode == 2, f"rc {r.returncode}: {r.stderr[-800:]}")
    check(f"{name}: names {expect}", expect in r.stderr, r.stderr[-800:])

checks.finish()
