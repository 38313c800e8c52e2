#!/usr/bin/env python3
"""What a weight patch costs a PyTorch trainer from Python: graphkeep.make_patch over two
dicts of an 8B-shaped bf16 model (Llama-3-8B's names and shapes, 291 tensors, 15 GiB)
at a density of changed elements, and PatchPublisher.publish of the same step (its
kept copy on the device). C++'s own make_patch of the same shapes is bench_delta's
make_patch_ms: run both in one device call to compare them.

    python3 tests/python/bench_patch_time.py --out patch_time.json      # the GPU machine
    bench_delta --model llama8b --densities 0.01 --json delta.json       # the same call
    python3 tests/python/bench_patch_time.py --cpu-check                 # tiny shapes, a CPU

Checks what it times: each patch holds exactly the elements that changed (that a patch
applies bit for bit is tests/python/test_patch.py's). Prints one JSON line per
measurement; --out writes them too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import graphkeep


def llama8b_shapes(layers=32, hidden=4096, kv=1024, mlp=14336, vocab=128256):
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes[p + "self_attn.q_proj.weight"] = (hidden, hidden)
        shapes[p + "self_attn.k_proj.weight"] = (kv, hidden)
        shapes[p + "self_attn.v_proj.weight"] = (kv, hidden)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, hidden)
        shapes[p + "mlp.gate_proj.weight"] = (mlp, hidden)
        shapes[p + "mlp.up_proj.weight"] = (mlp, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, mlp)
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def step(before, density, gen_device, seed):
    """A step that changes about `density` of each tensor's elements (each changed one
    differs in its bits), and the count of changed elements."""
    g = torch.Generator(device=gen_device).manual_seed(seed)
    after, changed = {}, 0
    for n, t in before.items():
        mask = torch.rand(t.shape, generator=g, device=t.device) < density
        a = torch.where(mask, t + torch.where(t == 0, 1.0, t.abs() * 0.125).to(t.dtype), t)
        changed += int((a.view(torch.int16) != t.view(torch.int16)).sum())
        after[n] = a
    return after, changed


def timed(fn, sync):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cpu-check", action="store_true", help="tiny shapes on the CPU: checks this script only")
    ap.add_argument("--out")
    a = ap.parse_args()
    device = "cpu" if a.cpu_check else "cuda"
    shapes = llama8b_shapes(2, 64, 16, 96, 256) if a.cpu_check else llama8b_shapes()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    g = torch.Generator(device=device).manual_seed(0)
    before = {n: torch.randn(s, generator=g, device=device).to(torch.bfloat16) for n, s in shapes.items()}
    after, changed = step(before, a.density, device, 1)
    nbytes = sum(t.numel() * t.element_size() for t in before.values())
    rows = []

    def emit(row):
        row.update(model="cpu-check" if a.cpu_check else "llama8b", tensors=len(before), model_bytes=nbytes,
                   density=a.density, changed_elements=changed, device=device,
                   gpu=torch.cuda.get_device_name() if device == "cuda" else None,
                   date=time.strftime("%Y-%m-%d"))
        rows.append(row)
        print(json.dumps(row), flush=True)

    times = []
    for _ in range(a.reps + 1):  # the first is a warm-up
        patch, ms = timed(lambda: graphkeep.make_patch(before, after, base_id="a", target_id="b"), sync)
        times.append(ms)
    count = sum(e.count for e in patch.entries)
    assert count == changed, f"the patch holds {count} changed elements, the step changed {changed}"
    emit({"what": "make_patch", "ms": statistics.median(times[1:]), "ms_all": times, "payload_bytes": patch.payload_bytes})

    times = []
    for r in range(a.reps + 1):
        pub = graphkeep.PatchPublisher(torch.bfloat16, keep="device")
        pub.publish(before)
        publication, ms = timed(lambda: pub.publish(after), sync)
        times.append(ms)
    assert publication.patch is not None
    assert sum(e.count for e in publication.patch.entries) == changed
    emit({"what": "publish", "ms": statistics.median(times[1:]), "ms_all": times, "kept_bytes": pub.kept_bytes})

    if a.out:
        with open(a.out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
