#!/usr/bin/env python3
"""The LLaMA family through the CLI: the llama-tiny example trains; a Hugging Face model
directory (tests/layers/golden/llama_tiny_hf, written by the independent PyTorch implementation
tests/layers/llama_reference.py) is imported and exported back bitwise, initialises a run
(model.init_from) and is refused, naming the key and the file, when it is not the config's model
or is damaged; the estimator reads config.json and answers the 70B question quickly.

usage: llama_cli_test.py ZERORT CONFIGS_DIR GOLDEN_DIR"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

zerort, configs, golden = (os.path.abspath(a) for a in sys.argv[1:4])
hf_dir = os.path.join(golden, "llama_tiny_hf")
t = Checks("llama_cli")
work = tempfile.mkdtemp(prefix="zerort-llama-cli-")
env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def run(*args, timeout=300):
    return subprocess.run([zerort, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=work)


def tensors(directory):
    """name -> (dtype, shape, bytes) over every .safetensors file of a directory."""
    out = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + size])
        for key, e in header.items():
            if key == "__metadata__":
                continue
            b, end = e["data_offsets"]
            out[key] = (e["dtype"], e["shape"], data[8 + size + b:8 + size + end])
    return out


with open(os.path.join(hf_dir, "config.json")) as f:
    hf = json.load(f)
# The golden model as a run config, on a raw uint16 token file of its 23-token vocabulary.
model = {"arch": "llama", "n_layer": hf["num_hidden_layers"], "n_head": hf["num_attention_heads"],
         "n_kv_head": hf["num_key_value_heads"], "d_model": hf["hidden_size"],
         "intermediate_size": hf["intermediate_size"], "rope_theta": hf["rope_theta"],
         "rms_norm_eps": hf["rms_norm_eps"], "seq_len": hf["max_position_embeddings"],
         "vocab_size": hf["vocab_size"]}
tokens = os.path.join(work, "tokens.bin")
with open(tokens, "wb") as f:
    f.write(struct.pack("<4096H", *[(i * 7 + i // 5) % 23 for i in range(4096)]))


def config(path, **extra):
    c = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
         "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
         "steps_per_print": 1, "model": dict(model),
         "data": {"path": tokens, "format": "uint16"},
         "train": {"steps": 4, "eval_windows": 2, "sample_tokens": 0}}
    for k, v in extra.items():
        c[k] = dict(c.get(k, {}), **v) if isinstance(v, dict) else v
    with open(path, "w") as f:
        json.dump(c, f)
    return path


# 1. import, export: every tensor bitwise the PyTorch implementation's.
r = run("checkpoint", "import", hf_dir, "imported")
t.check("import exits 0", r.returncode == 0, r.stderr[-500:])
t.check("import names step_0", "step_0" in r.stdout, r.stdout)
r = run("checkpoint", "export", "imported", "exported")
t.check("export exits 0", r.returncode == 0, r.stderr[-500:])
want, got = tensors(hf_dir), tensors(os.path.join(work, "exported"))
t.check("export holds every tensor", sorted(got) == sorted(want),
        f"{sorted(set(want) ^ set(got))[:5]}")
same = [k for k in want if k in got and got[k] == want[k]]
t.check("round trip is bitwise", len(same) == len(want), f"{len(same)} of {len(want)} equal")
with open(os.path.join(work, "exported", "config.json")) as f:
    out = json.load(f)
t.check("export's config.json is LLaMA's",
        out["architectures"] == ["LlamaForCausalLM"] and out["num_key_value_heads"] == 2 and
        out["intermediate_size"] == 24 and out["tie_word_embeddings"] is False, json.dumps(out))
r = run("checkpoint", "import", hf_dir, "imported")
t.check("import over an existing checkpoint: exit 2", r.returncode == 2, r.stderr[-300:])
# Sharded above a size (Hugging Face's layout: shards and their index), read back by import.
r = run("checkpoint", "export", "imported", "sharded", "--max-shard-size", "8KiB")
files = sorted(os.listdir(os.path.join(work, "sharded"))) if r.returncode == 0 else []
t.check("export --max-shard-size 8KiB: shards and an index", r.returncode == 0 and
        "model.safetensors.index.json" in files and
        sum(f.endswith(".safetensors") for f in files) >= 3, f"{files} {r.stderr[-300:]}")
r1 = run("checkpoint", "import", "sharded", "reimported")
r2 = run("checkpoint", "export", "reimported", "reexported")
t.check("the shards import and export again, bitwise",
        (r1.returncode, r2.returncode) == (0, 0) and
        tensors(os.path.join(work, "reexported")) == want, (r1.stderr + r2.stderr)[-300:])
r = run("checkpoint", "export", "imported", "x", "--max-shard-size", "lots")
t.check("--max-shard-size lots: exit 2", r.returncode == 2, r.stderr[-200:])

# 1b. GPT-2 through the same way (its Conv1D weights transposed on export and back on import):
# a trained checkpoint exported, imported, exported again: bitwise.
gpt2 = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "model": {"n_layer": 2, "n_head": 2, "d_model": 16, "seq_len": 16, "vocab_size": 256},
        "train": {"steps": 2, "eval_windows": 1, "sample_tokens": 0},
        "checkpoint": {"dir": "gpt2_run", "interval": 2}}
with open(os.path.join(work, "gpt2.json"), "w") as f:
    json.dump(gpt2, f)
r = run("train", "gpt2.json")
t.check("gpt2 run", r.returncode == 0, r.stderr[-300:])
r1 = run("checkpoint", "export", "gpt2_run", "gpt2_hf")
r2 = run("checkpoint", "import", "gpt2_hf", "gpt2_imported")
r3 = run("checkpoint", "export", "gpt2_imported", "gpt2_hf2")
t.check("gpt2 export, import, export", (r1.returncode, r2.returncode, r3.returncode) == (0, 0, 0),
        (r1.stderr + r2.stderr + r3.stderr)[-500:])
a1, a2 = tensors(os.path.join(work, "gpt2_hf")), tensors(os.path.join(work, "gpt2_hf2"))
t.check("gpt2 round trip is bitwise", a1 and a1 == a2,
        f"{len(a1)} tensors, differing: {[k for k in a1 if a2.get(k) != a1[k]][:3]}")

# 2. model.init_from: the run starts from the weights (their values are checked bitwise against
# PyTorch's in hf_weights_test; here: the run takes them, not the default initialisation).
r = run("train", config(os.path.join(work, "init.json"), model={"init_from": hf_dir}))
t.check("init_from trains", r.returncode == 0, r.stderr[-800:])
losses = [float(line.split("loss ")[1].split()[0]) for line in r.stdout.splitlines()
          if line.startswith("step ")]
t.check("four finite steps", len(losses) == 4 and all(x == x and x < 10 for x in losses),
        str(losses))
r0 = run("train", config(os.path.join(work, "scratch.json")))
scratch = [float(line.split("loss ")[1].split()[0]) for line in r0.stdout.splitlines()
           if line.startswith("step ")]
t.check("init_from is not the default initialisation", scratch and losses and
        abs(scratch[0] - losses[0]) > 0.05, f"{scratch[:1]} vs {losses[:1]}")

# 3. Refused, exit 2, naming model.init_from and what differs.
cases = [
    ("missing directory", {"init_from": os.path.join(work, "nope")}, "model.init_from"),
    ("another model", {"init_from": hf_dir, "n_layer": 3}, "n_layer 3 vs 2"),
    ("a GPT-2 config", {"init_from": hf_dir, "arch": "gpt2", "n_kv_head": 0,
                        "intermediate_size": 0, "rope_theta": 10000.0, "rms_norm_eps": 1e-5},
     "model.arch gpt2 vs llama"),
]
for what, m, expect in cases:
    r = run("train", config(os.path.join(work, "bad.json"), model=m))
    t.check(f"{what}: exit 2", r.returncode == 2, f"{r.returncode} {r.stderr[-300:]}")
    t.check(f"{what}: names it", expect in r.stderr, r.stderr[-400:])
broken = os.path.join(work, "broken_hf")
shutil.copytree(hf_dir, broken)
shard = os.path.join(broken, "model-00002-of-00002.safetensors")
with open(shard, "r+b") as f:
    f.truncate(os.path.getsize(shard) - 8)
r = run("train", config(os.path.join(work, "broken.json"), model={"init_from": broken}))
t.check("a truncated shard: exit 2", r.returncode == 2, f"{r.returncode} {r.stderr[-300:]}")
t.check("a truncated shard: names file and offsets",
        "model-00002-of-00002.safetensors" in r.stderr and "data_offsets" in r.stderr,
        r.stderr[-400:])

# 3b. An imported model's config.json survives export: keys zerort does not use (bos and eos ids,
# a longer max_position_embeddings than the run's seq_len, anything else) are written back, by a
# run that started from it (model.init_from, through a resume) and by `checkpoint import`.
extra_dir = os.path.join(work, "hf_extra")
shutil.copytree(hf_dir, extra_dir)
extra = dict(hf, bos_token_id=1, eos_token_id=2, max_position_embeddings=131072,
             custom_key={"kept": True})
with open(os.path.join(extra_dir, "config.json"), "w") as f:
    json.dump(extra, f)


def exported_config(directory):
    with open(os.path.join(work, directory, "config.json")) as f:
        return json.load(f)


def kept(c, want):
    return all(c.get(k) == v for k, v in want.items())


def train_and_export(name, model_keys):
    """Trains `model_keys` with a checkpoint in NAME_run and exports it to NAME_hf: the two
    processes, and the export's config.json and tensors (empty where the export failed)."""
    r1 = run("train", config(os.path.join(work, name + ".json"), model=model_keys,
                             checkpoint={"dir": name + "_run", "interval": 4}))
    r2 = run("checkpoint", "export", name + "_run", name + "_hf")
    if r2.returncode != 0:
        return r1, r2, {}, {}
    return r1, r2, exported_config(name + "_hf"), tensors(os.path.join(work, name + "_hf"))


