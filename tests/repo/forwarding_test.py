#!/usr/bin/env python3
"""ForwardingKernels (kernels/forwarding_kernels.h: the stream issue, the census and the timeline
wrap a ModelKernels in it) overrides every virtual function of ModelKernels. A virtual with a
default that the wrapper does not override answers with the default, not with the inner kernels:
until 2026-12-03 `attention_program` was one, so `zerort bench model --census` or `--timeline` on
CUDA with `model.attention_backend: "materialised"` allocated a flash program's saved bytes (a
log-sum-exp a query) for the materialised program's probabilities (it is pure virtual since).
The compiler checks the pure virtuals; this checks the others. Fails naming each virtual the
wrapper does not override."""
import pathlib
import re
import sys

INTERFACES = ("kernels/kernel_roles.h", "kernels/model_kernels.h")
WRAPPER = "kernels/forwarding_kernels.h"
VIRTUAL = re.compile(r"\bvirtual\s+[^;{}()]*?(?<![\w~])(~?\w+)\s*\(")
OVERRIDE = re.compile(r"(?<![\w~])(~?\w+)\s*\([^;{}()]*\)\s*(?:const\s*)?override\b")


def strip_comments(text):
    return re.sub(r"//[^\n]*", "", text)


def main(root):
    root = pathlib.Path(root)
    interface = "".join(strip_comments((root / name).read_text(encoding="utf-8"))
                        for name in INTERFACES)
    wrapper = strip_comments((root / WRAPPER).read_text(encoding="utf-8"))
    virtuals = {m.group(1) for m in VIRTUAL.finditer(interface)
                if not m.group(1).startswith("~")}
    overrides = {m.group(1) for m in OVERRIDE.finditer(wrapper)}
    if len(virtuals) < 40:
        print(f"FAIL: found only {len(virtuals)} virtual functions in {INTERFACES}: the pattern "
              "no longer reads the header")
        return 1
    missing = sorted(virtuals - overrides)
    for name in missing:
        print(f"FAIL: {WRAPPER}: ForwardingKernels does not override ModelKernels::{name} "
              f"({' or '.join(INTERFACES)}): the wrapped kernels would answer with the "
              "default, not the inner kernels'")
    stray = sorted(name for name in overrides - virtuals if not name.startswith("~"))
    for name in stray:
        print(f"FAIL: {WRAPPER}: {name} is marked override but is no virtual of ModelKernels "
              "(this test's patterns are out of date)")
    if missing or stray:
        return 1
    print(f"ok: ForwardingKernels overrides all {len(virtuals)} virtual functions of ModelKernels")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
