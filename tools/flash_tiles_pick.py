#!/usr/bin/env python3
"""Which of the CUDA flash kernels' block shapes to train with, from `zerort bench attention
--device cuda --json` lines (one a shape; tools/gpu-check.sh writes them): prints each shape's
TFLOP/s, every variant's against its default in the same run, and the model.flash_attention keys
of the variants that are at least MARGIN faster in every head-size-64 shape (the runs that take
them are at head size 64; the backward's variants exist only there, the forward's 128-query
blocks at 128 too, where they are reported and not chosen), as the last line:
  GPU_CHECK_SET=KEY=VALUE KEY=VALUE...   (empty: the defaults)
Of each kind's variants the one whose slowest shape gains most wins. A variant whose result
differs from the materialised path's otherwise than the default's does in any shape (bench
attention's *_max_abs_difference; a forward form by any other amount, since every forward form
computes the default's bits, a backward one by more than max(2 x, + 0.02) the default's
difference: a block shape that computes wrongly on this GPU) is never taken, however fast.
Exit 2, naming the line, for input that is not bench attention's JSON.
  tools/flash_tiles_pick.py FILE [--margin 0.02]"""
import argparse
import json
import sys

# bench attention's JSON key stems of the variants, and the model.flash_attention keys of each.
VARIANTS = {
    "flash_forward_128q": ("forward", {"forward_block_queries": 128}),
    "flash_forward_128q_8w": ("forward", {"forward_block_queries": 128, "forward_warps": 8}),
    "flash_backward_c32": ("backward", {"backward_query_chunk": 32}),
    "flash_backward_128k": ("backward", {"backward_block_keys": 128}),
    "flash_backward_128k_c32": ("backward", {"backward_block_keys": 128, "backward_query_chunk": 32}),
}


def read(path):
    shapes = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"flash_tiles_pick: {path}:{n}: not JSON ({e})")
            if not isinstance(row, dict) or row.get("bench") != "attention":
                raise SystemExit(f"flash_tiles_pick: {path}:{n}: not a bench attention result")
            # The fields read below: the shape's, and every rate a positive number.
            for key in ("batch", "seq", "heads", "kv_heads", "head_size", "flash_forward_tflops"):
                if key not in row:
                    raise SystemExit(f"flash_tiles_pick: {path}:{n}: no {key}")
            for key, value in row.items():
                if key.endswith("max_abs_difference") or key == "max_abs_difference_backward":
                    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                            not value >= 0:
                        raise SystemExit(f"flash_tiles_pick: {path}:{n}: {key} = {value!r} is "
                                         "not a difference")
                    continue
                if (key in ("batch", "seq", "heads", "kv_heads", "head_size")
                        or key.endswith("_tflops")) and (
                        isinstance(value, bool) or not isinstance(value, (int, float))
                        or not value > 0):
                    raise SystemExit(f"flash_tiles_pick: {path}:{n}: {key} = {value!r} is not a "
                                     "positive number")
            shapes.append(row)
    if not shapes:
        raise SystemExit(f"flash_tiles_pick: {path}: no bench attention result")
    return shapes


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--margin", type=float, default=0.02)
    a = p.parse_args(argv)
    try:
        shapes = read(a.file)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    except OSError as e:
        print(f"flash_tiles_pick: {e}", file=sys.stderr)
        return 2
    ratios = {stem: [] for stem in VARIANTS}  # each variant over its default, head size 64
    wrong = {}  # variant -> why it is never taken
    print("flash attention, TFLOP/s (FlashAttention's count); each variant against its default")
    for s in shapes:
        name = (f"B {s['batch']} T {s['seq']} heads {s['heads']}:{s['kv_heads']} "
                f"hs {s['head_size']}")
        parts = [f"forward {s['flash_forward_tflops']:.1f}"]
        if "flash_backward_tflops" in s:
            parts.append(f"backward {s['flash_backward_tflops']:.1f}")
        for stem, (kind, _) in VARIANTS.items():
            if f"{stem}_tflops" not in s or f"flash_{kind}_tflops" not in s:
                continue
            r = s[f"{stem}_tflops"] / s[f"flash_{kind}_tflops"]
            parts.append(f"{stem[6:]} {s[f'{stem}_tflops']:.1f} ({r:.2f}x)")
            default = s.get("max_abs_difference" if kind == "forward" else
                            "max_abs_difference_backward")
            mine = s.get(f"{stem}_max_abs_difference")
            # Every forward form computes the default's bits ([Note: the register-resident
            # forward]): any other difference is a form that computes wrongly on this GPU.
            if default is not None and mine is not None and (
                    mine != default if kind == "forward" else
                    mine > max(2 * default, default + 0.02)):
                wrong.setdefault(stem, f"{name}: differs from the materialised path by {mine:.3g} "
                                 f"where the default does by {default:.3g}")
            if s["head_size"] == 64:
                ratios[stem].append(r)
        print(f"  {name}: " + ", ".join(parts))
    # The head-size-64 shapes a variant of each kind must be timed in (a backward only where the
    # run timed the backward).
    need = {"forward": sum(s["head_size"] == 64 for s in shapes),
            "backward": sum(s["head_size"] == 64 and "flash_backward_tflops" in s for s in shapes)}
    for stem, why in wrong.items():
        print(f"{stem[6:]} is not taken: {why}")
    chosen = {}
    for kind in ("forward", "backward"):
        best, best_worst = None, 1.0 + a.margin
        for stem, (k, _) in VARIANTS.items():
            r = ratios[stem]
            # Every head-size-64 shape timed it, each at least the margin faster.
            if k != kind or not r or len(r) != need[kind] or min(r) < best_worst or stem in wrong:
                continue
            best, best_worst = stem, min(r)
        if best is not None:
            chosen.update(VARIANTS[best][1])
            print(f"{kind}: {best[6:]} is at least {best_worst:.2f}x the default in every "
                  "head-size-64 shape")
        else:
            print(f"{kind}: the default (no variant {1 + a.margin:.2f}x or more in every "
                  "head-size-64 shape)")
    print("GPU_CHECK_SET=" + " ".join(f"model.flash_attention.{k}={v}"
                                      for k, v in sorted(chosen.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
