#!/usr/bin/env python3
"""Independent PyTorch reference of zerort's LLaMA-family model, for the golden-value test.

Written from the LLaMA architecture as Hugging Face's modeling_llama describes it (not from
zerort's code): RMSNorm, rotary embeddings in the rotate-half convention with
inv_freq = theta^(-2i/hs), grouped-query attention (each key/value head repeated for its query
heads, repeat_kv), a SwiGLU MLP (down(silu(gate(x)) * up(x))), optional biases (Qwen2's on Q, K
and V; LLaMA's attention_bias on Q, K, V and O, its mlp_bias on gate, up and down), LLaMA 3.1's
rotary scaling (transformers' _compute_llama3_parameters: the frequencies remapped in three
bands), YaRN's (written from Peng et al. 2023 as transformers 5 parametrises it: a ramp over the
pairs between beta_fast and beta_slow turns of the original context, and the cosines and sines
scaled by the attention factor), dynamic NTK's (transformers' _compute_dynamic_ntk_parameters:
the base raised for a sequence longer than the original context), a head width other than
d_model / n_head (head_dim), Qwen3's q_norm and k_norm (each head's q and k RMSNorm-ed before
the rotation), and an output projection that is its own weight unless tie_word_embeddings. Fills
the model with random float32 weights, runs one batch in float64, and writes the weights, the
input, the loss, the logits at a few positions and every parameter's gradient to a JSON file that
tests/layers/decoder_golden_test.cc reads; zerort's fp32 run must agree to 1e-5 relative.

Regenerate (Debian: apt-get install python3-torch):
    /usr/bin/python3 tests/layers/llama_reference.py tests/layers/golden [VARIANT ...]
writes llama_tiny.json (GQA 4:2, untied), qwen2_tiny.json (Q/K/V biases, tied embeddings) and
llama31_tiny.json (every bias, llama3 rotary scaling, GQA 4:2), qwen2_yarn_tiny.json (Qwen2's
biases, YaRN scaling, GQA 4:2), llama_hd_tiny.json (a head_dim of 8 over d 16 and 4 heads, the
attention biases), llama_dynamic_tiny.json (dynamic NTK at twice the original context),
qwen3_tiny.json (Qwen3's per-head q and k norms, head_dim 8 over d 16, attention_bias), or only
the variants named, and
llama_tiny_hf/ and llama31_tiny_hf/: the same weights as Hugging Face model directories
(config.json, two safetensors shards and model.safetensors.index.json, Hugging Face's
LlamaForCausalLM names, float32), written here without the safetensors library, for
model.init_from's and the CLI's tests. CI does not run this script; it reads the committed files.
"""
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

