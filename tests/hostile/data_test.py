#!/usr/bin/env python3
"""Token files and text as untrusted data: a FIFO, /dev/zero, a directory, a header whose token
count times width wraps 64 bits or exceeds the file, a width or version out of range, a token
outside the vocabulary; and `zerort data prepare` given a FIFO, /dev/zero or a directory. Each is
exit 2 naming the file within seconds, in bounded memory, never a hang, a crash or bad_alloc.
Usage: data_test.py PATH_TO_ZERORT"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from harness import Checks  # noqa: E402

zerort = sys.argv[1]
checks = Checks("hostile_data_test")
check = checks.check
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def run(*args):
    """zerort's exit code ("timeout" past 60 s), its stderr as text, and the seconds it took."""
    start = time.time()
    try:
        r = subprocess.run([zerort, *args], capture_output=True, env=env, timeout=60)
        return r.returncode, r.stderr.decode("utf-8", "replace"), time.time() - start
    except subprocess.TimeoutExpired:
        return "timeout", "", time.time() - start


def header(count, width=2, version=1, vocab=256, magic=b"ZRTOKENS"):
    return magic + struct.pack("<IIQII", version, width, count, vocab, 0)


def token_file(name, data):
    path = os.path.join(tmp, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def megatron(prefix, index_after_magic):
    """A Megatron dataset PREFIX.idx (its magic, then the bytes given) + PREFIX.bin: the prefix."""
    token_file(prefix + ".idx", b"MMIDIDX\0\0" + index_after_magic)
    token_file(prefix + ".bin", b"\0" * 16)
    return os.path.join(tmp, prefix)


fifo = os.path.join(tmp, "data.fifo")
os.mkfifo(fifo)
cases = [
    ("a FIFO", fifo, "not a regular file"),
    ("/dev/zero", "/dev/zero", "not a regular file"),
    ("a directory", tmp, "not a regular file"),
    ("a count that wraps 64 bits", token_file("wrap.bin", header(2**63, 2) + b"\0\0"),
     "header says 9223372036854775808 tokens"),
    ("a count beyond the file", token_file("long.bin", header(10**12, 4) + b"\0" * 64),
     "header says 1000000000000 tokens"),
    ("width 3", token_file("w3.bin", header(4, 3) + b"\0" * 12), "token width 3"),
    ("version 9", token_file("v9.bin", header(4, 2, 9) + b"\0" * 8), "token-file version 9"),
    ("vocabulary 0", token_file("v0.bin", header(4, 2, 1, 0) + b"\0" * 8), "vocabulary size 0"),
    ("a token outside the vocabulary",
     token_file("oov.bin", header(400, 2, 1, 256) + struct.pack("<400H", 1, 2, 300, *[4] * 397)),
     "token 2 = 300 is outside the vocabulary"),
    ("a short header", token_file("short.bin", b"ZRTOK"), "shorter than the 32-byte"),
    ("no magic", token_file("nomagic.bin", header(4, 2, magic=b"NOTTOKEN") + b"\0" * 8),
     "not a token file zerort knows"),
    # The other formats ([Note: the token files zerort reads], data/token_source.h).
    ("an llm.c shard of version 7",
     token_file("llmc7.bin", struct.pack("<3i", 20240520, 7, 4) + b"\0" * 1012 + b"\0" * 8),
     "llm.c token shard version 7"),
    ("an llm.c shard shorter than its count",
     token_file("llmc.bin", struct.pack("<3i", 20240520, 1, 99) + b"\0" * 1012 + b"\0" * 8),
     "header says 99 tokens"),
    ("an llm.c token outside the model's vocabulary",
     token_file("llmcoov.bin", struct.pack("<3i", 20240520, 1, 400) + b"\0" * 1012 +
                struct.pack("<400H", *([5] * 20 + [50000] + [5] * 379))),
     "token 20 = 50000 is outside the vocabulary [0, 256)"),
    ("a Megatron index whose counts exceed it",
     megatron("mega", struct.pack("<QBQQ", 1, 8, 2**62, 1)), "do not fit its"),
    ("a Megatron index of float tokens",
     megatron("megaf", struct.pack("<QBQQ", 1, 7, 0, 1) + b"\0" * 8),
     "dtype code 7 is not an integer token type"),
    ("a raw array without data.format", token_file("train.bin", b"\1\0" * 64),
     "set data.format to uint16 or uint32"),
    # A name longer than the file system takes (std::filesystem threw, and zerort aborted, until
    # the config fuzzer met one).
    ("a 300-character name", "a" * 300, "File name too long"),
    # Longer than any path: refused as the config is read, its start quoted (a 1 MiB value was
    # echoed whole until 2026-12-04).
    ("a 5,000-character name", "a" * 5000, "5000 bytes, longer than any name or path"),
]
base = {
    "train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "seq_len": 8, "vocab_size": 256},
    "train": {"steps": 1, "eval_windows": 1, "sample_tokens": 0, "device": "cpu"},
}
for what, path, says in cases + [
        ("a raw uint16 array of an odd size", token_file("odd.bin", b"\1" * 65), "uint16")]:
    cfg = os.path.join(tmp, "run.json")
    with open(cfg, "w") as f:
        json.dump(dict(base, data={"path": path, "format": "uint16" if "odd" in path else "detect"}),
                  f)
    code, err, seconds = run("train", cfg)
    check(f"data.path is {what}: exit 2", code == 2, f"{code} {err[-600:]}")
    check(f"data.path is {what}: names the file and why",
          (path if len(path) <= 4096 else path[:50] + "...") in err and says in err
          and len(err) < 4000, err[-600:])
    check(f"data.path is {what}: within seconds", seconds < 10, f"{seconds:.1f} s")

for what, path in [("a FIFO", fifo), ("/dev/zero", "/dev/zero"), ("a directory", tmp)]:
    out = os.path.join(tmp, "prepared.bin")
    code, err, seconds = run("data", "prepare", path, out)
    check(f"data prepare of {what}: exit 2", code == 2, f"{code} {err[-600:]}")
    check(f"data prepare of {what}: says why", "not a regular file" in err, err[-600:])
    check(f"data prepare of {what}: writes nothing", not os.path.exists(out))
    check(f"data prepare of {what}: within seconds", seconds < 10)

# tokenizer.json files with byte fallback (LLaMA-2's, Mistral's layouts: [Note: zerort's
# tokenizers]) made hostile: each key of the wrong type, out of range, huge or empty is refused by
# `data prepare --tokenizer` naming the file and its JSON path, exit 2, nothing written; text that
# is not UTF-8 is refused naming its byte.
golden = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "golden")
with open(os.path.join(golden, "tokenizer_mistral.json")) as f:
    mistral = json.load(f)
