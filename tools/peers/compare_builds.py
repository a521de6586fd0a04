#!/usr/bin/env python3
"""Two zerort builds' training step on make bench-peers' shapes, in one run.

Whether a change made the CPU step slower is a question for one run: these machines differ from
day to day and by kind of work (docs/benchmarks.md), so a table from another day does not answer
it. For each shape of tools/peers/compare.py, `--rounds` rounds alternate the builds (`zerort
bench model --phases --json`: forward, backward, AdamW, ZeRO-0, one process), OpenBLAS detecting
its kernels, OMP_WAIT_POLICY and GOMP_SPINCOUNT as each build sets them. Prints every round, then
a markdown table of medians (tokens/s of the full step) with each build's ratio to the first.

usage: compare_builds.py NAME=ZERORT NAME=ZERORT... [--threads 2] [--rounds 3]
                         [--shapes tiny,small,gpt2]
(e.g. then=/tmp/old/build/tools/zerort now=build/tools/zerort; a build of an older commit:
`git worktree add /tmp/old COMMIT`, then cmake -DZR_ENABLE_CUDA=OFF and `ninja tools/zerort`)
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import SHAPES, bench_command, run_json, write_config  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("builds", nargs="+", metavar="NAME=ZERORT")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", default="tiny,small,gpt2")
    a = p.parse_args()
    builds = {}
    for arg in a.builds:
        name, sep, path = arg.partition("=")
        executable = os.path.isfile(path) and os.access(path, os.X_OK)
        if not sep or not name or name in builds or not executable:
            p.error(f"'{arg}' is not NAME=ZERORT with a new name and an executable zerort")
        builds[name] = path
    shapes = a.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown or len(builds) < 2 or a.threads < 1 or a.rounds < 1:
        p.error(f"--shapes takes {', '.join(SHAPES)} (got {', '.join(unknown)})" if unknown
                else "two builds or more; --threads and --rounds at least 1")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_CORETYPE")}
    env.update(OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    tokens = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            config, iters = write_config(tmp, shape), SHAPES[shape][-1]
            for r in range(a.rounds):
                for name, zerort in builds.items():
                    t = run_json(bench_command(zerort, config, iters), env)["step_tokens_per_s"]
                    tokens.setdefault((shape, name), []).append(t)
                    print(f"{shape} {name} round {r + 1}: {t:,.1f} tokens/s", flush=True)
    first = next(iter(builds))
    print(f"\nthreads {a.threads}, {a.rounds} interleaved rounds, medians (tokens/s of a full "
          "training step)\n")
    print("| shape | " + " | ".join(builds) + " | " +
          " | ".join(f"{n} / {first}" for n in builds if n != first) + " |")
    print("|---" * (2 * len(builds)) + "|")
    for shape in shapes:
        med = {n: statistics.median(tokens[(shape, n)]) for n in builds}
        print(f"| {shape} | " + " | ".join(f"{med[n]:,.0f}" for n in builds) + " | " +
              " | ".join(f"{med[n] / med[first]:.2f}" for n in builds if n != first) + " |")


if __name__ == "__main__":
    main()
