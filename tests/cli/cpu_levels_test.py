#!/usr/bin/env python3
"""tools/cpu_levels.py ([Note: the CPU levels]): misuse refused by name (exit 2), and on this
build the element-type tests run on an emulated SSE4.2 CPU after zerort env there named the
baseline loops; a tiny training run gives the same bits natively and on the emulated AVX2 and
SSE4.2 CPUs, OpenBLAS held to one kernel set ([Note: sums in written-out lanes],
kernels/cpu/vector_math.h); in a sanitized build (whose programs QEMU's user mode does not run)
only the refusals. Usage: cpu_levels_test.py BUILD_DIR SOURCE_DIR ZERORT"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks, merged, read_jsonl, tiny_run, write_json  # noqa: E402

build, source, zerort = (os.path.abspath(a) for a in sys.argv[1:4])
tool = os.path.join(source, "tools", "cpu_levels.py")
checks = Checks("cpu_levels_test")
check = checks.check


def run(*args, environment=None):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True,
                          timeout=600, env=environment)


empty = tempfile.mkdtemp()
r = run(empty)
check("a folder that is no build is refused by name",
      r.returncode == 2 and empty in r.stderr and "not a configured build" in r.stderr, r.stderr)
r = run(build, "-j", "0")
check("-j 0 is refused", r.returncode == 2 and "-j" in r.stderr, r.stderr)
r = run(build, "--level", "x86-64-v9")
check("an unknown level is refused", r.returncode == 2 and "x86-64-v9" in r.stderr, r.stderr)
for flag in ("-R", "-E"):
    r = run(build, flag, "(")
    check(f"{flag} with a broken pattern is refused naming it",
          r.returncode == 2 and f"{flag} '('" in r.stderr and "not a regular expression" in r.stderr,
          r.stderr)
r = run(build, "-R", "^NoSuchTest\\.")
check("a filter that selects nothing is refused",
      r.returncode == 2 and "no cpu test selected" in r.stderr, r.stderr)

env = json.loads(subprocess.run([zerort, "env", "--json"], capture_output=True, text=True,
                                timeout=120).stdout)
if env["build"]["sanitizers"]:
    print(f"cpu_levels_test: a {env['build']['sanitizers']} build: nothing emulated")
else:
    r = run(build, "--level", "x86-64-v2", "-R", "^DTypeTest\\.")
    check("the element-type tests pass on the emulated SSE4.2 CPU, its loops checked first",
          r.returncode == 0 and "x86-64-v2 (CPU loops baseline x86-64;" in r.stdout and
          " 0 failed of " in r.stdout and " 0 passed" not in r.stdout, r.stdout + r.stderr)
    # OPENBLAS_CORETYPE=Haswell in the caller's environment (this project's machines set it): the
    # SSE4.2 CPU still runs the kernels OpenBLAS picks for it, not AVX2 ones (QEMU: SIGILL).
    r = run(build, "--level", "x86-64-v2", "-R", "^FastOpsTest\\.MatmulBiasAndItsGradient$",
            environment=dict(os.environ, OPENBLAS_CORETYPE="Haswell"))
    check("a GEMM test on the emulated SSE4.2 CPU takes its kernels, whatever the caller's "
          "OPENBLAS_CORETYPE", r.returncode == 0 and "GEMM OpenBLAS, Nehalem kernels" in r.stdout
          and "1 passed, 0 skipped, 0 failed of 1" in r.stdout, r.stdout + r.stderr)

    # The run's numbers on each CPU: OpenBLAS held to its Nehalem kernels (which every level
    # runs), one thread, so that only the CPU loops' versions differ.
    spec = importlib.util.spec_from_file_location("cpu_levels", tool)
    levels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(levels)
    folder = tempfile.mkdtemp()
    env = {"OPENBLAS_CORETYPE": "Nehalem", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

    def numbers(name, model):
        cfg = write_json(folder, name + ".json", merged(tiny_run(10), {
            "checkpoint": {"dir": os.path.join(folder, name + "-ckpt")},
            "logging": {"metrics_file": os.path.join(folder, name + ".jsonl")}}))
        argv = [zerort, "--log-level", "off", "train", cfg]
        if model is None:
            r = subprocess.run(argv, env=dict(os.environ, **env), capture_output=True, text=True,
                               timeout=300)
            rc, text = r.returncode, r.stdout + r.stderr
        else:
            rc, text = levels.emulated(model, argv, env, folder, 300)
        check(f"the tiny run exits 0 ({name})", rc == 0, text[-500:])
        return [(m["loss"], m["grad_norm"]) for m in read_jsonl(folder, name)] if rc == 0 else []

    native = numbers("native", None)
    for level, model in sorted(levels.LEVELS.items()):
        ok, described = levels.check_level(build, level)
        check(f"zerort env under the {level} model names that level's loops", ok, described)
        got = numbers(level, model)
        steps = [i + 1 for i, (a, b) in enumerate(zip(native, got)) if a != b]
        check(f"a run's losses and grad norms at {level} are the native run's bits",
              len(native) == 10 and got == native, f"steps {steps} differ; {got[:2]} against "
              f"{native[:2]}")
    shutil.rmtree(folder, ignore_errors=True)

shutil.rmtree(empty, ignore_errors=True)
sys.exit(checks.finish())
