#!/usr/bin/env python3
"""DeepSpeed keys at work in `zerort train`, read from metrics.jsonl:
- fp16 follows the fp32 loss curve of the same run within 2% a step (fp16 storage of weights
  and activations, fp32 math: the difference is rounding, documented in docs/deepspeed.md);
- an overflow (fp16 with a loss scale of 2^30) is skipped on every rank: under mpirun -np 2 the
  run skips the same steps as one process accumulating the same two micro-batches, lowers the
  scale the same way and follows its loss curve (1e-4), which it could not if one rank stepped
  while the other skipped;
- wall_clock_breakdown's disjoint phases add up to at most the step time, to 95% of it in the
  median step, each present;
- gradient_predivide_factor and prescale_gradients give the default's loss curve (1e-5);
- LAMB at ZeRO-3 on 2 ranks gives the one-process loss curve (1e-5);
- stage3_gather_16bit_weights_on_model_save writes step_N/hf/model.safetensors in bf16 at each
  save of a ZeRO-3 run on 2 ranks, every value the bf16 rounding of the fp32 export's;
- a config with five problems reports all five in one run, naming the file, and
  --print-config shows where each "auto" value came from;
- csv_monitor writes DeepSpeed's CSV files; `zerort plot` draws a metrics file into a PNG that
  decodes (its IDAT stream inflates to height x (1 + width x 3 or 4) bytes) and an SVG that
  parses, skips a line cut short at the end and refuses a damaged one.
Usage: deepspeed_run_test.py PATH_TO_ZERORT MPIEXEC"""
import json
import os
import statistics
import struct
import xml.etree.ElementTree as ElementTree
import zlib
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

zerort, mpiexec = sys.argv[1], sys.argv[2]
checks = Checks("deepspeed_run_test")
check = checks.check
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

BASE = {
    "train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
    "zero_optimization": {"stage": 2},
    "steps_per_print": 100,
    "model": {"n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 32, "vocab_size": 256},
    "train": {"steps": 12, "eval_windows": 1, "sample_tokens": 0, "device": "cpu"},
}


def train(name, ranks=1, **keys):
    config = dict(BASE, **keys)
    config["logging"] = {"metrics_file": os.path.join(tmp, name + ".jsonl")}
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    command = [zerort, "train", path]
    if ranks > 1:
        command = [mpiexec, "-np", str(ranks), "--oversubscribe"] + command
    r = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    check(f"{name}: exits 0", r.returncode == 0, r.stderr[-1500:])
    if r.returncode != 0:
        return []
    with open(config["logging"]["metrics_file"]) as f:
        return [json.loads(line) for line in f]


def close(a, b, rel):
    return len(a) == len(b) > 0 and all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b))


fp32 = train("fp32")
fp16 = train("fp16", fp16={"enabled": True})
check("fp16 follows fp32 within 2% a step",
      close([r["loss"] for r in fp16], [r["loss"] for r in fp32], 0.02),
      [(round(a["loss"], 4), round(b["loss"], 4)) for a, b in zip(fp16, fp32)])
check("fp16's metrics carry the loss scale", fp16 and fp16[-1]["loss_scale"] == 65536.0,
      fp16[-1:] if fp16 else "")

big = {"enabled": True, "initial_scale_power": 30, "hysteresis": 1}
# The same micro-batches of 4 sequences (a rank's loss is its micro-batch's mean, so the scaled
# gradients are as large on one process with 2 accumulated micro-batches as on 2 ranks).
one = train("overflow1", fp16=big, train_micro_batch_size_per_gpu=4)
two = train("overflow2", ranks=2, fp16=big, train_micro_batch_size_per_gpu=4)
skipped = [r["step"] for r in one if r["skipped"]]
check("a 2^30 loss scale overflows fp16 and the step is skipped", len(skipped) >= 1, one[:3])
check("the scale halves after each overflow",
      one and one[-1]["loss_scale"] == 2.0 ** (30 - len(skipped)),
      [(r["step"], r["loss_scale"], r["skipped"]) for r in one])
