#!/usr/bin/env python3
"""`zerort train` end to end: stage 0 on one process, stage 3 under `mpirun -np 4`, and tensor
parallelism (tp 2 at np 2; dp 2 x tp 2 with sequence parallelism at np 4, checkpointed and
resumed on one process) give the same loss curve (fp32, 1e-5 relative) read from metrics.jsonl; --print-config; `zerort data prepare` feeding a
run; and exit code 2 with the JSON path for each kind of bad config (tensor-parallel ones under
mpirun).
Usage: train_test.py PATH_TO_ZERORT MPIEXEC"""
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

zerort, mpiexec = sys.argv[1], sys.argv[2]
checks = Checks("train_test")
check = checks.check
tmp = tempfile.mkdtemp()



def write(name, obj):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))
    return path


BASE = {
    "train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
    "gradient_clipping": 1.0,
    "steps_per_print": 5,
    "model": {"n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 32, "vocab_size": 256},
    "train": {"steps": 10, "eval_windows": 4, "sample_tokens": 20, "device": "cpu"},
}


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f]


env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
single = dict(BASE, train_micro_batch_size_per_gpu=8, zero_optimization={"stage": 0},
              logging={"metrics_file": os.path.join(tmp, "single.jsonl")})
r = subprocess.run([zerort, "train", write("single.json", single)], capture_output=True,
                   text=True, env=env, timeout=300)
check("single-process run exits 0", r.returncode == 0, r.stderr[-2000:])
check("prints metrics lines", "step    10/10 | loss" in r.stdout, r.stdout[-2000:])
check("prints a sample", "sample (temperature" in r.stdout, r.stdout[-500:])
sharded = dict(BASE, train_micro_batch_size_per_gpu=1,
               zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0},
               logging={"metrics_file": os.path.join(tmp, "sharded.jsonl")})
r = subprocess.run([mpiexec, "-np", "4", "--oversubscribe", zerort, "train",
                    write("sharded.json", sharded)], capture_output=True, text=True, env=env,
                   timeout=300)
check("mpirun -np 4 stage-3 run exits 0", r.returncode == 0, r.stderr[-2000:])
if not checks.failures:
    a, b = losses(os.path.join(tmp, "single.jsonl")), losses(os.path.join(tmp, "sharded.jsonl"))
    check("ten steps each", len(a) == len(b) == 10, f"{len(a)} {len(b)}")
    check("the loss falls", a[-1] < a[0] - 0.3, str(a))
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    check("stage 3 x 4 ranks == stage 0 x 1 rank to 1e-5", worst <= 1e-5, f"{worst} {a} {b}")

# Tensor parallelism: the same global batch and data order, so the same losses.
for np_, tp, sp, micro, stage in [(2, 2, False, 8, 0), (4, 2, True, 4, 1)]:
    name = f"tp{tp}_np{np_}"
    run = dict(BASE, train_micro_batch_size_per_gpu=micro, zero_optimization={"stage": stage},
               parallel={"tensor_parallel_size": tp, "sequence_parallel": sp},
               logging={"metrics_file": os.path.join(tmp, name + ".jsonl")})
    r = subprocess.run([mpiexec, "-np", str(np_), "--oversubscribe", zerort, "train",
                        write(name + ".json", run)], capture_output=True, text=True, env=env,
                       timeout=300)
    check(f"{name} exits 0", r.returncode == 0, r.stderr[-2000:])
    check(f"{name} reports the mesh", f"data {np_ // tp} x tensor {tp}" in r.stderr,
          r.stderr[-2000:])
    check(f"{name}: one rank prints", r.stdout.count("step    10/10 | loss") == 1, r.stdout[-2000:])
    if r.returncode == 0 and os.path.exists(os.path.join(tmp, "single.jsonl")):
        a, b = losses(os.path.join(tmp, "single.jsonl")), losses(os.path.join(tmp, name + ".jsonl"))
        worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
        check(f"{name} == one rank to 1e-5", len(b) == 10 and worst <= 1e-5, f"{worst} {a} {b}")

