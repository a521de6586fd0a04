#!/usr/bin/env python3
"""Offload from the command line: `zerort train` with optimizer state (and at stage 3 the
parameters) on the host or on NVMe follows the run without offload to the bit (losses in
metrics.jsonl); a checkpoint saved with NVMe offload resumes without offload and the reverse
(and, with MPIEXEC, at another world size: np 1 <-> np 2); an injected I/O error stops the run with
exit 1 naming the file while the previous checkpoint still loads; a disk too small for the state
(a 1 MiB tmpfs, where mounting is allowed) and bad offload configs exit 2 naming the key; nothing
is ever left in nvme_path.
Usage: offload_cli_test.py PATH_TO_ZERORT [MPIEXEC]"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

zerort = sys.argv[1]
mpiexec = sys.argv[2] if len(sys.argv) > 2 else None
checks = Checks("offload_cli_test")
check = checks.check
tmp = tempfile.mkdtemp()
nvme = os.path.join(tmp, "nvme")
os.makedirs(nvme)
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
           OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_btl_vader_single_copy_mechanism="none")


def offload(optimizer="none", param="none", path=nvme, engine="auto", ratio=1):
    z = {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 65536,
         "offload_optimizer": {"device": optimizer, "nvme_path": path, "ratio": ratio},
         "offload_param": {"device": param, "nvme_path": path, "buffer_size": 200000}}
    return z, {"engine": engine}


def config(name, steps, ckpt=None, micro=4, optimizer="none", param="none", engine="auto",
           path=nvme, ratio=1, **extra):
    zero, aio = offload(optimizer, param, path, engine, ratio)
    c = {
        "train_batch_size": 8, "train_micro_batch_size_per_gpu": micro,
        "zero_optimization": zero, "aio": aio,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "model": {"n_layer": 2, "n_head": 4, "d_model": 64, "seq_len": 64, "vocab_size": 256},
        "train": {"steps": steps, "eval_windows": 2, "sample_tokens": 0, "device": "cpu"},
        "logging": {"metrics_file": os.path.join(tmp, name + ".jsonl")},
    }
    if ckpt:
        c["checkpoint"] = {"dir": ckpt, "interval": 3, "keep_last_n": 3}
    c.update(extra)
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(c, f)
    return path


def run(args, launcher=(), extra_env=None):
    return subprocess.run([*launcher, zerort, *args], capture_output=True, text=True,
                          env=dict(env, **(extra_env or {})), timeout=300)


def losses(name):
    with open(os.path.join(tmp, name + ".jsonl")) as f:
        return [json.loads(line)["loss"] for line in f]


def nvme_empty(what):
    left = os.listdir(nvme)
    check(f"{what}: nothing left in nvme_path", not left, left)


# Every placement equals the device run, bitwise.
r = run(["train", config("device", 6)])
check("device run exits 0", r.returncode == 0, r.stderr[-2000:])
device = losses("device")
# Where the kernel refuses io_uring (`zerort env`: ENOSYS, or EPERM from a sysctl or a seccomp
# profile), the NVMe run that asks for it takes engine auto, which then uses the threads engine.
nvme_io = json.loads(subprocess.run([zerort, "env", "--json"], capture_output=True, text=True,
                                    env=env).stdout)["nvme_io"]
uring = "io_uring" if nvme_io["io_uring"] else "auto"
if not nvme_io["io_uring"]:
    print(f"offload_cli_test: io_uring refused here ({nvme_io['io_uring_refused']}): "
          "nvme_uring runs engine auto")
for name, kw in [("cpu", dict(optimizer="cpu")),
                 ("cpu_params", dict(optimizer="cpu", param="cpu")),
                 # DeepSpeed's Twin-Flow: the last half of the units' state on the host.
                 ("cpu_half", dict(optimizer="cpu", param="cpu", ratio=0.5)),
                 ("nvme_uring", dict(optimizer="nvme", param="nvme", engine=uring)),
                 ("nvme_threads", dict(optimizer="nvme", param="nvme", engine="threads"))]:
    if name == "nvme_uring":  # traced too: the NVMe tier's reads and updates per chunk
        kw = dict(kw, logging={"metrics_file": os.path.join(tmp, name + ".jsonl"),
                               "trace_file": os.path.join(tmp, "nvme_trace.json")})
    r = run(["train", config(name, 6, **kw)])
    if check(f"{name} run exits 0", r.returncode == 0, r.stderr[-2000:]):
        check(f"{name} losses equal the device run's bitwise", losses(name) == device,
              (losses(name), device))
    if name == "cpu_half":  # 4 units (embedding, 2 blocks, final norm): the last 2 on the host
        check("cpu_half: the log says which units went where",
              "ratio = 0.5: the optimizer state of the last 2 of 4 units" in r.stderr and
              "from unit 'blocks.1'" in r.stderr, r.stderr[-2000:])
    if name == "nvme_uring":
        with open(os.path.join(tmp, name + ".jsonl")) as f:
            rec = json.loads(f.readline())
        check("metrics.jsonl carries the nvme tier's peak",
              rec.get("peak_offload_bytes", {}).get("nvme", {}).get("total", 0) > 0, rec)
        if os.path.exists(os.path.join(tmp, "nvme_trace.json")):
            with open(os.path.join(tmp, "nvme_trace.json")) as f:
                events = json.load(f)
            track = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
            got = {(track[e["tid"]], e["name"].split(" [")[0]) for e in events if e.get("ph") == "X"}
            check("the trace has each chunk's NVMe reads on the io track and its update",
                  {("io", "nvme read blocks.0"), ("host", "optimizer blocks.0")} <= got,
                  str(sorted(got))[:800])
        else:
            check("the nvme run wrote its trace", False)
    nvme_empty(name)

# Units larger than one optimizer chunk (d_model 128: 197K-element blocks in 65,536-element
# chunks), bf16, two micro-batches reduced one by one: the chunked NVMe pipeline and gradient
# read-add-write change no bit either.
wide = dict(model={"n_layer": 3, "n_head": 4, "d_model": 128, "seq_len": 64, "vocab_size": 256},
            bf16={"enabled": True})
for name, kw in [("wide_device", {}), ("wide_nvme", dict(optimizer="nvme", param="nvme"))]:
    cfg = config(name, 5, micro=2, train_batch_size=4, **kw, **wide)
    with open(cfg) as f:
        c = json.load(f)
    c["zero_optimization"].update({"reduce_bucket_size": 1})
    c["zero_optimization"]["offload_param"]["buffer_size"] = 300000
    with open(cfg, "w") as f:
        json.dump(c, f)
    r = run(["train", cfg])
    check(f"{name} exits 0", r.returncode == 0, r.stderr[-2000:])
check("multi-chunk NVMe units, bf16: losses equal the device run bitwise",
      losses("wide_nvme") == losses("wide_device"), (losses("wide_nvme"), losses("wide_device")))
nvme_empty("multi-chunk")

# Resume across tiers: saved with NVMe offload, resumed without, and the reverse.
for first, second in [(dict(optimizer="nvme", param="nvme"), {}),
                      ({}, dict(optimizer="nvme", param="nvme"))]:
    ckpt = os.path.join(tmp, "ckpt_" + ("nvme_first" if first else "device_first"))
    tag = "nvme -> device" if first else "device -> nvme"
    a, b = "a_" + os.path.basename(ckpt), "b_" + os.path.basename(ckpt)
    r = run(["train", config(a, 3, ckpt, **first)])
    check(f"{tag}: first half exits 0", r.returncode == 0, r.stderr[-2000:])
    r = run(["train", config(b, 6, ckpt, **second), "--resume"])
    check(f"{tag}: resumed half exits 0", r.returncode == 0, r.stderr[-2000:])
    if r.returncode == 0:
        check(f"{tag}: steps 4-6 equal the straight run's bitwise", losses(b) == device[3:],
              (losses(b), device[3:]))
    nvme_empty(tag)

# At another world size (MPI): np 1 with NVMe offload -> np 2 without, and np 2 -> np 1 NVMe.
if mpiexec:
    for first_np, second_np in [(1, 2), (2, 1)]:
        ckpt = os.path.join(tmp, f"ckpt_np{first_np}")
        first = dict(optimizer="nvme", param="nvme") if first_np == 1 else {}
        second = {} if first_np == 1 else dict(optimizer="nvme", param="nvme")
        launch = lambda np_: (mpiexec, "-np", "2", "--oversubscribe") if np_ == 2 else ()
        w1, w2 = f"w1_np{first_np}", f"w2_np{first_np}"
        r = run(["train", config(w1, 3, ckpt, micro=4 // first_np, **first)], launch(first_np))
        check(f"np {first_np}: first half exits 0", r.returncode == 0, r.stderr[-2000:])
        r = run(["train", config(w2, 6, ckpt, micro=4 // second_np, **second), "--resume"],
                launch(second_np))
        check(f"np {first_np} -> np {second_np}: resumed half exits 0", r.returncode == 0,
              r.stderr[-2000:])
        if r.returncode == 0:
            got = losses(w2)
            close = len(got) == 3 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, device[3:]))
            check(f"np {first_np} -> np {second_np}: steps 4-6 equal the straight run to 1e-5",
                  close, (got, device[3:]))
        nvme_empty(f"np {first_np} -> np {second_np}")
else:
    print("offload_cli_test: no MPIEXEC given; the world-size resume is skipped")

# An I/O error during training: exit 1 naming the file; the checkpoint saved before still loads.
ckpt = os.path.join(tmp, "ckpt_fault")
r = run(["train", config("f1", 3, ckpt, optimizer="nvme", param="nvme")])
check("fault: the run before the fault exits 0", r.returncode == 0, r.stderr[-2000:])
r = run(["train", config("f2", 9, ckpt, optimizer="nvme", param="nvme"), "--resume"],
        extra_env={"ZERORT_FAIL_NVME_REQUEST": "150", "ZERORT_FAIL_NVME_ERRNO": "5"})
check("fault: an injected EIO exits 1", r.returncode == 1, (r.returncode, r.stderr[-2000:]))
check("fault: the message names the NVMe file", "zerort-rank0" in r.stderr and
      "Input/output error" in r.stderr, r.stderr[-2000:])
r2 = run(["checkpoint", "inspect", ckpt])
check("fault: the checkpoint saved before the fault still inspects clean", r2.returncode == 0 and
      ("step_3" in r2.stdout or "step_6" in r2.stdout), r2.stdout[-1000:] + r2.stderr[-1000:])
r2 = run(["train", config("f3", 4, ckpt, optimizer="nvme", param="nvme"), "--resume"])
check("fault: and resumes", r2.returncode == 0, r2.stderr[-2000:])
nvme_empty("fault")

# A disk too small for the state: a 1 MiB tmpfs, when this machine lets us mount one.
small = os.path.join(tmp, "small")
os.makedirs(small)
mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", small],
                         capture_output=True).returncode == 0
if mounted:
    try:
        r = run(["train", config("small", 2, optimizer="nvme", param="nvme", path=small)])
        check("small disk: exit 2", r.returncode == 2, (r.returncode, r.stderr[-2000:]))
        check("small disk: says how much is needed and free", "GiB" in r.stderr and small in
              r.stderr, r.stderr[-2000:])
        check("small disk: nothing left", not os.listdir(small), os.listdir(small))
    finally:
        subprocess.run(["umount", small])
else:
    print("offload_cli_test: mount is not allowed here; the small-disk case is skipped")

# Bad offload configs: exit 2 naming the key.
plain = os.path.join(tmp, "plain_file")
open(plain, "w").close()
fifo = os.path.join(tmp, "a_fifo")
os.mkfifo(fifo)
bad = [
    ("missing nvme_path", dict(optimizer="nvme", path=os.path.join(tmp, "nope")),
     "offload_optimizer.nvme_path"),
    ("a file as nvme_path", dict(optimizer="nvme", path=plain), "is not a directory"),
    ("a FIFO as nvme_path", dict(optimizer="nvme", path=fifo), "is not a directory"),
    ("a partial offload to nvme", dict(optimizer="nvme", ratio=0.5),
     "zero_optimization.offload_optimizer.ratio = 0.5"),
]
for what, kw, expect in bad:
    r = run(["train", config("bad", 2, **kw)])
    check(f"{what}: exit 2", r.returncode == 2, (r.returncode, r.stderr[-1000:]))
    check(f"{what}: names it", expect in r.stderr, r.stderr[-1000:])
stage2 = config("stage2", 2, param="cpu")
with open(stage2) as f:
    c = json.load(f)
c["zero_optimization"]["stage"] = 2
with open(stage2, "w") as f:
    json.dump(c, f)
r = run(["train", stage2])
# DeepSpeed ignores offload_param below stage 3; zerort does too, with a warning naming the key.
check("offload_param at stage 2: trains, warning that it is ignored", r.returncode == 0 and
      "[warning]" in r.stderr and "zero_optimization.offload_param.device" in r.stderr and
      "is ignored at zero_optimization.stage 2" in r.stderr, r.stderr[-1000:])
# offload_param.buffer_size is an upper bound: the fetch buffers are the size of the largest
# offloaded shard, said in the log (DeepSpeed's default of 1e8 elements x 5 buffers reserved
# 2 GB of pinned host memory for an 85K-parameter model).
r = run(["train", config("huge-buffer", 2, optimizer="nvme", param="nvme"), "--set",
         "zero_optimization.offload_param.buffer_size=1e15"])
check("offload_param.buffer_size=1e15: trains, its fetch buffers sized to the largest shard",
      r.returncode == 0 and re.search(r"offload_param: 5 fetch buffers of \d+ elements \(\d+\.\d MiB "
                                      r"in all\): the largest offloaded shard, unit 'blocks\.\d'",
                                      r.stderr) is not None, (r.returncode, r.stderr[-1000:]))
for key, value, expect in [
        ("zero_optimization.offload_param.buffer_count", "0", "buffer_count"),
        ("zero_optimization.offload_optimizer.buffer_count", "1e9", "buffer_count"),
        ("zero_optimization.sub_group_size", "-5", "sub_group_size"),
        ("aio.queue_depth", "\"eight\"", "aio.queue_depth"),
        ("aio.block_size", "1e300", "aio.block_size"),
        ("zero_optimization.offload_optimizer.nvme_path", "\"\"", "nvme_path")]:
    r = run(["train", config("hostile", 2, optimizer="nvme", param="nvme"), "--set",
             f"{key}={value}"])
    check(f"{key}={value}: exit 1 or 2, no crash", r.returncode in (1, 2), (r.returncode, r.stderr[-800:]))
    check(f"{key}={value}: the message names it", expect in r.stderr, r.stderr[-800:])
# GPUDirect Storage only tunes the I/O path: accepted, with a note saying what zerort does.
r = run(["train", config("gds", 2, optimizer="nvme"), "--set", "aio.use_gds=true",
         "--print-config"])
check("aio.use_gds: accepted with a note", r.returncode == 0 and "aio.use_gds" in r.stderr and
      "pinned host memory" in r.stderr, (r.returncode, r.stderr[-1000:]))
nvme_empty("bad configs")

# Memory: a 114 M-parameter model with its state on NVMe stays within what the estimator gives
# for the memory tiers (reserved bytes, allocator overhead included) plus a fixed allowance for
# the process itself (code, libraries, BLAS and OpenMP buffers, the corpus), and far below the
# same run without offload. Resident set from wait4's rusage of each child alone.
def max_rss_bytes(args):
    p = subprocess.Popen([zerort, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env=env, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    err = p.stderr.read()
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024, err


big = {"n_layer": 16, "n_head": 12, "d_model": 768, "seq_len": 64, "vocab_size": 256}
allowance = 512 << 20
for name, kw in [("m100_nvme", dict(optimizer="nvme", param="nvme")), ("m100_plain", {})]:
    cfg = config(name, 1, micro=1, **kw, train_batch_size=1,
                 model=big, train={"steps": 1, "eval_windows": 1, "sample_tokens": 0,
                                   "device": "cpu"})
    with open(cfg) as f:
        c = json.load(f)
    c["zero_optimization"].update({"reduce_bucket_size": 1, "sub_group_size": 4194304})
    c["zero_optimization"]["offload_param"].update({"buffer_size": 8000000, "buffer_count": 2})
    with open(cfg, "w") as f:
        json.dump(c, f)
    code, rss, err = max_rss_bytes(["train", cfg])
    check(f"{name}: exits 0", code == 0, err[-1500:])
    est = json.loads(run(["estimate", cfg, "--json"]).stdout)["tiers"]
    memory_tiers = sum(est[t]["reserved"] for t in ("device", "pinned_host", "host"))
    print(f"offload_cli_test: {name}: max resident set {rss >> 20} MiB; estimate of the memory "
          f"tiers {memory_tiers >> 20} MiB, nvme {est['nvme']['total'] >> 20} MiB")
    if name == "m100_nvme":
        nvme_rss, nvme_bound = rss, memory_tiers + allowance
        check(f"{name}: resident set {rss >> 20} MiB within the estimate's {memory_tiers >> 20} MiB "
              f"+ {allowance >> 20} MiB", rss <= nvme_bound, (rss, nvme_bound))
        with open(os.path.join(tmp, name + ".jsonl")) as f:
            rec = json.loads(f.readline())
        measured = rec["peak_offload_bytes"]["pinned_host"]["total"]
        check(f"{name}: the host tier's tracked peak equals the estimate",
              abs(measured - est["pinned_host"]["total"]) <= 0.05 * measured,
              (measured, est["pinned_host"]["total"]))
    else:
        check(f"NVMe offload's resident set ({nvme_rss >> 20} MiB) is under half the run "
              f"without offload ({rss >> 20} MiB)", nvme_rss < 0.5 * rss, (nvme_rss, rss))
    nvme_empty(name)

# bench offload: one JSON object with the baseline named and the ratio; bad flags exit 2.
r = run(["bench", "offload", "--path", nvme, "--size", str(8 << 20), "--rounds", "1", "--json"])
if check("bench offload exits 0", r.returncode == 0, r.stderr[-1500:]):
    j = json.loads(r.stdout)
    check("bench offload reports against fio", j.get("bench") == "offload" and
          "fio" in j.get("baseline", "") and j.get("ratio", 0) > 0 and
          j.get("fio_read_bytes_per_s", 0) > 0, j)
for flags in (["--block-size", "5000"], ["--rounds", "0"], ["--queue-depth", "-1"],
              ["--size", "100"], ["--engine", "libaio"]):
    r = run(["bench", "offload", "--path", nvme, *flags])
    check(f"bench offload {' '.join(flags)}: exit 2", r.returncode == 2, (r.returncode, r.stderr[-500:]))
odd = os.path.join(tmp, "odd dir; echo pwned > " + os.path.join(tmp, "pwned"))
os.makedirs(odd)
r = run(["bench", "offload", "--path", odd, "--size", str(4 << 20), "--rounds", "1", "--json"])
check("bench offload in a directory with a space and a ';': exit 0", r.returncode == 0,
      r.stderr[-800:])
check("...and nothing ran through a shell", not os.path.exists(os.path.join(tmp, "pwned")), "")
check("...and nothing is left there", not os.listdir(odd), os.listdir(odd))
r = run(["bench", "offload", "--path", os.path.join(tmp, "nope")])
check("bench offload on a missing path: exit 2", r.returncode == 2, (r.returncode, r.stderr[-500:]))
nvme_empty("bench offload")

shutil.rmtree(tmp, ignore_errors=True)
checks.finish()