r1 = run("train", config(os.path.join(work, "extra.json"), model={"init_from": extra_dir},
                         checkpoint={"dir": "extra_run", "interval": 2}, train={"steps": 2}))
r2 = run("train", config(os.path.join(work, "extra.json"), model={"init_from": extra_dir},
                         checkpoint={"dir": "extra_run", "interval": 2}, train={"steps": 4}),
         "--resume")
r3 = run("checkpoint", "export", "extra_run", "extra_out")
want_keys = {"bos_token_id": 1, "eos_token_id": 2, "max_position_embeddings": 131072,
             "custom_key": {"kept": True}, "architectures": ["LlamaForCausalLM"]}
t.check("init_from, resume, export: the imported config.json's keys survive",
        (r1.returncode, r2.returncode, r3.returncode) == (0, 0, 0) and
        kept(exported_config("extra_out"), want_keys),
        (r1.stderr + r2.stderr + r3.stderr)[-500:] +
        (json.dumps(exported_config("extra_out")) if r3.returncode == 0 else ""))
r1 = run("checkpoint", "import", extra_dir, "extra_imported")
r2 = run("checkpoint", "export", "extra_imported", "extra_out2")
t.check("import, export: the config.json's keys survive",
        (r1.returncode, r2.returncode) == (0, 0) and kept(exported_config("extra_out2"), want_keys),
        (r1.stderr + r2.stderr)[-500:])

