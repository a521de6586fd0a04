#!/usr/bin/env python3
"""tools/sass_steps.py (docs/gpu.md, "The tile copies' instructions") on SASS written as
`cuobjdump -sass` prints it: the kernels and their loops, a path through a loop with its branches
chosen, instructions the disassembler could not decode (their encoding alone) counted, a cubin's
e_flags rewritten, and misuse refused by name.
Usage: sass_steps_test.py SOURCE_DIR"""
import os
import re
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

tool = os.path.join(sys.argv[1], "tools", "sass_steps.py")
checks = Checks("sass_steps_test")
check = checks.check
tmp = tempfile.mkdtemp()


def line(address, text):
    return (f"        /*{address:04x}*/                   {text} ;"
            f"          /* 0x000fe40000000000 */\n"
            f"                                                   /* 0x000fe40000000000 */\n")


def undecoded():
    return "                                                   /* 0x00000001f2c07836 */\n" * 2


# A loop from 0x20 to 0x90: two HMMA every pass, a branch at 0x40 over one FMUL (the masked
# path), an instruction at 0x60 the disassembler did not decode, the back edge at 0x90.
loop_kernel = "".join([
    "\n\tcode for sm_90\n\t\tFunction : _Z4loopPf\n\t.headerflags    @\"EF_CUDA_SM90\"\n",
    line(0x00, "MOV R1, c[0x0][0x28]"),
    line(0x10, "IMAD R2, R0, 0x2, RZ"),
    line(0x20, "HMMA.16816.F32.BF16 R4, R8, R12, R4"),
    line(0x30, "ISETP.GE.AND P0, PT, R2, 0x40, PT"),
    line(0x40, "@P0 BRA 0x60"),
    line(0x50, "FMUL R4, R4, 0.5"),
    undecoded(),
    line(0x70, "HMMA.16816.F32.BF16 R4, R8, R14, R4"),
    line(0x80, "IADD3 R2, R2, 0x1, RZ"),
    line(0x90, "@!P1 BRA 0x20"),
    line(0xa0, "EXIT"),
    line(0xb0, "BRA 0xb0"),
])
plain_kernel = "".join([
    "\n\t\tFunction : _Z5plainPf\n",
    line(0x00, "MOV R1, c[0x0][0x28]"),
    line(0x10, "EXIT"),
])
away_kernel = "".join([  # a branch past its last instruction
    "\n\t\tFunction : _Z4awayPf\n",
    line(0x00, "BRA 0x400"),
    line(0x10, "EXIT"),
])
# 30 instructions of 30 opcodes: a path names every one of them, none cut off.
wide_kernel = "".join(["\n\t\tFunction : _Z4widePf\n"] +
                      [line(0x10 * i, f"OP{chr(65 + i % 26)}{i // 26} R1, R2") for i in range(30)] +
                      [line(0x1e0, "EXIT")])
# Fragment loads and products: two loads used by the next product (0 products between), one
# used two products later; two accumulators each taken up again one product later; the last
# products read by an FADD (not a product: not counted).
waits_kernel = "".join([
    "\n\t\tFunction : _Z5waitsPf\n",
    line(0x00, "LDSM.16.M88.4 R8, [R2]"),
    line(0x10, "LDSM.16.M88.4 R20, [R2+0x100]"),
    line(0x20, "HMMA.16816.F32.BF16 R4, R8, R20, R4"),
    line(0x30, "LDSM.16.MT88.4 R24, [R3]"),
    line(0x40, "HMMA.16816.F32.BF16 R12, R8, R22, R12"),
    line(0x50, "HMMA.16816.F32.BF16 R4, R8, R22, R4"),
    line(0x60, "HMMA.16816.F32.BF16 R12, R8, R24, R12"),
    line(0x70, "FADD R30, R4, R12"),
    line(0x80, "EXIT"),
])
sass = os.path.join(tmp, "k.sass")
with open(sass, "w") as f:
    f.write("\nFatbin elf code:\n================\narch = sm_90\n" + loop_kernel + plain_kernel +
            away_kernel + wide_kernel + waits_kernel)


def run(*args):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True, timeout=60)


r = run("kernels", sass)
check("kernels exits 0", r.returncode == 0, r.stderr)
check("the loop kernel: 12 instructions (the undecoded one counted), 8 in its loop",
      "12 instructions, outermost loop     8: loop(float*)" in r.stdout
      or "12 instructions, outermost loop     8: _Z4loopPf" in r.stdout, r.stdout)
