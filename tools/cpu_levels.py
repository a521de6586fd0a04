#!/usr/bin/env python3
"""A build's CPU tests on the x86-64 levels below this machine's, through QEMU's user-mode emulator
(Debian's qemu-user): `make test` must pass on any x86-64 machine, and this one runs only its own.

[Note: the CPU levels] below says how.

  tools/cpu_levels.py BUILD [--level x86-64-v3|x86-64-v2]... [-R REGEX] [-E REGEX] [-j N]

Exit 0 when every selected test passed (or skipped) at every level, 1 when one failed or a
level's check did not hold, 2 for bad input (no build there, no qemu-x86_64, an unknown level)."""
import argparse
import concurrent.futures
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

# [Note: the CPU levels]
# The CPU kernels' hot loops are compiled three times (ZR_CPU_CLONES, kernels/cpu/vector_math.h):
# AVX-512 (x86-64-v4), AVX2 + FMA (x86-64-v3) and the baseline; the loader picks one by the CPU's
# features, and OpenBLAS picks its GEMM kernels by the CPU's model. A machine runs one of each, so
# the tests of a machine with AVX-512 never run the other loops: their tails (16, 8 and 4 lanes),
# their bitwise claims (the optimizers' updates equal the scalar reference at every width) and the
# golden values' tolerances under another OpenBLAS kernel set. qemu-x86_64 -cpu MODEL runs a test
# program on an emulated CPU whose CPUID reports MODEL's features, so both choices follow it:
#   x86-64-v3  Haswell (AVX2 + FMA, no AVX-512): the v3 loops, OpenBLAS's Haswell kernels
#   x86-64-v2  Nehalem (SSE4.2): the baseline loops, OpenBLAS's Nehalem kernels
# (QEMU's own `qemu64` and `max` models report an AMD CPU that OpenBLAS takes for an Opteron, whose
# kernels use 3DNow!, which QEMU does not emulate: not used.) Each level is first checked with
# `zerort env` under the same model: its "CPU loops" line must name the level, or nothing runs.
# A process that executes a program leaves the emulator (user-mode QEMU emulates one program), so
# the environment here is what zerort's re-execution sets (kernels/openmp_waits.h: GOMP_SPINCOUNT
# and ZERORT_OPENMP_WAITS); a test that starts another program (a death test's re-execution)
# runs that one natively. QEMU's user mode has no io_uring (ENOSYS), so the io_uring engine's
# tests skip there as on any machine whose kernel refuses it (offload/nvme_store.h, IoUringUsable).
# The tests are those of the build's `cpu` label that run one of its own programs (ctest's list);
# the `mpi` label and the Python CLI tests start mpirun or zerort: not emulated. The caller's
# OPENBLAS_CORETYPE is not passed on (a test's own ENVIRONMENT may set one). Emulation runs a
# test several times slower than natively (the AVX2 model slower than the SSE4.2 one); each
# test's timeout is ctest's times --timeout-scale.

# The emulated CPU models; the features QEMU's translator lacks are turned off so that it does
# not warn about them on every start.
LEVELS = {
    "x86-64-v3": "Haswell-v4,pcid=off,x2apic=off,tsc-deadline=off,invpcid=off,spec-ctrl=off",
    "x86-64-v2": "Nehalem",
}
# What zerort env's "CPU loops" line starts with at each level (kernels/blas.h, CpuLoopLevel).
ENV_LINE = {"x86-64-v3": "AVX2 + FMA (x86-64-v3)", "x86-64-v2": "baseline"}
# A progress line after every this many tests of a level.
PROGRESS_EVERY = 50
# kernels/openmp_waits.h: the variables zerort's re-execution sets.
NO_REEXEC = {"GOMP_SPINCOUNT": "1000", "ZERORT_OPENMP_WAITS": "1"}


def refuse(why):
    sys.stderr.write(f"cpu_levels: {why}\n")
    sys.exit(2)


def ctest_list(build):
    if not os.path.isfile(os.path.join(build, "CTestTestfile.cmake")):
        refuse(f"{build}: not a configured build folder (no CTestTestfile.cmake)")
    r = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True, text=True)
    if r.returncode != 0:
        refuse(f"{build}: ctest --show-only failed: {r.stderr.strip()}")
    return json.loads(r.stdout)["tests"]


def selected(tests, build, include, exclude):
    """(name, argv, environment, working folder, timeout, skip patterns) of the cpu tests that run
    the build's own programs, filtered by name as ctest's -R and -E filter."""
    root = os.path.realpath(build) + os.sep
    out = []
    for t in tests:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        argv = t.get("command") or []
        if "cpu" not in props.get("LABELS", []) or not argv:
            continue
        if not os.path.realpath(argv[0]).startswith(root):
            continue
        if include and not re.search(include, t["name"]):
            continue
        if exclude and re.search(exclude, t["name"]):
            continue
        env = dict(kv.split("=", 1) for kv in props.get("ENVIRONMENT", []))
        skips = props.get("SKIP_REGULAR_EXPRESSION", [])
        out.append((t["name"], argv, env, props.get("WORKING_DIRECTORY", build),
                    float(props.get("TIMEOUT", 1500)), skips))
    return out