# 3c. Mistral 7B v0.1's sliding window ([Note: sliding windows]): within the window full causal
# attention is what Mistral computes, so a run of seq_len <= sliding_window starts from it,
# trains and exports as MistralForCausalLM with its window; a longer seq_len is refused.
mistral_dir = os.path.join(work, "hf_mistral")
shutil.copytree(hf_dir, mistral_dir)
with open(os.path.join(mistral_dir, "config.json"), "w") as f:
    json.dump(dict(hf, model_type="mistral", architectures=["MistralForCausalLM"],
                   sliding_window=8, max_position_embeddings=32768), f)
r1 = run("train", config(os.path.join(work, "mistral.json"),
                         model={"init_from": mistral_dir, "sliding_window": 8},
                         checkpoint={"dir": "mistral_run", "interval": 4}))
r2 = run("checkpoint", "export", "mistral_run", "mistral_out")
t.check("Mistral with a window >= seq_len: trains and exports as MistralForCausalLM",
        (r1.returncode, r2.returncode) == (0, 0) and
        kept(exported_config("mistral_out"), {"architectures": ["MistralForCausalLM"],
                                              "model_type": "mistral", "sliding_window": 8,
                                              "max_position_embeddings": 32768}),
        (r1.stderr + r2.stderr)[-500:])
