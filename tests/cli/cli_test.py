#!/usr/bin/env python3
"""The zerort CLI as a user meets it: env and bench comm output (text and --json with the keys
docs/design.md asks of every benchmark), and exit code 2 with a clear message for bad
input. Usage: cli_test.py PATH_TO_ZERORT"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

zerort = sys.argv[1]
checks = Checks("cli_test")
check = checks.check


def run(*args):
    return subprocess.run([zerort, *args], capture_output=True, text=True, timeout=120)



r = run("env", "--json")
check("env exits 0", r.returncode == 0, r.stderr)
env = json.loads(r.stdout)
for key in ("version", "build", "cuda", "nccl", "mpi", "openblas", "launch"):
    check(f"env has {key}", key in env, r.stdout)
check("env launch is single process", env["launch"]["world_size"] == 1, r.stdout)
# Each GPU's MFU denominator: a positive peak where zerort knows the name, else null (a GPU only).
for d in env["cuda"]["devices"]:
    peak = d.get("dense_bf16_peak_tflops", 0)
    check(f"env gives {d['name']}'s peak or null", peak is None or peak > 0, d)
check("library logs go to stderr, not stdout", "[rank" not in r.stdout, r.stdout)

env_text = run("env").stdout
check("env text names OpenBLAS", "OpenBLAS:" in env_text, env_text)

# The OpenBLAS kernel set is named, and a warning says when OPENBLAS_CORETYPE holds it to AVX2
# kernels on a CPU with AVX-512 (and only then).
def run_env(coretype):
    e = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    if coretype:
        e["OPENBLAS_CORETYPE"] = coretype
    out = subprocess.run([zerort, "env", "--json"], capture_output=True, text=True, timeout=120,
                         env=e)
    return json.loads(out.stdout)


with open("/proc/cpuinfo") as f:
    flags = set(next(line for line in f if line.startswith("flags")).split(":")[1].split())
avx512 = "avx512f" in flags
if env["cpu_gemm"].startswith("OpenBLAS"):
    held = run_env("Haswell")
    check("OPENBLAS_CORETYPE=Haswell is the kernel set named",
          held["cpu_gemm"] == "OpenBLAS, Haswell kernels", held["cpu_gemm"])
    check("a warning names OPENBLAS_CORETYPE exactly when the CPU has AVX-512",
          ("OPENBLAS_CORETYPE=Haswell" in held["cpu_gemm_warning"]) == avx512,
          held["cpu_gemm_warning"])
    free = run_env(None)
    check("no warning without OPENBLAS_CORETYPE", free["cpu_gemm_warning"] == "",
          free["cpu_gemm_warning"])

# The CPU loops' version named by the CPU's features as the x86-64 levels define them (this
# machine's; tools/cpu_levels.py checks the others on emulated CPUs), unless the build has one.
# LZCNT (the kernel's "abm") is left out: some guests' kernels list neither "abm" nor "lzcnt"
# where CPUID has it (this project's AMD EPYC machines under Firecracker), and every CPU with
# AVX2 has it.
V3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"}
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
level = ("AVX-512 (x86-64-v4)" if V4 <= flags else
         "AVX2 + FMA (x86-64-v3)" if V3 <= flags else "baseline x86-64")
check("env names the CPU loops' version this CPU's features pick",
      env["cpu_loops"] in (level, "baseline (the per-width versions are not built: "
                                  "ZR_CPU_DISPATCH=OFF)"), (env["cpu_loops"], level))
check("env text names it", f"CPU loops: {env['cpu_loops']}" in env_text, env_text)
# The NVMe engine aio.engine auto gets: io_uring, or the threads engine and the kernel's refusal.
uring = env["nvme_io"]
check("env says whether io_uring is usable, and why not",
      uring["io_uring"] is True and uring["io_uring_refused"] == "" or
      uring["io_uring"] is False and "io_uring_queue_init" in uring["io_uring_refused"], uring)
check("env text names the NVMe engine",
      ("NVMe I/O:  io_uring" if uring["io_uring"] else "NVMe I/O:  threads") in env_text, env_text)

r = run("bench", "comm", "--backend", "loopback", "--ranks", "3", "--min-bytes", "4KiB",
        "--max-bytes", "64KiB", "--rounds", "1", "--json")
check("bench comm exits 0", r.returncode == 0, r.stderr)
bench = json.loads(r.stdout)
for key in ("bench", "baseline", "ratio"):
    check(f"bench json has {key}", key in bench, r.stdout)
check("bench name", bench.get("bench") == "comm", r.stdout)
check("bench ratio positive", bench.get("ratio", 0) > 0, r.stdout)
ops = {row["op"] for row in bench["results"]}
check("bench covers the three collectives", ops == {"all_gather", "reduce_scatter", "all_reduce"},
      str(ops))
check("bench sizes 4, 16, 64 KiB per op", len(bench["results"]) == 9, r.stdout)

# The optimizer-overlap probe: both timings and their ratio (values are not judged: a timing).
r = run("bench", "adamw", "--params", "65536", "--rounds", "1", "--overlap", "--json")
check("bench adamw --overlap exits 0", r.returncode == 0, r.stderr)
adamw = json.loads(r.stdout) if r.returncode == 0 else {}
ov = adamw.get("overlap", {})
for key in ("gemms_s", "in_turn_s", "beside_s", "step_s", "ratio", "hidden_fraction_of_step"):
    check(f"bench adamw --overlap json has {key}", key in ov, r.stdout)
check("bench adamw --overlap timings are positive",
      ov.get("in_turn_s", 0) > 0 and ov.get("gemms_s", 0) > 0, r.stdout)
# The offloaded step's other host work, timed beside the step (positive rates).
for key in ("worker_params_per_s", "worker_vs_caller", "worker_beside_a_busy_core",
            "grad_add_gbps", "grad_write_gbps", "zero_fill_gbps", "last_add_and_norm_s",
            "last_add_with_norm_s", "last_add_norm_ratio"):
    check(f"bench adamw json has a positive {key}", adamw.get(key, 0) > 0, r.stdout)
r = run("bench", "adamw", "--params", "65536", "--rounds", "1", "--json")
check("bench adamw without --overlap has no overlap key",
      r.returncode == 0 and "overlap" not in json.loads(r.stdout), r.stdout)
# The device lane's method (on this machine queued CPU streams stand in for the GPU): the split
# update bitwise the CPU's, many chunks through two staging sets (an odd count: the last chunk
# short), every share timed.
r = run("bench", "adamw", "--params", "70001", "--rounds", "1", "--lane", "--json")
check("bench adamw --lane exits 0", r.returncode == 0, r.stderr)
lane = json.loads(r.stdout) if r.returncode == 0 else {}
check("bench adamw --lane: the split update is bitwise the CPU's", lane.get("bitwise") is True,
      r.stdout)
check("bench adamw --lane runs several chunks", 0 < lane.get("chunk", 0) < 70001 / 8, r.stdout)
check("bench adamw --lane times the CPU, the lane and six shares",
      lane.get("cpu_s", 0) > 0 and lane.get("lane_s", 0) > 0 and
      [row.get("share") for row in lane.get("shares", [])] == [0.3, 0.4, 0.5, 0.6, 0.7, 1.0] and
      all(row.get("seconds", 0) > 0 for row in lane.get("shares", [])), r.stdout)
r = run("bench", "adamw", "--params", "70001", "--lane", "--overlap")
check("bench adamw --lane with --overlap is a usage error (exit 2)", r.returncode == 2, r.stderr)
r = run("bench", "adamw", "--params", "70001", "--lane=often")
check("bench adamw --lane=often is a usage error (exit 2)", r.returncode == 2, r.stderr)
# Buffers larger than the memory available are refused before any is filled (the kernel would
# grant them and the fill would run the machine out of memory): exit 2 naming --params.
with open("/proc/meminfo") as f:
    available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
if 38 * 2**32 > available:  # 38 bytes a parameter on a GPU, 40 without one
    r = run("bench", "adamw", "--params", str(2**32), "--rounds", "1", "--lane")
    check("bench adamw --lane refuses --params beyond the memory available (exit 2)",
          r.returncode == 2 and f"--params {2**32} needs" in r.stderr, r.stderr)

# bench attention: flash against the materialised path, grouped-query, in one run; and what it
# refuses (a --kv-heads that does not divide --heads, a device it does not know or lacks).
r = run("bench", "attention", "--batch", "1", "--seq", "130", "--heads", "4", "--kv-heads", "2",
        "--head-size", "16", "--rounds", "1", "--json")
check("bench attention exits 0", r.returncode == 0, r.stderr)
att = json.loads(r.stdout) if r.returncode == 0 else {}
for key in ("bench", "baseline", "flash_forward_tflops", "materialised_forward_tflops",
            "forward_speedup", "backward_speedup", "saved_bytes_flash", "saved_bytes_materialised"):
    check(f"bench attention json has {key}", key in att, r.stdout)
check("bench attention's two paths agree", att.get("max_abs_difference", 1) < 1e-4, r.stdout)
check("... and so do their input gradients", att.get("max_abs_difference_backward", 1) < 1e-4,
      r.stdout)
check("bench attention: flash saves one fp32 per query (1 x 4 x 130 x 4 B)",
      att.get("saved_bytes_flash") == 2080, r.stdout)
check("bench attention on the CPU times one call at a time (a GPU's: 10 back to back)",
      att.get("calls_per_time") == 1, r.stdout)
r = run("bench", "attention", "--heads", "12", "--kv-heads", "5")
check("bench attention --kv-heads 5 of 12 heads exits 2 naming it",
      r.returncode == 2 and "--kv-heads" in r.stderr, r.stderr)
r = run("bench", "attention", "--batch", "1024", "--seq", "45", "--heads", "256", "--head-size",
        "512")
check("bench attention refuses 294.5 GiB of buffers at once (exit 2)",
      r.returncode == 2 and "more than 8 GiB" in r.stderr, r.stderr)
r = run("bench", "attention", "--device", "cuda", "--seq", "256", "--rounds", "1")
check("bench attention --device cuda: measured on a GPU, else exit 2 naming the missing device",
      r.returncode == 0 or (r.returncode == 2 and "no CUDA device" in r.stderr), r.stderr)
r = run("bench", "attention", "--device", "tpu")
check("bench attention --device tpu exits 2 naming it",
      r.returncode == 2 and "--device 'tpu' must be cpu or cuda" in r.stderr, r.stderr)


configs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs")
r = run("bench", "model", "--config", os.path.join(configs, "bench-tiny.json"), "--iters", "1",
        "--cpu", "--json")
check("bench model exits 0", r.returncode == 0, r.stderr)
model = json.loads(r.stdout) if r.returncode == 0 else {}
for key in ("bench", "baseline", "ratio", "tokens_per_s", "achieved_tflops", "flops_per_token"):
    check(f"bench model json has {key}", key in model, r.stdout)
check("bench model counts tiny's parameters", model.get("params") == 120576, r.stdout)
check("bench model ratio positive", model.get("ratio", 0) > 0, r.stdout)
r = run("bench", "model", "--config", os.path.join(configs, "bench-tiny.json"), "--iters", "1",
        "--cpu", "--census", "--json")
census = json.loads(r.stdout).get("census", {}) if r.returncode == 0 else {}
ops = census.get("ops", {})
# bench-tiny: 2 GPT-2 blocks; one attention, one fused fc + GELU per block; the loss into the
# ledger (as zerort train: no host read inside the micro-batch).
check("bench model --census counts each block's attention and MLP",
      ops.get("Attention") == 2 and ops.get("AttentionBackward") == 2
      and ops.get("MatmulGelu") == 2, r.stdout[-500:])
check("bench model --census: no host read, the loss into the ledger",
      census.get("host_reads") == 0 and ops.get("AddToLossLedger") == 1
      and census.get("per_block") == census.get("per_micro_batch", 0) / 2, r.stdout[-500:])
r = run("bench", "model", "--config", os.path.join(configs, "bench-tiny.json"), "--iters", "1",
        "--cpu", "--census", "--timeline", "--json")
out = json.loads(r.stdout) if r.returncode == 0 else {}
timeline, census = out.get("timeline", {}), out.get("census", {})
kinds = timeline.get("kinds", {})
# Every call the census counts is timed once, grouped by kind; the calls' stream time and the
# gaps between them add up to the span, which lies inside the forward+backward's marks.
check("bench model --timeline times every call the census counts",
      timeline.get("calls") == census.get("per_micro_batch")
      and sum(k.get("calls", 0) for k in kinds.values()) == timeline.get("calls"), r.stdout[-800:])
check("bench model --timeline: GEMMs with their FLOP/s, attention, norms, no host read",
      kinds.get("gemm", {}).get("tflops", 0) > 0 and kinds.get("attention", {}).get("tflops", 0) > 0
      and kinds.get("norm", {}).get("calls") == 10 and "host read" not in kinds
      and sum(g.get("calls", 0) for g in timeline.get("gemms", {}).values())
      == kinds.get("gemm", {}).get("calls"), r.stdout[-800:])
others = timeline.get("others", {})
check("bench model --timeline: the other calls by operation, the attention's two directions apart",
      sum(g.get("calls", 0) for g in others.values()) + kinds.get("gemm", {}).get("calls", -1)
      == timeline.get("calls") and others.get("Attention", {}).get("tflops", 0) > 0
      and others.get("AttentionBackward", {}).get("calls") == 2
      and others.get("LayerNormBackward", {}).get("calls", 0) > 0, r.stdout[-800:])
check("bench model --timeline: GB/s for the memory-bound calls, not for the GEMMs",
      others.get("LayerNorm", {}).get("gbps", 0) > 0 and kinds.get("norm", {}).get("gbps", 0) > 0
      and "gbps" not in kinds.get("gemm", {"gbps": 1}) and "gbps" not in others.get("Attention", {"gbps": 1}),
      r.stdout[-800:])
check("bench model --timeline: calls + gaps = span, inside the step's marks",
      abs(timeline.get("ops_s", 0) + timeline.get("gaps_s", 0) - timeline.get("span_s", -1)) < 1e-9
      and 0 < timeline.get("span_s", 0) <= timeline.get("forward_backward_stream_s", 0) + 1e-9,
      r.stdout[-800:])

r = run("estimate", "--model", "gpt2-xl", "--gpus", "8")
check("estimate gpt2-xl exits 0", r.returncode == 0, r.stderr)
check("estimate prints 24 layouts", r.stdout.count("\n  ") >= 21, r.stdout)
check("estimate prints its caveats", "Not modelled" in r.stdout, r.stdout)
r = run("estimate", "--model", "gpt2", "--gpus", "1", "--micro-batch", "8", "--fit", "5GiB",
        "--json")
fit = json.loads(r.stdout) if r.returncode == 0 else {"rows": []}
check("--fit keeps only what fits",
      all(x["tiers"]["device"]["reserved"] <= 5 * 2**30 for x in fit["rows"]),
      r.stdout[:300])
check("--fit says why", all("why" in x for x in fit["rows"]) and len(fit["rows"]) > 0,
      r.stdout[:300])
r = run("estimate", "--params", "7.5e9", "--largest-layer-params", "1e8", "--gpus", "64",
        "--json")
cold = json.loads(r.stdout) if r.returncode == 0 else {"rows": []}
paper = [x["zero_paper_bytes"] / 1e9 for x in cold["rows"] if x.get("offload") == "none"]
check("cold mode labels the ZeRO paper's figures (120, 31.4, 16.6, 1.9 GB)",
      len(paper) == 4 and abs(paper[0] - 120) < 0.1 and abs(paper[1] - 31.4) < 0.1
      and abs(paper[2] - 16.6) < 0.1 and abs(paper[3] - 1.9) < 0.1, str(paper))
runtime = {(x["stage"], x["offload"]): x for x in cold["rows"]}
check("cold mode is zerort's runtime: fp32 gradient shards put it above the paper",
      all(runtime[(s, "none")]["device_bytes"] > runtime[(s, "none")]["zero_paper_bytes"]
          for s in range(4)) if len(runtime) == 10 else False, r.stdout[:300])
check("cold mode has offload layouts: the optimizer state on the host moves off the GPU",
      len(runtime) == 10 and runtime[(2, "cpu")]["device_bytes"] < runtime[(2, "none")]["device_bytes"]
      and runtime[(2, "cpu")]["host_bytes_per_node"] > 0
      and runtime[(3, "nvme")]["nvme_bytes_per_node"] > 0, r.stdout[:300])
r = run("estimate", os.path.join(configs, "tiny-cpu.json"), "--world-size", "2",
        "--measure", "--json")
check("estimate --measure exits 0", r.returncode == 0, r.stderr[-500:])
measured = json.loads(r.stdout) if r.returncode == 0 else {}
if measured:
    est = measured["tiers"]["device"]["total"]
    got = measured["measured_device"]["total"]
    check("--measure total within 5%", abs(est - got) <= 0.05 * got, f"{est} {got}")

tmp = tempfile.mkdtemp()
# A cluster's config estimated on a machine that lacks its NVMe directory, data file and
# checkpoint directory: estimate reads the config and touches none of its paths; train refuses.
cluster = os.path.join(tmp, "cluster.json")
with open(cluster, "w") as f:
    json.dump({"train_micro_batch_size_per_gpu": 1, "model": {"preset": "tiny"},
               "zero_optimization": {"stage": 3,
                   "offload_optimizer": {"device": "nvme", "nvme_path": "/nonexistent/nvme0"},
                   "offload_param": {"device": "nvme", "nvme_path": "/nonexistent/nvme0"}},
               "data": {"path": "/nonexistent/tokens.bin"},
               "checkpoint": {"dir": "/proc/no-such/ckpt"}}, f)
r = run("estimate", cluster, "--world-size", "8")
check("estimate of a config whose paths are elsewhere exits 0", r.returncode == 0, r.stderr[-500:])
r = run("train", cluster)
check("train refuses the same config naming each path (exit 2)",
      r.returncode == 2 and "3 problems" in r.stderr and "nvme_path" in r.stderr
      and "data.path" in r.stderr and "checkpoint.dir" in r.stderr, r.stderr[-800:])
check("nothing was created for it", not os.path.exists("/nonexistent"), "")
bad_heads = os.path.join(tmp, "bad-heads.json")
with open(bad_heads, "w") as f:
    json.dump({"model": {"preset": "tiny", "n_head": 5}}, f)
# model.attention_backend = flash or cudnn where that program does not apply (fp32, head size
# 16): the estimate for a GPU refuses it by name; on the CPU (flash always) it estimates. Hostile
# values of the key: each exit 2, naming it.
def tiny_attention(name, backend):
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump({"model": {"preset": "tiny", "attention_backend": backend},
                   "train_micro_batch_size_per_gpu": 2}, f)
    return path


for backend, said in [("flash", 'model.attention_backend = "flash": flash attention on CUDA '
                                 "takes bf16 or fp16"),
                      ("cudnn", 'model.attention_backend = "cudnn": cuDNN\'s flash attention '
                                "takes bf16 or fp16, not f32")]:
    path = tiny_attention(backend + "-fp32", backend)
    r = run("estimate", path, "--device", "cuda")
    check(f"estimate --device cuda refuses a {backend} request fp32 cannot take (exit 2, by name)",
          r.returncode == 2 and said in r.stderr, r.stderr[-500:])
    r = run("estimate", path, "--device", "cpu")
    check(f"... and on the CPU, which runs flash always, estimates {backend}", r.returncode == 0,
          r.stderr[-500:])
for name, backend, said in [
        ("backend-number", 7, "model.attention_backend = 7: expected a string, got a number"),
        ("backend-empty", "", 'model.attention_backend = "": expected one of flash, '
                              "materialised, cudnn"),
        ("backend-array", ["cudnn"], "expected a string, got an array"),
        ("backend-huge", "c" * 5000, "expected one of flash, materialised, cudnn")]:
    r = run("estimate", tiny_attention(name, backend), "--device", "cuda")
    check(f"model.attention_backend hostile ({name}): exit 2 naming it",
          r.returncode == 2 and said in r.stderr, r.stderr[-500:])
# model.flash_attention, the CUDA flash kernels' block shapes: the same estimate whatever they are
# (they split the same work); one the head size does not take, or a value none takes, is refused
# naming the key (exit 2).
with open(os.path.join(configs, "gpt2-124m-bf16-zero3.json")) as f:
    gpt2_config = json.load(f)


def gpt2_with(name, tiles, **model):
    config = json.loads(json.dumps(gpt2_config))
    config["model"].update(model, flash_attention=tiles)
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    return path


plain = run("estimate", gpt2_with("tiles-default", {}), "--device", "cuda")
r = run("estimate", gpt2_with("tiles-128", {"forward_block_queries": 128, "backward_block_keys": 128,
                                            "backward_query_chunk": 32}), "--device", "cuda")
check("estimate --device cuda with model.flash_attention's other block shapes: the same estimate",
      plain.returncode == 0 and r.returncode == 0  # the first line names the file
      and r.stdout.split("\n", 1)[1] == plain.stdout.split("\n", 1)[1],
      r.stderr[-500:] + plain.stderr[-500:])
r = run("estimate", gpt2_with("tiles-96", {"forward_block_queries": 96}), "--device", "cuda")
check("a block shape no head size takes: exit 2 naming the key and the values",
      r.returncode == 2 and "model.flash_attention.forward_block_queries = 96: one of 0 (the "
      "default), 64, 128" in r.stderr, r.stderr[-500:])
r = run("estimate", gpt2_with("tiles-warps-6", {"forward_warps": 6}), "--device", "cuda")
check("forward warps no block has: exit 2 naming the key and the values",
      r.returncode == 2 and "model.flash_attention.forward_warps = 6: one of 0 (the default), 4, 8"
      in r.stderr, r.stderr[-500:])
r = run("estimate", gpt2_with("tiles-64q-8w", {"forward_block_queries": 64, "forward_warps": 8}),
        "--device", "cuda")
check("64 queries on 8 warps (no such block): exit 2 naming both keys",
      r.returncode == 2 and "forward_block_queries = 64 with forward_warps = 8 at head size 64"
      in r.stderr, r.stderr[-500:])
r = run("estimate", gpt2_with("tiles-hs128", {"backward_block_keys": 128}, n_head=6), "--device",
        "cuda")
check("a block shape this head size does not take (head size 128): exit 2 naming it",
      r.returncode == 2 and "model.flash_attention.backward_block_keys = 128 at head size 128"
      in r.stderr, r.stderr[-500:])
# model.attention_backend = cudnn (cuDNN's flash attention, in builds given cudnn-frontend): an
# estimate for a GPU takes it in any build (it plans the log-sum-exps zerort's flash saves, and
# cuDNN's workspace budgets) and refuses block shapes (zerort's kernels') by name; fp32 above.
r = run("estimate", gpt2_with("cudnn", {}, attention_backend="cudnn"), "--device", "cuda")
check("estimate --device cuda with model.attention_backend cudnn: exit 0", r.returncode == 0,
      r.stderr[-500:])
r = run("estimate", gpt2_with("cudnn-tiles", {"backward_block_keys": 128},
                              attention_backend="cudnn"), "--device", "cuda")
check("... with model.flash_attention's block shapes: exit 2 saying they are zerort's kernels'",
      r.returncode == 2 and 'model.attention_backend = "cudnn" runs cuDNN\'s attention' in r.stderr,
      r.stderr[-500:])
# Hostile values of the section and its keys: each refused, exit 2, naming the key and why.
for name, tiles, said in [
        ("tiles-string", {"forward_block_queries": "128"}, "expected an integer, got a string"),
        ("tiles-negative", {"backward_block_keys": -64}, "out of range, expected an integer in"),
        ("tiles-huge", {"backward_query_chunk": 1e12}, "out of range, expected an integer in"),
        ("tiles-fraction", {"forward_block_queries": 64.5}, "expected an integer, got a number"),
        ("tiles-typo", {"forward_queries": 128}, "unknown key 'model.flash_attention.forward_queries'"),
        ("warps-string", {"forward_warps": "8"}, "expected an integer, got a string"),
        ("warps-negative", {"forward_warps": -8}, "out of range, expected an integer in [0, 8]"),
        ("warps-huge", {"forward_warps": 1e12}, "out of range, expected an integer in [0, 8]"),
        ("warps-fraction", {"forward_warps": 7.5}, "expected an integer, got a number"),
        ("warps-array", {"forward_warps": [8]}, "expected an integer, got an array"),
        ("tiles-not-object", 128, "model.flash_attention = 128: expected an object")]:
    r = run("estimate", gpt2_with(name, tiles), "--device", "cuda")
    check(f"model.flash_attention hostile ({name}): exit 2 naming it",
          r.returncode == 2 and said in r.stderr, r.stderr[-500:])
# bench model --set overrides a key as train's does.
r = run("bench", "model", "--config", os.path.join(configs, "bench-tiny.json"), "--iters", "1",
        "--cpu", "--json", "--set", "model.n_layer=3", "--set", "model.attention_backend=materialised")
check("bench model --set: the overrides apply (3 blocks)", r.returncode == 0
      and json.loads(r.stdout).get("n_layer") == 3, r.stderr[-500:])
r = run("bench", "model", "--config", os.path.join(configs, "bench-tiny.json"), "--cpu",
        "--set", "model.attention_backend=fast")
check("bench model --set with a value the key does not take: exit 2 naming the choices",
      r.returncode == 2 and "attention_backend" in r.stderr and "materialised" in r.stderr,
      r.stderr[-500:])
r = run("bench", "model", "--config", os.path.join(configs, "bench-tiny.json"), "--cpu",
        "--set", "model.flash_attention.forward_warps=abc")
check("bench model --set forward_warps=abc: exit 2 naming the key",
      r.returncode == 2 and "model.flash_attention.forward_warps = \"abc\": expected an integer"
      in r.stderr, r.stderr[-500:])
bad_preset = os.path.join(tmp, "bad-preset.json")
with open(bad_preset, "w") as f:
    json.dump({"model": {"preset": "gpt9"}}, f)

for args, needle in [
    (["bench", "model", "--config", bad_heads], "does not divide"),
    (["bench", "model", "--config", bad_preset], "gpt9"),
    (["bench", "model", "--config", os.path.join(tmp, "missing.json")], "missing.json"),
    (["bench", "comm", "--backend", "carrier-pigeon"], "carrier-pigeon"),
    (["bench", "comm", "--max-bytes", "12QB"], "12QB"),
    (["bench", "comm", "--ops", "all_to_all"], "all_to_all"),
    (["bench", "comm", "--min-bytes", "1MiB", "--max-bytes", "1KiB"], "--min-bytes"),
    (["train", "no-such-run.json"], "no-such-run.json: cannot be read"),
    (["estimate", "no-such-run.json"], "no-such-run.json"),
    (["estimate", "--model", "gpt7", "--gpus", "8"], "gpt7"),
    (["estimate", "--model", "gpt2", "--gpus", "0"], "--gpus 0"),
    (["estimate", "--layers", "4", "--hidden", "100", "--heads", "3"], "does not divide"),
    (["estimate", "--model", "gpt2", "--fit", "lots"], "--fit lots"),
    (["no-such-command"], "no-such-command"),
]:
    r = run(*args)
    check(f"{' '.join(args)} exits 2", r.returncode == 2, f"rc={r.returncode} {r.stderr}")
    check(f"{' '.join(args)} names the problem", needle in r.stderr + r.stdout, r.stderr)

checks.finish()
