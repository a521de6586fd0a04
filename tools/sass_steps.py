#!/usr/bin/env python3
"""Instruction counts of CUDA kernels from their SASS (docs/gpu.md, "The tile copies'
instructions"): a static measure of a kernel's loop where no GPU is at hand to time it.

  tools/sass_steps.py patch-cubin IN OUT
      rewrites an sm_90 cubin's ELF e_flags (CUDA 12.8+ encoding) to the older one that CUDA 11's
      cuobjdump reads, for machines whose newer toolkit has no disassembler
  tools/sass_steps.py kernels SASS
      each kernel of `cuobjdump -sass` output: its instructions and its outermost loop's
  tools/sass_steps.py loop SASS KERNEL
      KERNEL's (a substring of its demangled name) loops and the conditional branches in its
      outermost loop, each with its address, so that a path can be chosen
  tools/sass_steps.py path SASS KERNEL START STOP [ADDR=taken|fall ...]
      the instructions from address START up to STOP (hex), following each conditional branch as
      given (unnamed ones fall through; an unconditional one is taken), by opcode
  tools/sass_steps.py waits SASS KERNEL START STOP [ADDR=taken|fall ...]
      on that path, how far apart a result and its first use sit, counted in the tensor-core
      products (HMMA) issued between them: each shared-memory fragment load (LDSM) and the first
      instruction reading one of its registers, each HMMA and the next HMMA accumulating onto its
      result. A load or product whose use follows with few products between waits its latency
      out unless another warp issues meanwhile (a static view of how well ptxas interleaved them)

Instructions the disassembler could not decode (its output has their encoding only) are counted
as UNDECODED, so a count covers every 16 bytes of code."""
import collections
import re
import shutil
import struct
import subprocess
import sys

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;")
BRANCH = re.compile(r"(@!?U?P\w+\s+)?BRA(?:\.\w+)*\s+(?:!?U?P\w+,\s*)?(?:`\([^)]*\)\s*)?0x([0-9a-f]+)")


def demangle(names):
    tool = shutil.which("c++filt")
    if tool is None:
        return list(names)
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout
    return out.splitlines() if out else list(names)


def parse(text):
    """{demangled name: [(address, instruction text)]}, every 16 bytes present."""
    pieces = re.split(r"\n\s*Function : ", "\n" + text)[1:]
    mangled = [p.split("\n", 1)[0].strip() for p in pieces]
    kernels = {}
    for name, piece in zip(demangle(mangled), pieces):
        found = {int(a, 16): s for a, s in INSTRUCTION.findall(piece)}
        if not found:
            continue
        kernels[name] = [(a, found.get(a, "UNDECODED")) for a in range(0, max(found) + 16, 16)]
    return kernels


def opcode(s):
    s = re.sub(r"^@!?U?P\w+\s+", "", s)
    return s.split()[0].split(".")[0]


def branches(code):
    """(address, target, conditional) of each branch."""
    out = []
    for a, s in code:
        m = BRANCH.match(s)
        if m:
            out.append((a, int(m.group(2), 16), m.group(1) is not None))
    return out


def outermost_loop(code):
    back = [(t, a) for a, t, _ in branches(code) if t <= a]
    return max(back, key=lambda span: span[1] - span[0]) if back else None


def mix(code):
    return collections.Counter(opcode(s) for _, s in code)


def show(counter, n=14):
    return ", ".join(f"{k} {v}" for k, v in counter.most_common(n))


def find(kernels, substring):
    hits = [k for k in kernels if substring in k]
    if len(hits) != 1:
        sys.exit(f"sass_steps: {len(hits)} kernels match '{substring}'" +
                 "".join(f"\n  {k}" for k in hits))
    return hits[0], kernels[hits[0]]


def walk(code, start, stop, choices):
    index = {a: i for i, (a, _) in enumerate(code)}
    if start not in index:
        sys.exit(f"sass_steps: no instruction at {start:#x}")
    if stop not in index and stop != code[-1][0] + 16:  # STOP may be just past the last one
        sys.exit(f"sass_steps: no instruction at {stop:#x}")
    i, path = index[start], []
    while i < len(code) and code[i][0] != stop:
        a, s = code[i]
        path.append((a, s))
        if len(path) > 100000:
            sys.exit("sass_steps: the path does not reach STOP (a loop taken forever?)")
        m = BRANCH.match(s)
        if m and (m.group(1) is None or choices.get(a, False)):
            target = int(m.group(2), 16)
            if target not in index:
                sys.exit(f"sass_steps: the branch at {a:#x} goes to {target:#x}, outside the kernel")
            i = index[target]
            continue
        i += 1
    return path


REGISTER = re.compile(r"\bR(\d+)\b")
# Opcodes whose first operand is not a register they write.
STORES = {"ST", "STS", "STG", "STL", "RED", "REDG", "ATOM", "ATOMG", "ATOMS", "LDGSTS", "BRA",
          "BAR", "EXIT", "DEPBAR", "MEMBAR"}


