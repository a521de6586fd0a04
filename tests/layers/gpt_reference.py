#!/usr/bin/env python3
"""Independent PyTorch reference of zerort's GPT model, for the golden-value test.

Builds a GPT-2-style model from torch.nn modules (written from the GPT-2 architecture, not from
zerort's code), fills it with random weights, runs one batch, and writes the weights, the input,
the loss, the logits at a few positions and every parameter's gradient to a JSON file that
tests/layers/decoder_golden_test.cc reads. The values are computed in float64 from float32 weights;
zerort's fp32 run must agree to 1e-5 relative.

Regenerate (Debian: apt-get install python3-torch):
    /usr/bin/python3 tests/layers/gpt_reference.py tests/layers/golden/gpt_tiny.json
CI does not run this script; it reads the committed JSON.

Second use, checking `zerort checkpoint export` and `zerort eval` (tests/cli/export_eval_test.py):
    gpt_reference.py --eval EXPORT_DIR TOKEN_FILE MAX_WINDOWS
loads EXPORT_DIR/model.safetensors (Hugging Face GPT-2 names, read without the safetensors
library) into this model and prints {"loss": ..., "tokens": ...}: the mean next-token loss over the
first MAX_WINDOWS non-overlapping windows of seq_len + 1 tokens of a zerort token file.
"""
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = dict(n_layer=2, n_head=2, d_model=16, seq_len=8, vocab_size=23)
BATCH = 2


class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        hs = d // self.n_head
        q, k, v = (z.view(b, t, self.n_head, hs).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        scores = scores.masked_fill(~mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["d_model"])
        self.wpe = nn.Embedding(c["seq_len"], c["d_model"])
        self.blocks = nn.ModuleList(Block(c["d_model"], c["n_head"]) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["d_model"], eps=1e-5)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T  # the tied output projection

    def named_zerort(self):
        """(zerort's parameter name, tensor) pairs."""
        out = [("wte", self.wte.weight), ("wpe", self.wpe.weight)]
        for i, b in enumerate(self.blocks):
            p = f"blocks.{i}."
            for ours, mod in (("ln1", b.ln1), ("attn.qkv", b.qkv), ("attn.proj", b.proj),
                              ("ln2", b.ln2), ("mlp.fc", b.fc), ("mlp.proj", b.fc_proj)):
                out += [(p + ours + ".weight", mod.weight), (p + ours + ".bias", mod.bias)]
        out += [("ln_f.weight", self.ln_f.weight), ("ln_f.bias", self.ln_f.bias)]
        return out


def golden(path):
    torch.manual_seed(20261121)
    model = Gpt(CONFIG)
    with torch.no_grad():
        for _, p in model.named_zerort():
            # float32 values (what zerort loads), larger than GPT-2's 0.02 so every path matters.
            p.copy_(torch.randn(p.shape) * 0.3)
    model = model.double()
    seq, vocab = CONFIG["seq_len"], CONFIG["vocab_size"]
    data = torch.randint(0, vocab, (BATCH, seq + 1))
    tokens, targets = data[:, :-1], data[:, 1:]
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    positions = [[0, 0], [0, seq - 1], [1, 3], [1, seq - 1]]
    out = {
        "config": CONFIG,
        "batch": BATCH,
        "tokens": tokens.reshape(-1).tolist(),
        "targets": targets.reshape(-1).tolist(),
        "params": {n: p.detach().float().reshape(-1).tolist() for n, p in model.named_zerort()},
        "loss": loss.item(),
        "logit_positions": positions,
        "logits": [logits[b, t].tolist() for b, t in positions],
        "grads": {n: p.grad.reshape(-1).tolist() for n, p in model.named_zerort()},
        "generator": "tests/layers/gpt_reference.py, torch " + torch.__version__,
    }
    with open(path, "w") as f:
        json.dump(out, f)
    print(f"wrote {path}: loss {loss.item():.10f}")


def read_safetensors(path):
    import struct
    with open(path, "rb") as f:
        data = f.read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    base = 8 + size
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "F32", entry
        begin, end = entry["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + begin:base + end]), dtype=torch.float32)
        out[name] = t.reshape(entry["shape"])
    return out


def read_tokens(path):
    import struct
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"ZRTOKENS", "not a zerort token file"
    version, width, count, vocab = struct.unpack("<IIQI", data[8:28])
    fmt = {1: "B", 2: "H", 4: "I"}[width]
    return list(struct.unpack(f"<{count}{fmt}", data[32:32 + count * width]))


def evaluate(export_dir, token_file, max_windows):
    with open(os.path.join(export_dir, "config.json")) as f:
        hf = json.load(f)
    config = dict(n_layer=hf["n_layer"], n_head=hf["n_head"], d_model=hf["n_embd"],
                  seq_len=hf["n_positions"], vocab_size=hf["vocab_size"])
    model = Gpt(config).double()
    tensors = read_safetensors(os.path.join(export_dir, "model.safetensors"))
    ours = dict(model.named_zerort())
    with torch.no_grad():
        for name, value in tensors.items():
            parts = name.split(".")
            if parts[1] in ("wte", "wpe"):
                target = parts[1]
            elif parts[1] == "ln_f":
                target = "ln_f." + parts[2]
            else:  # transformer.h.<i>.<module>.<sub>.<leaf> or transformer.h.<i>.<ln>.<leaf>
                i, rest = parts[2], ".".join(parts[3:])
                for hf_part, our_part in (("ln_1.", "ln1."), ("ln_2.", "ln2."),
                                          ("attn.c_attn.", "attn.qkv."),
                                          ("attn.c_proj.", "attn.proj."),
                                          ("mlp.c_fc.", "mlp.fc."), ("mlp.c_proj.", "mlp.proj.")):
                    if rest.startswith(hf_part):
                        target = f"blocks.{i}." + our_part + rest[len(hf_part):]
                        break
                if target.endswith(".weight") and "ln" not in rest.split(".")[0]:
                    value = value.T  # Conv1D [in, out] -> Linear [out, in]
            ours[target].copy_(value.double())
    tokens = read_tokens(token_file)
    seq = config["seq_len"]
    windows = min(max_windows, len(tokens) // (seq + 1))
    data = torch.tensor(tokens[:windows * (seq + 1)]).view(windows, seq + 1)
    with torch.no_grad():
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, config["vocab_size"]), data[:, 1:].reshape(-1))
    print(json.dumps({"loss": loss.item(), "tokens": windows * seq}))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--eval":
        evaluate(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) == 2:
        golden(sys.argv[1])
    else:
        sys.exit(__doc__)