META = "\u2581"


def tokenizer_case(name, change):
    t = json.loads(json.dumps(mistral))
    change(t)
    return token_file(name, json.dumps(t).encode())  # any file's bytes


def set_key(path, value):
    def change(t):
        *parents, last = path
        o = t
        for p in parents:
            o = o[p]
        o[last] = value
    return change


text = token_file("text.txt", "a plain text with \u2603 and more words\n".encode() * 50)
tokenizer_cases = [
    ("byte_fallback a string", set_key(["model", "byte_fallback"], "yes"), "model.byte_fallback"),
    ("fuse_unk a number", set_key(["model", "fuse_unk"], 1), "model.fuse_unk"),
    ("unk_token a number", set_key(["model", "unk_token"], 5), "model.unk_token"),
    ("unk_token empty", set_key(["model", "unk_token"], ""), "model.unk_token"),
    ("unk_token a 2 MiB string", set_key(["model", "unk_token"], "u" * (2 << 20)),
     "model.unk_token"),
    ("an empty vocab", set_key(["model", "vocab"], {}), "model.vocab"),
    ("an id out of range", set_key(["model", "vocab", "zz"], 2**40), "model.vocab[\"zz\"]"),
    ("BPE dropout 0.5", set_key(["model", "dropout"], 0.5), "model.dropout"),
    ("Metaspace's replacement empty", set_key(["pre_tokenizer", "replacement"], ""),
     "pre_tokenizer.replacement"),
    ("Metaspace's replacement two characters", set_key(["pre_tokenizer", "replacement"], "__"),
     "pre_tokenizer.replacement"),
    ("Metaspace's prepend_scheme a number", set_key(["pre_tokenizer", "prepend_scheme"], 7),
     "pre_tokenizer.prepend_scheme"),
    ("Metaspace's split a string", set_key(["pre_tokenizer", "split"], "no"),
     "pre_tokenizer.split"),
    ("a Strip whose start is negative", set_key(["decoder", "decoders", 3, "start"], -1),
     "decoder[3]"),
    ("a Strip whose start is 1e30", set_key(["decoder", "decoders", 3, "start"], 1e30),
     "decoder[3]"),
    ("a Prepend normalizer without its string",
     set_key(["normalizer"], {"type": "Prepend", "prepend": ""}), "normalizer"),
    ("a merge of tokens not in the vocab", set_key(["model", "merges", 0], [META + "q", "zz"]),
     "model.merges[0]"),
]
for what, change, says in tokenizer_cases:
    tok = tokenizer_case("tok.json", change)
    out = os.path.join(tmp, "tok.bin")
    code, err, seconds = run("data", "prepare", text, out, "--tokenizer", tok)
    check(f"tokenizer with {what}: exit 2", code == 2, f"{code} {err[-600:]}")
    check(f"tokenizer with {what}: names the file and the key", tok in err and says in err,
          err[-600:])
    check(f"tokenizer with {what}: writes nothing", not os.path.exists(out))
    check(f"tokenizer with {what}: within seconds", seconds < 10, f"{seconds:.1f} s")
