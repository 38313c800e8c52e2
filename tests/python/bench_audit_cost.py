#!/usr/bin/env python3
"""What graphkeep.audit and Manifest.verify cost on the decode graphs of an 8B-shaped
plain PyTorch decoder (Llama-3-8B shapes: 32 layers, hidden 4096, 32 heads over 8 KV
heads of 128, MLP 14336, vocabulary 128256, bf16), captured as a serving engine
does: 35 decode graphs (batch 1, 2, 4, then 8 to 256 in steps of 8) in one memory
pool, over a static KV cache.

    python3 tests/python/bench_audit_cost.py            # on the GPU machine (H200)
    python3 tests/python/bench_audit_cost.py --cpu-check  # tiny shapes, eager, on a CPU:
                                                          # checks the decoder code only

Measures, per graph and in total: the scan (driver-API walk of every node: nodes per
second), the audit (scan + allocator state + classification against one shared walk
of the model), and the verification after a reload: one walk of the model and the
35 verifies sharing it (what a guard before every replay after a reload costs), and
one verify that walks the model itself. Checks what it measures: every manifest is
clean, an in-place reload (copy_ into every parameter) verifies clean, and rebinding
one weight is named by every graph (the layer's projection is in every graph).
Prints one JSON line per phase and a summary; with --out FILE, writes the JSON too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import graphkeep


class RMSNorm(nn.Module):
    def __init__(self, dim, eps, **kw):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, **kw))
        self.eps = eps

    def forward(self, x):
        v = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(v + self.eps)).to(x.dtype) * self.weight


class Layer(nn.Module):
    def __init__(self, c, **kw):
        super().__init__()
        H, nh, nkv, hd, inter = c["hidden"], c["heads"], c["kv_heads"], c["head_dim"], c["inter"]
        self.input_layernorm = RMSNorm(H, 1e-5, **kw)
        self.q_proj = nn.Linear(H, nh * hd, bias=False, **kw)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False, **kw)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False, **kw)
        self.o_proj = nn.Linear(nh * hd, H, bias=False, **kw)
        self.post_attention_layernorm = RMSNorm(H, 1e-5, **kw)
        self.gate_proj = nn.Linear(H, inter, bias=False, **kw)
        self.up_proj = nn.Linear(H, inter, bias=False, **kw)
        self.down_proj = nn.Linear(inter, H, bias=False, **kw)
        self.nh, self.nkv, self.hd = nh, nkv, hd

    def forward(self, x, cos, sin, k_cache, v_cache, pos, mask):
        B = x.shape[0]
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, self.nh, 1, self.hd)
        k = self.k_proj(h).view(B, self.nkv, 1, self.hd)
        v = self.v_proj(h).view(B, self.nkv, 1, self.hd)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rows = torch.arange(B, device=x.device)
        k_cache[rows, :, pos] = k[:, :, 0]          # [B, kv, L, hd] cache rows of sequences 0..B-1
        v_cache[rows, :, pos] = v[:, :, 0]
        a = F.scaled_dot_product_attention(q, k_cache[:B], v_cache[:B], attn_mask=mask, enable_gqa=True)
        x = x + self.o_proj(a.reshape(B, self.nh * self.hd))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return (x * cos + rot * sin).to(x.dtype)


class Decoder(nn.Module):
    def __init__(self, c, **kw):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"], **kw)
        self.layers = nn.ModuleList(Layer(c, **kw) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"], 1e-5, **kw)
        self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False, **kw)
        # On the current default device (meta while main() builds the 8B
        # shape; main() then sets it on the GPU).
        inv = 1.0 / (500000.0 ** (torch.arange(0, c["head_dim"], 2, dtype=torch.float32) / c["head_dim"]))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, ids, pos, caches, max_len):
        B = ids.shape[0]
        f = pos.float()[:, None] * self.inv_freq[None]
        emb = torch.cat([f, f], -1)
        cos, sin = emb.cos()[:, None, None, :], emb.sin()[:, None, None, :]
        mask = (torch.arange(max_len, device=ids.device)[None] <= pos[:, None])[:, None, None, :]
        x = self.embed_tokens(ids)
        for layer, (kc, vc) in zip(self.layers, caches):
            x = layer(x, cos.to(x.dtype), sin.to(x.dtype), kc, vc, pos, mask)
        return self.lm_head(self.norm(x)).float()


SHAPES = {
    "8b": dict(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, inter=14336),
    "tiny": dict(vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, inter=128),
}


def batch_sizes():
    return [1, 2, 4] + list(range(8, 257, 8))


def emit(rec, results):
    results.append(rec)
    print(json.dumps(rec), flush=True)


def cpu_check():
    c = SHAPES["tiny"]
    torch.manual_seed(0)
    model = Decoder(c, dtype=torch.float32)
    L = 16
    caches = [(torch.zeros(4, c["kv_heads"], L, c["head_dim"]), torch.zeros(4, c["kv_heads"], L, c["head_dim"]))
              for _ in range(c["layers"])]
    ids, pos = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 0, 0, 0])
    with torch.no_grad():
        a = model(ids, pos, caches, L)
        b = model(ids[:2], pos[:2] + 1, caches, L)
    coll = graphkeep.collect(model)
    n_params = len(list(model.parameters()))
    ok = (a.shape == (4, c["vocab"]) and b.shape == (2, c["vocab"]) and bool(torch.isfinite(a).all())
          and len(coll.parameters()) == n_params and coll.paths("buffer") == ["inv_freq"] and not coll.escaped())
    print(f"cpu-check: decoder ran eagerly, logits {tuple(a.shape)} and {tuple(b.shape)}, collector found "
          f"{len(coll.parameters())}/{n_params} parameters: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5, help="timed repetitions of scan and verify")
    ap.add_argument("--out", default="")
    ap.add_argument("--cpu-check", action="store_true")
    args = ap.parse_args()
    if args.cpu_check:
        return cpu_check()
    if not torch.cuda.is_available() or not graphkeep.with_cuda:
        print("bench_audit_cost: needs a CUDA device and graphkeep's CUDA parts", file=sys.stderr)
        return 2
    c = SHAPES[args.shape]
    results: list[dict] = []
    torch.manual_seed(0)
    dev = torch.device("cuda")
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = Decoder(c, dtype=torch.bfloat16)
    model = model.to_empty(device=dev)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
        for layer in model.layers:
            layer.input_layernorm.weight.fill_(1)
            layer.post_attention_layernorm.weight.fill_(1)
        model.norm.weight.fill_(1)
        inv = 1.0 / (500000.0 ** (torch.arange(0, c["head_dim"], 2, dtype=torch.float32, device=dev) / c["head_dim"]))
        model.inv_freq = inv
    sizes = batch_sizes()
    B = max(sizes)
    caches = [(torch.zeros(B, c["kv_heads"], args.max_len, c["head_dim"], dtype=torch.bfloat16, device=dev),
               torch.zeros(B, c["kv_heads"], args.max_len, c["head_dim"], dtype=torch.bfloat16, device=dev))
              for _ in range(c["layers"])]
    ids = torch.zeros(B, dtype=torch.long, device=dev)
    pos = torch.zeros(B, dtype=torch.long, device=dev)
    emit({"phase": "build", "params_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
          "s": time.perf_counter() - t0}, results)

    graphs, outs = {}, {}
    pool = None
    t0 = time.perf_counter()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for b in (B, 1):
            model(ids[:b], pos[:b], caches, args.max_len)
    torch.cuda.current_stream().wait_stream(s)
    for b in sorted(sizes, reverse=True):   # the largest first, then the rest in its pool
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.no_grad(), torch.cuda.graph(g, pool=pool):
            outs[b] = model(ids[:b], pos[:b], caches, args.max_len)
        g.instantiate()
        pool = g.pool() if pool is None else pool
        graphs[b] = g
    torch.cuda.synchronize()
    emit({"phase": "capture", "graphs": len(graphs), "s": time.perf_counter() - t0}, results)

    # the scan alone
    scans = {}
    per_graph = []
    for b, g in graphs.items():
        ts = []
        for _ in range(args.repeat):
            sc = graphkeep.scan(g)
            ts.append(sc["ms"])
        scans[b] = sc
        per_graph.append((b, sc["nodes"], statistics.median(ts), int(sc["address"].numel())))
    nodes = sum(n for _, n, _, _ in per_graph)
    scan_ms = sum(ms for _, _, ms, _ in per_graph)
    emit({"phase": "scan", "graphs": len(per_graph), "nodes": nodes, "words": sum(w for *_, w in per_graph),
          "ms_total": scan_ms, "nodes_per_s": nodes / (scan_ms / 1e3),
          "largest_graph": {"batch": B, "nodes": scans[B]["nodes"], "ms": dict((b, m) for b, _, m, _ in per_graph)[B]}},
         results)

    # audits, one shared walk of the model
    static = {"ids": ids, "pos": pos}
    for i, (kc, vc) in enumerate(caches):
        static[f"k_cache.{i}"], static[f"v_cache.{i}"] = kc, vc
    t0 = time.perf_counter()
    walk = graphkeep.collect(model)
    walk_ms = (time.perf_counter() - t0) * 1e3
    manifests = {}
    t0 = time.perf_counter()
    for b, g in graphs.items():
        manifests[b] = graphkeep.audit(g, model, static_io={**static, "logits": outs[b]}, collection=walk)
    audit_ms = (time.perf_counter() - t0) * 1e3
    unclean = {b: m.describe() for b, m in manifests.items() if not m.clean}
    counts = {k: sum(m.counts()[k] for m in manifests.values()) for k in graphkeep.CLASSES}
    emit({"phase": "audit", "graphs": len(manifests), "walk_ms": walk_ms, "ms_total": audit_ms,
          "ms_per_graph": audit_ms / len(manifests), "addresses": counts, "unclean_graphs": len(unclean)}, results)
    for b, d in list(unclean.items())[:3]:
        print(f"UNCLEAN batch {b}:\n{d}", flush=True)
    # An unknown word may be a stale host word in a kernel's by-value
    # parameters (Note [Stale bytes in kernel parameters]) that happens to hit
    # a live block: audit such a graph again against a second capture of the
    # same forward (confirm_with), which drops words the two do not share.
    confirmed = {}
    for b in unclean:
        g2 = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.no_grad(), torch.cuda.graph(g2, pool=pool):
            model(ids[:b], pos[:b], caches, args.max_len)
        g2.instantiate()
        m2 = graphkeep.audit(graphs[b], model, static_io={**static, "logits": outs[b]}, collection=walk,
                             confirm_with=g2)
        confirmed[b] = m2.clean
        if m2.clean:
            manifests[b] = m2
        else:
            print(f"UNCLEAN batch {b} after confirm_with:\n{m2.describe()}", flush=True)
    if unclean:
        emit({"phase": "confirm", "graphs": len(unclean), "clean_after_confirm": sum(confirmed.values())}, results)
    unclean = {b: d for b, d in unclean.items() if not confirmed.get(b, False)}
    del walk

    # in-place reload, then verification: one walk + 35 verifies, and a verify that walks
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.001)
    shared, own = [], []
    ok_after_copy = True
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        walk = graphkeep.collect(model)
        results_ok = [m.verify(walk).ok for m in manifests.values()]
        shared.append((time.perf_counter() - t0) * 1e3)
        ok_after_copy &= all(results_ok)
        t0 = time.perf_counter()
        manifests[B].verify(model)
        own.append((time.perf_counter() - t0) * 1e3)
    del walk
    emit({"phase": "verify", "graphs": len(manifests), "ms_all_graphs_one_walk": statistics.median(shared),
          "ms_one_graph_own_walk": statistics.median(own), "clean_after_copy_reload": ok_after_copy}, results)

    # negative: rebinding one weight is named by every graph
    name = "layers.7.down_proj.weight"
    model.get_parameter(name).data = model.get_parameter(name).data.clone()
    walk = graphkeep.collect(model)
    named = sum(m.verify(walk).stale_paths() == [name] for m in manifests.values())
    emit({"phase": "rebind", "path": name, "graphs_naming_it": named, "graphs": len(manifests)}, results)

    ok = not unclean and ok_after_copy and named == len(manifests)
    summary = (f"SUMMARY: {len(graphs)} decode graphs of the {args.shape} decoder, {nodes} nodes: scan "
               f"{nodes / (scan_ms / 1e3):,.0f} nodes/s ({scan_ms:.1f} ms for all), audit {audit_ms:.1f} ms for all "
               f"(walk {walk_ms:.1f} ms); verify after a reload {statistics.median(shared):.2f} ms for all graphs "
               f"(one walk), {statistics.median(own):.2f} ms for one graph with its own walk; clean {not unclean}, "
               f"copy reload clean {ok_after_copy}, rebind named by {named}/{len(manifests)}: "
               f"{'ok' if ok else 'FAILED'}")
    print(summary, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"results": results, "summary": summary}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