check("both ranks skip the same steps (the 2-rank run skips as the 1-process one)",
      [r["step"] for r in two if r["skipped"]] == skipped,
      [(r["step"], r["skipped"]) for r in two])
check("... and follows the same loss curve (1e-4)",
      close([r["loss"] for r in two], [r["loss"] for r in one], 1e-4),
      [(round(a["loss"], 5), round(b["loss"], 5)) for a, b in zip(two, one)])
check("training goes on after the skipped steps", one and not one[-1]["skipped"], one[-1:])

# A model large enough for a step of tens of milliseconds: 5% of the tiny model's 2 ms step is
# one context switch on a loaded 2-core machine, and the check failed under ctest -j2.
timed = train("wall", wall_clock_breakdown=True,
              model={"n_layer": 2, "n_head": 2, "d_model": 128, "seq_len": 128,
                     "vocab_size": 256})
phases = ["forward", "backward", "reduce", "optimizer", "gather", "other"]
check("wall_clock_breakdown: every phase in every record",
      timed and all(set(r.get("wall_clock_s", {})) == set(phases) for r in timed), timed[:1])
# The phases are disjoint parts of the step, so they never add up to more than it (a guarantee);
# that they leave little unaccounted is a timing, so it is asked of the median step: a step
# preempted between two phases (ctest -j2 on two cores) can leave more than 5% of it outside.
covered = []
for r in timed[1:]:
    w = r["wall_clock_s"]
    measured = sum(w[p] for p in phases if p != "other")
    check(f"step {r['step']}: forward + backward + reduce + optimizer + gather at most the step "
          f"time", measured <= r["step_time_s"] * (1 + 1e-6) + 1e-9, (measured, r["step_time_s"], w))
    check(f"step {r['step']}: forward and backward take time", w["forward"] > 0 and
          w["backward"] > 0, w)
    covered.append(measured / r["step_time_s"] if r["step_time_s"] > 0 else 0.0)
check("the median step's phases cover 95% of it", covered and statistics.median(covered) >= 0.95,
      covered)

# LAMB: ZeRO-3 over 2 ranks (each parameter's norm summed over its shards) on the one-process
# curve.
lamb = {"type": "Lamb", "params": {"lr": 2e-2, "weight_decay": 0.01, "max_coeff": 5.0}}
lamb1 = train("lamb1", optimizer=lamb, zero_optimization={"stage": 0})
lamb2 = train("lamb2", ranks=2, optimizer=lamb, train_micro_batch_size_per_gpu=4,
              zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0})
check("LAMB: ZeRO-3 on 2 ranks follows one process (1e-5)",
      close([r["loss"] for r in lamb2], [r["loss"] for r in lamb1], 1e-5),
      [(a["loss"], b["loss"]) for a, b in zip(lamb2, lamb1)])
check("LAMB: it trains", lamb1 and lamb1[-1]["loss"] < lamb1[0]["loss"] - 0.1, lamb1[-1:])
# stage3_max_reuse_distance (blocks kept gathered from forward to backward) and
# allgather_bucket_size (stage 2's updated parameters gathered in pieces) change no number.
z3 = {"stage": 3, "stage3_param_persistence_threshold": 0}
base3 = train("z3", ranks=2, train_micro_batch_size_per_gpu=4, zero_optimization=z3)
reuse3 = train("z3reuse", ranks=2, train_micro_batch_size_per_gpu=4,
               zero_optimization=dict(z3, stage3_max_reuse_distance=1e9))
check("stage3_max_reuse_distance 1e9: the same loss curve",
      base3 and [r["loss"] for r in reuse3] == [r["loss"] for r in base3],
      [(a["loss"], b["loss"]) for a, b in zip(reuse3, base3)])
base2 = train("z2", ranks=2, train_micro_batch_size_per_gpu=4)
pieces2 = train("z2pieces", ranks=2, train_micro_batch_size_per_gpu=4,
                zero_optimization={"stage": 2, "allgather_bucket_size": 1000})
check("allgather_bucket_size 1000: the same loss curve",
      base2 and [r["loss"] for r in pieces2] == [r["loss"] for r in base2],
      [(a["loss"], b["loss"]) for a, b in zip(pieces2, base2)])
