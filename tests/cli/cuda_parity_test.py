"""The CUDA device trains like the CPU one: for each configuration the same steps run with
train.device "cpu" and "cuda", and every step's loss must agree within the precision's tolerance
(fp32 1e-5 relative, bf16/fp16 1e-3, the bf16 flash and cuDNN cases 2e-3 and their first step 1e-4;
measured on an H100/H200: 1.0e-7 and 7.8e-5). The matrix
covers ZeRO 0-3 with prefetch and reuse-distance keeps, unit-sized buckets, no overlap, gradient
accumulation, bf16 and fp16, AdamW and LAMB on the device and host tiers, parameter and optimizer
offload to host memory (also with the gradients summed on the device) and NVMe, activation
checkpointing, the flash attention at head size 64
(bf16, fp16), LLaMA (grouped-query, fp32 and bf16) and Qwen3 (per-head q/k norms, a wide
head_dim, dynamic NTK; fp32 and bf16); with an MPI launcher, two ranks on
one GPU against two CPU ranks (also LLaMA in bf16, ZeRO++'s qwZ and qgZ, 1-bit Adam and 0/1
Adam). Without a usable GPU it exits 77, which ctest reports as skipped.
Usage: cuda_parity_test.py PATH_TO_ZERORT [MPIEXEC]"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, merged, tiny_run  # noqa: E402

zerort = sys.argv[1]
mpiexec = sys.argv[2] if len(sys.argv) > 2 else ""
tmp = tempfile.mkdtemp()
STEPS = 10
BASE = tiny_run(STEPS)


def train(name, device, extra, np=1):
    """Runs `extra` on `device`; returns (completed process, per-step losses)."""
    config = merged(merged(BASE, extra), {
        "train": {"device": device},
        "checkpoint": {"dir": os.path.join(tmp, name, device)},
        "logging": {"metrics_file": os.path.join(tmp, name, device + ".jsonl")}})
    for key in ("offload_optimizer", "offload_param"):
        tier = config["zero_optimization"].get(key, {})
        if tier.get("device") == "nvme":
            tier["nvme_path"] = os.path.join(tmp, name, device + "-nvme")
            os.makedirs(tier["nvme_path"], exist_ok=True)
    path = os.path.join(tmp, f"{name}-{device}.json")
    os.makedirs(os.path.join(tmp, name), exist_ok=True)
    with open(path, "w") as f:
        json.dump(config, f)
    cmd = [zerort, "train", path, "--overwrite"]
    if np > 1:
        cmd = [mpiexec, "-np", str(np), "--oversubscribe", "-x", "LD_LIBRARY_PATH", *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    losses = []
    if r.returncode == 0:
        with open(config["logging"]["metrics_file"]) as f:
            losses = [json.loads(line)["loss"] for line in f if '"loss"' in line]
    return r, losses


probe, _ = train("probe", "cuda", {"train": {"steps": 1}})
if probe.returncode == 2 and "no usable GPU" in probe.stderr:
    print("cuda_parity_test: skipped:", probe.stderr.strip().splitlines()[-1])
    sys.exit(77)

checks = Checks("cuda_parity_test")
check = checks.check
FP32, HALF = 1e-5, 1e-3
# The 16-bit flash cases: zerort's CUDA kernels round P and dS to bf16/fp16 for the tensor-core
# products, as FlashAttention-2 does, and so do the CPU's 16-bit kernels since 2026-11-30
# (cpu::fast's flash `products`; FlashTilesTest.TheCpuModelKernelsRoundAsThePrograms). Before, the
# CPU kept them in fp32 and the bf16 run differed by 2.65e-3 at one step on an H200. Besides the
# trajectory, their first step's loss (the same weights, one forward) within FIRST_STEP.
# Their bf16 trajectories within BF16_FLASH, half of bf16's unit roundoff (2^-8): since the flash
# backward adds dQ by atomics (2026-11-30) the GPU's trajectory varies from run to run in its last
# bits, and a 10-step run at the tiny run's learning rate amplifies that (the thirteenth run,
# H200, 2026-12-04: 1.03e-3 at step 9, its first step within 1.5e-5). The rounding gap fixed
# above (2.65e-3) would still fail it; fp16's flash case keeps HALF (3.4e-4 in that run).
BF16_FLASH = 2e-3
FLASH_CASES = {"bf16-flash-hs64", "fp16-flash-hs64", "llama-gqa-bf16-flash",
               "two-ranks-llama-bf16-flash"}
FIRST_STEP = 1e-4
CASES = [
    ("stage0", 1, FP32, {"zero_optimization": {"stage": 0}}),
    ("stage1", 1, FP32, {"zero_optimization": {"stage": 1, "allgather_bucket_size": 3000}}),
    ("stage2-accumulation", 1, FP32, {"zero_optimization": {"stage": 2, "reduce_bucket_size": 5000},
                                      "gradient_accumulation_steps": 3}),
    ("stage3-prefetch-keep", 1, FP32, {"zero_optimization": {
        "stage3_prefetch_bucket_size": 30000, "stage3_max_reuse_distance": 1000000000,
        "reduce_bucket_size": 5000}, "gradient_accumulation_steps": 2}),
    ("stage3-no-overlap", 1, FP32, {"zero_optimization": {"overlap_comm": False}}),
    ("unit-buckets", 1, FP32, {"zero_optimization": {"stage": 2, "reduce_bucket_size": 1},
                               "model": {"n_layer": 4}}),
    ("bf16", 1, HALF, {"bf16": {"enabled": True}}),
    ("fp16", 1, HALF, {"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}),
    ("lamb", 1, FP32, {"optimizer": {"type": "Lamb"}, "model": {"d_model": 64}}),
    ("offload-host-lamb", 1, FP32, {
        "optimizer": {"type": "Lamb"}, "train_micro_batch_size_per_gpu": 8,
        "model": {"d_model": 128, "seq_len": 64},
        "zero_optimization": {"offload_optimizer": {"device": "cpu"},
                              "offload_param": {"device": "cpu"}}}),
    ("offload-host-bf16", 1, HALF, {"bf16": {"enabled": True},
                                    "zero_optimization": {"offload_optimizer": {"device": "cpu"}}}),
    # [Note: gradient sums on the device]: the host-tier units' gradients summed on the GPU, each
    # unit's sum copied to pinned memory for its update behind the next forward.
    ("offload-host-grad-sums", 1, FP32, {"gradient_accumulation_steps": 2,
                                         "train": {"device_grad_sums": True},
                                         "zero_optimization": {
                                             "offload_optimizer": {"device": "cpu"}}}),
    ("offload-nvme", 1, FP32, {"zero_optimization": {"offload_optimizer": {"device": "nvme"},
                                                     "offload_param": {"device": "nvme"},
                                                     "sub_group_size": 4000}}),
    ("checkpointing", 1, FP32, {"model": {"activation_checkpointing": True}}),
    # Head size 64 in bf16/fp16: the model's attention through zerort's flash kernels
    # (kernels/memory_facts.h's AttentionProgramFor), a sequence of 80 (a 64-row tile and a tail).
    ("bf16-flash-hs64", 1, BF16_FLASH, {"bf16": {"enabled": True},
                                  "model": {"d_model": 128, "seq_len": 80}}),
    ("fp16-flash-hs64", 1, HALF, {"fp16": {"enabled": True}, "zero_optimization": {"stage": 2},
                                  "model": {"d_model": 128, "seq_len": 80}}),
    # LLaMA: rotary positions, RMSNorm, SwiGLU, grouped-query attention (4 query heads on 2
    # key/value heads), an untied head; in fp32 (materialised attention) and in bf16 at head
    # size 64 (flash, each key/value head read in place for its two query heads).
    ("llama-gqa", 1, FP32, {"model": {"arch": "llama", "n_head": 4, "n_kv_head": 2,
                                      "d_model": 64, "intermediate_size": 176}}),
    ("llama-gqa-bf16-flash", 1, BF16_FLASH, {"bf16": {"enabled": True},
                                       "model": {"arch": "llama", "n_head": 4, "n_kv_head": 2,
                                                 "d_model": 256, "intermediate_size": 688,
                                                 "seq_len": 80}}),
    # Qwen3: each query and key head RMSNorm-ed before the rotation (qk_norm), a head_dim wider
    # than d_model / n_head (4 heads of 32 over d 64), attention_bias's four biases, and dynamic
    # NTK past half the sequence (seq_len 32 over an original context of 16); in fp32, and in bf16
    # at head size 64 through flash attention.
    ("qwen3-qk-norm", 1, FP32, {"model": {
        "arch": "llama", "n_head": 4, "n_kv_head": 2, "d_model": 64, "head_dim": 32,
        "intermediate_size": 176, "qk_norm": True, "qkv_bias": True, "o_proj_bias": True,
        "rope_scaling": {"rope_type": "dynamic", "factor": 2,
                         "original_max_position_embeddings": 16}}}),
    ("qwen3-qk-norm-bf16-flash", 1, BF16_FLASH, {"bf16": {"enabled": True}, "model": {
        "arch": "llama", "n_head": 4, "n_kv_head": 2, "d_model": 128, "head_dim": 64,
        "intermediate_size": 352, "qk_norm": True, "seq_len": 80}}),
]
FLASH_CASES.add("qwen3-qk-norm-bf16-flash")
# cuDNN's attention (model.attention_backend cudnn), where the build has it: it rounds P and dS for
# its tensor-core products as FlashAttention-2 does, so the flash cases' tolerances; the CPU runs
# its flash kernels for the same config.
env = subprocess.run([zerort, "env", "--json"], capture_output=True, text=True)
if env.returncode == 0 and json.loads(env.stdout)["build"].get("cudnn_attention"):
    CASES.append(("bf16-cudnn-hs64", 1, BF16_FLASH, {"bf16": {"enabled": True}, "model": {
        "d_model": 128, "seq_len": 80, "attention_backend": "cudnn"}}))
    CASES.append(("llama-gqa-bf16-cudnn", 1, BF16_FLASH, {"bf16": {"enabled": True}, "model": {
        "arch": "llama", "n_head": 4, "n_kv_head": 2, "d_model": 256, "intermediate_size": 688,
        "seq_len": 80, "attention_backend": "cudnn"}}))
    FLASH_CASES |= {"bf16-cudnn-hs64", "llama-gqa-bf16-cudnn"}
if mpiexec:  # two ranks on one GPU: NCCL refuses a duplicate GPU, MPI with host staging runs
    CASES.append(("two-ranks-one-gpu", 2, FP32, {}))
    CASES.append(("two-ranks-llama-bf16-flash", 2, BF16_FLASH, {
        "bf16": {"enabled": True}, "model": {"arch": "llama", "n_head": 4, "n_kv_head": 2,
                                             "d_model": 256, "intermediate_size": 688}}))
    # ZeRO++'s int8 weight gather and gradient reduce-scatter, quantized on the GPU: the CUDA
    # kernels are bitwise the CPU's, but a matmul's last bit can move a value across a rounding
    # boundary of the quantizer, so the half-precision tolerance.
    CASES.append(("two-ranks-qwz-qgz", 2, HALF, {"zero_optimization": {
        "stage": 3, "zero_quantized_weights": True, "zero_quantized_gradients": True}}))
    # 1-bit Adam ([Note: 1-bit Adam]): compressed from step 5, the signs packed on the GPU; a
    # value near zero may take the other sign where the matmuls' last bits differ.
    CASES.append(("two-ranks-onebit-adam", 2, HALF, {
        "zero_optimization": {"stage": 0}, "gradient_clipping": 0.0,
        "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-4, "freeze_step": 4}}}))
    CASES.append(("two-ranks-zero-one-adam", 2, HALF, {
        "zero_optimization": {"stage": 0}, "gradient_clipping": 0.0,
        "optimizer": {"type": "ZeroOneAdam", "params": {
            "lr": 1e-4, "var_freeze_step": 4, "var_update_scaler": 2, "local_step_scaler": 2,
            "local_step_clipper": 4}}}))
    # 1-bit LAMB ([Note: 1-bit LAMB]): compressed from step 5, the fused momentum on the GPU.
    CASES.append(("two-ranks-onebit-lamb", 2, HALF, {
        "zero_optimization": {"stage": 0}, "gradient_clipping": 0.0,
        "optimizer": {"type": "OneBitLamb", "params": {"lr": 1e-3, "freeze_step": 4}}}))

for name, np, tolerance, extra in CASES:
    runs = {device: train(name, device, extra, np) for device in ("cpu", "cuda")}
    for device, (r, losses) in runs.items():
        check(f"{name} (np {np}) on {device} exits 0 with {STEPS} losses",
              r.returncode == 0 and len(losses) == STEPS, (r.stdout + r.stderr)[-1500:])
    a, b = runs["cpu"][1], runs["cuda"][1]
    if len(a) == len(b) == STEPS:
        worst = max(abs(x - y) / max(abs(x), 1e-6) for x, y in zip(a, b))
        print(f"{name:24s} max relative loss difference {worst:.2e} (tolerance {tolerance:.0e})")
        check(f"{name}: cuda losses within {tolerance:.0e} of cpu's", worst <= tolerance,
              f"cpu {a}\ncuda {b}")
        if name in FLASH_CASES:
            first = abs(a[0] - b[0]) / max(abs(a[0]), 1e-6)
            print(f"{name:24s} first step's relative loss difference {first:.2e} "
                  f"(tolerance {FIRST_STEP:.0e})")
            check(f"{name}: the first step's loss within {FIRST_STEP:.0e} of cpu's",
                  first <= FIRST_STEP, f"cpu {a[0]} cuda {b[0]}")

checks.finish()