r = run("train", config(os.path.join(work, "window.json"), model={"sliding_window": 4}))
t.check("seq_len 8 beyond a window of 4: exit 2 naming both", r.returncode == 2 and
        "model.seq_len = 8 is longer than model.sliding_window = 4" in r.stderr,
        f"{r.returncode} {r.stderr[-400:]}")

# 3d. eval reads a checkpoint under a run config: the checkpoint's architecture must be the
# config's (a wrong tie flag or rotary base would evaluate other weights), or exit 2 naming it.
for key, value in [("tie_word_embeddings", True), ("rope_theta", 500000.0),
                   ("rms_norm_eps", 1e-6)]:
    r = run("eval", config(os.path.join(work, "eval_bad.json"), model={key: value}),
            "--checkpoint", "extra_run", "--max-windows", "2")
    t.check(f"eval with another model.{key}: exit 2 naming it",
            r.returncode == 2 and f"model.{key} = " in r.stderr, f"{r.returncode} {r.stderr[-400:]}")
r = run("eval", config(os.path.join(work, "eval_ok.json")), "--checkpoint", "extra_run",
        "--max-windows", "2")
t.check("eval with the checkpoint's architecture: exit 0", r.returncode == 0, r.stderr[-400:])

# 3e. LLaMA 3.1's rotary scaling and LLaMA's attention_bias and mlp_bias (llama31_tiny_hf, the
# golden model decoder_golden_test checks to 1e-5): import and export bitwise with their config.json
# keys; a run config with the keys starts from it; one without a key is refused naming it, by
# init_from and by eval.
hf31 = os.path.join(golden, "llama31_tiny_hf")
with open(os.path.join(hf31, "config.json")) as f:
    hf31_config = json.load(f)
r1 = run("checkpoint", "import", hf31, "imported31")
r2 = run("checkpoint", "export", "imported31", "exported31")
t.check("llama3 scaling and biases: import, export",
        (r1.returncode, r2.returncode) == (0, 0), (r1.stderr + r2.stderr)[-500:])
t.check("llama3 scaling and biases: bitwise, o_proj and MLP biases among them",
        tensors(os.path.join(work, "exported31")) == tensors(hf31) and
        "model.layers.1.self_attn.o_proj.bias" in tensors(hf31) and
        "model.layers.0.mlp.down_proj.bias" in tensors(hf31), "tensors differ")
with open(os.path.join(work, "exported31", "config.json")) as f:
    out31 = json.load(f)
t.check("export's config.json keeps attention_bias, mlp_bias and rope_scaling",
        out31.get("attention_bias") is True and out31.get("mlp_bias") is True and
        out31.get("rope_scaling") == hf31_config["rope_scaling"], json.dumps(out31))
model31 = dict(model, n_head=4, n_kv_head=2, d_model=32, intermediate_size=20, qkv_bias=True,
               o_proj_bias=True, mlp_bias=True, rope_scaling=hf31_config["rope_scaling"])
r = run("train", config(os.path.join(work, "run31.json"), model=dict(model31, init_from=hf31)))
t.check("init_from a LLaMA 3.1-style model trains", r.returncode == 0, r.stderr[-500:])
no_mlp_bias = dict(model31, init_from=hf31, mlp_bias=False)
r = run("train", config(os.path.join(work, "run31_bad.json"), model=no_mlp_bias))
t.check("init_from without mlp_bias: exit 2 naming it",
        r.returncode == 2 and "mlp_bias false vs true" in r.stderr, r.stderr[-400:])
unscaled = dict(model31, rope_scaling={"rope_type": "default"})
r = run("eval", config(os.path.join(work, "eval31.json"), model=unscaled),
        "--checkpoint", "imported31", "--max-windows", "2")
t.check("eval without the checkpoint's rotary scaling: exit 2 naming model.rope_scaling",
        r.returncode == 2 and "model.rope_scaling = " in r.stderr, r.stderr[-400:])
