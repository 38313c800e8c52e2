#!/usr/bin/env python3
"""The baseline of gk-decode-bench (bench/decode_bench.cpp): a plain PyTorch decoder of
the same shapes as the example engine's benchmark models, one decode step captured in
a CUDA graph, timed by replaying it. torch only.

    python3 bench/plain_decoder.py --model llama8b --batch 64 --kv-len 64 --json plain.json
    python3 bench/plain_decoder.py --model tiny --device cpu [--dense]   # eager, checks the code only

What one step does, as a serving engine written in plain PyTorch would: embedding; per
layer the transformers-style RMSNorm (float32, then the model dtype), the fused q/k/v
projection (F.linear on one [(H + 2 KV) D, hidden] weight), Qwen3's q/k norms for
qwen3moe30b, RoPE, the new keys and values written into a static KV cache
[B, KV, L, D], F.scaled_dot_product_attention over the whole cache with a mask of the
positions past each sequence's (enable_gqa), o_proj and the residual add; then the MLP:
fused gate/up (one weight), SiLU times up, down, or for qwen3moe30b the MoE block with
routing on the device (softmax in float32, top-k, renormalized, rows sorted by expert,
offsets by scatter_add_ and cumsum) and two torch._grouped_mm calls; the final norm,
lm_head, logits in float32 and their argmax (the step's output: the next tokens).

KV length: the cache holds --kv-len positions per sequence and every sequence is at
position kv_len - 1, so each step attends over kv_len positions (the engine's bench
decodes at the same position with the same cache length).

Prints one JSON object per run (appended to --json): model, batch, kv_len,
plain_torch_step_ms (the mean replay of the captured step, back to back, CUDA events),
plain_torch_eager_ms (the same step eagerly: host launches included), device, torch.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.nn.functional as F

MODELS = {
    # the shapes of bench/bench_models.h's model_config()
    "llama8b": dict(vocab=128256, hidden=4096, inter=14336, layers=32, heads=32, kv_heads=8, head_dim=128,
                    theta=500000.0, qk_norm=False, experts=0, topk=0, moe_inter=0),
    "qwen3moe30b": dict(vocab=151936, hidden=2048, inter=6144, layers=48, heads=32, kv_heads=4, head_dim=128,
                        theta=1000000.0, qk_norm=True, experts=128, topk=8, moe_inter=768),
    "tiny": dict(vocab=256, hidden=64, inter=128, layers=2, heads=4, kv_heads=2, head_dim=16, theta=10000.0,
                 qk_norm=True, experts=8, topk=2, moe_inter=32),
}
EPS = 1e-5


def rms_norm(x, w):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


class Plain:
    def __init__(self, c, batch, kv_len, dtype, device, moe):
        self.c, self.B, self.L, self.moe = c, batch, kv_len, moe
        H, nh, kv, d = c["hidden"], c["heads"], c["kv_heads"], c["head_dim"]
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape):
            return (torch.randn(*shape, generator=g, device=device, dtype=dtype) / math.sqrt(shape[-1]))

        def norm(n):
            return 1 + 0.05 * torch.randn(n, generator=g, device=device, dtype=dtype)

        self.embed = torch.randn(c["vocab"], H, generator=g, device=device, dtype=dtype)
        self.layers = []
        for _ in range(c["layers"]):
            lay = dict(ln1=norm(H), ln2=norm(H), qkv=w((nh + 2 * kv) * d, H), o=w(H, nh * d))
            if c["qk_norm"]:
                lay.update(qn=norm(d), kn=norm(d))
            if moe:
                E, I = c["experts"], c["moe_inter"]
                lay.update(router=w(E, H), w13=w(E, 2 * I, H), w2=w(E, H, I))
            else:
                lay.update(gate_up=w(2 * c["inter"], H), down=w(H, c["inter"]))
            self.layers.append(lay)
        self.norm = norm(H)
        self.head = w(c["vocab"], H)
        self.k_cache = [torch.zeros(batch, kv, kv_len, d, device=device, dtype=dtype) for _ in range(c["layers"])]
        self.v_cache = [torch.zeros_like(k) for k in self.k_cache]
        inv = 1.0 / (c["theta"] ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        self.inv_freq = inv
        self.ids = torch.zeros(batch, dtype=torch.long, device=device)
        self.pos = torch.full((batch,), kv_len - 1, dtype=torch.long, device=device)
        self.rows = torch.arange(batch, device=device)

    def moe_block(self, lay, h):
        c = self.c
        T, E, K = h.shape[0], c["experts"], c["topk"]
        probs = torch.softmax(F.linear(h, lay["router"]), -1, dtype=torch.float32)
        gates, experts = probs.topk(K, -1)
        gates = gates / gates.sum(-1, keepdim=True)
        flat = experts.reshape(-1)
        order = flat.sort(stable=True).indices
        counts = torch.zeros(E, dtype=torch.int32, device=h.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = counts.cumsum(0, dtype=torch.int32)
        rows = h.index_select(0, order // K)
        hh = torch._grouped_mm(rows, lay["w13"].transpose(1, 2), offs)
        i = hh.shape[1] // 2
        a = F.silu(hh[:, :i]) * hh[:, i:]
        ys = torch._grouped_mm(a, lay["w2"].transpose(1, 2), offs)
        y = torch.empty(T * K, h.shape[1], device=h.device, dtype=h.dtype).index_copy_(0, order, ys)
        return (y.view(T, K, -1).float() * gates.unsqueeze(-1)).sum(1).to(h.dtype)

    def step(self):
        c, B = self.c, self.B
        nh, kv, d = c["heads"], c["kv_heads"], c["head_dim"]
        f = self.pos.float()[:, None] * self.inv_freq[None]
        emb = torch.cat([f, f], -1)
        x = self.embed.index_select(0, self.ids)
        cos, sin = emb.cos()[:, None, :].to(x.dtype), emb.sin()[:, None, :].to(x.dtype)
        mask = (torch.arange(self.L, device=x.device)[None] <= self.pos[:, None])[:, None, None, :]
        for li, lay in enumerate(self.layers):
            h = rms_norm(x, lay["ln1"])
            qkv = F.linear(h, lay["qkv"])
            q = qkv[:, : nh * d].view(B, nh, d)
            k = qkv[:, nh * d: (nh + kv) * d].view(B, kv, d)
            v = qkv[:, (nh + kv) * d:].view(B, kv, d)
            if c["qk_norm"]:
                q, k = rms_norm(q, lay["qn"]), rms_norm(k, lay["kn"])
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            self.k_cache[li][self.rows, :, self.pos] = k
            self.v_cache[li][self.rows, :, self.pos] = v
            a = F.scaled_dot_product_attention(q[:, :, None], self.k_cache[li], self.v_cache[li], attn_mask=mask,
                                               enable_gqa=True)
            x = x + F.linear(a.reshape(B, nh * d), lay["o"])
            h = rms_norm(x, lay["ln2"])
            if self.moe:
                x = x + self.moe_block(lay, h)
            else:
                gu = F.linear(h, lay["gate_up"])
                i = gu.shape[1] // 2
                x = x + F.linear(F.silu(gu[:, :i]) * gu[:, i:], lay["down"])
        logits = F.linear(rms_norm(x, self.norm), self.head).float()
        return logits.argmax(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama8b", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--kv-len", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--dense", action="store_true", help="tiny: a dense MLP instead of the MoE block")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    c = MODELS[a.model]
    cuda = a.device.startswith("cuda")
    dtype = torch.bfloat16
    moe = c["experts"] > 0 and not a.dense
    torch.set_grad_enabled(False)
    m = Plain(c, a.batch, a.kv_len, dtype, torch.device(a.device), moe)
    rec = dict(model=a.model, batch=a.batch, kv_len=a.kv_len, dtype=str(dtype).replace("torch.", ""),
               torch=torch.__version__)
    if not cuda:  # code check only
        tokens = m.step()
        assert tokens.shape == (a.batch,) and int(tokens.min()) >= 0 and int(tokens.max()) < c["vocab"]
        rec.update(device="cpu", check="ok: eager step ran, tokens in range")
        print(json.dumps(rec), flush=True)
        return
    rec["device"] = torch.cuda.get_device_name()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            m.step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    ev[0].record()
    for _ in range(5):
        m.step()
    ev[1].record()
    torch.cuda.synchronize()
    rec["plain_torch_eager_ms"] = round(ev[0].elapsed_time(ev[1]) / 5, 4)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = m.step()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    ev[0].record()
    for _ in range(a.reps):
        graph.replay()
    ev[1].record()
    torch.cuda.synchronize()
    rec["plain_torch_step_ms"] = round(ev[0].elapsed_time(ev[1]) / a.reps, 4)
    rec["tokens_in_range"] = bool(int(out.min()) >= 0 and int(out.max()) < c["vocab"])
    print(json.dumps(rec), flush=True)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