ok_tok = tokenizer_case("ok.json", lambda t: None)
for what, data, at in [("a lone surrogate's encoding", b"fine text \xed\xa0\x80 then", 10),
                       ("a stray continuation byte", b"fine \x80", 5)]:
    bad_text = token_file("bad.txt", data)
    out = os.path.join(tmp, "bad_text.bin")
    code, err, seconds = run("data", "prepare", bad_text, out, "--tokenizer", ok_tok)
    check(f"text with {what}: exit 2", code == 2, f"{code} {err[-600:]}")
    check(f"text with {what}: names the file and the byte",
          bad_text in err and f"not valid UTF-8 at byte {at}" in err, err[-600:])
    check(f"text with {what}: writes nothing", not os.path.exists(out))

# Configs: not a regular file, numbers out of double range, ill-formed UTF-8, integers beyond 2^53,
# deep nesting, a long string, a --set with ill-formed UTF-8.
def config_file(name, data):
    path = os.path.join(tmp, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


cfg_fifo = os.path.join(tmp, "config.fifo")
os.mkfifo(cfg_fifo)
config_cases = [
    ("/dev/zero", ["/dev/zero"], "not a regular file"),
    ("a FIFO", [cfg_fifo], "not a regular file"),
    ("a directory", [tmp], "not a regular file"),
    ("1e400", [config_file("big.json", b'{"train_batch_size": 1e400}')], "number overflow"),
    ("ill-formed UTF-8", [config_file("utf.json", b'{"optimizer": {"type": "Adam\xff"}}')],
     "ill-formed UTF-8"),
    ("an integer beyond 2^53",
     [config_file("int.json", b'{"train_batch_size": 99999999999999999999999}')],
     "train_batch_size"),
    ("deep nesting", [config_file("deep.json", b'{"x": ' + b"[" * 100000 + b"]" * 100000 + b"}")],
     "nested more than 64 levels deep at 'x[0][0]"),
    ("a 50 MB string",
     [config_file("long.json", b'{"train_batch_size": 4, "x": "' + b"a" * 50000000 + b'"}')],
     "a string of 50000000 bytes (at most 1048576) at 'x'"),
    ("collective_timeout_s a string", [config_file("t1.json", json.dumps(base).encode()),
                                       "--set", 'parallel.collective_timeout_s="abc"'],
     "parallel.collective_timeout_s"),
    ("collective_timeout_s 0", [config_file("t2.json", json.dumps(base).encode()),
                                "--set", "parallel.collective_timeout_s=0"],
     "parallel.collective_timeout_s = 0"),
    ("collective_timeout_s 1e300", [config_file("t3.json", json.dumps(base).encode()),
                                    "--set", "parallel.collective_timeout_s=1e300"],
     "parallel.collective_timeout_s"),
    ("check_memory a number", [config_file("t4.json", json.dumps(base).encode()),
                               "--set", "train.check_memory=1"], "train.check_memory = 1"),
    ("a --set with ill-formed UTF-8",
     [config_file("ok.json", json.dumps(base).encode()), "--set", "train.device=cpu\udcff"],
     "train.device"),
]
# The keys DeepSpeed's own verdicts opened (sub_group_size 0, "_" comments, cuda_visible_devices,
# a fractional fp16.min_loss_scale): still typed, ranged and bounded.
def with_keys(name, **top):
    return config_file(name, json.dumps(dict(base, **top)).encode())


config_cases += [
    ("sub_group_size a string", [with_keys("sg1.json", zero_optimization={"sub_group_size": "0"})],
     "zero_optimization.sub_group_size = \"0\""),
    ("sub_group_size -1", [with_keys("sg2.json", zero_optimization={"sub_group_size": -1})],
     "zero_optimization.sub_group_size = -1"),
    ("sub_group_size 1e300", [with_keys("sg3.json", zero_optimization={"sub_group_size": 1e300})],
     "zero_optimization.sub_group_size"),
    ("fp16.min_loss_scale -1",
     [with_keys("ml1.json", fp16={"enabled": True, "min_loss_scale": -1})],
     "fp16.min_loss_scale = -1"),
    ("fp16.min_loss_scale a string",
     [with_keys("ml2.json", fp16={"enabled": True, "min_loss_scale": "auto"})],
     "fp16.min_loss_scale"),
    ("a _comment nested 100,000 deep",
     [config_file("cdeep.json", b'{"_comment": ' + b"[" * 100000 + b"]" * 100000 + b"}")],
     "nested more than 64 levels deep at '_comment[0]"),
    ("cuda_visible_devices a 2 MiB string",
     [with_keys("cvd.json", cuda_visible_devices="0," * (1 << 20))],
     "a string of 2097152 bytes (at most 1048576) at 'cuda_visible_devices'"),
    ("data.format a number", [with_keys("df1.json", data={"format": 16})], "data.format"),
    ("data.format a name it does not know",
     [with_keys("df2.json", data={"format": "int8"})], "data.format = \"int8\""),
    ("data.format empty", [with_keys("df3.json", data={"format": ""})], "data.format"),
    ("data.format a 2 MiB string", [with_keys("df4.json", data={"format": "u" * (2 << 20)})],
     "at 'data.format'"),
    ("offload_param below stage 3 with a device that does not exist",
     [with_keys("op.json", zero_optimization={"stage": 2, "offload_param": {"device": "gpu"}})],
     "zero_optimization.offload_param.device"),
]
for what, args, says in config_cases:
    code, err, seconds = run("train", *args)
    check(f"config is {what}: exit 2", code == 2, f"{code} {err[-600:]}")
    check(f"config is {what}: says why", says in err, err[-600:])
    check(f"config is {what}: within seconds", seconds < 10)

# Memory before allocating: a run the estimator says cannot fit in this machine's memory is
# refused at once (exit 2) with the estimate and the layouts that would fit, not OOM-killed
# (GPT-2 124M at micro-batch 48: 39 GiB without activation checkpointing, 16 GiB with it; since
# the CPU attention keeps no seq x seq probabilities, micro-batch 24 needs only 21 GiB).
for what, model, micro, says in [
        ("GPT-2 XL at micro-batch 8", {"preset": "gpt2-xl"}, 8,
         "No ZeRO stage or activation checkpointing makes it fit"),
        ("GPT-2 124M at micro-batch 48", {"preset": "gpt2"}, 48,
         "It would fit with zero_optimization.stage 0 with model.activation_checkpointing"),
]:
    cfg = os.path.join(tmp, "memory.json")
    ckpt = os.path.join(tmp, "memory_ckpt")
    with open(cfg, "w") as f:
        json.dump(dict(base, model=model, train_batch_size=micro,
                       train_micro_batch_size_per_gpu=micro, checkpoint={"dir": ckpt}), f)
    code, err, seconds = run("train", cfg)
    check(f"{what}: exit 2", code == 2, f"{code} {err[-800:]}")
    # On a machine with less than GPT-2 XL's 18 GiB of fp32 masters and moments, refused before
    # the replay by those alone (engine/preflight.cc).
    masters = "its fp32 masters and 2 optimizer moment(s) alone" in err and micro == 8
    check(f"{what}: says it does not fit, with the estimate",
          masters or ("this run does not fit in host memory" in err and "activations" in err and
                      says in err), err[-800:])
    check(f"{what}: refused within seconds", seconds < 10)
    check(f"{what}: nothing saved", not os.path.exists(os.path.join(ckpt, "latest")))

# A model of 16,384 blocks (26 billion parameters, 400 GB of model state) is refused at once by
# its fp32 masters and moments alone (314 GB), or, on a machine that has that much, after one
# replay of its step, not nine: no ZeRO stage can fit it, so the layouts that might are not each
# replayed (engine/preflight.cc). Its time against `zerort estimate` of the same config (one
# replay), in the same run: at most about 1x, and 9x when every layout was replayed.
cfg = os.path.join(tmp, "deep.json")
with open(cfg, "w") as f:
    json.dump(dict(base, model={"n_layer": 16384, "n_head": 4, "d_model": 256, "seq_len": 128,
                                "vocab_size": 256}, checkpoint={"dir": os.path.join(tmp, "deep")}),
              f)
code, _, one_replay = run("estimate", cfg)
check("a 16,384-block model: estimate runs", code == 0)
code, err, refused = run("train", cfg)
check("a 16,384-block model: exit 2", code == 2 and ("No ZeRO stage" in err or
      "its fp32 masters and 2 optimizer moment(s) alone" in err), f"{code} {err[-600:]}")
check("... refused within 3x one replay's time", refused < 3 * one_replay + 1,
      f"{refused:.2f} s against {one_replay:.2f} s")

# A metrics file for `zerort plot`: a line nested 100,000 deep or with a 2 MiB string is exit 2
# naming the file and the line (the last line, cut short by a killed run, alone is skipped).
good_line = json.dumps({"step": 1, "loss": 5.0})
for what, bad in [("nested 100,000 deep", '{"step": ' + "[" * 100000 + "]" * 100000 + "}"),
                  ("a 2 MiB string", json.dumps({"step": 2, "note": "x" * (2 << 20)}))]:
    metrics = os.path.join(tmp, "metrics.jsonl")
    with open(metrics, "w") as f:
        f.write(good_line + "\n" + bad + "\n" + good_line + "\n")
    out = os.path.join(tmp, "plot.png")
    code, err, seconds = run("plot", metrics, "-o", out)
    check(f"plot of a metrics line {what}: exit 2", code == 2, f"{code} {err[-600:]}")
    check(f"plot of a metrics line {what}: names the file and line",
          "metrics.jsonl: line 2" in err, err[-600:])
    check(f"plot of a metrics line {what}: draws nothing", not os.path.exists(out))
    check(f"plot of a metrics line {what}: within seconds", seconds < 10)

# The same tokens in every format train to the same losses, bit for bit ([Note: the token files
# zerort reads]); and a 20 GB token file (sparse: no disk is used) trains with the resident memory
# of the 1 MiB built-in corpus, since windows are read from a memory map, never the whole file.
def train_losses(data, steps=3):
    """(exit code, the metrics file's losses, stderr, peak resident KiB) of a short run."""
    run_dir = tempfile.mkdtemp(dir=tmp)
    cfg = os.path.join(run_dir, "run.json")
    with open(cfg, "w") as f:
        json.dump(dict(base, data=data, train=dict(base["train"], steps=steps),
                       checkpoint={"dir": os.path.join(run_dir, "ckpt"), "interval": 0},
                       logging={"metrics_file": os.path.join(run_dir, "m.jsonl")}), f)
    # Started by a small Python of its own: a child forked from this one (which holds the 50 MB
    # configs above) would count this process's pages in its peak before exec.
    r = subprocess.run([sys.executable, "-c", WAIT4, zerort, "train", cfg], capture_output=True,
                       env=env, timeout=120)
    err = r.stderr.decode("utf-8", "replace")
    status, peak_kib = (int(x) for x in r.stdout.split()) if r.returncode == 0 else (-1, 0)
    losses = []
    if os.path.exists(os.path.join(run_dir, "m.jsonl")):
        with open(os.path.join(run_dir, "m.jsonl")) as f:
            losses = [json.loads(line)["loss"] for line in f]
    return status, losses, err, peak_kib


# Runs argv[1:], prints its exit code and peak resident KiB (wait4's rusage of that child alone).
WAIT4 = """import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(p.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)"""


tokens = [(i * 7 + i // 5) % 256 for i in range(4000)]
u16 = struct.pack(f"<{len(tokens)}H", *tokens)
formats = {
    "zerort": {"path": token_file("same.zr", header(len(tokens), 2) + u16)},
    "llm.c": {"path": token_file("same.llmc", struct.pack("<3i", 20240520, 1, len(tokens)) +
                                 b"\0" * 1012 + u16)},
    "Megatron": {"path": megatron("same", b"")},
    "raw uint16": {"path": token_file("same.u16", u16), "format": "uint16"},
}
# Megatron: two sequences of 1000 and 3000 tokens, uint16, back to back.
token_file("same.idx", b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, 8, 2, 3) +
           struct.pack("<2i", 1000, 3000) + struct.pack("<2q", 0, 2000) + struct.pack("<3q", 0, 1, 2))
token_file("same.bin", u16)
results = {name: train_losses(data) for name, data in formats.items()}
for name, (code, losses, err, _) in results.items():
    check(f"{name} tokens: trains", code == 0 and len(losses) == 3, f"{code} {err[-600:]}")
    check(f"{name} tokens: the zerort file's losses, bitwise",
          losses == results["zerort"][1], f"{losses} vs {results['zerort'][1]}")

# data.blend ([Note: blending token files], data/blend_index.h): a blend of one file is that
# file, bit for bit; two files train; a malformed list or a missing file is exit 2 naming it.
one = train_losses({"blend": [1, formats["zerort"]["path"]]})
check("a blend of one file: its losses, bitwise", one[0] == 0 and one[1] == results["zerort"][1],
      f"{one[0]} {one[1]} vs {results['zerort'][1]} {one[2][-300:]}")
two = train_losses({"blend": ["0.3", formats["zerort"]["path"], 0.7, formats["llm.c"]["path"]]})
check("a blend of two files trains", two[0] == 0 and len(two[1]) == 3, f"{two[0]} {two[2][-400:]}")
for what, data, says in [
        ("an odd list", {"blend": [1, "a", 2]}, "data.blend = [1,\"a\",2]"),
        ("a zero weight", {"blend": [0, formats["zerort"]["path"]]}, "data.blend[0] = 0"),
        ("a path that is a number", {"blend": [1, 2]}, "data.blend[1] = 2"),
        ("a weight that is a word", {"blend": ["half", "a"]}, "data.blend[0] = \"half\""),
        ("path and blend", {"path": formats["zerort"]["path"], "blend": [1, "a"]},
         "data.path and data.blend both"),
        ("a missing file", {"blend": [1, formats["zerort"]["path"], 1, os.path.join(tmp, "nope")]},
         "data.blend[3]"),
        ("a tiny weight", {"blend": [1, formats["zerort"]["path"], 1e-9, formats["zerort"]["path"]]},
         "at least 2/65536")]:
    cfg = os.path.join(tmp, "blend.json")
    with open(cfg, "w") as f:
        json.dump(dict(base, data=data), f)
    code, err, seconds = run("train", cfg)
    check(f"blend, {what}: exit 2", code == 2, f"{code} {err[-300:]}")
    check(f"blend, {what}: names it", says in err, err[-400:])

big = os.path.join(tmp, "big.zr")
with open(big, "wb") as f:
    f.write(header(10**10, 2))
    f.truncate(32 + 2 * 10**10)  # 20 GB of token 0, a hole on disk
code, losses, err, big_kib = train_losses({"path": big})
_, _, _, corpus_kib = train_losses({})
check("a 20 GB token file: trains", code == 0 and len(losses) == 3, f"{code} {err[-600:]}")
check("a 20 GB token file: resident memory within 32 MiB of the built-in corpus's run",
      big_kib < corpus_kib + 32 * 1024, f"{big_kib} KiB vs {corpus_kib} KiB")
print(f"peak resident memory: 20 GB token file {big_kib} KiB, built-in corpus {corpus_kib} KiB")

sys.exit(checks.finish())