# logging.trace_file: Chrome trace-event JSON with one process per rank and its tracks.
trace = os.path.join(tmp, "traces", "run.json")
traced = dict(BASE, train_micro_batch_size_per_gpu=4, zero_optimization={"stage": 1},
              parallel={"tensor_parallel_size": 2}, train=dict(BASE["train"], steps=3),
              checkpoint={"dir": os.path.join(tmp, "traced_ckpt")},
              logging={"trace_file": trace})
r = subprocess.run([mpiexec, "-np", "4", "--oversubscribe", zerort, "train",
                    write("traced.json", traced)], capture_output=True, text=True, env=env,
                   timeout=300)
check("a traced run exits 0", r.returncode == 0, r.stderr[-2000:])
if r.returncode == 0:
    with open(trace) as f:
        events = json.load(f)
    check("the trace is a list of events", isinstance(events, list) and len(events) > 0)
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    check("one process per rank", names == {r_: f"rank {r_}" for r_ in range(4)}, str(names))
    spans = [e for e in events if e.get("ph") == "X"]
    check("complete events carry times", all(isinstance(e["ts"], int) and e["dur"] >= 0
                                             for e in spans))
    for rank in range(4):
        mine = {e["name"] for e in spans if e["pid"] == rank}
        check(f"rank {rank}: every micro-batch, step and the save",
              {"forward+backward 1.0", "forward+backward 3.0", "optimizer step 3",
               "checkpoint save 3"} <= mine, str(sorted(mine))[:500])
    tracks = {(e["pid"], e["args"]["name"]) for e in events if e.get("name") == "thread_name"}
    check("compute and io tracks on every rank",
          all((rank, t) in tracks for rank in range(4) for t in ("compute", "io")), str(tracks))
    # Every collective on its stream's track, named by kind, group and bytes (CommSpans).
    track_of = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                if e.get("name") == "thread_name"}
    for rank in range(4):
        colls = [(track_of[(rank, e["tid"])], e["name"]) for e in spans if e["pid"] == rank and
                 e["name"].split(" ")[0] in ("all_gather", "reduce_scatter", "all_reduce")]
        kinds = {(t, n.split(" ")[0], n.split(" ")[1]) for t, n in colls}
        check(f"rank {rank}: the tensor-parallel all-reduces on the compute track",
              ("compute", "all_reduce", "world.tp") in kinds, str(sorted(kinds))[:600])
        check(f"rank {rank}: the gradients' data-parallel reduction on the comm track",
              any(t == "comm" and g == "world.dp" for t, _, g in kinds), str(sorted(kinds))[:600])
        check(f"rank {rank}: each names its bytes", all(" B" in n for _, n in colls), str(colls[:3]))
        units = {n for e in spans for n in [e["name"]]
                 if e["pid"] == rank and track_of[(rank, e["tid"])] == "compute"}
        check(f"rank {rank}: every unit's forward and backward on the compute track",
              {"forward blocks.0", "backward blocks.0", "forward blocks.1",
               "backward blocks.1", "optimizer blocks.0", "optimizer blocks.1"} <= units,
              str(sorted(units))[:600])

# zerort bench model on a data x tensor mesh: per-device numbers over every device.
bench_cfg = dict(BASE, train_micro_batch_size_per_gpu=8,
                 parallel={"tensor_parallel_size": 2, "sequence_parallel": True})
r = subprocess.run([mpiexec, "-np", "2", "--oversubscribe", zerort, "bench", "model", "--config",
                    write("bench_tp.json", bench_cfg), "--cpu", "--iters", "1", "--json"],
                   capture_output=True, text=True, env=env, timeout=300)
check("bench model at tp 2 exits 0", r.returncode == 0, r.stderr[-2000:])
if r.returncode == 0:
    lines = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    check("one rank reports", len(lines) == 1, r.stdout[-1000:])
    b = lines[0] if lines else {}
    check("bench model reports the mesh", b.get("tensor_parallel") == 2 and
          b.get("data_parallel") == 1 and b.get("world_size") == 2, str(b))
    check("per device = run / devices",
          abs(b.get("tokens_per_s_per_device", 0) * 2 - b.get("tokens_per_s", -1)) < 1e-6 *
          b.get("tokens_per_s", 1), str(b))

