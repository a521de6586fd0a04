#!/usr/bin/env python3
"""Real DeepSpeed configs (tests/configs/deepspeed, provenance in SOURCES.md), each merged with a
tiny model and a 2-step train section: every one trains, or exits 2 naming a key by docs/deepspeed.md's rule
(a DeepSpeed key that would change what is trained, an "auto" without a rule, or a key DeepSpeed
does not have). Anything else (a crash, another exit code, a message naming no key) fails.

The changes made to a config: a batch triple written for N ranks (train_batch_size = micro x
accumulation x N) drops its accumulation, so on one process the accumulation becomes N-fold and
the global batch and micro-batch stay as written; and a global batch of more than
MAX_ACCUMULATION micro-batches on one process (bing_bert's 65,536 sequences in micro-batches of
64: 1,024 of them a step, three quarters of this test's time) is cut to that many, as
train_batch_size = MAX_ACCUMULATION x micro (no key's meaning depends on the count). Prints the
share that trains or is refused by the rule.

Each outcome (trained, trained with a warning naming a key, or refused with the first key the
message names) must equal the one in
CORPUS_DIR/expected.txt, so a DeepSpeed key that stops being understood fails here even where a
refusal would pass the rule; `--update` rewrites that file after a deliberate change.

A config whose tensor_parallel.autotp_size is N > 1 runs under `MPIRUN -np N` (skipped, and
counted apart, without MPIRUN).

usage: deepspeed_corpus_test.py ZERORT CORPUS_DIR [MPIRUN] [--update]
"""
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile

update = "--update" in sys.argv
args = [a for a in sys.argv[1:] if a != "--update"]
zerort, corpus = os.path.abspath(args[0]), args[1]
mpirun = args[2] if len(args) > 2 else None  # for configs written for several ranks
TINY_MODEL = {"n_layer": 2, "n_head": 4, "d_model": 32, "seq_len": 32, "vocab_size": 256}
MAX_ACCUMULATION = 16
TINY_TRAIN = {"steps": 2, "sample_tokens": 0, "eval_windows": 1, "device": "cpu",
              "check_memory": False}
RULE = [
    "a DeepSpeed key zerort does not support",  # refused keys
    "does not support yet",                     # optimizer.type Lamb
    "1-bit optimizer",                          # OneBitAdam / OneBitLamb / ZeroOneAdam
    "a DeepSpeed scheduler zerort does not implement",
    "no rule resolves \"auto\"",
    "unknown key",                              # not a DeepSpeed key (a typo)
    "set train_micro_batch_size_per_gpu",       # no batch size (DeepSpeed refuses it too)
    "needs zero_optimization.stage",            # offload below its stage (docs/offload.md)
]


def prepare(name, tmp):
    with open(os.path.join(corpus, name)) as f:
        config = json.load(f)
    config["model"] = TINY_MODEL
    config["train"] = TINY_TRAIN
    note = ""
    t, m, a = (config.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                        "gradient_accumulation_steps"))
    numbers = all(isinstance(x, (int, float)) for x in (t, m, a))
    if numbers and t != m * a:
        del config["gradient_accumulation_steps"]
        note = f"written for {t // (m * a)} ranks"
    if (all(isinstance(x, int) for x in (t, m)) and "gradient_accumulation_steps" not in config
            and m > 0 and t % m == 0 and t > MAX_ACCUMULATION * m):
        config["train_batch_size"] = MAX_ACCUMULATION * m
        note = (note + ", " if note else "") + f"{t // m} micro-batches a step cut to {MAX_ACCUMULATION}"
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        for section in ("offload_optimizer", "offload_param"):
            if isinstance(zero.get(section), dict) and "nvme_path" in zero[section]:
                zero[section]["nvme_path"] = tmp
    tp = config.get("tensor_parallel", {}).get("autotp_size", 1)
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(config, f)
    return path, note, tp if isinstance(tp, int) else 1


def run(name):
    with tempfile.TemporaryDirectory() as tmp:
        path, note, ranks = prepare(name, tmp)
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        command = [zerort, "train", path]
        if ranks > 1:
            if not mpirun:
                return name, "skipped", f"needs {ranks} ranks and no mpirun was given", note
            command = [mpirun, "-np", str(ranks), "--oversubscribe"] + command
            note = (note + ", " if note else "") + f"{ranks} ranks"
        try:
            r = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env,
                               cwd=tmp)
        except subprocess.TimeoutExpired:
            return name, "FAILED", "timed out after 300 s", note
    if r.returncode == 0:
        ok = re.search(r"step +2/2", r.stdout) is not None
        # A key zerort reads and warns about (DeepSpeed ignores it, or takes it only in another
        # form) is pinned too: "trained warned KEY".
        warned = [m.group(1) for m in re.finditer(r"\[warning\] [^ ]*config\.json: ([a-z_0-9.]+)",
                                                  r.stderr)]
        outcome = "trained" + (f" warned {warned[0]}" if warned else "")
        return name, outcome if ok else "FAILED", "" if ok else r.stdout[-400:], note
    errors = [l for l in r.stderr.splitlines() if "[error]" in l or l.startswith("  - ")]
    message = "\n".join(errors) or r.stderr[-600:]
    text = re.sub(r"^.*\[error\] [^:]*: ", "", message.splitlines()[0])
    text = re.sub(r"^\d+ problems:$", "", text) or message.splitlines()[1][4:]
    key = re.search(r"(?:unknown key ')?([a-z_0-9]+(?:\.[a-z_0-9]+)*)(?: = |'| \()", text)
    if r.returncode == 2 and key and any(s in message for s in RULE):
        return name, f"refused {key.group(1)}", message, note
    return name, "FAILED", f"exit {r.returncode}: {message[-800:]}", note


names = sorted(n for n in os.listdir(corpus) if n.endswith(".json"))
with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    results = list(pool.map(run, names))

expected_path = os.path.join(corpus, "expected.txt")
expected = {}
if os.path.exists(expected_path):
    for line in open(expected_path):
        if line.strip() and not line.startswith("#"):
            n, outcome = line.split(" ", 1)
            expected[n] = outcome.strip()
if update:
    with open(expected_path, "w") as f:
        f.write("# zerort's outcome for each config of this corpus (deepspeed_corpus_test.py --update)\n")
        for name, outcome, _, _ in results:
            f.write(f"{name} {outcome}\n")
counts = {}
changed = []
for name, outcome, detail, note in results:
    kind = outcome.split(" ")[0]
    counts[kind] = counts.get(kind, 0) + 1
    if not update and outcome != "skipped" and expected.get(name) != outcome:
        changed.append(f"{name}: expected {expected.get(name)!r}, got {outcome!r}")
    first = detail.strip().splitlines()[0][-200:] if detail.strip() else ""
    print(f"{outcome:8} {name}{' (' + note + ')' if note else ''}{': ' + first if first else ''}")
    if outcome == "FAILED":
        print(detail)
total = len(results) - counts.get("skipped", 0)
good = counts.get("trained", 0) + counts.get("refused", 0)
print(f"\n{total} configs: {counts.get('trained', 0)} trained, {counts.get('refused', 0)} refused by "
      f"the rule, {counts.get('FAILED', 0)} failed ({counts.get('skipped', 0)} skipped); "
      f"{100.0 * good / max(total, 1):.1f}% train or are refused by the rule")
for c in changed:
    print("CHANGED", c)
sys.exit(0 if counts.get("FAILED", 0) == 0 and not changed and total > 0 else 1)
