#!/usr/bin/env python3
"""The training step zerort benchmarks, in PyTorch (Debian's python3-torch, CPU), as a peer.

The same GPT-2 model as zerort's (layers/decoder_model.h): learned position embeddings, pre-norm
blocks of LayerNorm, causal self-attention through one fused QKV projection, LayerNorm, an MLP of
4 d with GELU (tanh approximation), a final LayerNorm and a head tied to the token embedding;
fp32; softmax cross-entropy; AdamW. One training step = forward, backward, optimizer step, on
one micro-batch of random tokens. Prints one JSON object: the median step time and tokens/s.

With --llama, the LLaMA family's model as zerort's (layers/README.md, "the two architectures"):
RMSNorm, rotary embeddings (rotate-half), --kv-heads key/value heads repeated for the query heads,
a SwiGLU MLP of --ffn channels, no biases, an untied head.

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


class RMSNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)


class LlamaBlock(torch.nn.Module):
    def __init__(self, d, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv, self.hs = heads, kv_heads, d // heads
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q = torch.nn.Linear(d, d, bias=False)
        self.k = torch.nn.Linear(d, kv_heads * self.hs, bias=False)
        self.v = torch.nn.Linear(d, kv_heads * self.hs, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.gate = torch.nn.Linear(d, ffn, bias=False)
        self.up = torch.nn.Linear(d, ffn, bias=False)
        self.down = torch.nn.Linear(ffn, d, bias=False)

    def forward(self, x, mask, cos, sin):
        b, t, d = x.shape

        def rope(z):
            half = z.shape[-1] // 2
            return z * cos[:t] + torch.cat((-z[..., half:], z[..., :half]), dim=-1) * sin[:t]

        h = self.n1(x)
        q = rope(self.q(h).view(b, t, self.heads, self.hs).transpose(1, 2))
        k = rope(self.k(h).view(b, t, self.kv, self.hs).transpose(1, 2))
        v = self.v(h).view(b, t, self.kv, self.hs).transpose(1, 2)
        rep = self.heads // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hs))
        att = att.masked_fill(mask[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
        x = x + self.o((att @ v).transpose(1, 2).contiguous().view(b, t, d))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(torch.nn.Module):
    def __init__(self, layers, d, heads, kv_heads, ffn, seq, vocab):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(
            LlamaBlock(d, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        hs = d // heads
        freqs = torch.outer(torch.arange(seq).float(),
                            1.0 / 10000.0 ** (torch.arange(0, hs, 2).float() / hs))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, idx, targets):
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x, self.mask, self.cos, self.sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama", action="store_true")
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--ffn", type=int, default=0)
    for name, default in [("layers", 4), ("d", 128), ("heads", 4), ("seq", 128), ("batch", 8),
                          ("vocab", 256), ("iters", 5), ("threads", 2)]:
        p.add_argument("--" + name, type=int, default=default)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    if a.llama:
        model = Llama(a.layers, a.d, a.heads, a.kv_heads, a.ffn, a.seq, a.vocab)
    else:
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