# A checkpoint saved at dp 2 x tp 2 (np 4, sequence parallel, a padded vocabulary) after 5 steps,
# resumed on one process (tp 1) for the other 5: the losses of the straight one-process run; and
# exported to Hugging Face from the tensor-parallel layout.
tp_ckpt = os.path.join(tmp, "tp_moved")
tp_first = dict(BASE, train_micro_batch_size_per_gpu=4, zero_optimization={"stage": 1},
                parallel={"tensor_parallel_size": 2, "sequence_parallel": True,
                          "make_vocab_size_divisible_by": 3},
                train=dict(BASE["train"], steps=5), checkpoint={"dir": tp_ckpt},
                logging={"metrics_file": os.path.join(tmp, "tp_moved.jsonl")})
r = subprocess.run([mpiexec, "-np", "4", "--oversubscribe", zerort, "train",
                    write("tp_moved1.json", tp_first)], capture_output=True, text=True, env=env,
                   timeout=300)
check("5 steps at dp 2 x tp 2 with a checkpoint", r.returncode == 0, r.stderr[-2000:])
tp_second = dict(single, train=dict(BASE["train"], steps=10), checkpoint={"dir": tp_ckpt},
                 logging={"metrics_file": os.path.join(tmp, "tp_moved.jsonl")})
r = subprocess.run([zerort, "train", write("tp_moved2.json", tp_second), "--resume"],
                   capture_output=True, text=True, env=env, timeout=300)
check("resumed on one process at tp 1", r.returncode == 0, r.stderr[-2000:])
if r.returncode == 0 and os.path.exists(os.path.join(tmp, "single.jsonl")):
    a, b = losses(os.path.join(tmp, "single.jsonl")), losses(os.path.join(tmp, "tp_moved.jsonl"))
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    check("the tp-moved run follows the straight one to 1e-5", len(b) == 10 and worst <= 1e-5,
          f"{worst} {a} {b}")
hf = os.path.join(tmp, "tp_hf")
r = subprocess.run([zerort, "checkpoint", "export", os.path.join(tp_ckpt, "step_5"), hf],
                   capture_output=True, text=True, timeout=120)
