#!/usr/bin/env python3
"""Whether each CPU loop built per vector width is vectorised in every version: reads a built
library's (or object's) machine code with objdump.

  tools/cpu_clones.py LIBRARY
  tools/cpu_clones.py --disassembly FILE    (what `objdump -d --no-show-raw-insn` printed)

[Note: the CPU loops' versions] below says what is counted. Prints a line per function (its
packed floating-point operations in each version); exit 0 when every version of every loop that
the AVX-512 version vectorises is vectorised too, 1 naming each one that is not, 2 for bad input
(no such file, no objdump), 77 when the library holds no versions (a build with
-DZR_CPU_DISPATCH=OFF, or by another compiler than GCC)."""
import collections
import os
import re
import shutil
import subprocess
import sys

# [Note: the CPU loops' versions]
# A function marked ZR_CPU_CLONES (kernels/cpu/vector_math.h) is compiled three times by GCC, as
# symbols NAME.arch_x86_64_v4 (AVX-512), NAME.arch_x86_64_v3 (AVX2 + FMA) and NAME.default (the
# baseline's SSE2), and the loader picks one for the machine. The tests run one version per machine
# (tools/cpu_levels.py emulates the others for their results), so a version that the compiler did
# not vectorise is seen by nobody: until 2026-12-07 GCC's -ftrapping-math left every loop with a
# float select (math::Max and Min, FastExp's clamps) scalar below AVX-512, and GELU, SwiGLU, the
# cross-entropy and the flash blocks ran up to 6x slower on AVX2 machines than they had to.
# The count: packed floating-point arithmetic (add, sub, mul, div, min, max, sqrt, compare and the
# FMAs, `ps` and `pd`, any register width; not the logic operations, which scalar code uses for
# zeroing and signs). A function whose AVX-512 version has at least MIN_LOOP_OPS of them holds a
# vectorised loop; each other version must then have at least half as many (a vectorised version
# has about as many: the same loop, its tail loop in narrower vectors). Below that, scalar code
# (its tails' few packed operations). A loop that cannot vectorise at the baseline is listed in
# BASELINE_SCALAR with the reason.
MIN_LOOP_OPS = 8
BASELINE_SCALAR = {
    # kernels/flash_math.h's ProbExponent2 is one fused multiply-add (math::Fma), as the CUDA
    # programs round it; the baseline has no FMA instruction, so it is a call to libm's fmaf.
    "FlashBackwardBlock": "its exponent is a fused multiply-add: a libm call on the baseline",
}
VERSIONS = {"arch_x86_64_v4": "AVX-512", "arch_x86_64_v3": "AVX2", "default": "baseline"}
SYMBOL = re.compile(r"^[0-9a-f]+ <(.+)>:$")
CLONE = re.compile(r"^(.+?)\.(arch_x86_64_v4|arch_x86_64_v3|default)((?:\.[a-z]+\.\d+)*)$")
PACKED = re.compile(r"^v?(add|sub|mul|div|max|min|sqrt|cmp[a-z]*|f[n]?m(add|sub)[0-9]*)p[sd]$")


def counts_of(disassembly):
    """{mangled base name: {version: packed operations}} over the clones' symbols (a clone's
    .isra/.part pieces added to it)."""
    counts = collections.defaultdict(collections.Counter)
    current = None
    for line in disassembly.splitlines():
        m = SYMBOL.match(line)
        if m:
            c = CLONE.match(m.group(1))
            current = (c.group(1), c.group(2)) if c else None
            if current:
                counts[current[0]][current[1]] += 0
            continue
        if current is None:
            continue
        fields = line.split("\t")
        if len(fields) >= 2 and fields[1].split() and PACKED.match(fields[1].split()[0]):
            counts[current[0]][current[1]] += 1
    return counts


def demangled(names):
    if not names or not shutil.which("c++filt"):
        return list(names)
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    out = r.stdout.splitlines()
    return out if r.returncode == 0 and len(out) == len(names) else list(names)


def short_name(full):
    """The function's own name: `ns::(anonymous namespace)::GeluSpan(float*, ...)` -> GeluSpan."""
    return full.replace("(anonymous namespace)", "").split("(", 1)[0].rsplit("::", 1)[-1]


def disassembly_of(args):
    """objdump's text for the command line, or (None, why)."""
    if len(args) == 2 and args[0] == "--disassembly":
        try:
            with open(args[1], encoding="utf-8", errors="replace") as f:
                return f.read(), None
        except OSError as e:
            return None, f"{args[1]}: {e.strerror}"
    if len(args) != 1 or args[0].startswith("-"):
        return None, "usage: cpu_clones.py LIBRARY | --disassembly FILE"
    if not os.path.isfile(args[0]):
        return None, f"{args[0]}: no such file"
    objdump = shutil.which("objdump")
    if objdump is None:
        return None, "objdump not found (Debian's binutils)"
    r = subprocess.run([objdump, "-d", "--no-show-raw-insn", args[0]], capture_output=True,
                       text=True)
    if r.returncode != 0:
        return None, f"objdump -d {args[0]} failed: {r.stderr.strip()[:500]}"
    return r.stdout, None


def main():
    text, why = disassembly_of(sys.argv[1:])
    if text is None:
        print(f"cpu_clones: {why}", file=sys.stderr)
        return 2
    library = sys.argv[-1]
    counts = counts_of(text)
    if not counts:
        print(f"cpu_clones: {library} holds no per-width versions (ZR_CPU_DISPATCH off, or not "
              "built by GCC): nothing to check")
        return 77
    names = sorted(counts)
    failures = []
    print(f"{'AVX-512':>8} {'AVX2':>6} {'baseline':>9}  packed floating-point operations")
    for mangled, full in zip(names, demangled(names)):
        c = counts[mangled]
        name = short_name(full)
        why = f" (baseline scalar: {BASELINE_SCALAR[name]})" if name in BASELINE_SCALAR else ""
        print(f"{c['arch_x86_64_v4']:8} {c['arch_x86_64_v3']:6} {c['default']:9}  "
              f"{full[:110]}{why}")
        missing = [v for v in VERSIONS if v not in c]
        if missing:
            failures.append(f"{name}: no {', '.join(VERSIONS[v] for v in missing)} version")
            continue
        wide = c["arch_x86_64_v4"]
        if wide < MIN_LOOP_OPS:
            continue
        for version in ("arch_x86_64_v3", "default"):
            if version == "default" and name in BASELINE_SCALAR:
                continue
            if 2 * c[version] < wide:
                failures.append(f"{name}: the {VERSIONS[version]} version runs scalar "
                                f"({c[version]} packed operations against the AVX-512 version's "
                                f"{wide})")
    for f in failures:
        print(f"cpu_clones: {f}")
    if failures:
        print(f"cpu_clones: {len(names)} functions, {len(failures)} versions missing or not "
              "vectorised where the AVX-512 one is")
    else:
        print(f"cpu_clones: {len(names)} functions, each vectorised in every version where the "
              "AVX-512 one is")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