r = run("eval", config(os.path.join(work, "eval31.json"), model=model31),
        "--checkpoint", "imported31", "--max-windows", "2")
t.check("eval with it: exit 0", r.returncode == 0, r.stderr[-400:])
# YaRN ([Note: rotary scaling]; the values are qwen2_yarn_tiny's golden model's) and a head_dim
# other than d_model / n_head (8 over d 16 and 4 heads: q 32 channels): a run config with the
# keys trains; export writes them back (rope_scaling's optional keys among them, q_proj and
# o_proj [32, 16] and [16, 32]); a run from the export reads them from its config.json.
yarn = {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 64,
        "beta_fast": 16, "attention_factor": 1.25}
wide = dict(model, rope_scaling=yarn, head_dim=8)
r1, r2, yarn_config, yarn_tensors = train_and_export("yarn", wide)
shapes = [yarn_tensors.get(f"model.layers.0.self_attn.{p}_proj.weight", (0, 0))[1] for p in "qo"]
t.check("yarn and head_dim: trains; export's config.json has rope_scaling and head_dim",
        (r1.returncode, r2.returncode) == (0, 0) and yarn_config.get("rope_scaling") == yarn and
        yarn_config.get("head_dim") == 8 and shapes == [[32, 16], [16, 32]],
        (r1.stderr + r2.stderr)[-500:] + json.dumps(yarn_config) + str(shapes))
r = run("train", config(os.path.join(work, "yarn_again.json"),
                        model=dict(wide, init_from=os.path.join(work, "yarn_hf"))))
t.check("yarn and head_dim: a run from the export trains", r.returncode == 0, r.stderr[-500:])
r = run("train", config(os.path.join(work, "yarn_narrow.json"),
                        model=dict(model, rope_scaling=yarn,
                                   init_from=os.path.join(work, "yarn_hf"))))
t.check("yarn and head_dim: a run config without head_dim is refused naming it",
        r.returncode == 2 and "head_dim 4 vs 8" in r.stderr, r.stderr[-500:])
# Dynamic NTK (the values are llama_dynamic_tiny's golden model's: seq_len 8, twice the original
# context): trains; export writes rope_scaling and the original context as max_position_embeddings
# (what transformers scales from), and eval runs the checkpoint at a longer seq_len.
dynamic = {"rope_type": "dynamic", "factor": 2, "original_max_position_embeddings": 4}
r1, r2, dynamic_config, _ = train_and_export("dynamic", dict(model, rope_scaling=dynamic))
t.check("dynamic NTK: trains; export's config.json has rope_scaling, max_position_embeddings 4",
        (r1.returncode, r2.returncode) == (0, 0) and
        dynamic_config.get("rope_scaling") == dynamic and
        dynamic_config.get("max_position_embeddings") == 4,
        (r1.stderr + r2.stderr)[-500:] + json.dumps(dynamic_config))
r = run("eval", config(os.path.join(work, "dynamic_eval.json"),
                       model=dict(model, rope_scaling=dynamic, seq_len=16)),
        "--checkpoint", "dynamic_run", "--max-windows", "2")
t.check("dynamic NTK: eval at seq_len 16 (four times the context) reads the checkpoint",
        r.returncode == 0, r.stderr[-400:])
# Qwen3 (qwen3_tiny's golden model's features): per-head q and k norms with a head_dim of 8 and
# attention_bias; trains, exports as Qwen3ForCausalLM with q_norm and k_norm tensors of [8] and
# its head_dim written out (Qwen3's absent head_dim is 128), and a run from the export trains.
# With an MLP bias (no Qwen3 has one) export is refused naming model.qk_norm.
qwen3 = dict(model, qk_norm=True, head_dim=8, qkv_bias=True, o_proj_bias=True)
r1, r2, qwen3_config, qwen3_tensors = train_and_export("qwen3", qwen3)
norms = [qwen3_tensors.get(f"model.layers.1.self_attn.{p}_norm.weight", (0, 0))[1] for p in "qk"]
t.check("qk_norm: trains; exports as Qwen3ForCausalLM with q_norm and k_norm of [8]",
        (r1.returncode, r2.returncode) == (0, 0) and
        qwen3_config.get("architectures") == ["Qwen3ForCausalLM"] and
        qwen3_config.get("model_type") == "qwen3" and qwen3_config.get("head_dim") == 8 and
        qwen3_config.get("attention_bias") is True and norms == [[8], [8]],
        (r1.stderr + r2.stderr)[-500:] + json.dumps(qwen3_config) + str(norms))