def registers(s):
    """(opcode, registers written, registers read) of an instruction: HMMA.16816 reads A (4), B (2)
    and C (4) and writes D (4); LDSM .x1/.x2/.x4 writes 1, 2 or 4; a store or branch writes none;
    any other writes its first operand's register."""
    s = re.sub(r"^@!?U?P\w+\s+", "", s)
    op = s.split()[0] if s.split() else ""
    regs = [[int(r) for r in REGISTER.findall(o)] for o in s[len(op):].split(",")]
    base = op.split(".")[0]
    read = {r for rs in regs[1:] for r in rs}
    if base == "HMMA" and len(regs) == 4 and all(regs[i] for i in range(3)):
        d, a, b = regs[0][0], regs[1][0], regs[2][0]
        c = set(range(regs[3][0], regs[3][0] + 4)) if regs[3] else set()
        return base, set(range(d, d + 4)), set(range(a, a + 4)) | set(range(b, b + 2)) | c
    if base == "LDSM" and regs and regs[0]:
        n = 4 if ".4" in op else 2 if ".2" in op else 1
        return base, set(range(regs[0][0], regs[0][0] + n)), read
    if base in STORES or not regs[0]:
        return base, set(), {r for rs in regs for r in rs}
    return base, {regs[0][0]}, read


def waits(path):
    """{"LDSM": Counter, "HMMA": Counter} of the HMMAs issued between each result and its first
    use (an LDSM's by any instruction, an HMMA's by the next HMMA); a result never used on the
    path is not counted."""
    info = [registers(s) for _, s in path]
    out = {"LDSM": collections.Counter(), "HMMA": collections.Counter()}
    for i, (base, written, _) in enumerate(info):
        if base not in out or not written:
            continue
        between = 0
        for later, wrote, read in info[i + 1:]:
            if read & written:
                if base == "LDSM" or later == "HMMA":
                    out[base][between] += 1
                break
            if wrote & written:  # overwritten unread
                break
            between += later == "HMMA"
    return out


def patch_cubin(src, dst):
    data = bytearray(open(src, "rb").read())
    if data[:4] != b"\x7fELF" or data[4] != 2:
        sys.exit(f"sass_steps: {src} is not a 64-bit ELF file")
    flags = struct.unpack_from("<I", data, 48)[0]
    arch = (flags >> 8) & 0xFF  # the 12.8+ encoding keeps the architecture in bits 8-15
    if arch < 50:
        sys.exit(f"sass_steps: {src}: e_flags {flags:#x} is not the newer encoding")
    old = arch | 0x500 | (arch << 16)  # SM, 64-bit addresses and unified textures, virtual SM
    struct.pack_into("<I", data, 48, old)
    open(dst, "wb").write(data)
    print(f"{dst}: e_flags {flags:#x} -> {old:#x} (sm_{arch})")


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    command = argv[1]
    if command == "patch-cubin" and len(argv) == 4:
        return patch_cubin(argv[2], argv[3])
    kernels = parse(open(argv[2]).read())
    if command == "kernels" and len(argv) == 3:
        for name, code in kernels.items():
            loop = outermost_loop(code)
            inside = sum(1 for a, _ in code if loop and loop[0] <= a <= loop[1])
            print(f"{len(code):6d} instructions, outermost loop {inside:5d}: {name}")
    elif command == "loop" and len(argv) == 4:
        name, code = find(kernels, argv[3])
        print(f"{name}: {len(code)} instructions")
        for a, t, _ in branches(code):
            if t <= a:
                body = [x for x in code if t <= x[0] <= a]
                print(f"  loop {t:#06x}-{a:#06x}: {len(body)}: {show(mix(body))}")
        loop = outermost_loop(code)
        if loop:
            text = dict(code)
            print(f"  conditional branches in {loop[0]:#06x}-{loop[1]:#06x}:")
            for a, t, conditional in branches(code):
                if conditional and loop[0] <= a <= loop[1]:
                    print(f"    {a:#06x} -> {t:#06x}  {text[a]}")
    elif command in ("path", "waits") and len(argv) >= 6:
        name, code = find(kernels, argv[3])
        choices = {}
        for arg in argv[6:]:
            m = re.fullmatch(r"(?:0x)?([0-9a-fA-F]+)=(taken|fall)", arg)
            if not m:
                sys.exit(f"sass_steps: '{arg}' is not ADDR=taken or ADDR=fall")
            choices[int(m.group(1), 16)] = m.group(2) == "taken"
        path = walk(code, int(argv[4], 16), int(argv[5], 16), choices)
        if command == "waits":
            print(f"{name}: {len(path)} instructions")
            for base, what in (("LDSM", "LDSM -> first use"), ("HMMA", "HMMA -> next on it")):
                c = waits(path)[base]
                n = sum(c.values())
                few = sum(v for k, v in c.items() if k < 2)
                spread = ", ".join(f"{k}: {v}" for k, v in sorted(c.items()))
                print(f"  {what}: {n}, {few} with fewer than 2 HMMA between; "
                      f"HMMA between: {spread}")
            return
        counts = mix(path)
        # Every opcode: a count for one step is read for its rare ones too (a barrier, a load).
        print(f"{name}: {len(path)} instructions, {counts['HMMA']} HMMA: {show(counts, None)}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
