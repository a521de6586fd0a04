#!/usr/bin/env python3
"""tools/cpu_levels.py ([Note: the CPU levels]): misuse refused by name (exit 2), and on this
build the element-type tests run on an emulated SSE4.2 CPU after zerort env there named the
baseline loops; in a sanitized build (whose programs QEMU's user mode does not run) only the
refusals. Usage: cpu_levels_test.py BUILD_DIR SOURCE_DIR ZERORT"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

build, source, zerort = sys.argv[1:4]
tool = os.path.join(source, "tools", "cpu_levels.py")
checks = Checks("cpu_levels_test")
check = checks.check


def run(*args):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True,
                          timeout=600)


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

sys.exit(checks.finish())
