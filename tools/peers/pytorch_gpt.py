#!/usr/bin/env python3
"""The training step zerort benchmarks, in PyTorch (Debian's python3-torch, CPU), as a peer.

The same GPT-2 model as zerort's (layers/gpt_model.h): learned position embeddings, pre-norm
blocks of LayerNorm, causal self-attention through one fused QKV projection, LayerNorm, an MLP of
4 d with GELU (tanh approximation), a final LayerNorm and a head tied to the token embedding;
fp32; softmax cross-entropy; AdamW. One training step = forward, backward, optimizer step, on
one micro-batch of random tokens. Prints one JSON object: the median step time and tokens/s.

Threads: torch.set_num_threads(--threads). OMP_WAIT_POLICY must be set in the environment before
the process starts (tools/peers/compare.py runs this script once per setting).
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.fc_proj = torch.nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        hs = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(mask[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, layers, d, heads, seq, vocab):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d)
        self.wpe = torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.lnf = torch.nn.LayerNorm(d)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()  # the tied head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in [("layers", 4), ("d", 128), ("heads", 4), ("seq", 128), ("batch", 8),
                          ("vocab", 256), ("iters", 5), ("threads", 2)]:
        p.add_argument("--" + name, type=int, default=default)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = Gpt(a.layers, a.d, a.heads, a.seq, a.vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    idx = torch.randint(a.vocab, (a.batch, a.seq))
    targets = torch.randint(a.vocab, (a.batch, a.seq))
    times = []
    for it in range(a.iters + 1):  # the first step warms up
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(idx, targets).backward()
        opt.step()
        if it > 0:
            times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    print(json.dumps({"peer": "pytorch", "version": torch.__version__, "threads": a.threads,
                      "params": sum(x.numel() for x in model.parameters()),
                      "step_s": step, "tokens_per_s": a.batch * a.seq / step}))


if __name__ == "__main__":
    main()