r = run("train", config(os.path.join(work, "qwen3_again.json"),
                        model=dict(qwen3, init_from=os.path.join(work, "qwen3_hf"))))
t.check("qk_norm: a run from the export trains", r.returncode == 0, r.stderr[-500:])
r1, r2, _, _ = train_and_export("qwen3_mlp", dict(qwen3, mlp_bias=True))
t.check("qk_norm with an MLP bias: trains, export exit 2 naming model.qk_norm",
        r1.returncode == 0 and r2.returncode == 2 and "model.qk_norm" in r2.stderr and
        not os.path.exists(os.path.join(work, "qwen3_mlp_hf")), (r1.stderr + r2.stderr)[-500:])
# Biases no Hugging Face architecture has (Q/K/V and MLP without O): zerort trains them; export
# refuses, naming the flags, and writes nothing.
r1, r2, _, _ = train_and_export("odd", dict(model, qkv_bias=True, mlp_bias=True))
t.check("Q/K/V and MLP biases without O's: trains, export exit 2 naming the flags",
        r1.returncode == 0 and r2.returncode == 2 and "model.o_proj_bias" in r2.stderr and
        not os.path.exists(os.path.join(work, "odd_hf")), (r1.stderr + r2.stderr)[-500:])

# 3f. A NaN in a file's weights ([Note: weights that are not numbers]): import and a run from it
# are exit 2 naming the file, the tensor and the element; nothing is written.
nan_dir = os.path.join(work, "hf_nan")
shutil.copytree(hf_dir, nan_dir)
with open(os.path.join(nan_dir, "model.safetensors.index.json")) as f:
    nan_file = os.path.join(
        nan_dir, json.load(f)["weight_map"]["model.layers.0.self_attn.k_proj.weight"])
with open(nan_file, "r+b") as f:
    (size,) = struct.unpack("<Q", f.read(8))
    begin = json.loads(f.read(size))["model.layers.0.self_attn.k_proj.weight"]["data_offsets"][0]
    f.seek(8 + size + begin + 4 * 3)
    f.write(struct.pack("<f", float("nan")))
says = f"{nan_file}: tensor 'model.layers.0.self_attn.k_proj.weight' holds nan at element 3"
r = run("checkpoint", "import", nan_dir, "nan_imported")
t.check("import of a NaN weight: exit 2 naming the file, tensor and element, nothing written",
        r.returncode == 2 and says in r.stderr and
        not any(n.startswith("nan_imported") for n in os.listdir(work)),
        f"{r.returncode} {r.stderr[-400:]}")
r = run("train", config(os.path.join(work, "nan.json"), model={"init_from": nan_dir},
                        checkpoint={"dir": "nan_run", "interval": 4}))
t.check("a run from a NaN weight: exit 2 naming model.init_from and the tensor, no checkpoint",
        r.returncode == 2 and f"model.init_from: {says}" in r.stderr and
        not os.path.exists(os.path.join(work, "nan_run", "step_4")),
        f"{r.returncode} {r.stderr[-400:]}")

# 4. The llama-tiny example (make run-llama), 40 steps of its 1500: a SentencePiece tokenizer
# trained on the built-in corpus, the corpus tokenized with it, the model trained and sampled.
r1 = run("data", "corpus", "corpus.txt")
r2 = run("data", "train-tokenizer", "tokenizer.model", "--vocab-size", "512", "--threads", "2")
r3 = run("data", "prepare", "corpus.txt", "corpus.bin", "--tokenizer", "tokenizer.model")
t.check("the example's data steps", (r1.returncode, r2.returncode, r3.returncode) == (0, 0, 0),
        (r1.stderr + r2.stderr + r3.stderr)[-500:])
