"""Shared by the CLI tests: named checks that collect failures, and the report that ends a test;
the small ZeRO-3 run config the device-parity tests vary, the merge that varies it, and a run of
it; a tool's refusal of a file; a config written to a test's folder and a metrics file read back."""
import json
import os
import subprocess
import sys


def repo_files(root):
    """The repository's files, relative to `root`: git's list, or every file under root outside
    build folders when it is not a git checkout."""
    try:
        return subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                              check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return [os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root)
                for f in names if "/build" not in d and "/.git" not in d]


def tiny_run(steps):
    """A 2-layer, d 32 GPT at ZeRO-3 with AdamW, micro-batch 2, for `steps` steps."""
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        "steps_per_print": steps,
        "model": {"n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 32, "vocab_size": 256},
        "train": {"steps": steps, "eval_windows": 2, "sample_tokens": 0},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }


def tiny_train(check, zerort, folder, name, steps, extra):
    """`zerort train` on tiny_run(steps) with `extra` merged in, its config and checkpoints in
    `folder` under `name`; checks that it exits 0."""
    config = merged(tiny_run(steps), merged(
        {"checkpoint": {"dir": os.path.join(folder, name + "-ckpt")}}, extra))
    cfg = write_json(folder, name + ".cfg", config)
    r = subprocess.run([zerort, "--log-level", "off", "train", cfg], capture_output=True, text=True)
    check(f"{name}: zerort train exits 0", r.returncode == 0, (r.stdout + r.stderr)[-800:])


def unreadable_paths(folder, suffix):
    """The paths every file-reading tool refuses before opening, each (what, path, why): `folder`
    itself, a FIFO made in it (which would block a read), and a missing file."""
    fifo = os.path.join(folder, "fifo")
    os.mkfifo(fifo)
    return [("a directory", folder, "not a regular file"), ("a FIFO", fifo, "not a regular file"),
            ("a missing file", os.path.join(folder, "absent" + suffix), "not a regular file")]


def check_refuses(check, what, argv, path, why):
    """Runs a tool's `argv`; checks that it exits 2 within 20 s, naming `path` and `why`."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        check(f"{what}: exits 2 naming it and why",
              r.returncode == 2 and path in r.stderr and why in r.stderr, r.stderr[-500:])
    except subprocess.TimeoutExpired:
        check(f"{what}: exits 2 naming it and why", False, "still running after 20 s")


def write_json(folder, name, obj):
    """`obj` as JSON in folder/name; its path."""
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(json.dumps(obj))
    return path


def read_jsonl(folder, name):
    """The records of folder/name.jsonl (a run's metrics file)."""
    with open(os.path.join(folder, name + ".jsonl")) as f:
        return [json.loads(line) for line in f]


def merged(base, extra):
    """`base` with `extra`'s keys set, objects merged key by key (base is not changed)."""
    out = json.loads(json.dumps(base))
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


class Checks:
    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failures = []

    def check(self, what, condition, detail=""):
        if condition:
            self.passed += 1
        else:
            self.failures.append(f"{what}: {detail}")
        return condition

    def finish(self):
        print(f"{self.name}: {self.passed} passed, {len(self.failures)} failed")
        for f in self.failures:
            print("FAILED", f)
        sys.exit(1 if self.failures else 0)


def check_onebit_resumes(check, train, losses, folder, short, points):
    """A 1-bit optimizer's resumes ([Note: 1-bit Adam]): `short` (a run config of N steps) trained
    straight, then for each (at, bitwise) of `points` saved at step `at` and resumed: in the
    warm-up (bitwise) on the straight curve bit for bit; after it with the compression errors
    starting from zero (DeepSpeed resets them on a load): the first loss equal (it reads the saved
    weights), later ones within 10% (the tiny batch's step-to-step spread is about 5%), not equal.
    `train(name, overrides, extra_args)` runs one; `losses(name)` reads its per-step losses."""
    if not train("straight", short):
        return
    steps = short["train"]["steps"]
    straight = losses("straight")
    for at, bitwise in points:
        name = f"resume{at}"
        ckpt = {"checkpoint": {"dir": os.path.join(folder, "ckpt_" + name)}}
        if not (train(name + "_first", merged(merged(short, ckpt), {"train": {"steps": at}})) and
                train(name, merged(short, ckpt), ["--resume"])):
            continue
        got = losses(name)[-(steps - at):]
        if bitwise:
            check(f"resumed from step {at} (warm-up): the straight curve bit for bit",
                  got == straight[at:], f"{got} {straight[at:]}")
        else:
            check(f"resumed from step {at} (compressed): the errors start again from zero",
                  got != straight[at:], f"{got} {straight[at:]}")
            check(f"resumed from step {at}: the first loss equal, then within 10% of the curve",
                  got[0] == straight[at] and
                  all(abs(x - y) <= 0.1 * y for x, y in zip(got, straight[at:])),
                  f"{got} {straight[at:]}")


def simulated_nodes_trainer(check, zerort, mpiexec, folder, base, env):
    """A function train(name, overrides, extra_args=(), ranks=4) that trains `base` merged with
    `overrides` (its metrics file and checkpoint directory named after the run, in `folder`) on
    `ranks` ranks under MPIEXEC as simulated nodes of two (ZERORT_RANKS_PER_NODE), checks that it
    exits 0, and returns whether it did."""
    def train(name, overrides, extra_args=(), ranks=4):
        named = {"logging": {"metrics_file": os.path.join(folder, name + ".jsonl")},
                 "checkpoint": {"dir": os.path.join(folder, "ckpt_" + name)}}
        run = merged(base, merged(named, overrides))
        cmd = [mpiexec, "-np", str(ranks), "--oversubscribe", "-x", "ZERORT_RANKS_PER_NODE",
               zerort, "train", write_json(folder, name + ".json", run), *extra_args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env=dict(env, ZERORT_RANKS_PER_NODE=str(min(ranks, 2))))
        check(f"{name} exits 0", r.returncode == 0, r.stderr[-2000:])
        return r.returncode == 0
    return train
