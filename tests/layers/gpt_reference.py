#!/usr/bin/env python3
"""Independent PyTorch reference of zerort's GPT model, for the golden-value test.

Builds a GPT-2-style model from torch.nn modules (written from the GPT-2 architecture, not from
zerort's code), fills it with random weights, runs one batch, and writes the weights, the input,
the loss, the logits at a few positions and every parameter's gradient to a JSON file that
tests/layers/gpt_golden_test.cc reads. The values are computed in float64 from float32 weights;
zerort's fp32 run must agree to 1e-5 relative.

Regenerate (Debian: apt-get install python3-torch):
    /usr/bin/python3 tests/layers/gpt_reference.py tests/layers/golden/gpt_tiny.json
CI does not run this script; it reads the committed JSON.
"""
import json
import math
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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    golden(sys.argv[1])