r = run("train", os.path.join(configs, "llama-tiny-cpu.json"), "--set", "train.steps=40",
        "--set", "train.eval_interval=0", "--set", "checkpoint.dir=", "--set",
        "logging.metrics_file=", "--set", "train.sample_tokens=16", "--set", "steps_per_print=10",
        "--set", "data.path=corpus.bin", "--set", "data.tokenizer=tokenizer.model")
t.check("llama-tiny-cpu trains", r.returncode == 0, r.stderr[-800:])
ex = [float(line.split("loss ")[1].split()[0]) for line in r.stdout.splitlines()
      if line.startswith("step ")]
t.check("llama-tiny-cpu learns", len(ex) >= 2 and ex[-1] < ex[0] - 1.0, str(ex))
t.check("its sample is text", "sample (temperature" in r.stdout and
        "The shard manager" in r.stdout.split("sample (temperature")[-1], r.stdout[-300:])

# 4b. bf16 with the optimizer state and parameters offloaded to the host (ZeRO-3): it trains.
r = run("train", os.path.join(configs, "llama-tiny-cpu.json"), "--set", "train.steps=6",
        "--set", "train.eval_interval=0", "--set", "checkpoint.dir=", "--set",
        "logging.metrics_file=", "--set", "train.sample_tokens=0", "--set", "steps_per_print=1",
        "--set", "data.path=corpus.bin", "--set", "data.tokenizer=tokenizer.model",
        "--set", "bf16.enabled=true",
        "--set", "zero_optimization.offload_optimizer.device=cpu",
        "--set", "zero_optimization.offload_param.device=cpu")
off = [float(line.split("loss ")[1].split()[0]) for line in r.stdout.splitlines()
       if line.startswith("step ")]
t.check("llama bf16 with host offload trains", r.returncode == 0 and len(off) == 6 and
        off[-1] < off[0], f"{off} {r.stderr[-400:]}")

# 5. The estimator: config.json in, and the 70B question answered in under a second (its own
# timing of the replay; the process with its start-up is allowed more on a loaded machine).
r = run("estimate", "--hf-config", hf_dir, "--gpus", "2", "--tp", "2", "--json")
t.check("estimate --hf-config", r.returncode == 0, r.stderr[-300:])
if r.returncode == 0:
    with open(os.path.join(golden, "llama_tiny.json")) as f:
        count = sum(len(v) for v in json.load(f)["params"].values())  # PyTorch's tensors
    t.check("its parameters are the model's", json.loads(r.stdout)["model"] == count,
            f"{r.stdout[:200]} vs {count}")
start = time.monotonic()
r = run("estimate", "--model", "llama-3-70b", "--gpus", "8", "--nodes", "4", "--seq-len", "4096",
        "--fit", "80GiB")
wall = time.monotonic() - start
t.check("70B estimate exits 0", r.returncode == 0, r.stderr[-300:])
t.check("70B estimate names the model", "70553.7M parameters" in r.stdout, r.stdout[:300])
t.check("70B estimate under a second (replay)", "estimated in 0." in r.stdout, r.stdout[-300:])
t.check("70B estimate: the process under 5 s", wall < 5, f"{wall:.2f} s")
r = run("estimate", "--model", "llama-3-8b", "--gpus", "2", "--tp", "4")
t.check("--tp above the GPUs: exit 2", r.returncode == 2, r.stderr[-200:])
r = run("estimate", "--model", "llama-3-8b", "--gpus", "8", "--nodes", "2", "--tp", "16")
t.check("--tp 16 with 8 key/value heads: exit 2", r.returncode == 2 and "n_kv_head" in r.stderr,
        r.stderr[-200:])

# 6. A tokenizer (tests/data/golden/tokenizer_llama3.json, LLaMA-3's pre-tokenisation, checked
# against Hugging Face's JavaScript implementation in tokenizer_test): data prepare on 2 threads,
# a LLaMA model trained on the ids, its sample decoded to text.
tokenizer = os.path.join(os.path.dirname(golden), "..", "data", "golden", "tokenizer_llama3.json")
with open(tokenizer) as f:
    tok = json.load(f)
vocab = max(tok["model"]["vocab"].values()) + 1 + len(tok["added_tokens"])
corpus = os.path.join(work, "corpus.txt")
with open(os.path.join(os.path.dirname(configs), "README.md")) as f:
    readme = f.read()