check("the kernel without a loop: 2 instructions",
      re.search(r"^ +2 instructions, outermost loop +0: (plain\(float\*\)|_Z5plainPf)$", r.stdout,
                re.M) is not None, r.stdout)

r = run("loop", sass, "loop")
check("loop lists the loop and its conditional branches",
      r.returncode == 0 and "loop 0x0020-0x0090: 8:" in r.stdout and "UNDECODED 1" in r.stdout
      and "0x0040 -> 0x0060  @P0 BRA 0x60" in r.stdout, r.stdout + r.stderr)

# One pass through the loop, the branch at 0x40 falling through (the FMUL runs) or taken.
r = run("path", sass, "loop", "20", "a0", "40=fall")
check("the path falling through: 8 instructions, 2 HMMA",
      r.returncode == 0 and ": 8 instructions, 2 HMMA" in r.stdout and "FMUL 1" in r.stdout,
      r.stdout + r.stderr)
r = run("path", sass, "loop", "20", "a0", "40=taken")
check("the path taking the branch: 7 instructions, no FMUL",
      ": 7 instructions, 2 HMMA" in r.stdout and "FMUL" not in r.stdout, r.stdout + r.stderr)
r = run("path", sass, "wide", "0", "1e0")
counted = sum(int(n) for n in re.findall(r"[A-Z0-9_.]+ (\d+)", r.stdout.split("HMMA:", 1)[-1]))
check("a path names every opcode it ran (30 of them), not the most common few",
      r.returncode == 0 and ": 30 instructions" in r.stdout and counted == 30, r.stdout + r.stderr)
r = run("path", sass, "loop", "20", "a0", "0x40=taken", "90=taken")
check("a back edge always taken never reaches STOP: an error, not a hang",
      r.returncode != 0 and "does not reach STOP" in r.stderr, r.stderr)
r = run("waits", sass, "waits", "0", "90")
check("waits: 3 loads, 2 used with no product between, 1 after 2",
      r.returncode == 0 and "LDSM -> first use: 3, 2 with fewer than 2 HMMA between; "
      "HMMA between: 0: 2, 2: 1" in r.stdout, r.stdout + r.stderr)
check("waits: 2 accumulators taken up one product later (the FADD not counted)",
      "HMMA -> next on it: 2, 2 with fewer than 2 HMMA between; HMMA between: 1: 2" in r.stdout,
      r.stdout + r.stderr)
for bad, says in ((["path", sass, "nothing", "20", "a0"], "0 kernels match 'nothing'"),
                  (["path", sass, "loop", "24", "a0"], "no instruction at 0x24"),
                  (["waits", sass, "waits", "8", "90"], "no instruction at 0x8"),
                  (["waits", sass, "nothing", "0", "90"], "0 kernels match 'nothing'"),
                  (["path", sass, "loop", "20", "a0", "40=maybe"], "'40=maybe' is not"),
                  (["path", sass, "away", "0", "10"], "goes to 0x400, outside the kernel"),
                  (["frobnicate", sass], "Instruction counts of CUDA kernels")):
    r = run(*bad)
    check(f"{bad[0]} {bad[2] if len(bad) > 2 else ''} refused: {says}",
          r.returncode != 0 and says in r.stderr, r.stderr)

# An sm_90 cubin's header as CUDA 13 writes it (architecture in bits 8-15), and one that is not.
cubin = os.path.join(tmp, "k.cubin")
header = bytearray(64)
header[:5] = b"\x7fELF\x02"
struct.pack_into("<I", header, 48, 0x06005A04)
open(cubin, "wb").write(bytes(header) + b"rest of the file")
r = run("patch-cubin", cubin, os.path.join(tmp, "old.cubin"))
patched = open(os.path.join(tmp, "old.cubin"), "rb").read() if r.returncode == 0 else b""
check("patch-cubin writes sm_90 in the old encoding and keeps the rest",
      r.returncode == 0 and struct.unpack_from("<I", patched, 48)[0] == 0x005A055A
      and patched[64:] == b"rest of the file", r.stdout + r.stderr)
r = run("patch-cubin", os.path.join(tmp, "old.cubin"), os.path.join(tmp, "again.cubin"))
check("an old-encoding cubin is refused", r.returncode != 0 and "not the newer encoding" in r.stderr,
      r.stderr)
r = run("patch-cubin", sass, os.path.join(tmp, "x.cubin"))
check("a file that is not ELF is refused", r.returncode != 0 and "not a 64-bit ELF" in r.stderr,
      r.stderr)

sys.exit(checks.finish())
