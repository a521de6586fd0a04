#!/usr/bin/env python3
"""zerort against llm.c on the same GPU, the same model, batch and tokens, in one run.

    llmc_side_by_side.py --zerort ZERORT --config CONFIG --llmc TRAIN_GPT2CU[:LABEL] ...
                         [--batch 8 --seq 1024 --accum 4 --steps 30 --warmup 5] [--work DIR]
                         [--vocab 50257] [--set KEY=VALUE ...] [--json OUT]

GPT-2 124M from random weights in both: zerort with CONFIG (its model is the one llm.c's `-e d12`
builds: 12 layers, 768 wide, vocabulary padded to 50304, tied embeddings), llm.c's
`train_gpt2cu` (built from its own folder, never copied into zerort: tools/gpu-check.sh builds
it in a scratch folder). Both read one token file in llm.c's format (its 1024-byte header, magic
20240520, version 1, uint16 tokens; zerort detects it), written here from a seeded generator:
the tokens' values do not change a step's time. Each trains `--steps` optimizer steps of
batch x seq x accum tokens (llm.c's `-d` total batch); the first `--warmup` are dropped and the
rest's median step time gives tokens/s. MFU is by one count for both, zerort's (6N + 12·L·d·T
FLOPs per token, the figure its metrics report, over the device's dense bf16 peak), beside
llm.c's own MFU as it prints it. `--llmc` may be given several times (without and with cuDNN);
each is run and compared.

Prints a table and, with --json, writes the numbers. Exit 0 when every run trained and its
losses are finite; 1 when one failed (its log's tail is printed); 2 for bad arguments.
"""
import argparse
import json
import math
import os
import random
import re
import statistics
import struct
import subprocess
import sys

LLMC_MAGIC, LLMC_VERSION, LLMC_HEADER_INTS = 20240520, 1, 256
MAX_TOKENS = 1 << 28  # 512 MiB of uint16 tokens, under the header's int32 count
# llm.c's per-step line (train_gpt2.cu):
# "step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s"
# Built without NVML (NO_NVML=1, as gpu-pack.sh builds it) llm.c knows no peak and prints its MFU as
# a negative percentage (-100.0%): that run's own MFU is unknown, not negative.
LLMC_STEP = re.compile(r"^step\s+(\d+)/(\d+) \| loss\s+(\S+) .*\| ([0-9.]+) ms \| (-?[0-9.]+)% \w+ MFU")


def write_llmc_tokens(path, count, vocab, seed):
    """An llm.c token shard: 256 int32 header (magic, version, token count) and uint16 tokens."""
    if not 0 < vocab <= 65536:
        raise ValueError(f"--vocab {vocab}: llm.c's files hold uint16 tokens (1 .. 65536)")
    rng = random.Random(seed)
    header = [0] * LLMC_HEADER_INTS
    header[0], header[1], header[2] = LLMC_MAGIC, LLMC_VERSION, count
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{LLMC_HEADER_INTS}i", *header))
        chunk = 1 << 16
        for start in range(0, count, chunk):
            n = min(chunk, count - start)
            f.write(struct.pack(f"<{n}H", *(rng.randrange(vocab) for _ in range(n))))


def parse_llmc_log(text):
    """[(step, loss, ms, mfu%)] from llm.c's step lines, in order."""
    steps = []
    for line in text.splitlines():
        m = LLMC_STEP.match(line.strip())
        if m:
            steps.append((int(m.group(1)), float(m.group(3)), float(m.group(4)), float(m.group(5))))
    return steps


def parse_zerort_metrics(text):
    """zerort's metrics file: one JSON record a step (the last one's evaluation has val_loss)."""
    return [r for r in (json.loads(line) for line in text.splitlines() if line.strip())
            if "step_time_s" in r]