with open(corpus, "w") as f:
    f.write(readme * 3)
r = run("data", "prepare", corpus, "bpe.bin", "--tokenizer", tokenizer, "--threads", "2")
t.check("data prepare --tokenizer", r.returncode == 0 and f"vocabulary {vocab}" in r.stdout,
        r.stdout + r.stderr[-300:])
cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
       "model": {"arch": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 64,
                 "intermediate_size": 176, "seq_len": 64, "vocab_size": vocab},
       "data": {"path": "bpe.bin", "tokenizer": tokenizer},
       "train": {"steps": 30, "eval_windows": 2, "sample_tokens": 24,
                 "sample_prompt": "The shard manager", "sample_temperature": 0},
       "steps_per_print": 10}
with open(os.path.join(work, "bpe.json"), "w") as f:
    json.dump(cfg, f)
cfg["checkpoint"] = {"dir": "bpe_ckpt", "interval": 30}
with open(os.path.join(work, "bpe.json"), "w") as f:
    json.dump(cfg, f)
r = run("train", "bpe.json")
t.check("a LLaMA model trains on BPE ids", r.returncode == 0, r.stderr[-500:])
sample = r.stdout.split("sample (temperature 0, top-k 40):\n")[-1] if r.returncode == 0 else ""
t.check("its sample is decoded text", sample.startswith("The shard manager") and
        "\\x" not in sample, sample[:200])
# data.eod_mask_loss in zerort eval too: documents (JSON lines) with the end-of-text token between
# them; masked, fewer targets count and the loss is another.
with open(os.path.join(work, "docs.jsonl"), "w") as f:
    for para in readme.split("\n\n")[:200]:
        if para.strip():
            f.write(json.dumps({"text": para}) + "\n")
r = run("data", "prepare", "docs.jsonl", "docs.bin", "--tokenizer", tokenizer)
masked_cfg = dict(cfg, data=dict(cfg["data"], eod_mask_loss=True))
with open(os.path.join(work, "bpe_masked.json"), "w") as f:
    json.dump(masked_cfg, f)
e1 = run("eval", "bpe.json", "--checkpoint", "bpe_ckpt", "--data", "docs.bin", "--max-windows",
         "200", "--json")
e2 = run("eval", "bpe_masked.json", "--checkpoint", "bpe_ckpt", "--data", "docs.bin",
         "--max-windows", "200", "--json")
if e1.returncode == 0 and e2.returncode == 0:
    plain, masked = json.loads(e1.stdout.splitlines()[-1]), json.loads(e2.stdout.splitlines()[-1])
    t.check("eval with eod_mask_loss counts fewer targets", masked["tokens"] < plain["tokens"] and
            masked["loss"] != plain["loss"], f"{plain} {masked}")
else:
    t.check("eval with and without eod_mask_loss", False, (e1.stderr + e2.stderr)[-400:])
small = dict(cfg, model=dict(cfg["model"], vocab_size=256))
with open(os.path.join(work, "small_vocab.json"), "w") as f:
    json.dump(small, f)
start = time.monotonic()
r = run("train", "small_vocab.json")
t.check("a tokenizer larger than model.vocab_size: exit 2 at once",
        r.returncode == 2 and "data.tokenizer" in r.stderr and "858 tokens" in r.stderr and
        time.monotonic() - start < 5, r.stderr[-300:])
r = run("data", "prepare", corpus, "x.bin", "--tokenizer", os.path.join(work, "nope.json"))
t.check("a missing tokenizer: exit 2", r.returncode == 2 and "nope.json" in r.stderr,
        r.stderr[-300:])
t.check("... and no output", not os.path.exists(os.path.join(work, "x.bin")))
with open(os.path.join(work, "bad_tok.json"), "w") as f:
    json.dump(dict(tok, model=dict(tok["model"], type="WordPiece")), f)
r = run("data", "prepare", corpus, "x.bin", "--tokenizer", "bad_tok.json")
t.check("a WordPiece tokenizer: exit 2 naming model.type",
        r.returncode == 2 and "model.type" in r.stderr, r.stderr[-300:])

shutil.rmtree(work, ignore_errors=True)
t.finish()