check("LAMB: not AdamW's curve", lamb1 and fp32 and abs(lamb1[3]["loss"] - fp32[3]["loss"]) > 1e-4,
      (lamb1[3:4], fp32[3:4]))



def safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def bf16_bits(x):  # round to nearest even, as runtime/dtype.h
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


ckpt = os.path.join(tmp, "ckpt16")
saved = train("save16", ranks=2, bf16={"enabled": True}, train_micro_batch_size_per_gpu=4,
              zero_optimization={"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
              checkpoint={"dir": ckpt, "interval": 6})
hf = [os.path.join(ckpt, f"step_{s}", "hf", "model.safetensors") for s in (6, 12)]
check("16-bit save: step_6/hf and step_12/hf", all(os.path.exists(p) for p in hf), hf)
if all(os.path.exists(p) for p in hf):
    out32 = os.path.join(tmp, "export32")
    r = subprocess.run([zerort, "checkpoint", "export", os.path.join(ckpt, "step_12"), out32],
                       capture_output=True, text=True, env=env, timeout=120)
    check("fp32 export of the same step: exit 0", r.returncode == 0, r.stderr[-500:])
    h16, d16 = safetensors(hf[1])
    h32, d32 = safetensors(os.path.join(out32, "model.safetensors"))
    names = [k for k in h16 if k != "__metadata__"]
    check("16-bit save: BF16 tensors, the fp32 export's names and shapes",
          names and all(h16[k]["dtype"] == "BF16" and h16[k]["shape"] == h32[k]["shape"]
                        for k in names) and set(names) == set(h32) - {"__metadata__"}, names[:3])
    mismatches = 0
    for k in names:
        a, b = h16[k]["data_offsets"], h32[k]["data_offsets"]
        values = struct.unpack(f"<{(b[1] - b[0]) // 4}f", d32[b[0]:b[1]])
        bits = struct.unpack(f"<{(a[1] - a[0]) // 2}H", d16[a[0]:a[1]])
        mismatches += sum(1 for x, y in zip(values, bits) if bf16_bits(x) != y)
    check("16-bit save: every value is the bf16 rounding of the master", mismatches == 0,
          mismatches)

default = train("mean2", ranks=2, train_micro_batch_size_per_gpu=4)
for name, keys in [("predivide2", {"gradient_predivide_factor": 2.0}),
                   ("prescale2", {"prescale_gradients": True})]:
    got = train(name, ranks=2, train_micro_batch_size_per_gpu=4, **keys)
    check(f"{name}: the default's loss curve (1e-5)",
          close([r["loss"] for r in got], [r["loss"] for r in default], 1e-5),
          [(a["loss"], b["loss"]) for a, b in zip(got, default)])

# Five problems, one run.
bad = os.path.join(tmp, "five.json")
with open(bad, "w") as f:
    json.dump({"zero_optimization": {"stage": 7, "stgae": 2}, "sparse_attention": {"mode": "fixed"},
               "optimizer": {"type": "AdamW", "params": {"lr": "fast"}}, "train": {"steps": 0}}, f)
r = subprocess.run([zerort, "train", bad], capture_output=True, text=True, env=env, timeout=60)
check("five problems: exit 2", r.returncode == 2, r.returncode)
check("five problems: all named in one message, with the file",
      f"{bad}: 5 problems" in r.stderr and all(
          s in r.stderr for s in ["zero_optimization.stage = 7", "zero_optimization.stgae",
                                  "sparse_attention", "optimizer.params.lr", "train.steps = 0"]),
      r.stderr[-1500:])
r2 = subprocess.run([zerort, "train", bad, "--print-config"], capture_output=True, text=True,
                    env=env, timeout=60)
check("--print-config refuses what train refuses", r2.returncode == 2 and
      "5 problems" in r2.stderr, r2.stderr[-800:])

auto = os.path.join(tmp, "auto.json")
with open(auto, "w") as f:
    json.dump({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
               "gradient_accumulation_steps": "auto",
               "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
               "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
               "model": BASE["model"], "train": BASE["train"]}, f)
r = subprocess.run([mpiexec, "-np", "2", "--oversubscribe", zerort, "train", auto,
                    "--print-config"], capture_output=True, text=True, env=env, timeout=60)
check("auto: --print-config exits 0 under mpirun -np 2", r.returncode == 0, r.stderr[-800:])
try:
    printed = json.loads(r.stdout)
except json.JSONDecodeError:
    printed = {}
check("auto: train_batch_size = 4 x 1 x 2 ranks, reduce_bucket_size = d_model^2",
      printed.get("train_batch_size") == 8 and
      printed.get("zero_optimization", {}).get("reduce_bucket_size") == 32 * 32, r.stdout[:400])
check("auto: each value says where it came from",
      "zero_optimization.reduce_bucket_size = \"auto\" -> 1024 (model.d_model^2)" in r.stderr and
      "optimizer.params.lr = \"auto\" -> 0.0003" in r.stderr, r.stderr[-1500:])

csv_dir = os.path.join(tmp, "csv")
watched = train("csv", csv_monitor={"enabled": True, "output_path": csv_dir, "job_name": "job"},
                fp16={"enabled": True}, train={**BASE["train"], "eval_interval": 6})
files = sorted(os.listdir(os.path.join(csv_dir, "job"))) if os.path.isdir(
    os.path.join(csv_dir, "job")) else []
check("csv_monitor: DeepSpeed's file names", files == [
    "Train_Samples_loss_scale.csv", "Train_Samples_lr.csv", "Train_Samples_tokens_per_s.csv",
    "Train_Samples_train_loss.csv", "Train_Samples_val_loss.csv"], files)
if "Train_Samples_train_loss.csv" in files:
    with open(os.path.join(csv_dir, "job", "Train_Samples_train_loss.csv")) as f:
        rows = f.read().split()
    check("csv_monitor: header, then a row per step by global samples, the metrics' losses",
          rows[0] == "step,train_loss" and len(rows) == 13 and rows[1].startswith("8,") and
          abs(float(rows[-1].split(",")[1]) - watched[-1]["loss"]) < 1e-6, rows[:3])
    # A second run into the same directory appends its rows, as DeepSpeed's monitor does, under
    # the one header (a second header mid-file is a row of text to a CSV reader).
    train("csv_again", csv_monitor={"enabled": True, "output_path": csv_dir, "job_name": "job"},
          fp16={"enabled": True}, train={**BASE["train"], "eval_interval": 6})
    with open(os.path.join(csv_dir, "job", "Train_Samples_train_loss.csv")) as f:
        rows = f.read().split()
    check("csv_monitor: a second run appends its rows under the one header",
          rows.count("step,train_loss") == 1 and len(rows) == 25, rows[:2] + rows[12:15])


def png_decodes(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return False, "no PNG signature"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if zlib.crc32(kind + body) != struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]:
            return False, f"bad CRC in {kind}"
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color = header[:4]
    channels = {2: 3, 6: 4}.get(color, 0)
    raw = zlib.decompress(idat)
    return len(raw) == height * (1 + width * channels * depth // 8) and width >= 800, (
        width, height, depth, color, len(raw))


plot_in = os.path.join(tmp, "fp32.jsonl")
for ext in ("png", "svg"):
    out = os.path.join(tmp, f"loss.{ext}")
    r = subprocess.run([zerort, "plot", plot_in, "-o", out], capture_output=True, text=True,
                       env=env, timeout=120)
    check(f"plot {ext}: exit 0", r.returncode == 0, r.stderr[-800:])
    size = os.path.getsize(out) if os.path.exists(out) else 0
    check(f"plot {ext}: a real image ({size} bytes)", size > 5000, size)
    if ext == "png" and size:
        ok, detail = png_decodes(out)
        check("plot png: decodes", ok, detail)
    elif size:
        try:
            root = ElementTree.parse(out).getroot()
            check("plot svg: parses, with drawn paths", root.tag.endswith("svg") and
                  len(root.findall(".//{http://www.w3.org/2000/svg}path")) > 4, root.tag)
        except ElementTree.ParseError as e:
            check("plot svg: parses", False, str(e))
# gnuplot draws into a file of zerort's beside the image, renamed over it: nothing else is left.
left = sorted(n for n in os.listdir(tmp)
              if n.startswith("loss.") and n not in ("loss.png", "loss.svg"))
check("plot: nothing left beside the images", not left, left)
with open(plot_in) as f:
    lines = f.read().splitlines()
cut = os.path.join(tmp, "cut.jsonl")
with open(cut, "w") as f:
    f.write("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
r = subprocess.run([zerort, "plot", cut, "-o", os.path.join(tmp, "cut.png")], capture_output=True,
                   text=True, env=env, timeout=120)
check("plot: a last line cut short is skipped with a warning", r.returncode == 0 and
      "cut short" in r.stderr, r.stderr[-500:])
# A run killed after its sixth record and resumed from the third step's checkpoint appends from
# the fourth step on: the resumed run's records replace the killed run's (the lines drawn never
# turn back), and plot says which.
steps = [json.loads(line)["step"] for line in lines]
resumed = os.path.join(tmp, "resumed.jsonl")
with open(resumed, "w") as f:
    f.write("\n".join(lines[:6] + lines[3:]) + "\n")
r = subprocess.run([zerort, "plot", resumed, "-o", os.path.join(tmp, "resumed.png")],
                   capture_output=True, text=True, env=env, timeout=120)
says = (f"line 7 (step {steps[3]}) starts a resumed run; it replaces 3 earlier record(s), "
        f"steps {steps[3]}..{steps[5]}")
check("plot: a resumed run's records replace the killed run's, and it says so",
      r.returncode == 0 and says in r.stderr and len(lines) > 6, r.stderr[-500:])
damaged = os.path.join(tmp, "damaged.jsonl")
with open(damaged, "w") as f:
    f.write(lines[0] + "\n{oops\n" + lines[1] + "\n")
r = subprocess.run([zerort, "plot", damaged, "-o", os.path.join(tmp, "d.png")], capture_output=True,
                   text=True, env=env, timeout=120)
check("plot: a damaged line is exit 2 naming the file and line", r.returncode == 2 and
      "damaged.jsonl: line 2" in r.stderr and not os.path.exists(os.path.join(tmp, "d.png")),
      (r.returncode, r.stderr[-500:]))
# A series without one finite value (a diverged run's loss, written as null; an fp16 run whose
# every step so far overflowed, its gradient norm): its panel is drawn empty, not an error.
for field, what in [("grad_norm", "every gradient norm"), ("loss", "every loss")]:
    nulls = os.path.join(tmp, f"null-{field}.jsonl")
    with open(nulls, "w") as f:
        for line in lines:
            record = json.loads(line)
            record[field] = None
            record.pop("val_loss", None)
            f.write(json.dumps(record) + "\n")
    out = os.path.join(tmp, f"null-{field}.png")
    r = subprocess.run([zerort, "plot", nulls, "-o", out], capture_output=True, text=True,
                       env=env, timeout=120)
    check(f"plot: {what} null draws the other panels", r.returncode == 0 and
          os.path.exists(out) and os.path.getsize(out) > 5000 and png_decodes(out)[0],
          (r.returncode, r.stderr[-500:]))
r = subprocess.run([zerort, "plot", plot_in, "-o", os.path.join(tmp, "x.jpg")],
                   capture_output=True, text=True, env=env, timeout=60)
check("plot: -o x.jpg is exit 2", r.returncode == 2 and ".png or .svg" in r.stderr, r.stderr[-300:])
for bad_in, bad_out, what in [("/dev/zero", "z.png", "/dev/zero as the metrics file"),
                              (plot_in, "", "a directory as the output")]:
    r = subprocess.run([zerort, "plot", bad_in, "-o", os.path.join(tmp, bad_out) if bad_out else
                        tmp + "/"], capture_output=True, text=True, env=env, timeout=10)
    check(f"plot: {what} is exit 2 at once", r.returncode == 2, (r.returncode, r.stderr[-300:]))
checks.finish()
