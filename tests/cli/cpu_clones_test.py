#!/usr/bin/env python3
"""tools/cpu_clones.py ([Note: the CPU loops' versions]): misuse refused (exit 2); on objdump
text written here, a version that runs scalar or is missing named (exit 1), a library without
versions skipped (77), the baseline's listed exception honoured; and the build's kernels library
vectorised in every version (with -ftrapping-math, GCC 12 left GELU, SwiGLU, the cross-entropy
and the flash blocks scalar below AVX-512: this failed). Usage: cpu_clones_test.py LIBRARY
SOURCE_DIR"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

library, source = sys.argv[1:3]
tool = os.path.join(source, "tools", "cpu_clones.py")
checks = Checks("cpu_clones_test")
check = checks.check


def run(*args):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True,
                          timeout=300)


def function(name, version, packed, scalar=4):
    """objdump's lines for one symbol: `packed` packed multiplies among scalar adds."""
    lines = [f"0000000000001000 <{name}.{version}>:"]
    lines += ["    1000:\tvmulps %ymm1,%ymm2,%ymm3" for _ in range(packed)]
    lines += ["    1004:\tvaddss %xmm1,%xmm2,%xmm3" for _ in range(scalar)]
    return "\n".join(lines + [""])


def disassembly(text):
    f = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    f.write(text)
    f.close()
    r = run("--disassembly", f.name)
    os.unlink(f.name)
    return r


# Misuse.
for args, what in (((), "no argument"), (("/nonexistent/libx.so",), "a missing library"),
                   (("--disassembly",), "--disassembly without a file"),
                   (("--disassembly", "/nonexistent/x.txt"), "a missing disassembly"),
                   (("a", "b"), "two libraries")):
    r = run(*args)
    check(f"{what} is refused", r.returncode == 2 and "cpu_clones:" in r.stderr,
          f"exit {r.returncode}: {r.stderr[-300:]}")

# Crafted disassembly: `_ZL4Loopv` demangles to Loop().
vectorised = "".join(function("_ZL4Loopv", v, 40) for v in ("arch_x86_64_v4", "arch_x86_64_v3",
                                                            "default"))
r = disassembly(vectorised)
check("every version vectorised passes", r.returncode == 0 and "1 functions, each" in r.stdout,
      f"exit {r.returncode}: {r.stdout[-400:]}")
r = disassembly(function("_ZL4Loopv", "arch_x86_64_v4", 40) +
                function("_ZL4Loopv", "arch_x86_64_v3", 3) + function("_ZL4Loopv", "default", 40))
check("an AVX2 version that runs scalar is named", r.returncode == 1 and
      "Loop: the AVX2 version runs scalar (3 packed operations against the AVX-512 version's 40)"
      in r.stdout, f"exit {r.returncode}: {r.stdout[-400:]}")
r = disassembly(function("_ZL4Loopv", "arch_x86_64_v4", 40) +
                function("_ZL4Loopv", "arch_x86_64_v3", 40))
check("a missing version is named", r.returncode == 1 and "Loop: no baseline version" in r.stdout,
      f"exit {r.returncode}: {r.stdout[-400:]}")
r = disassembly(function("_ZL4Loopv", "arch_x86_64_v4", 5) +
                function("_ZL4Loopv", "arch_x86_64_v3", 0) + function("_ZL4Loopv", "default", 0))
check("scalar code in every version is not a loop to check", r.returncode == 0,
      f"exit {r.returncode}: {r.stdout[-400:]}")
# The baseline's listed exception (a libm fmaf call): its AVX2 version is still checked.
flash = "_ZN12_GLOBAL__N_118FlashBackwardBlockEv"
r = disassembly(function(flash, "arch_x86_64_v4", 50) + function(flash, "arch_x86_64_v3", 50) +
                function(flash, "default", 0))
check("FlashBackwardBlock's scalar baseline is allowed", r.returncode == 0,
      f"exit {r.returncode}: {r.stdout[-400:]}")
r = disassembly(function(flash, "arch_x86_64_v4", 50) + function(flash, "arch_x86_64_v3", 0) +
                function(flash, "default", 0))
check("FlashBackwardBlock's AVX2 version is still checked",
      r.returncode == 1 and "FlashBackwardBlock: the AVX2 version runs scalar" in r.stdout,
      f"exit {r.returncode}: {r.stdout[-400:]}")
r = disassembly("0000000000001000 <_Z4Mainv>:\n    1000:\tvmulps %ymm1,%ymm2,%ymm3\n")
check("a library without versions is skipped",
      r.returncode == 77 and "nothing to check" in r.stdout,
      f"exit {r.returncode}: {r.stdout[-400:]}")

# The build's kernels library.
r = run(library)
check("the kernels library is vectorised in every version", r.returncode == 0,
      f"exit {r.returncode}:\n{r.stdout[-3000:]}{r.stderr[-500:]}")
for name in ("GeluSpan", "GeluBackwardSpan", "SwiGluRow", "CrossEntropySpan", "FlashForwardBlock",
             "AdamRange", "MomentsChunk", "ApplyRange"):
    check(f"the kernels library's {name} is counted", f"::{name}(" in r.stdout, r.stdout[-2000:])
checks.finish()