def emulated(model, argv, env, cwd, timeout):
    program = os.path.join(cwd, argv[0])  # argv[0] itself when absolute
    if not os.access(program, os.X_OK):  # QEMU exits 1 saying nothing
        return 127, f"{program}: no such program"
    # OpenBLAS picks its kernels by the emulated CPU's model: a core type the caller's environment
    # names (this project's machines set OPENBLAS_CORETYPE=Haswell) would run AVX2 kernels on the
    # SSE4.2 model, which QEMU stops with SIGILL. A test's own environment may still name one.
    full = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    full.update(NO_REEXEC)
    full.update(env)
    try:
        r = subprocess.run(["qemu-x86_64", "-cpu", model] + argv, cwd=cwd, env=full,
                           capture_output=True, text=True, errors="replace", timeout=timeout)
        return r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        text = (e.stdout or b"") + (e.stderr or b"")
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        return None, text + f"\n(timed out after {timeout:.0f} s)"


def check_level(build, level):
    """The level's model makes zerort pick that level's loops: (ok, zerort env's lines)."""
    zerort = os.path.join(os.path.abspath(build), "tools", "zerort")
    if not os.access(zerort, os.X_OK):
        refuse(f"{build}: no tools/zerort to check the level with (build it first)")
    rc, text = emulated(LEVELS[level], [zerort, "env"], {}, build, 120)
    if rc != 0:
        return False, f"exit {rc}: {text.strip()[-300:]}"
    lines = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if value:
            lines.setdefault(key.strip(), value.strip())
    loops, gemm = lines.get("CPU loops", "?"), lines.get("CPU GEMM", "?")
    return loops.startswith(ENV_LINE[level]), f"CPU loops {loops}; GEMM {gemm}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--level", action="append", choices=sorted(LEVELS))
    ap.add_argument("-R", dest="include", help="only the tests whose names match")
    ap.add_argument("-E", dest="exclude", help="not the tests whose names match")
    ap.add_argument("-j", dest="jobs", type=int, default=2)
    ap.add_argument("--timeout-scale", type=float, default=10.0)
    args = ap.parse_args()
    if args.jobs < 1 or args.timeout_scale <= 0:
        refuse("-j and --timeout-scale must be positive")
    for flag, pattern in (("-R", args.include), ("-E", args.exclude)):
        try:
            re.compile(pattern or "")
        except re.error as e:
            refuse(f"{flag} {pattern!r}: not a regular expression ({e})")
    if platform.machine() != "x86_64":
        print(f"cpu_levels: a {platform.machine()} machine: the levels are x86-64's, nothing run")
        return 0
    if shutil.which("qemu-x86_64") is None:
        refuse("qemu-x86_64 not found: Debian's qemu-user (scripts/install-deps.sh installs it)")
    tests = selected(ctest_list(args.build), args.build, args.include, args.exclude)
    if not tests:
        refuse(f"{args.build}: no cpu test selected")
    failed_levels = 0
    for level in args.level or ["x86-64-v3", "x86-64-v2"]:
        ok, described = check_level(args.build, level)
        if not ok:
            print(f"cpu_levels: {level}: zerort env under -cpu {LEVELS[level]} says {described}, "
                  f"not {ENV_LINE[level]}: the tests would not run that level's loops", flush=True)
            failed_levels += 1
            continue
        start = time.monotonic()
        passed = skipped = 0
        failures = []

        def run(test):
            name, argv, env, cwd, timeout, skips = test
            rc, text = emulated(LEVELS[level], argv, env, cwd, timeout * args.timeout_scale)
            return name, rc, text, any(re.search(s, text) for s in skips)

        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            # As each test ends, not in the order they started: one slow test (a memory grid
            # configuration takes minutes emulated) holds back no failure and no progress line.
            futures = [pool.submit(run, t) for t in tests]
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                name, rc, text, skip = future.result()
                if skip:
                    skipped += 1
                elif rc == 0:
                    passed += 1
                else:
                    failures.append(name)
                    print(f"cpu_levels: {level}: {name} failed (exit {rc}):\n{text[-4000:]}",
                          flush=True)
                if done % PROGRESS_EVERY == 0 and done < len(tests):
                    # A run stopped early (a full level takes half an hour or more) leaves this.
                    print(f"cpu_levels: {level}: {done} of {len(tests)} run ({passed} passed, "
                          f"{skipped} skipped, {len(failures)} failed) in "
                          f"{time.monotonic() - start:.0f} s, the last {name}", flush=True)
        print(f"cpu_levels: {level} ({described}): {passed} passed, {skipped} skipped, "
              f"{len(failures)} failed of {len(tests)} in {time.monotonic() - start:.0f} s"
              + (f": {', '.join(sorted(failures))}" if failures else ""), flush=True)
        failed_levels += bool(failures)
    return 1 if failed_levels else 0


if __name__ == "__main__":
    sys.exit(main())