check("export from a dp 2 x tp 2 checkpoint exits 0", r.returncode == 0, r.stderr[-1000:])
if r.returncode == 0:
    with open(os.path.join(hf, "model.safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    wte = header.get("transformer.wte.weight", header.get("wte.weight", {})).get("shape")
    check("the exported wte has the real vocabulary (no padding)", wte == [256, 32], str(wte))

# A checkpoint saved at world size 4 and stage 3, resumed at world size 2 and stage 1.
ckpt = os.path.join(tmp, "moved")
first = dict(sharded, train=dict(BASE["train"], steps=5), checkpoint={"dir": ckpt},
             logging={"metrics_file": os.path.join(tmp, "moved.jsonl")})
r = subprocess.run([mpiexec, "-np", "4", "--oversubscribe", zerort, "train",
                    write("moved1.json", first)], capture_output=True, text=True, env=env,
                   timeout=300)
check("5 steps at np 4 stage 3 with a checkpoint", r.returncode == 0, r.stderr[-2000:])
second = dict(first, train_micro_batch_size_per_gpu=2, zero_optimization={"stage": 1},
              train=dict(BASE["train"], steps=10))
r = subprocess.run([mpiexec, "-np", "2", "--oversubscribe", zerort, "train",
                    write("moved2.json", second), "--resume"], capture_output=True, text=True,
                   env=env, timeout=300)
check("resumed at np 2 stage 1", r.returncode == 0, r.stderr[-2000:])
if r.returncode == 0 and os.path.exists(os.path.join(tmp, "sharded.jsonl")):
    a, b = losses(os.path.join(tmp, "sharded.jsonl")), losses(os.path.join(tmp, "moved.jsonl"))
    check("10 steps in the moved run", len(b) == 10, str(b))
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    check("the moved run follows the straight one to 1e-5", worst <= 1e-5, f"{worst} {a} {b}")

r = subprocess.run([zerort, "train", write("print.json", single), "--print-config",
                    "--set", "zero_optimization.stage=2"], capture_output=True, text=True)
check("--print-config exits 0", r.returncode == 0, r.stderr)
printed = json.loads(r.stdout) if r.returncode == 0 else {}
check("--set applied", printed.get("zero_optimization", {}).get("stage") == 2, r.stdout[:300])
check("batch resolved", printed.get("gradient_accumulation_steps") == 1, r.stdout[:300])

text = os.path.join(tmp, "text.txt")
with open(text, "w") as f:
    f.write("abcdefghij" * 2000)
tokens = os.path.join(tmp, "tokens.bin")
r = subprocess.run([zerort, "data", "prepare", text, tokens], capture_output=True, text=True)
check("data prepare exits 0", r.returncode == 0, r.stderr)
check("data prepare counts", "20000 byte-level tokens" in r.stdout, r.stdout)
prepared = dict(single, data={"path": tokens}, train=dict(BASE["train"], steps=3),
                logging={"metrics_file": os.path.join(tmp, "prepared.jsonl")})
r = subprocess.run([zerort, "train", write("prepared.json", prepared)], capture_output=True,
                   text=True, env=env, timeout=300)
check("training on a prepared file exits 0", r.returncode == 0, r.stderr[-1000:])

bad_cases = [
    ({"trian": {}}, "did you mean 'train'"),
    ({"stage": 3}, "zero_optimization.stage"),
    ({"zero_optimization": {"stage": 5}}, "zero_optimization.stage = 5"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": -1}}}, "optimizer.params.lr = -1"),
    ({"bf16": {"enabled": "yes"}}, "bf16.enabled"),
    ({"train_batch_size": "auto"}, "\"auto\""),
    ({"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2}, "do not multiply out"),
    ({"data": {"path": "/no/such/tokens.bin"}}, "/no/such/tokens.bin"),
    ({"checkpoint": {"dir": "/proc/zerort-ckpt"}}, "checkpoint.dir"),
    ({"logging": {"trace_file": tmp}}, "is not a regular file"),
    ({"logging": {"trace_file": 7}}, "logging.trace_file"),
]
for i, (config, needle) in enumerate(bad_cases):
    merged = dict(single)
    merged.update(config)
    r = subprocess.run([zerort, "train", write(f"bad{i}.json", merged)], capture_output=True,
                       text=True, timeout=60)
    check(f"bad config {i} exits 2", r.returncode == 2, f"rc={r.returncode} {r.stderr[-500:]}")
    check(f"bad config {i} names {needle}", needle in r.stderr, r.stderr[-500:])
tp_cases = [  # (ranks, config, what stderr names)
    (1, {"parallel": {"tensor_parallel_size": 2}},
     "parallel.tensor_parallel_size = 2 does not divide the world size 1"),
    (2, {"parallel": {"tensor_parallel_size": 3}},
     "parallel.tensor_parallel_size = 3 does not divide the world size 2"),
    (4, {"parallel": {"tensor_parallel_size": 4}},
     "parallel.tensor_parallel_size = 4 does not divide model.n_head = 2"),
    (4, {"parallel": {"tensor_parallel_size": 2}, "train_micro_batch_size_per_gpu": 3},
     "do not multiply out"),
    (2, {"parallel": {"tensor_parallel_size": 2, "make_vocab_size_divisible_by": 0}},
     "parallel.make_vocab_size_divisible_by"),
]
for i, (ranks, config, needle) in enumerate(tp_cases):
    merged = dict(single)
    merged.update(config)
    cmd = [zerort, "train", write(f"badtp{i}.json", merged)]
    if ranks > 1:
        cmd = [mpiexec, "-np", str(ranks), "--oversubscribe"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    check(f"bad tp config {i} exits 2", r.returncode == 2, f"rc={r.returncode} {r.stderr[-800:]}")
    check(f"bad tp config {i} names {needle}", needle in r.stderr, r.stderr[-800:])
r = subprocess.run([zerort, "train", write("dup.json", '{"seed": 1, "seed": 2}')],
                   capture_output=True, text=True)
check("duplicate key exits 2", r.returncode == 2 and "duplicate key 'seed'" in r.stderr, r.stderr)
check("nothing was created by bad configs", not os.path.exists("/proc/zerort-ckpt") and
      not glob.glob(glob.escape(tmp) + "*.tmp"))

checks.finish()
