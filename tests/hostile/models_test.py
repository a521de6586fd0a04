#!/usr/bin/env python3
"""The inputs issue 30 added, as untrusted input: the LLaMA model keys, model.init_from, data.blend's
files, data.tokenizer, data.eod_mask_loss, and the flags of `estimate --hf-config/--tp/--pp`,
`checkpoint import`, `checkpoint export --max-shard-size`, `data prepare --tokenizer/--threads`,
`data train-tokenizer` and `data corpus`, each given a wrong type, a value out of range, an
empty or huge value, a FIFO, /dev/zero or a directory where a file is expected. Each is exit 2
within seconds naming the key, flag or file, writes nothing, and never hangs or crashes.
Usage: models_test.py PATH_TO_ZERORT"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from harness import Checks  # noqa: E402

zerort = os.path.abspath(sys.argv[1])
checks = Checks("hostile_models_test")
check = checks.check
tmp = tempfile.mkdtemp()
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
fifo = os.path.join(tmp, "a.fifo")
os.mkfifo(fifo)
empty_dir = os.path.join(tmp, "empty_dir")
os.mkdir(empty_dir)
os.mkdir(os.path.join(tmp, "d.model"))
big_json = os.path.join(tmp, "big.json")
with open(big_json, "w") as f:
    f.write('{"model_type": "llama", "x": "' + "a" * (3 << 20) + '"}')
not_json = os.path.join(tmp, "not.json")
with open(not_json, "w") as f:
    f.write("{this is not json")
text = os.path.join(tmp, "text.txt")
with open(text, "w") as f:
    f.write("some text\n" * 100)
junk_model = os.path.join(tmp, "junk.model")  # not a SentencePiece ModelProto
with open(junk_model, "wb") as f:
    f.write(b"\xff" * 64)


def run(*args):
    start = time.time()
    try:
        r = subprocess.run([zerort, *args], capture_output=True, env=env, timeout=60, cwd=tmp)
        return r.returncode, r.stderr.decode("utf-8", "replace"), time.time() - start
    except subprocess.TimeoutExpired:
        return "timeout", "", time.time() - start


def expect(what, args, says, outputs=()):
    code, err, seconds = run(*args)
    check(f"{what}: exit 2", code == 2, f"{code} {err[-400:]}")
    check(f"{what}: names it", says in err, f"wanted '{says}' in: {err[-400:]}")
    check(f"{what}: within seconds", seconds < 10, f"{seconds:.1f} s")
    for out in outputs:  # nor the file it would have been written through (OUT.zerort-*.tmp)
        left = glob.glob(glob.escape(os.path.join(tmp, out)) + "*")
        check(f"{what}: writes no {out}", not left, str(left))


llama = {"arch": "llama", "n_layer": 1, "n_head": 4, "n_kv_head": 2, "d_model": 32,
         "intermediate_size": 64, "seq_len": 16, "vocab_size": 256}
base = {"train_micro_batch_size_per_gpu": 2, "model": llama,
        "train": {"steps": 1, "eval_windows": 1, "sample_tokens": 0, "device": "cpu"}}


def config(name, model=None, data=None):
    c = dict(base, model=dict(llama, **(model or {})))
    if data is not None:
        c["data"] = data
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(c, f)
    return path


# The model keys: type, range, meaning.
for what, model, says in [
        ("an unknown arch", {"arch": "bert"}, "model.arch"),
        ("arch as a number", {"arch": 7}, "model.arch"),
        ("arch empty", {"arch": ""}, "model.arch"),
        ("arch as a list", {"arch": ["llama"]}, "model.arch"),
        ("rope_type empty", {"rope_scaling": {"rope_type": ""}}, "model.rope_scaling.rope_type"),
        ("rope_type huge", {"rope_scaling": {"rope_type": "x" * 100000}},
         "model.rope_scaling.rope_type"),
        ("n_kv_head not dividing n_head", {"n_kv_head": 3}, "model.n_kv_head = 3"),
        ("head_dim negative", {"head_dim": -2}, "model.head_dim"),
        ("head_dim odd", {"head_dim": 7}, "model.head_dim = 7: rotary embeddings rotate pairs"),
        ("head_dim x n_head past 2^20", {"n_head": 65536, "n_kv_head": 1, "head_dim": 65536},
         "model.n_head x model.head_dim = 65536 x 65536: at most 1048576"),
        ("head_dim on GPT-2", {"arch": "gpt2", "n_kv_head": 0, "intermediate_size": 0,
                               "head_dim": 8}, "model.head_dim is a LLaMA key"),
        ("n_kv_head negative", {"n_kv_head": -1}, "model.n_kv_head"),
        ("n_kv_head huge", {"n_kv_head": 2**40}, "model.n_kv_head"),
        ("no intermediate_size", {"intermediate_size": 0}, "model.intermediate_size = 0"),
        ("intermediate_size a string", {"intermediate_size": "64"}, "model.intermediate_size"),
        ("rope_theta below 1", {"rope_theta": 0.5}, "model.rope_theta"),
        ("rope_theta huge", {"rope_theta": 1e13}, "model.rope_theta"),
        ("rms_norm_eps 0", {"rms_norm_eps": 0}, "model.rms_norm_eps"),
        ("an odd head size", {"n_head": 32, "n_kv_head": 32}, "head size must be even"),
        ("qkv_bias a string", {"qkv_bias": "yes"}, "model.qkv_bias"),
        ("o_proj_bias a number", {"o_proj_bias": 1}, "model.o_proj_bias"),
        ("mlp_bias a string", {"mlp_bias": "true"}, "model.mlp_bias"),
        ("o_proj_bias on GPT-2", {"arch": "gpt2", "n_kv_head": 0, "intermediate_size": 0,
                                  "o_proj_bias": True}, "model.o_proj_bias is a LLaMA key"),
        ("qk_norm a string", {"qk_norm": "yes"}, "model.qk_norm"),
        ("qk_norm on GPT-2", {"arch": "gpt2", "n_kv_head": 0, "intermediate_size": 0,
                              "qk_norm": True}, "model.qk_norm is a LLaMA key"),
        ("rope_scaling a string", {"rope_scaling": "llama3"}, "model.rope_scaling"),
        ("rope_scaling longrope", {"rope_scaling": {"rope_type": "longrope", "factor": 2}},
         "model.rope_scaling.rope_type = \"longrope\""),
        ("rope_scaling dynamic without its context",
         {"rope_scaling": {"rope_type": "dynamic", "factor": 2}},
         "model.rope_scaling.original_max_position_embeddings = 0"),
        ("rope_scaling dynamic below 1",
         {"rope_scaling": {"rope_type": "dynamic", "factor": 0.5,
                           "original_max_position_embeddings": 64}},
         "model.rope_scaling.factor = 0.5"),
        ("rope_scaling's yarn key on dynamic",
         {"rope_scaling": {"rope_type": "dynamic", "factor": 2,
                           "original_max_position_embeddings": 64, "beta_fast": 16}},
         "model.rope_scaling.beta_fast is set"),
        ("rope_scaling yarn without its factor", {"rope_scaling": {"rope_type": "yarn"}},
         "model.rope_scaling.factor = 0"),
        ("rope_scaling yarn without its context", {"rope_scaling": {"rope_type": "yarn",
                                                                    "factor": 4}},
         "model.rope_scaling.original_max_position_embeddings = 0"),
        ("rope_scaling yarn's betas crossed",
         {"rope_scaling": {"rope_type": "yarn", "factor": 4,
                           "original_max_position_embeddings": 64, "beta_fast": 0.5}},
         "model.rope_scaling.beta_fast = 0.5 must be above model.rope_scaling.beta_slow = 1"),
        ("rope_scaling yarn's attention factor negative",
         {"rope_scaling": {"rope_type": "yarn", "factor": 4,
                           "original_max_position_embeddings": 64, "attention_factor": -1}},
         "model.rope_scaling.attention_factor"),
        ("rope_scaling's yarn key on llama3",
         {"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
                           "high_freq_factor": 4, "original_max_position_embeddings": 64,
                           "mscale": 1}},
         "model.rope_scaling.mscale is set, and model.rope_scaling.rope_type is \"llama3\""),
        ("rope_scaling llama3 without its bands", {"rope_scaling": {"rope_type": "llama3",
                                                                    "factor": 8}},
         "model.rope_scaling.low_freq_factor = 0"),
        ("rope_scaling's factor huge", {"rope_scaling": {"rope_type": "linear", "factor": 1e300}},
         "model.rope_scaling.factor"),
        ("rope_scaling's factor negative", {"rope_scaling": {"rope_type": "linear",
                                                             "factor": -2}},
         "model.rope_scaling.factor"),
        ("rope_scaling's factor without a type", {"rope_scaling": {"factor": 4}},
         "model.rope_scaling.factor is set, and model.rope_scaling.rope_type is \"default\""),
        ("rope_scaling's unknown key", {"rope_scaling": {"rope_type": "linear", "factor": 2,
                                                         "beta_fast": 32}},
         "model.rope_scaling.beta_fast"),
        ("rope_scaling on GPT-2", {"arch": "gpt2", "n_kv_head": 0, "intermediate_size": 0,
                                   "rope_scaling": {"rope_type": "linear", "factor": 2}},
         "model.rope_scaling is a LLaMA key"),
        ("a LLaMA key on GPT-2", {"arch": "gpt2", "n_kv_head": 2, "intermediate_size": 0},
         "model.n_kv_head is a LLaMA key"),
        ("init_from a FIFO", {"init_from": fifo}, "model.init_from"),
        ("init_from an empty directory", {"init_from": empty_dir}, "model.init_from"),
        ("init_from a file", {"init_from": text}, "model.init_from"),
        ("init_from a number", {"init_from": 3}, "model.init_from"),
        ("init_from empty of meaning (a 3 MiB config.json)", {"init_from": big_json},
         "model.init_from")]:
    expect(f"model: {what}", ["train", config("m", model)], says)

# Models too large to exist: refused before any replay of the step (the preflight once walked
# every unit at every use, and a 65,536-block config hung there with no output), at once.
huge = {"arch": "gpt2", "n_layer": 65536, "n_head": 8, "d_model": 65536, "seq_len": 64,
        "vocab_size": 256, "n_kv_head": 0, "intermediate_size": 0}
code, err, seconds = run("train", config("huge", huge))
check("65,536 blocks of d 65,536: exit 2", code == 2, f"{code} {err[-400:]}")
check("65,536 blocks of d 65,536: names its largest unit", "its largest unit" in err, err[-400:])
check("65,536 blocks of d 65,536: within 2 s", seconds < 2, f"{seconds:.1f} s")
# 65,536 blocks of d 1,024 (825 billion parameters): every block fits, the model's fp32 masters
# and Adam's moments (9.9 TB) fit no machine. Refused before any replay of the step (which takes
# seconds at this many blocks), naming them.
deep = {"arch": "gpt2", "n_layer": 65536, "n_head": 8, "d_model": 1024, "seq_len": 64,
        "vocab_size": 256, "n_kv_head": 0, "intermediate_size": 0}
code, err, seconds = run("train", config("deep", deep))
check("65,536 blocks of d 1,024: exit 2", code == 2, f"{code} {err[-400:]}")
check("65,536 blocks of d 1,024: names the masters and moments",
      "its fp32 masters and 2 optimizer moment(s) alone, 825" in err, err[-400:])
check("65,536 blocks of d 1,024: within 2 s", seconds < 2, f"{seconds:.1f} s")
# The estimator on a 1,000-block model answers at once (0.07 s measured; its replay is linear in
# the units).
many = {"arch": "gpt2", "n_layer": 1000, "n_head": 4, "d_model": 64, "seq_len": 64,
        "vocab_size": 256, "n_kv_head": 0, "intermediate_size": 0}
start = time.time()
r = subprocess.run([zerort, "estimate", config("many", many)], capture_output=True, env=env,
                   timeout=60, cwd=tmp)
seconds = time.time() - start
check("estimate of 1,000 blocks: exit 0", r.returncode == 0, r.stderr.decode()[-400:])
check("estimate of 1,000 blocks: within 3 s", seconds < 3, f"{seconds:.1f} s")

# model.sliding_window ([Note: sliding windows]): wrong type, out of range, huge, and longer than
# the window.
for what, model, says in [
        ("sliding_window a string", {"sliding_window": "4096"}, "model.sliding_window"),
        ("sliding_window negative", {"sliding_window": -1}, "model.sliding_window"),
        ("sliding_window huge", {"sliding_window": 2**40}, "model.sliding_window"),
        ("seq_len beyond the window", {"sliding_window": 8},
         "model.seq_len = 16 is longer than model.sliding_window = 8"),
        ("sliding_window on GPT-2", {"arch": "gpt2", "n_kv_head": 0, "intermediate_size": 0,
                                     "sliding_window": 64}, "model.sliding_window is a LLaMA key")]:
    expect(f"model: {what}", ["train", config("w", model)], says)

# A Hugging Face config.json's keys (estimate --hf-config reads it as init_from and import do):
# hidden_act, rope_parameters, the bias flags and sliding_window given a wrong type, a value out
# of range or that zerort does not compute, huge or empty: exit 2 naming the key and the file.
hf_base = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 256, "max_position_embeddings": 64}
for what, extra, says in [
        ("hidden_act unknown", {"hidden_act": "gelu"}, "hidden_act = \"gelu\""),
        ("hidden_act a number", {"hidden_act": 3}, "hidden_act = 3: not a string"),
        ("hidden_act empty", {"hidden_act": ""}, "hidden_act = \"\""),
        ("hidden_act 2 MiB", {"hidden_act": "s" * (2 << 20)}, "config.json"),
        ("rope_parameters a list", {"rope_parameters": [1, 2]}, "rope_parameters = [1,2]"),
        ("rope_parameters longrope", {"rope_parameters": {"rope_type": "longrope", "factor": 8}},
         "rope_parameters.rope_type = \"longrope\""),
        ("rope_parameters yarn's truncate off",
         {"rope_parameters": {"rope_type": "yarn", "factor": 8, "truncate": False}},
         "rope_parameters.truncate = false"),
        ("rope_parameters llama3 without its bands",
         {"rope_parameters": {"rope_type": "llama3", "factor": 8}},
         "rope_parameters.low_freq_factor is missing"),
        ("rope_scaling dynamic without its factor", {"rope_scaling": {"type": "dynamic"}},
         "rope_scaling.factor is missing"),
        ("rope_scaling a string", {"rope_scaling": "llama3"}, "rope_scaling = \"llama3\": not an"),
        ("rope_scaling's type a number", {"rope_scaling": {"rope_type": 3}},
         "rope_scaling.rope_type = 3: not a string"),
        ("rope_scaling's factor a string", {"rope_scaling": {"rope_type": "linear", "factor": "8"}},
         "rope_scaling.factor = \"8\": not a number"),
        ("rope_scaling's factor below 1", {"rope_scaling": {"rope_type": "linear", "factor": 0.5}},
         "rope_scaling.factor = 0.5: must be in"),
        ("rope_scaling's factor huge", {"rope_scaling": {"rope_type": "linear", "factor": 1e300}},
         "rope_scaling.factor"),
        ("rope_scaling's bands inverted",
         {"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4,
                           "high_freq_factor": 1, "original_max_position_embeddings": 8192}},
         "rope_scaling.high_freq_factor = 1: must be above low_freq_factor = 4"),
        ("rope_scaling's original context huge",
         {"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
                           "high_freq_factor": 4, "original_max_position_embeddings": 2**40}},
         "rope_scaling.original_max_position_embeddings = 1099511627776"),
        ("rope_scaling and rope_parameters disagreeing",
         {"rope_scaling": {"rope_type": "linear", "factor": 2},
          "rope_parameters": {"rope_type": "linear", "factor": 4}},
         "rope_parameters (linear x4) disagrees with rope_scaling (linear x2)"),
        ("rope_scaling llama3", {"rope_scaling": {"rope_type": "llama3", "factor": 32,
                                                  "low_freq_factor": 1, "high_freq_factor": 4,
                                                  "original_max_position_embeddings": 8192}},
         None),
        ("rope_parameters' theta a string", {"rope_parameters": {"rope_theta": "big"}},
         "rope_parameters.rope_theta = \"big\": not a number"),
        ("rope_parameters' theta 0", {"rope_parameters": {"rope_theta": 0}},
         "rope_parameters.rope_theta = 0: must be in"),
        ("rope_parameters empty", {"rope_parameters": {}}, None),
        ("attention_bias a string", {"attention_bias": "yes"}, "attention_bias = \"yes\""),
        ("attention_bias true", {"attention_bias": True}, None),
        ("mlp_bias a number", {"mlp_bias": 1}, "mlp_bias = 1: not a boolean"),
        ("mlp_bias true", {"mlp_bias": True}, None),
        ("sliding_window a string (Mistral)", {"model_type": "mistral", "sliding_window": "8"},
         "sliding_window = \"8\": not an integer"),
        ("sliding_window 0 (Mistral)", {"model_type": "mistral", "sliding_window": 0},
         "sliding_window = 0: must be in"),
        ("sliding_window huge (Mistral)", {"model_type": "mistral", "sliding_window": 2**40},
         "sliding_window = 1099511627776"),
        ("use_sliding_window a string (Qwen2)", {"model_type": "qwen2",
                                                 "use_sliding_window": "true"},
         "use_sliding_window = \"true\": not a boolean"),
        ("attention_bias a string (Qwen3)", {"model_type": "qwen3", "attention_bias": "no"},
         "attention_bias = \"no\": not a boolean"),
        ("head_dim odd (Qwen3)", {"model_type": "qwen3", "head_dim": 7}, "head_dim = 7"),
        ("Qwen3 with its head_dim left out", {"model_type": "qwen3"}, None)]:
    d = os.path.join(tmp, "hf_" + str(abs(hash(what))))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(hf_base, **extra), f)
    if says is None:  # accepted (an empty rope_parameters: no scaling and the default theta;
        # Qwen3's default head_dim of 128 over 4 heads of d 32)
        code, err, seconds = run("estimate", "--hf-config", d)
        check(f"config.json: {what}: exit 0", code == 0, f"{code} {err[-300:]}")
        continue
    expect(f"config.json: {what}", ["estimate", "--hf-config", d], says)

# data.tokenizer, data.blend's files, data.eod_mask_loss.
for what, data, says in [
        ("tokenizer a FIFO", {"tokenizer": fifo}, "data.tokenizer"),
        ("tokenizer a directory", {"tokenizer": empty_dir}, "data.tokenizer"),
        ("tokenizer not JSON", {"tokenizer": not_json}, "data.tokenizer"),
        ("tokenizer /dev/zero", {"tokenizer": "/dev/zero"}, "data.tokenizer"),
        ("a blend file that is a FIFO", {"blend": [1, fifo]}, "data.blend[1]"),
        ("a blend file that is a directory", {"blend": [1, empty_dir]}, "data.blend[1]"),
        ("a blend of 1025 files", {"blend": [1, text] * 1025}, "data.blend"),
        ("eod_mask_loss without an end-of-text token", {"eod_mask_loss": True},
         "data.eod_mask_loss needs the end-of-text token"),
        ("eos_token_id beyond the vocabulary", {"eod_mask_loss": True, "eos_token_id": 300},
         "outside model.vocab_size"),
        ("eos_token_id huge", {"eos_token_id": 2**40}, "data.eos_token_id"),
        ("eod_mask_loss a string", {"eod_mask_loss": "true"}, "data.eod_mask_loss")]:
    expect(f"data: {what}", ["train", config("d", data=data)], says)

# The new flags.
for what, args, says, outputs in [
        ("estimate --hf-config a FIFO", ["estimate", "--hf-config", fifo], "--hf-config", ()),
        ("estimate --hf-config an empty directory", ["estimate", "--hf-config", empty_dir],
         "config.json", ()),
        ("estimate --hf-config not JSON", ["estimate", "--hf-config", not_json], "not.json", ()),
        ("estimate --hf-config 3 MiB", ["estimate", "--hf-config", big_json], "big.json", ()),
        ("estimate --hf-config and --model", ["estimate", "--hf-config", not_json, "--model",
                                              "gpt2"], "give one", ()),
        ("estimate --tp 0", ["estimate", "--model", "llama-3-8b", "--tp", "0"], "--tp 0", ()),
        ("estimate --pp huge", ["estimate", "--model", "llama-3-8b", "--gpus", "8", "--pp",
                                "2147483647"], "--pp", ()),
        ("estimate --tp not dividing", ["estimate", "--model", "llama-3-8b", "--gpus", "6",
                                        "--tp", "4"], "does not divide", ()),
        ("checkpoint import of a FIFO", ["checkpoint", "import", fifo, "out_a"], "a.fifo",
         ("out_a",)),
        ("checkpoint import of an empty directory", ["checkpoint", "import", empty_dir, "out_b"],
         "config.json", ("out_b",)),
        ("checkpoint export --max-shard-size 0", ["checkpoint", "export", empty_dir, "out_c",
                                                  "--max-shard-size", "0"],
         "--max-shard-size", ("out_c",)),
        ("data prepare --tokenizer a FIFO", ["data", "prepare", text, "p1.bin", "--tokenizer",
                                             fifo], "a.fifo", ("p1.bin",)),
        ("data prepare --tokenizer a directory", ["data", "prepare", text, "p2.bin",
                                                  "--tokenizer", empty_dir], "empty_dir",
         ("p2.bin",)),
        ("data prepare --tokenizer a junk .model", ["data", "prepare", text, "p3.bin",
                                                    "--tokenizer", junk_model],
         "junk.model: not a SentencePiece model", ("p3.bin",)),
        ("data prepare of a FIFO with a tokenizer", ["data", "prepare", fifo, "p4.bin",
                                                     "--tokenizer", not_json], "not.json",
         ("p4.bin",)),
        ("data prepare --threads -1", ["data", "prepare", text, "p5.bin", "--threads", "-1"],
         "--threads", ("p5.bin",)),
        ("train-tokenizer --type word", ["data", "train-tokenizer", "t1.model", "--type", "word"],
         "--type word", ("t1.model",)),
        ("train-tokenizer --vocab-size 0", ["data", "train-tokenizer", "t2.model",
                                            "--vocab-size", "0"], "--vocab-size 0",
         ("t2.model",)),
        ("train-tokenizer --vocab-size huge", ["data", "train-tokenizer", "t3.model",
                                               "--vocab-size", "99999999"], "--vocab-size",
         ("t3.model",)),
        ("train-tokenizer --input a FIFO", ["data", "train-tokenizer", "t4.model", "--input",
                                            fifo], "a.fifo", ("t4.model",)),
        ("train-tokenizer --input /dev/zero", ["data", "train-tokenizer", "t5.model", "--input",
                                               "/dev/zero"], "/dev/zero", ("t5.model",)),
        ("train-tokenizer --input a directory", ["data", "train-tokenizer", "t6.model", "--input",
                                                 empty_dir], "empty_dir", ("t6.model",)),
        ("train-tokenizer to a name without .model", ["data", "train-tokenizer", "t7.bin"],
         "t7.bin", ("t7.bin",)),
        ("data corpus into a directory", ["data", "corpus", empty_dir], "empty_dir", ()),
        ("data prepare into a directory", ["data", "prepare", text, empty_dir], "empty_dir", ()),
        ("train-tokenizer into a directory", ["data", "train-tokenizer", "d.model"], "d.model",
         ())]:
    expect(what, args, says, outputs)

sys.exit(checks.finish())
