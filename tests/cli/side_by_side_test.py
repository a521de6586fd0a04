#!/usr/bin/env python3
"""tools/peers/llmc_side_by_side.py without a GPU: zerort trains on the CPU and a stand-in for
llm.c's train_gpt2cu (it checks the flags and the token file the harness gives it, as llm.c
would read them, and prints step lines in llm.c's format with known step times) takes its place.
Checks the token file's layout, that zerort read it, the medians and ratio from known times, and
that a failed, short or diverging peer run, or bad arguments, fail the comparison.
Usage: side_by_side_test.py PATH_TO_ZERORT REPO_ROOT"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

zerort, root = sys.argv[1], sys.argv[2]
script = os.path.join(root, "tools", "peers", "llmc_side_by_side.py")
checks = Checks("side_by_side_test")
check = checks.check

# The stand-in: MODE ok | fail (exit 1 after two steps) | nan (a NaN loss at step 3) | no-nvml
# (llm.c built with NO_NVML=1 knows no peak and prints "-100.0% bf16 MFU", as on the H200 on
# 2026-11-30).
STAND_IN = r'''#!/usr/bin/env python3
import os, struct, sys
mode = os.environ.get("STAND_IN_MODE", "ok")
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
b, t, d, n = int(args["-b"]), int(args["-t"]), int(args["-d"]), int(args["-x"])
assert args["-e"] == "d12", args
assert d % (b * t) == 0 and d // (b * t) == int(os.environ["STAND_IN_ACCUM"]), args
assert int(args["-v"]) > n, "llm.c evaluates every -v steps: it must exceed the run"
for key in ("-i", "-j"):
    with open(args[key], "rb") as f:
        magic, version, count = struct.unpack("<3i", f.read(12))
        f.seek(0, 2)
        assert (magic, version) == (20240520, 1) and f.tell() == 1024 + 2 * count, args[key]
for s in range(n):
    if mode == "fail" and s == 2:
        print("cudaMalloc failed: out of memory", flush=True)
        sys.exit(1)
    loss = float("nan") if mode == "nan" and s == 2 else 5.5 - 0.01 * s
    ms = 200.0 if s == 0 else 110.0 if s == n - 1 else 100.0 + s
    print("step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | "
          "%.1f%% bf16 MFU | %.0f tok/s" % (s + 1, n, loss, 0.0, 1.2, 0.0, 6e-4, ms,
                                              -100.0 if mode == "no-nvml" else 40.0 + s, 1e3))
'''

with tempfile.TemporaryDirectory() as tmp:
    stand_in = os.path.join(tmp, "train_gpt2cu")
    with open(stand_in, "w") as f:
        f.write(STAND_IN)
    os.chmod(stand_in, 0o755)
    config = os.path.join(root, "configs", "bench-tiny.json")
    batch, seq, accum, steps, warmup = 2, 32, 2, 5, 2

    def side_by_side(*extra, mode="ok", work="w"):
        env = dict(os.environ, STAND_IN_MODE=mode, STAND_IN_ACCUM=str(accum))
        out = os.path.join(tmp, work + ".json")
        r = subprocess.run(
            [sys.executable, script, "--zerort", zerort, "--config", config,
             "--llmc", stand_in + ":stand-in", "--batch", str(batch), "--seq", str(seq),
             "--accum", str(accum), "--steps", str(steps), "--warmup", str(warmup),
             "--vocab", "256", "--set", "train.device=cpu", "--work", os.path.join(tmp, work),
             "--json", out, *extra], capture_output=True, text=True, timeout=120, env=env)
        return r, out

    r, out = side_by_side()
    check("both runs: exit 0", r.returncode == 0, r.stdout + r.stderr)
    if r.returncode == 0:
        result = json.load(open(out))
        names = [x["name"] for x in result["runs"]]
        check("a result for zerort and for the peer", names == ["zerort", "llm.c stand-in"], names)
        zr, peer = result["runs"]
        # The stand-in's steps 3-5 take 102, 103, 110 ms: median 103 ms (mean 105) of 128 tokens.
        tokens = batch * seq * accum
        check("the peer's median step time", abs(peer["median_step_ms"] - 103.0) < 1e-9, peer)
        check("the peer's tokens/s from it", abs(peer["tokens_per_s"] - tokens / 0.103) < 1e-6,
              peer)
        check("llm.c's own MFU kept (median of its timed steps)",
              abs(peer["llmc_own_mfu"] - 0.43) < 1e-9, peer)
        check("the ratio is zerort's tokens/s over the peer's",
              abs(peer["zerort_ratio"] - zr["tokens_per_s"] / peer["tokens_per_s"]) < 1e-9
              and zr["zerort_ratio"] == 1.0, result)
        check("steps after the warm-up are timed", zr["steps_timed"] == steps - warmup == peer[
            "steps_timed"], result)
        check("no MFU without a device peak (the CPU)", zr["mfu"] is None, zr)
        check("losses are finite and near ln(256) from random weights",
              zr["finite"] and abs(zr["first_loss"] - 5.545) < 0.5, zr)
    log = open(os.path.join(tmp, "w", "zerort.log")).read()
    check("zerort read the llm.c token file", "data: " + os.path.join(tmp, "w", "train.bin") in log,
          log)
    with open(os.path.join(tmp, "w", "train.bin"), "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        body = f.read()
    check("token file: llm.c's header, its count matching the file",
          header[:2] == (20240520, 1) and len(body) == 2 * header[2] and not any(header[3:]),
          header[:3])
    toks = struct.unpack(f"<{len(body) // 2}H", body)
    check("tokens below --vocab and not all one value", max(toks) < 256 and len(set(toks)) > 200,
          (max(toks), len(set(toks))))
    check("enough tokens for every step without rereading",
          header[2] >= steps * batch * seq * accum, header[2])

    r, out = side_by_side(mode="no-nvml", work="no-nvml")
    check("a peer that knows no peak (-100.0% MFU) is still timed: exit 0",
          r.returncode == 0, r.stdout + r.stderr)
    if r.returncode == 0:
        peer = json.load(open(out))["runs"][1]
        check("... its steps all read, its own MFU unknown, not negative",
              peer["steps_timed"] == steps - warmup and "llmc_own_mfu" not in peer
              and abs(peer["median_step_ms"] - 103.0) < 1e-9, peer)
    r, _ = side_by_side(mode="fail", work="fail")
    check("a peer that fails: exit 1", r.returncode == 1, r.stdout + r.stderr)
    check("... with its exit code, steps and log's tail",
          "exit 1, 2 of 5 steps" in r.stdout and "out of memory" in r.stdout, r.stdout)
    r, _ = side_by_side(mode="nan", work="nan")
    check("a peer whose loss is not finite: exit 1, said", r.returncode == 1 and
          "NOT FINITE" in r.stdout, r.stdout + r.stderr)
    r, _ = side_by_side("--set", "optimizer.params.lr=-1", work="zbad")
    check("a zerort run that fails: exit 1 with its log's tail", r.returncode == 1 and
          "zerort: exit 2" in r.stdout and "optimizer.params.lr" in r.stdout, r.stdout + r.stderr)
    r, _ = side_by_side("--warmup", "5", work="args")
    check("warm-up of every step refused: exit 2", r.returncode == 2 and "--warmup" in r.stderr,
          r.stderr)
    r, _ = side_by_side("--llmc", os.path.join(tmp, "missing"), work="args")
    check("a missing peer binary refused by name: exit 2",
          r.returncode == 2 and "missing: not an executable" in r.stderr, r.stderr)
    r, _ = side_by_side("--llmc", tmp, work="args")
    check("a directory as the peer binary refused: exit 2",
          r.returncode == 2 and "not an executable file" in r.stderr, r.stderr)
    r, _ = side_by_side("--tokens", "-5", work="args")
    check("negative --tokens refused: exit 2", r.returncode == 2 and "--tokens" in r.stderr,
          r.stderr)
    r, _ = side_by_side("--steps", "100000000", work="args")
    check("a run too big for llm.c's int32 token count refused before writing: exit 2",
          r.returncode == 2 and "training tokens" in r.stderr
          and not os.path.exists(os.path.join(tmp, "args", "train.bin")), r.stderr)
    os.makedirs(os.path.join(tmp, "fifo"))
    os.mkfifo(os.path.join(tmp, "fifo", "train.bin"))
    r, _ = side_by_side(work="fifo")
    check("a FIFO where the token file goes refused, not written into: exit 2",
          r.returncode == 2 and "train.bin exists and is not a regular file" in r.stderr, r.stderr)
    with open(os.path.join(tmp, "plainfile"), "w") as f:
        f.write("x")
    r, _ = side_by_side(work="plainfile")
    check("--work that is a file refused by name: exit 2",
          r.returncode == 2 and "--work" in r.stderr, r.stderr)
    r, _ = side_by_side("--vocab", "70000", work="args")
    check("a vocabulary uint16 cannot hold refused: exit 2",
          r.returncode == 2 and "--vocab 70000" in r.stderr, r.stderr)

checks.finish()