VARIANTS = {
    "llama_tiny": dict(n_layer=2, n_head=4, n_kv_head=2, d_model=16, seq_len=8, vocab_size=23,
                       intermediate_size=24, rope_theta=1000.0, rms_norm_eps=1e-5,
                       tie_word_embeddings=False, qkv_bias=False),
    "qwen2_tiny": dict(n_layer=2, n_head=4, n_kv_head=2, d_model=16, seq_len=8, vocab_size=23,
                       intermediate_size=20, rope_theta=10000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, qkv_bias=True),
    # LLaMA 3.1's rotary bands all reached: head size 8, theta 1000 gives wavelengths 6.3 (kept:
    # below 64 / 4), 35 (blended) and 199, 1117 (divided by 8: above 64 / 1).
    "llama31_tiny": dict(n_layer=2, n_head=4, n_kv_head=2, d_model=32, seq_len=8, vocab_size=23,
                         intermediate_size=20, rope_theta=1000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, qkv_bias=True, o_proj_bias=True,
                         mlp_bias=True,
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0,
                                           original_max_position_embeddings=64)),
    # YaRN's three kinds of pair all reached: head size 8, theta 1000 and an original context of
    # 64 put the ramp's ends at pairs floor(-0.66) -> 0 and ceil(1.34) = 2: pair 0 kept, pair 1
    # half interpolated, pairs 2 and 3 divided by the factor; attention factor 0.1 ln 4 + 1.
    "qwen2_yarn_tiny": dict(n_layer=2, n_head=4, n_kv_head=2, d_model=32, seq_len=8,
                            vocab_size=23, intermediate_size=20, rope_theta=1000.0,
                            rms_norm_eps=1e-6, tie_word_embeddings=True, qkv_bias=True,
                            rope_scaling=dict(rope_type="yarn", factor=4.0,
                                              original_max_position_embeddings=64)),
    # A head width that is not d_model / n_head (Hugging Face's head_dim; Mistral-Nemo's, Qwen3's):
    # 4 heads of 8 over d 16, so q and the attention output have 32 channels; LLaMA's
    # attention_bias sizes q's and o's biases by them.
    "llama_hd_tiny": dict(n_layer=2, n_head=4, n_kv_head=2, head_dim=8, d_model=16, seq_len=8,
                          vocab_size=23, intermediate_size=24, rope_theta=1000.0,
                          rms_norm_eps=1e-5, tie_word_embeddings=False, qkv_bias=True,
                          o_proj_bias=True),
    # Dynamic NTK at a seq_len of twice the original context (transformers' max_position_embeddings,
    # zerort's original_max_position_embeddings): the base 1000 x (2 x 8 / 4 - 1)^(8 / 6), about
    # 4327, for every pair but the first (whose frequency is 1 at any base).
    # Qwen3 (Qwen3-0.6B's shape in small: head_dim 8 over d 16, so q is 32 wide; tied): q and k
    # RMSNorm-ed per head before the rotation (q_norm, k_norm), with attention_bias's four biases.
    "qwen3_tiny": dict(n_layer=2, n_head=4, n_kv_head=2, head_dim=8, d_model=16, seq_len=8,
                       vocab_size=23, intermediate_size=24, rope_theta=10000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, qkv_bias=True, o_proj_bias=True, qk_norm=True),
    "llama_dynamic_tiny": dict(n_layer=2, n_head=4, n_kv_head=2, d_model=32, seq_len=8,
                               vocab_size=23, intermediate_size=20, rope_theta=1000.0,
                               rms_norm_eps=1e-5, tie_word_embeddings=False, qkv_bias=False,
                               rope_scaling=dict(rope_type="dynamic", factor=2.0,
                                                 original_max_position_embeddings=4)),
}
BATCH = 2


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama3_inv_freq(inv_freq, s):
    """transformers' _compute_llama3_parameters, in float64."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_context = s["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, inv_freq_llama)


def yarn_inv_freq(inv_freq, theta, hs, s):
    """YaRN's frequencies and attention factor, in float64 (defaults: beta_fast 32, beta_slow 1,
    the attention factor 0.1 ln(factor) + 1; the ramp's ends rounded outwards to whole pairs)."""
    factor, context = s["factor"], s["original_max_position_embeddings"]
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def pair_turning(turns):  # the pair index that turns `turns` times over the context
        return hs * math.log(context / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(pair_turning(beta_fast)), 0)
    high = min(math.ceil(pair_turning(beta_slow)), hs - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(hs // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    scale = s.get("attention_factor") or (0.1 * math.log(factor) + 1 if factor > 1 else 1.0)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp), scale


def dynamic_theta(theta, hs, t, s):
    """transformers' dynamic NTK base for a sequence of t positions, in float64: raised only where
    t exceeds the original context (transformers' max_position_embeddings)."""
    factor, context = s["factor"], s["original_max_position_embeddings"]
    length = max(t, context)
    return theta * ((factor * length / context) - (factor - 1)) ** (hs / (hs - 2))


def rope(x, theta, scaling=None):
    # x: [b, heads, t, hs]
    t, hs = x.shape[2], x.shape[3]
    if scaling is not None and scaling["rope_type"] == "dynamic":
        theta = dynamic_theta(theta, hs, t, scaling)
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    scale = 1.0
    if scaling is not None and scaling["rope_type"] == "yarn":
        inv_freq, scale = yarn_inv_freq(inv_freq, theta, hs, scaling)
    elif scaling is not None and scaling["rope_type"] != "dynamic":
        assert scaling["rope_type"] == "llama3"
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * (emb.cos() * scale) + rotate_half(x) * (emb.sin() * scale)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, self.h, self.kv = c["d_model"], c["n_head"], c["n_kv_head"]
        self.hs = c.get("head_dim") or d // self.h
        self.theta = c["rope_theta"]
        self.scaling = c.get("rope_scaling")
        bias = c["qkv_bias"]
        self.attn_norm = RMSNorm(d, c["rms_norm_eps"])
        self.q = nn.Linear(d, self.h * self.hs, bias=bias)
        self.k = nn.Linear(d, self.kv * self.hs, bias=bias)
        self.v = nn.Linear(d, self.kv * self.hs, bias=bias)
        self.o = nn.Linear(self.h * self.hs, d, bias=c.get("o_proj_bias", False))
        self.mlp_norm = RMSNorm(d, c["rms_norm_eps"])
        f = c["intermediate_size"]
        mlp_bias = c.get("mlp_bias", False)
        self.gate = nn.Linear(d, f, bias=mlp_bias)
        self.up = nn.Linear(d, f, bias=mlp_bias)
        self.down = nn.Linear(f, d, bias=mlp_bias)
        # Qwen3's q_norm and k_norm: an RMSNorm over each head's channels, one gain for all.
        self.q_norm = self.k_norm = None
        if c.get("qk_norm"):
            self.q_norm = RMSNorm(self.hs, c["rms_norm_eps"])
            self.k_norm = RMSNorm(self.hs, c["rms_norm_eps"])

    def attention(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.h, self.hs)
        k = self.k(x).view(b, t, self.kv, self.hs)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v(x).view(b, t, self.kv, self.hs).transpose(1, 2)
        q, k = rope(q, self.theta, self.scaling), rope(k, self.theta, self.scaling)
        rep = self.h // self.kv
        k = k.repeat_interleave(rep, dim=1)  # repeat_kv: head j serves query heads j rep ..
        v = v.repeat_interleave(rep, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.hs)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        scores = scores.masked_fill(~mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.o(y.transpose(1, 2).reshape(b, t, self.h * self.hs))

    def forward(self, x):
        x = x + self.attention(self.attn_norm(x))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c["vocab_size"], c["d_model"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.norm = RMSNorm(c["d_model"], c["rms_norm_eps"])
        self.lm_head = None
        if not c["tie_word_embeddings"]:
            self.lm_head = nn.Linear(c["d_model"], c["vocab_size"], bias=False)

    def forward(self, idx):
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x)
        w = self.wte.weight if self.lm_head is None else self.lm_head.weight
        return self.norm(x) @ w.T

    def named_zerort(self):
        """(zerort's parameter name, tensor) pairs."""
        out = [("wte", self.wte.weight)]
        for i, b in enumerate(self.blocks):
            p = f"blocks.{i}."
            out += [(p + "attn_norm.weight", b.attn_norm.weight),
                    (p + "attn.q.weight", b.q.weight), (p + "attn.k.weight", b.k.weight),
                    (p + "attn.v.weight", b.v.weight), (p + "attn.o.weight", b.o.weight),
                    (p + "mlp_norm.weight", b.mlp_norm.weight),
                    (p + "mlp.gate.weight", b.gate.weight), (p + "mlp.up.weight", b.up.weight),
                    (p + "mlp.down.weight", b.down.weight)]
            # The biases last, in zerort's order (decoder::LlamaParam).
            if b.q.bias is not None:
                out += [(p + "attn.q.bias", b.q.bias), (p + "attn.k.bias", b.k.bias),
                        (p + "attn.v.bias", b.v.bias)]
            if b.o.bias is not None:
                out += [(p + "attn.o.bias", b.o.bias)]
            if b.gate.bias is not None:
                out += [(p + "mlp.gate.bias", b.gate.bias), (p + "mlp.up.bias", b.up.bias),
                        (p + "mlp.down.bias", b.down.bias)]
            if b.q_norm is not None:
                out += [(p + "attn.q_norm.weight", b.q_norm.weight),
                        (p + "attn.k_norm.weight", b.k_norm.weight)]
        out.append(("norm.weight", self.norm.weight))
        if self.lm_head is not None:
            out.append(("lm_head.weight", self.lm_head.weight))
        return out


HF_NAMES = {"wte": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
            "lm_head.weight": "lm_head.weight"}
HF_PARTS = [("attn_norm.", "input_layernorm."), ("attn.q_norm.", "self_attn.q_norm."),
            ("attn.k_norm.", "self_attn.k_norm."), ("attn.q.", "self_attn.q_proj."),
            ("attn.k.", "self_attn.k_proj."), ("attn.v.", "self_attn.v_proj."),
            ("attn.o.", "self_attn.o_proj."), ("mlp_norm.", "post_attention_layernorm."),
            ("mlp.gate.", "mlp.gate_proj."), ("mlp.up.", "mlp.up_proj."),
            ("mlp.down.", "mlp.down_proj.")]


def hf_name(ours):
    if ours in HF_NAMES:
        return HF_NAMES[ours]
    _, layer, rest = ours.split(".", 2)
    for a, b in HF_PARTS:
        if rest.startswith(a):
            return f"model.layers.{layer}.{b}{rest[len(a):]}"
    raise KeyError(ours)


def write_safetensors(path, tensors):
    import struct
    header, blobs, offset = {}, [], 0
    for name, t in tensors:
        data = t.detach().float().contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_hf(model, config, out):
    os.makedirs(out, exist_ok=True)
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
          "hidden_size": config["d_model"], "intermediate_size": config["intermediate_size"],
          "num_hidden_layers": config["n_layer"], "num_attention_heads": config["n_head"],
          "num_key_value_heads": config["n_kv_head"], "vocab_size": config["vocab_size"],
          "max_position_embeddings": config["seq_len"], "rope_theta": config["rope_theta"],
          "rms_norm_eps": config["rms_norm_eps"], "rope_scaling": config.get("rope_scaling"),
          "hidden_act": "silu", "tie_word_embeddings": config["tie_word_embeddings"],
          "attention_bias": config["qkv_bias"] and config.get("o_proj_bias", False),
          "torch_dtype": "float32"}
    if config.get("mlp_bias", False):
        hf["mlp_bias"] = True
    if config.get("head_dim"):
        hf["head_dim"] = config["head_dim"]
    assert config["qkv_bias"] == config.get("o_proj_bias", False)  # LLaMA's attention_bias
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    tensors = [(hf_name(n), p) for n, p in model.named_zerort()]
    half = len(tensors) // 2
    shards = {"model-00001-of-00002.safetensors": tensors[:half],
              "model-00002-of-00002.safetensors": tensors[half:]}
    weight_map = {}
    for file, part in shards.items():
        write_safetensors(os.path.join(out, file), part)
        weight_map.update({name: file for name, _ in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(4 * p.numel() for _, p in tensors)},
                   "weight_map": weight_map}, f, indent=2)


def golden(name, config, path):
    torch.manual_seed(20261127)
    model = Llama(config)
    with torch.no_grad():
        for n, p in model.named_zerort():
            # float32 values, larger than 0.02 so every path matters; gains near 1.
            p.copy_(torch.randn(p.shape) * 0.3 + (1.0 if n.endswith("norm.weight") else 0.0))
    model = model.double()
    seq, vocab = config["seq_len"], config["vocab_size"]
    data = torch.randint(0, vocab, (BATCH, seq + 1))
    tokens, targets = data[:, :-1], data[:, 1:]
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    positions = [[0, 0], [0, seq - 1], [1, 3], [1, seq - 1]]
    out = {
        "config": config,
        "batch": BATCH,
        "tokens": tokens.reshape(-1).tolist(),
        "targets": targets.reshape(-1).tolist(),
        "params": {n: p.detach().float().reshape(-1).tolist() for n, p in model.named_zerort()},
        "loss": loss.item(),
        "logit_positions": positions,
        "logits": [logits[b, t].tolist() for b, t in positions],
        "grads": {n: p.grad.reshape(-1).tolist() for n, p in model.named_zerort()},
        "generator": "tests/layers/llama_reference.py, torch " + torch.__version__,
    }
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"wrote {path}: {name} loss {loss.item():.10f}")
    if name in ("llama_tiny", "llama31_tiny"):
        write_hf(model, config, os.path.join(os.path.dirname(path), name + "_hf"))


if __name__ == "__main__":
    if len(sys.argv) < 2 or any(v not in VARIANTS for v in sys.argv[2:]):
        sys.exit(__doc__)
    for name in sys.argv[2:] or VARIANTS:
        golden(name, VARIANTS[name], os.path.join(sys.argv[1], name + ".json"))
