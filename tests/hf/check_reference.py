#!/usr/bin/env python3
"""An independent re-implementation of tests/hf/README.md, checked against the oracle.

Reads DIR/step{k}/ (config.json, sharded safetensors through the index) and
DIR/reference.safetensors written by make_reference.py, recomputes the full-forward
logits and the greedy tokens with plain torch (no transformers import), following
README.md op for op, and reports the largest differences. It is the executable
form of the README, and a model of what the C++ engine has to do.

    python3 tests/hf/check_reference.py DIR [--atol 1e-4]   # exit 1 when over atol
"""

import argparse
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file


def load_checkpoint(step_dir):
    index = os.path.join(step_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for name in files:
        with safe_open(os.path.join(step_dir, name), "pt") as h:
            for k in h.keys():
                w[k] = h.get_tensor(k)
    return w


def rms_norm(x, weight, eps):
    # weight * (x_f32 * rsqrt(mean(x_f32^2) + eps)).to(x.dtype)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def linear(x, w):
    return x @ w.t()


def mlp(x, p):
    return linear(torch.nn.functional.silu(linear(x, p["gate_proj"])) * linear(x, p["up_proj"]), p["down_proj"])


def forward(cfg, w, tokens):
    arch = cfg["model_type"]
    eps = cfg["rms_norm_eps"]
    n_h, n_kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    emb = w["model.embed_tokens.weight"]
    dtype = emb.dtype
    B, T = tokens.shape

    # RoPE tables: float32, then cast to the model dtype.
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.arange(T).float()[:, None] * inv_freq[None, :]          # [T, d/2]
    ang = torch.cat((freqs, freqs), dim=-1)                                # [T, d]
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)

    mask = torch.full((T, T), torch.finfo(dtype).min, dtype=dtype).triu(1)  # 0 on and below the diagonal

    x = emb[tokens]                                                        # [B, T, H]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = linear(h, w[p + "self_attn.q_proj.weight"]).view(B, T, n_h, d)
        k = linear(h, w[p + "self_attn.k_proj.weight"]).view(B, T, n_kv, d)
        v = linear(h, w[p + "self_attn.v_proj.weight"]).view(B, T, n_kv, d)
        if arch in ("qwen3", "qwen3_moe"):                                  # per head, before RoPE
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, d]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = n_h // n_kv                                                   # query head j uses kv head j // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(2, 3)) * (d ** -0.5) + mask
        a = torch.softmax(s, dim=-1, dtype=torch.float32).to(dtype)
        o = (a @ v).transpose(1, 2).reshape(B, T, n_h * d)
        x = x + linear(o, w[p + "self_attn.o_proj.weight"])

        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        if arch == "qwen3_moe":
            hf = h.reshape(B * T, -1)
            router = linear(hf, w[p + "mlp.gate.weight"])                  # [N, E]
            probs = torch.softmax(router, dim=-1, dtype=torch.float32)
            top_w, top_e = torch.topk(probs, cfg["num_experts_per_tok"], dim=-1)
            if cfg["norm_topk_prob"]:
                top_w = top_w / top_w.sum(-1, keepdim=True)
            top_w = top_w.to(dtype)
            out = torch.zeros_like(hf)
            for e in range(cfg["num_experts"]):                            # ascending expert order
                tok, slot = torch.where(top_e == e)
                if tok.numel() == 0:
                    continue
                ep = {n: w[f"{p}mlp.experts.{e}.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj")}
                out.index_add_(0, tok, mlp(hf[tok], ep) * top_w[tok, slot, None])
            m = out.view(B, T, -1)
        else:
            m = mlp(h, {n: w[f"{p}mlp.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj")})
        x = x + m
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["lm_head.weight"] if "lm_head.weight" in w else emb            # tied: lm_head = embed_tokens
    return linear(x, head).float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--atol", type=float, default=1e-4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    ref = load_file(os.path.join(a.dir, "reference.safetensors"))
    steps = sorted(int(k[4:].split(".")[0]) for k in ref if k.endswith(".logits"))
    worst = 0.0
    for k in steps:
        step_dir = os.path.join(a.dir, f"step{k}")
        with open(os.path.join(step_dir, "config.json")) as f:
            cfg = json.load(f)
        if cfg.get("rope_scaling"):
            sys.exit(f"check_reference: {step_dir}/config.json has rope_scaling {cfg['rope_scaling']}; this "
                     "re-implementation has plain RoPE only (gk-hf-check compares the engine's scaled rotary "
                     "tables with transformers' instead)")
        w = load_checkpoint(step_dir)
        tokens = ref[f"step{k}.tokens"]
        logits = forward(cfg, w, tokens)
        d_full = (logits - ref[f"step{k}.logits"]).abs().max().item()
        # Greedy decoding with the full forward (no cache) vs the oracle's cached generate.
        gen = ref[f"step{k}.generated"]
        n_new = gen.shape[1] - ref[f"step{k}.generated_logits"].shape[1]
        seq = gen[:, :n_new].clone()
        d_gen = 0.0
        for j in range(ref[f"step{k}.generated_logits"].shape[1]):
            last = forward(cfg, w, seq)[:, -1]
            d_gen = max(d_gen, (last - ref[f"step{k}.generated_logits"][:, j]).abs().max().item())
            seq = torch.cat([seq, gen[:, n_new + j:n_new + j + 1]], dim=1)  # teacher-force the oracle's tokens
            if not torch.equal(last.argmax(-1), gen[:, n_new + j]):
                print(f"step {k}: greedy token {j} differs: {last.argmax(-1).tolist()} vs {gen[:, n_new + j].tolist()}")
        print(f"step {k}: max|logits - ref|={d_full:.3g} max|decode logits - ref|={d_gen:.3g} "
              f"(max|ref|={ref[f'step{k}.logits'].abs().max().item():.3g})")
        worst = max(worst, d_full, d_gen)
    print(f"check_reference: {a.dir}: worst {worst:.3g} (atol {a.atol:g})")
    sys.exit(0 if worst <= a.atol else 1)


if __name__ == "__main__":
    main()