def safe(label):
    """A peer's label as part of a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", label)


def tail(path, lines=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return str(e)


def run(cmd, log_path, timeout):
    print("+", " ".join(cmd), flush=True)
    with open(log_path, "w") as log:
        try:
            return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            log.write(f"\nside-by-side: killed after {timeout} s\n")
            return 124


def summarise(name, step_seconds, losses, tokens_per_step, flops_per_token, peak_flops, warmup):
    timed = step_seconds[warmup:]
    if not timed:
        raise ValueError(f"{name}: {len(step_seconds)} steps, none after the {warmup} warm-up steps")
    median = statistics.median(timed)
    tps = tokens_per_step / median
    return {"name": name, "steps_timed": len(timed), "median_step_ms": 1e3 * median,
            "tokens_per_s": tps,
            "mfu": tps * flops_per_token / peak_flops if flops_per_token and peak_flops else None,
            "first_loss": losses[0], "last_loss": losses[-1],
            "finite": all(math.isfinite(x) for x in losses)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zerort", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--llmc", action="append", default=[],
                   help="llm.c's train_gpt2cu, as PATH or PATH:LABEL; repeatable")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--vocab", type=int, default=50257, help="token values drawn below this")
    p.add_argument("--tokens", type=int, default=0, help="training tokens written (default: enough)")
    p.add_argument("--set", action="append", default=[], help="more zerort --set KEY=VALUE")
    p.add_argument("--work", default="/tmp/llmc-side-by-side")
    p.add_argument("--timeout", type=int, default=300, help="seconds each run may take")
    p.add_argument("--json")
    a = p.parse_args()
    if min(a.batch, a.seq, a.accum, a.steps) < 1 or not 0 <= a.warmup < a.steps:
        p.error("--batch, --seq, --accum, --steps must be positive and --warmup below --steps")

    def executable(flag, path):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            p.error(f"{flag} {path}: not an executable file")

    executable("--zerort", a.zerort)
    peers = []
    for spec in a.llmc:
        path, _, label = spec.partition(":")
        executable("--llmc", path)
        peers.append((path, label or os.path.basename(path)))
    tokens_per_step = a.batch * a.seq * a.accum
    # Every step reads fresh tokens; zerort holds back validation_fraction (5%) of the file's tail.
    count = a.tokens or (a.steps + 2) * tokens_per_step * 21 // 20 + a.seq + 1
    # llm.c's header counts tokens in an int32; a bigger file would also take long to write here.
    if a.tokens < 0 or count > MAX_TOKENS:
        p.error(f"{count} training tokens (--tokens, or --steps x --batch x --seq x --accum): "
                f"must be in [1, {MAX_TOKENS}]")
    try:
        os.makedirs(a.work, exist_ok=True)
    except OSError as e:
        p.error(f"--work {a.work}: {e.strerror}")
    # The files this run writes in --work: an existing one must be a regular file (a FIFO would
    # block the write, a directory fail it).
    names = ["train.bin", "val.bin", "zerort.log", "zerort-metrics.jsonl"] + [
        f"llmc-{safe(label)}.log" for _, label in peers]
    for name in names:
        path = os.path.join(a.work, name)
        if os.path.lexists(path) and (os.path.islink(path) or not os.path.isfile(path)):
            p.error(f"--work {a.work}: {name} exists and is not a regular file")
    train_bin, val_bin = os.path.join(a.work, "train.bin"), os.path.join(a.work, "val.bin")
    try:
        write_llmc_tokens(train_bin, count, a.vocab, seed=1)
        write_llmc_tokens(val_bin, a.batch * a.seq + 1, a.vocab, seed=2)
    except ValueError as e:
        p.error(str(e))

    failed, results = False, []
    metrics = os.path.join(a.work, "zerort-metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    zlog = os.path.join(a.work, "zerort.log")
    cmd = [a.zerort, "train", a.config, "--overwrite", "--set", f"data.path={train_bin}",
           "--set", f"train_micro_batch_size_per_gpu={a.batch}",
           "--set", f"gradient_accumulation_steps={a.accum}", "--set", f"model.seq_len={a.seq}",
           "--set", f"train.steps={a.steps}", "--set", f"train.eval_interval={a.steps}",
           "--set", "train.eval_windows=1", "--set", "train.sample_tokens=0",
           "--set", f"logging.metrics_file={metrics}", "--set", f"steps_per_print={a.steps}"]
    for kv in a.set:
        cmd += ["--set", kv]
    rc = run(cmd, zlog, a.timeout)
    records = parse_zerort_metrics(tail(metrics, 10**6)) if rc == 0 else []
    flops_per_token = peak = None
    if rc != 0 or len(records) != a.steps:
        failed = True
        print(f"zerort: exit {rc}, {len(records)} of {a.steps} steps; {zlog}:\n{tail(zlog)}")
    else:
        last = records[-1]
        flops_per_token = 1e12 * last["tflops_per_device"] / last["tokens_per_s_per_device"]
        # The device's dense bf16 peak, as zerort knows it (none on a CPU: no MFU).
        if last.get("mfu"):
            peak = 1e12 * last["tflops_per_device"] / last["mfu"]
        r = summarise("zerort", [x["step_time_s"] for x in records], [x["loss"] for x in records],
                      tokens_per_step, flops_per_token, peak, a.warmup)
        r["peak_memory_mib"] = last["peak_memory_total_bytes"] / 2**20
        results.append(r)

    for path, label in peers:
        log = os.path.join(a.work, f"llmc-{safe(label)}.log")
        # -v: validation only at step 0 and the last (llm.c divides by it: 0 is not "never"),
        # one batch of it (-m 1); -s 0: no sampling; -e d12: GPT-2 124M from random weights.
        cmd = [path, "-e", "d12", "-i", train_bin, "-j", val_bin, "-b", str(a.batch),
               "-t", str(a.seq), "-d", str(tokens_per_step), "-x", str(a.steps),
               "-v", str(10 * a.steps + 1000), "-m", "1", "-s", "0", "-y", "0"]
        rc = run(cmd, log, a.timeout)
        steps = parse_llmc_log(tail(log, 10**6))
        if rc != 0 or len(steps) != a.steps:
            failed = True
            print(f"llm.c ({label}): exit {rc}, {len(steps)} of {a.steps} steps; {log}:\n{tail(log)}")
            continue
        r = summarise(f"llm.c {label}", [ms / 1e3 for _, _, ms, _ in steps],
                      [loss for _, loss, _, _ in steps], tokens_per_step, flops_per_token, peak,
                      a.warmup)
        own = [m for _, _, _, m in steps[a.warmup:]]
        if min(own) >= 0:  # else llm.c did not know its peak (above)
            r["llmc_own_mfu"] = statistics.median(own) / 100
        results.append(r)

    zr = next((r for r in results if r["name"] == "zerort"), None)
    print(f"\n{os.path.basename(a.config)}: {a.batch} x {a.seq} x {a.accum} tokens a step, median of steps "
          f"{a.warmup + 1}-{a.steps}; MFU by zerort's count"
          + (f" ({flops_per_token / 1e9:.3f} GFLOP/token, peak {peak / 1e12:.0f} TFLOP/s)"
             if flops_per_token and peak else ""))
    print(f"{'run':<24} {'ms/step':>9} {'tokens/s':>11} {'MFU':>7} {'zerort/it':>10} "
          f"{'loss first -> last':>20}")
    for r in results:
        r["zerort_ratio"] = zr["tokens_per_s"] / r["tokens_per_s"] if zr else None
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        ratio = f"{r['zerort_ratio']:.3f}" if r["zerort_ratio"] is not None else "n/a"
        print(f"{r['name']:<24} {r['median_step_ms']:>9.2f} {r['tokens_per_s']:>11.0f} {mfu:>7} "
              f"{ratio:>10} {r['first_loss']:>9.4f} -> {r['last_loss']:<8.4f}"
              + ("" if r["finite"] else "  NOT FINITE")
              + (f"  (llm.c's own MFU {100 * r['llmc_own_mfu']:.1f}%)" if "llmc_own_mfu" in r else ""))
        failed = failed or not r["finite"]
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"batch": a.batch, "seq": a.seq, "accum": a.accum, "steps": a.steps,
                       "warmup": a.warmup, "flops_per_token": flops_per_token,
                       "peak_flops": peak, "runs": results}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
