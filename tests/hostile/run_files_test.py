#!/usr/bin/env python3
"""Hostile and careless use of a checkpoint directory and metrics file (`zerort train`): zerort
deletes only what it wrote, never takes over an earlier run, and one run holds a directory at a
time. Every case states the exit code and the message it expects, and checks that the files it
must not touch are byte-identical afterwards.
Usage: run_files_test.py PATH_TO_ZERORT"""
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from harness import Checks  # noqa: E402

zerort = sys.argv[1]
checks = Checks("run_files_test")
check = checks.check
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def config(name, ckpt, steps, interval=1, keep=1, metrics=None):
    c = {
        "train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "steps_per_print": 1000,
        "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "seq_len": 32, "vocab_size": 256},
        "train": {"steps": steps, "eval_windows": 1, "sample_tokens": 0, "device": "cpu"},
        "checkpoint": {"dir": ckpt, "interval": interval, "keep_last_n": keep},
    }
    if metrics is not None:
        c["logging"] = {"metrics_file": metrics}
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(c, f)
    return path


def train(cfg, *flags):
    return subprocess.run([zerort, "train", cfg, *flags], capture_output=True, text=True, env=env,
                          timeout=300)


def snapshot(root, skip=(".zerort.lock",)):
    """Every file under root (not following links) -> sha256 of its bytes, or the link target."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            path = os.path.join(d, name)
            rel = os.path.relpath(path, root)
            if name in skip:
                continue
            if os.path.islink(path):
                out[rel] = "link:" + os.readlink(path)
            else:
                with open(path, "rb") as f:
                    out[rel] = hashlib.sha256(f.read()).hexdigest()
    return out


def subset(before, after):
    """The files of `before`, unchanged, in `after`."""
    return {k: v for k, v in after.items() if k in before} == before


def user_files(ckpt, names):
    for rel, text in names.items():
        path = os.path.join(ckpt, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


# 1. A new run in a directory holding an earlier run's checkpoints: exit 2, says how on, and the
#    earlier run is byte-identical. With --overwrite it runs; the earlier run's steps stay (its
#    rotation is of its own steps; a step it saves again would replace an earlier run's, never a
#    user's directory).
a = os.path.join(tmp, "earlier")
r = train(config("earlier", a, 2))
check("an earlier run saves", r.returncode == 0, r.stderr[-1500:])
earlier = snapshot(a)
r = train(config("again", a, 3))
check("a new run over an earlier run: exit 2", r.returncode == 2, f"{r.returncode} {r.stderr[-800:]}")
check("... says --resume, another directory or --overwrite",
      "holds an earlier run's checkpoints" in r.stderr and "--resume" in r.stderr and
      "--overwrite" in r.stderr, r.stderr[-800:])
check("... the earlier run is untouched", snapshot(a) == earlier)
r = train(config("again", a, 3, interval=0), "--overwrite")  # saves step 3 only
check("--overwrite starts a new run there", r.returncode == 0, r.stderr[-1500:])
check("... the earlier run's last step is kept (only this run's are rotated)",
      subset({k: v for k, v in earlier.items() if k.startswith("step_2/")}, snapshot(a)),
      sorted(snapshot(a)))
with open(os.path.join(a, "latest")) as f:
    check("... latest names the new run's step", f.read().strip() == "step_3")

# 1b. A directory whose `latest` is a link to /dev/zero: a new run refuses it at once (the link is
#     never read), leaving it as it was.
z = os.path.join(tmp, "zero_latest")
os.makedirs(z)
os.symlink("/dev/zero", os.path.join(z, "latest"))
start = time.time()
r = train(config("zero_latest", z, 1))
check("latest linked to /dev/zero: exit 2 within seconds",
      r.returncode == 2 and time.time() - start < 10, f"{r.returncode} {r.stderr[-600:]}")
check("... the link untouched", os.readlink(os.path.join(z, "latest")) == "/dev/zero")

# 2. A user's directories that look like steps, and files among them: a run saving every step
#    with keep_last_n 1 deletes none of them.
b = os.path.join(tmp, "users")
user_files(b, {"step_0/notes.txt": "mine", "step_5/notes.txt": "mine",
               "step_007/weights.bin": "x" * 100, "step_1x/a": "a", "notes.txt": "keep me"})
mine = snapshot(b)
r = train(config("users", b, 3))
check("a run among a user's step-like directories exits 0", r.returncode == 0, r.stderr[-1500:])
check("... the user's files are byte-identical", subset(mine, snapshot(b)), sorted(snapshot(b)))
steps = sorted(n for n in os.listdir(b) if n.startswith("step_") and
               os.path.exists(os.path.join(b, n, "metadata.json")))
check("... its own rotation kept only its last step", steps == ["step_3"], str(steps))

# 3. A user's step_2.tmp or step_2 where the run saves step 2: exit 2 naming it, untouched, and
#    the step before is intact.
for what, rel in [("step_2.tmp", "step_2.tmp/data"), ("step_2", "step_2/data")]:
    c = os.path.join(tmp, "inway_" + what.replace(".", "_"))
    user_files(c, {rel: "user data"})
    mine = snapshot(c)
    r = train(config("inway", c, 3, keep=0))
    check(f"a user's {what} in the way: exit 2", r.returncode == 2,
          f"{r.returncode} {r.stderr[-800:]}")
    check(f"... names it", f"{what} exists and was not written by this run" in r.stderr,
          r.stderr[-800:])
    check(f"... untouched", subset(mine, snapshot(c)))
    check(f"... step_1 intact", os.path.exists(os.path.join(c, "step_1", "metadata.json")))
    check(f"... no .tmp of the failed save left",
          not any(n.endswith(".tmp") for n in os.listdir(c) if n != "step_2.tmp"),
          str(os.listdir(c)))

# 3b. A step_2.tmp whose .zerort-run marker is not one a killed save of this run could leave
#     ([Note: a kill at any instant], checkpoint_save.cc): a cut (empty) marker beside a user's
#     file, a FIFO, a directory, 1 MiB of hex digits without a newline. Each is in the way: exit 2
#     naming it, within seconds (the FIFO is never opened to block), and left as it was.
for what, make in [
        ("an empty marker beside a user's file",
         lambda t: user_files(os.path.dirname(t), {"step_2.tmp/.zerort-run": "",
                                                   "step_2.tmp/data": "user data"})),
        ("a FIFO", lambda t: os.mkfifo(os.path.join(t, ".zerort-run"))),
        ("a directory", lambda t: os.makedirs(os.path.join(t, ".zerort-run"))),
        ("1 MiB without a newline",
         lambda t: user_files(os.path.dirname(t), {"step_2.tmp/.zerort-run": "a" * (1 << 20)}))]:
    c = os.path.join(tmp, "marker_" + what.split()[-1])
    target = os.path.join(c, "step_2.tmp")
    os.makedirs(target)
    make(target)
    before = sorted(os.listdir(target))
    start = time.time()
    r = train(config("inway", c, 3, keep=0))
    check(f"a step_2.tmp whose marker is {what}: exit 2 naming it",
          r.returncode == 2 and "step_2.tmp exists and was not written by this run" in r.stderr,
          f"{r.returncode} {r.stderr[-800:]}")
    check(f"... within seconds", time.time() - start < 30)
    after = sorted(os.listdir(target)) if os.path.isdir(target) else "removed"
    check(f"... left as it was", after == before, str(after))

# 4. A leftover step_3.tmp of this same run (a crashed save) is removed by its next save.
d = os.path.join(tmp, "leftover")
r = train(config("leftover", d, 2))
with open(os.path.join(d, "step_2", "metadata.json")) as f:
    run_id = json.load(f).get("run_id", "")
check("the metadata names the run", len(run_id) == 16, run_id)
user_files(d, {"step_3.tmp/.zerort-run": run_id + "\n", "step_3.tmp/partial.bin": "half"})
user_files(d, {"step_9.tmp/.zerort-run": "0123456789abcdef\n", "step_9.tmp/other.bin": "x"})
other = snapshot(os.path.join(d, "step_9.tmp"))
r = train(config("leftover", d, 4), "--resume")
check("resume over its own crashed save exits 0", r.returncode == 0, r.stderr[-1500:])
check("... its leftover .tmp is gone", not os.path.exists(os.path.join(d, "step_3.tmp")))
check("... another run's .tmp is untouched",
      snapshot(os.path.join(d, "step_9.tmp")) == other)
with open(os.path.join(d, "step_4", "metadata.json")) as f:
    check("... the resumed run keeps its id", json.load(f).get("run_id") == run_id)

# 5. Two runs in one directory at once: the second exits 2 naming the first's pid; the first
#    finishes unharmed.
e = os.path.join(tmp, "busy")
first = subprocess.Popen([zerort, "train", config("busy", e, 100000, interval=0)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
lock = os.path.join(e, ".zerort.lock")
deadline = time.time() + 60
while time.time() < deadline and not (os.path.exists(lock) and os.path.getsize(lock) > 0):
    time.sleep(0.1)
time.sleep(0.5)
start = time.time()
r = train(config("busy2", e, 2))
seconds = time.time() - start
check("a second run in a busy directory: exit 2", r.returncode == 2,
      f"{r.returncode} {r.stderr[-800:]}")
check("... names the holder's pid", f"in use by another run (process {first.pid}" in r.stderr,
      r.stderr[-800:])
check("... within a few seconds", seconds < 10, f"{seconds:.1f} s")
r = train(config("busy2", e, 2), "--resume")
check("... with --resume too", r.returncode == 2 and "in use by another run" in r.stderr,
      r.stderr[-800:])
first.send_signal(signal.SIGTERM)
_, err = first.communicate(timeout=120)
check("the first run saves and stops on SIGTERM", first.returncode == 0, err[-1500:])
check("... its checkpoint is complete", os.path.exists(os.path.join(e, "latest")))
with open(os.path.join(e, "latest")) as f:
    stopped = int(f.read().strip().split("_")[1])
r = train(config("busy3", e, stopped + 1), "--resume")
check("after it, the directory is free: --resume continues", r.returncode == 0, r.stderr[-1500:])

# 6. A metrics file of an earlier run: a new run refuses to truncate it; --overwrite replaces it.
m = os.path.join(tmp, "metrics", "run.jsonl")
os.makedirs(os.path.dirname(m))
with open(m, "w") as f:
    f.write('{"step": 1, "loss": 5.0}\n')
before = snapshot(os.path.dirname(m))
cfg = config("metrics", os.path.join(tmp, "metrics_ckpt"), 1, metrics=m)
r = train(cfg)
check("a new run over a non-empty metrics file: exit 2", r.returncode == 2,
      f"{r.returncode} {r.stderr[-800:]}")
check("... names it and the ways on", "logging.metrics_file " + m in r.stderr and
      "--overwrite" in r.stderr, r.stderr[-800:])
check("... the file is byte-identical", snapshot(os.path.dirname(m)) == before)
check("... no checkpoint directory was started",
      not os.path.exists(os.path.join(tmp, "metrics_ckpt", "latest")))
r = train(cfg, "--overwrite")
check("--overwrite replaces it", r.returncode == 0, r.stderr[-1500:])
with open(m) as f:
    check("... with this run's one step", len(f.readlines()) == 1)
# The same for logging.trace_file (it was replaced without a word).
t = os.path.join(tmp, "trace", "run.json")
os.makedirs(os.path.dirname(t))
with open(t, "w") as f:
    f.write("an earlier run's trace, or the user's file\n")
before = snapshot(os.path.dirname(t))
with open(cfg) as f:
    c = json.load(f)
c["logging"] = {"trace_file": t}
c["checkpoint"]["dir"] = os.path.join(tmp, "trace_ckpt")
cfg_t = os.path.join(tmp, "trace.json")
with open(cfg_t, "w") as f:
    json.dump(c, f)
r = train(cfg_t)
check("a new run over a non-empty trace file: exit 2 naming it and the ways on",
      r.returncode == 2 and "logging.trace_file " + t in r.stderr and "--overwrite" in r.stderr,
      f"{r.returncode} {r.stderr[-800:]}")
check("... the file is byte-identical", snapshot(os.path.dirname(t)) == before)
r = train(cfg_t, "--overwrite")
with open(t) as f:
    replaced = f.read()
check("--overwrite replaces it with this run's trace", r.returncode == 0 and
      replaced.startswith("["), f"{r.returncode} {replaced[:80]} {r.stderr[-800:]}")

# 7. Writes that fail are errors: a metrics file on a full disk (/dev/full) stops the run with
#    exit 1 naming the file; a FIFO nobody reads and a directory are refused at once.
full = os.path.join(tmp, "full.json")
with open(config("full_base", os.path.join(tmp, "full_ckpt"), 3)) as f:
    cfg = json.load(f)
cfg.pop("checkpoint")
with open(full, "w") as f:
    cfg["logging"] = {"metrics_file": "/dev/full"}
    json.dump(cfg, f)
r = train(full)
check("metrics on a full disk: exit 1", r.returncode == 1, f"{r.returncode} {r.stderr[-800:]}")
check("... names the file and the error",
      "write logging.metrics_file /dev/full" in r.stderr and "No space left" in r.stderr,
      r.stderr[-800:])
fifo = os.path.join(tmp, "metrics.fifo")
os.mkfifo(fifo)
# A FIFO is refused when it is opened (exit 1, the open's error); a directory, or one in a
# directory that cannot be made, before the run starts (exit 2, a config error; it was exit 1
# from the open until the config fuzzer met "..").
for what, target, codes, says in [
        ("a FIFO nobody reads", fifo, (1, 2), "logging.metrics_file " + fifo),
        ("a directory", tmp, (2,), f'logging.metrics_file = "{tmp}" is a directory'),
        ("..", "..", (2,), 'logging.metrics_file = ".." is a directory'),
        ("in a directory under /proc", "/proc/no-such-dir/m.jsonl", (2,),
         'logging.metrics_file\'s directory = "/proc/no-such-dir"')]:
    cfg["logging"] = {"metrics_file": target}
    with open(full, "w") as f:
        json.dump(cfg, f)
    start = time.time()
    r = train(full, "--overwrite")
    check(f"metrics file is {what}: refused", r.returncode in codes and says in r.stderr,
          f"{r.returncode} {r.stderr[-800:]}")
    check(f"... within a second or two", time.time() - start < 5, f"{time.time() - start:.1f} s")

# 8. Resume checks the config that shapes the saved state: a changed head count, optimizer or
#    compute dtype is refused with both values, the checkpoint untouched; a changed ZeRO stage
#    and batch size are allowed.
g = os.path.join(tmp, "shaped")
r = train(config("shaped", g, 2))
saved = snapshot(g)
with open(config("shaped_base", g, 3)) as f:
    base = json.load(f)
for what, edit, message in [
        ("n_head", lambda c: c["model"].update(n_head=4), "model.n_head = 2, this run's config has 4"),
        ("the optimizer", lambda c: c.update(optimizer={"type": "SGD", "params": {"lr": 0.1}}),
         'optimizer.type = "AdamW", this run\'s config has "SGD"'),
        ("bf16", lambda c: c.update(bf16={"enabled": True}),
         "bf16.enabled = false, this run's config has true")]:
    c = json.loads(json.dumps(base))
    edit(c)
    path = os.path.join(tmp, "shaped_edit.json")
    with open(path, "w") as f:
        json.dump(c, f)
    r = train(path, "--resume")
    check(f"resume with another {what}: exit 2", r.returncode == 2,
          f"{r.returncode} {r.stderr[-800:]}")
    check(f"... names both values", message in r.stderr, r.stderr[-800:])
    check(f"... the checkpoint is untouched", subset(saved, snapshot(g)))
c = json.loads(json.dumps(base))
c.update(zero_optimization={"stage": 2}, train_batch_size=8)
path = os.path.join(tmp, "shaped_ok.json")
with open(path, "w") as f:
    json.dump(c, f)
r = train(path, "--resume")
check("resume with another ZeRO stage and batch size runs", r.returncode == 0, r.stderr[-1500:])

# A command's output that exists is not replaced unasked ([Note: outputs the user named] in
# runtime/user_file.h): exit 2 naming it and --overwrite, the file byte-identical; with
# --overwrite it is replaced. `data prepare` never writes over its own input.
outs = os.path.join(tmp, "outputs")
os.makedirs(outs)
words = os.path.join(outs, "words.txt")
with open(words, "w") as f:
    f.write("a few words to tokenize\n" * 50)


def zr(*args):
    return subprocess.run([zerort, *args], capture_output=True, text=True, env=env, timeout=300)


for what, args, name in [
        ("data corpus", ["data", "corpus"], "corpus.txt"),
        ("data prepare", ["data", "prepare", words], "tokens.bin"),
        ("data train-tokenizer", ["data", "train-tokenizer", "--vocab-size", "512", "--threads",
                                  "1"], "tok.model")]:
    out = os.path.join(outs, name)
    with open(out, "w") as f:
        f.write("saved before\n")
    before = snapshot(outs)
    r = zr(*args, out)
    check(f"{what} onto an existing {name}: exit 2 naming it and --overwrite",
          r.returncode == 2 and out in r.stderr and "--overwrite" in r.stderr,
          f"{r.returncode} {r.stderr[-600:]}")
    check(f"... {name} is byte-identical", snapshot(outs) == before)
    r = zr(*args, out, "--overwrite")
    check(f"{what} --overwrite replaces it", r.returncode == 0 and snapshot(outs)[name] !=
          before[name], f"{r.returncode} {r.stderr[-600:]}")
# --overwrite given a value, and what is never replaced even with it: a directory or a FIFO.
os.mkdir(os.path.join(outs, "a_dir"))
fifo = os.path.join(tmp, "out.fifo")  # outside `outs`: snapshot would block reading it
os.mkfifo(fifo)
before = snapshot(outs)
for what, args, says in [
        ("--overwrite=maybe", ["data", "corpus", os.path.join(outs, "new.txt"), "--overwrite=maybe"],
         "--overwrite"),
        ("data corpus --overwrite onto a directory",
         ["data", "corpus", os.path.join(outs, "a_dir"), "--overwrite"], "is not a regular file"),
        ("data prepare --overwrite onto a FIFO",
         ["data", "prepare", words, fifo, "--overwrite"],
         "is not a regular file"),
        ("checkpoint export --overwrite into a file",
         ["checkpoint", "export", g, os.path.join(outs, "words.txt"), "--overwrite"],
         "is not a directory")]:
    start = time.time()
    r = zr(*args)
    check(f"{what}: exit 2 within seconds, saying why", r.returncode == 2 and says in r.stderr and
          time.time() - start < 10, f"{r.returncode} {r.stderr[-600:]}")
    check(f"... {what}: nothing written", snapshot(outs) == before and
          not os.path.exists(os.path.join(outs, "new.txt")))
before = snapshot(outs)
r = zr("data", "prepare", words, words, "--overwrite")
check("data prepare onto its own input: exit 2 even with --overwrite, the text untouched",
      r.returncode == 2 and "is the text it would be made from" in r.stderr and
      snapshot(outs) == before, f"{r.returncode} {r.stderr[-600:]}")
# checkpoint export into a directory that holds files (a model's own, say): exit 2, untouched;
# with --overwrite the export's files are written and an earlier export's weight files it does
# not write go (an old model.safetensors would shadow new shards), the user's other files stay.
hf = os.path.join(tmp, "hf_out")
os.makedirs(hf)
with open(os.path.join(hf, "README.md"), "w") as f:
    f.write("a model card\n")
before = snapshot(hf)
r = zr("checkpoint", "export", g, hf)
check("export into a directory that holds files: exit 2 naming it and --overwrite",
      r.returncode == 2 and hf in r.stderr and "--overwrite" in r.stderr,
      f"{r.returncode} {r.stderr[-600:]}")
check("... the directory is byte-identical", snapshot(hf) == before)
r = zr("checkpoint", "export", g, hf, "--overwrite", "--max-shard-size", "8KiB")
sharded = sorted(snapshot(hf))
check("export --overwrite writes shards and their index beside the user's file",
      r.returncode == 0 and "model.safetensors.index.json" in sharded and "README.md" in sharded
      and "model.safetensors" not in sharded, f"{r.returncode} {sharded} {r.stderr[-600:]}")
r = zr("checkpoint", "export", g, hf, "--overwrite")
files = sorted(snapshot(hf))
check("export --overwrite as one file removes the earlier export's shards and index",
      r.returncode == 0 and files == ["README.md", "config.json", "model.safetensors"],
      f"{r.returncode} {files} {r.stderr[-600:]}")

# A file of the user's beside an output, named as zerort's own temporary once was (OUT.tmp), is
# never opened, truncated or removed ([Note: a file written beside its target] in
# runtime/user_file.h): every writer makes a new file of its own, exclusively, and leaves none
# behind. Before that note each of these wrote through OUT.tmp and renamed it away.
beside = os.path.join(tmp, "beside")
os.makedirs(beside)
cfg_b = config("beside", os.path.join(tmp, "beside_ckpt"), 1)
with open(cfg_b) as f:
    tc = json.load(f)
tc["logging"] = {"trace_file": os.path.join(beside, "trace.json")}
with open(cfg_b, "w") as f:
    json.dump(tc, f)
export_dir = os.path.join(beside, "hf")
os.makedirs(export_dir)
for what, args, target in [
        ("data corpus", ["data", "corpus", os.path.join(beside, "c.txt")], "c.txt"),
        ("data prepare", ["data", "prepare", words, os.path.join(beside, "t.bin")], "t.bin"),
        ("data train-tokenizer", ["data", "train-tokenizer", os.path.join(beside, "k.model"),
                                  "--vocab-size", "512", "--threads", "1"], "k.model"),
        ("checkpoint export", ["checkpoint", "export", g, export_dir, "--overwrite"],
         "hf/model.safetensors"),
        ("logging.trace_file", ["train", cfg_b], "trace.json")]:
    mine = os.path.join(beside, target + ".tmp")
    with open(mine, "w") as f:
        f.write("the user's own file\n")
    before = snapshot(beside)
    r = zr(*args)
    after = snapshot(beside)
    check(f"{what} beside the user's {target}.tmp: written", r.returncode == 0 and
          target in after, f"{r.returncode} {r.stderr[-600:]}")
    check(f"... {target}.tmp byte-identical", after.get(target + ".tmp") ==
          before[target + ".tmp"], str(sorted(after)))
    left = [n for n in after if ".zerort-" in n]
    check(f"... nothing of its own left beside it", not left, str(left))

sys.exit(checks.finish())
