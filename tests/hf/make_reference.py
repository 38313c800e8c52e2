#!/usr/bin/env python3
"""Reference models and checkpoints from Hugging Face transformers (the oracle).

Builds a small random Llama / Qwen3 / Qwen3-MoE model with transformers==4.57.6,
saves sharded safetensors checkpoints of it before and after a few training
updates, and records what transformers computes for each checkpoint, so that a
C++ engine that loads the same checkpoints can be checked against it.

    python3 tests/hf/make_reference.py --arch {llama,qwen3,qwen3_moe} --out DIR
        [--size tiny|small|medium] [--dtype float32|bfloat16] [--steps N] [--shard-size SIZE]
        [--seed 0] [--warmup N] [--tied] [--rope linear|dynamic|llama3|llama3_8192]
        [--device cpu|cuda] [--threads 1]

Writes
    DIR/step{k}/   k = 0..steps: config.json, generation_config.json,
                   model-0000i-of-0000n.safetensors + model.safetensors.index.json
                   (save_pretrained(max_shard_size=shard_size, safe_serialization=True),
                   shard_size 200KB for tiny (3-4 shards), 20MB for small, 200MB for medium;
                   a single model.safetensors when everything fits in one shard)
    DIR/reference.safetensors, per step k:
        step{k}.tokens            [B=3, T=12]  int64    prompts (same for every k)
        step{k}.logits            [B, T, V]    float32  full forward, no cache
        step{k}.generated         [B, 4+6]     int64    4 prompt tokens + 6 greedy tokens
        step{k}.generated_logits  [B, 6, V]    float32  logits of each greedy decode step
                                                        (the KV-cache path; extra)
        step{k}.logits_fp8        [B, T, V]    float32  full forward with the engine's FP8 W8A8
                                                        format applied inside transformers
                                                        (fp8_forward below)
        step{k}.logits_w4a16      [B, T, V]    float32  the same with the engine's W4A16 format
                                                        (w4a16_forward below)
        step{k}.logits_f32        [B, T, V]    float32  bfloat16 runs only: the same checkpoint
                                                        computed in float32 (transformers' own
                                                        bfloat16 error, for comparison)
        rope.cos, rope.sin        [P, D]       float32  the model's rotary tables (its rotary
                                                        embedding's cos and sin, positions 0..P-1,
                                                        P = max_position_embeddings)
        rope.{name}.cos, .sin     [P, D]       float32  the same for DIR/rope/{name}/config.json:
                                                        the model's config with the rope_scaling
                                                        ROPE_PRESETS[name] (and none for "default")
        metadata: arch, size, dtype, steps, warmup, seed, tied, shard_size, transformers, torch

    The outputs of step k are computed by a model loaded back from DIR/step{k} with
    from_pretrained(dtype=<dtype>, attn_implementation="eager"): they are what
    transformers gives for that checkpoint as stored on disk.

Training between checkpoints: per step, 3 AdamW updates (lr 1e-2) on the causal
LM loss of the prompts, on a float32 master copy; the checkpoint is the master
cast to --dtype. Every weight (the norms' too, which start at 1) moves.

Tensor names written (listed from the saved index; layer 0 shown, layers 0..L-1):
  all archs
    model.embed_tokens.weight                      [V, H]
    model.layers.0.input_layernorm.weight          [H]
    model.layers.0.post_attention_layernorm.weight [H]
    model.layers.0.self_attn.q_proj.weight         [nH*D, H]
    model.layers.0.self_attn.k_proj.weight         [nKV*D, H]
    model.layers.0.self_attn.v_proj.weight         [nKV*D, H]
    model.layers.0.self_attn.o_proj.weight         [H, nH*D]
    model.norm.weight                              [H]
    lm_head.weight                                 [V, H]  (absent with --tied)
  qwen3, qwen3_moe in addition
    model.layers.0.self_attn.q_norm.weight         [D]
    model.layers.0.self_attn.k_norm.weight         [D]
  llama, qwen3 (dense MLP)
    model.layers.0.mlp.gate_proj.weight            [I, H]
    model.layers.0.mlp.up_proj.weight              [I, H]
    model.layers.0.mlp.down_proj.weight            [H, I]
  qwen3_moe (every layer sparse: decoder_sparse_step 1, mlp_only_layers [])
    model.layers.0.mlp.gate.weight                 [E, H]  (router)
    model.layers.0.mlp.experts.{e}.gate_proj.weight [Im, H]  e = 0..E-1
    model.layers.0.mlp.experts.{e}.up_proj.weight   [Im, H]
    model.layers.0.mlp.experts.{e}.down_proj.weight [H, Im]
  No biases anywhere (attention_bias, mlp_bias false; Qwen3 MLPs have none).
  The forward semantics are in tests/hf/README.md; tests/hf/check_reference.py
  re-implements them in plain torch and checks DIR against the oracle.
"""

import argparse
import json
import os
import re
import shutil
import sys
import time

# Before torch is imported: deterministic cuBLAS (only matters with --device cuda),
# and no hub access (everything is local).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

TRANSFORMERS_PIN = "4.57.6"
B, T = 3, 12          # prompts
PROMPT, GEN = 4, 6    # greedy generation: first PROMPT tokens, GEN new tokens
UPDATES_PER_STEP = 3
LR = 1e-2

SIZES = {
    "tiny": dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, intermediate_size=128,
                 num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32),
    "small": dict(vocab_size=4096, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=64, intermediate_size=1408,
                  num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256),
    # The H200 run's size (docs/gpu-runs.md): 160M parameters dense, 290M MoE.
    "medium": dict(vocab_size=32000, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                   num_key_value_heads=8, head_dim=64, intermediate_size=2816,
                   num_experts=32, num_experts_per_tok=4, moe_intermediate_size=256),
}


def die(msg):
    print(f"make_reference: error: {msg}", file=sys.stderr)
    sys.exit(1)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", required=True, choices=["llama", "qwen3", "qwen3_moe"])
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--size", default="tiny", choices=sorted(SIZES))
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--steps", type=int, default=2, help="training steps after step 0 (default 2)")
    p.add_argument("--shard-size", default=None,
                   help="save_pretrained max_shard_size (default 200KB for tiny, 20MB for small)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=0,
                   help="training updates before step 0 (default 0: step 0 is the random initialization, whose "
                        "logits are small, so relative differences there measure rounding noise more than the model)")
    p.add_argument("--tied", action="store_true", help="tie_word_embeddings=True (no lm_head.weight)")
    p.add_argument("--rope", default=None, choices=sorted(ROPE_PRESETS),
                   help="the model's rope_scaling, one of ROPE_PRESETS (default: none, plain RoPE)")
    p.add_argument("--device", default="cpu", help="torch device for the run (default cpu)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads (default 1: fastest for tiny models on a busy machine, "
                        "and the float32 results do not depend on the thread count)")
    a = p.parse_args()
    if a.steps < 0:
        die("--steps must be >= 0")
    if a.shard_size is None:
        a.shard_size = {"tiny": "200KB", "small": "20MB"}.get(a.size, "200MB")
    return a


def import_libs():
    try:
        import torch
        import safetensors.torch
        import transformers
    except ImportError as e:
        die(f"{e}; install with: python3 -m pip install transformers=={TRANSFORMERS_PIN} safetensors "
            "(scripts/setup.sh does)")
    if transformers.__version__ != TRANSFORMERS_PIN:
        die(f"transformers {transformers.__version__} is installed, the reference is pinned to "
            f"{TRANSFORMERS_PIN} (later versions change the MoE weight layout); "
            f"python3 -m pip install transformers=={TRANSFORMERS_PIN}")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return torch, safetensors.torch, transformers


# rope_scaling presets (transformers 4.57's modeling_rope_utils.py computes
# them). llama3: with the tiny model's head_dim 16 and theta 1e4 the
# wavelengths 2 pi / inv_freq are 6.3, 19.9, 62.8, ... 19869: the values below
# (original context 8, below the 12 positions compared) leave the first
# frequency unchanged, smooth the second and divide the rest by the factor;
# llama3_8192 is Llama 3.1's own entry (one frequency of each kind as well).
# dynamic is given with the older "type" key.
ROPE_PRESETS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 0.25, "high_freq_factor": 1.0,
               "original_max_position_embeddings": 8},
    "llama3_8192": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192},
}


def make_config(transformers, arch, size, tied, rope=None):
    s = SIZES[size]
    common = dict(
        vocab_size=s["vocab_size"], hidden_size=s["hidden_size"],
        num_hidden_layers=s["num_hidden_layers"], num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_key_value_heads"], head_dim=s["head_dim"],
        intermediate_size=s["intermediate_size"], hidden_act="silu",
        rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=256,
        rope_scaling=dict(ROPE_PRESETS[rope]) if rope else None,
        attention_bias=False, attention_dropout=0.0, initializer_range=0.02,
        tie_word_embeddings=tied, use_cache=True,
        # No special tokens: greedy generation never stops early on an EOS and
        # no embedding row is zeroed as padding.
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    if arch == "llama":
        return transformers.LlamaConfig(mlp_bias=False, pretraining_tp=1, **common)
    if arch == "qwen3":
        return transformers.Qwen3Config(use_sliding_window=False, **common)
    return transformers.Qwen3MoeConfig(
        use_sliding_window=False, num_experts=s["num_experts"],
        num_experts_per_tok=s["num_experts_per_tok"], moe_intermediate_size=s["moe_intermediate_size"],
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        output_router_logits=False, **common)


# The engine's FP8 W8A8 format (examples/engine/weight_formats.cpp, Note [FP8 CPU twin]):
# a float8_e4m3fn weight with a float32 scale per output channel, made from the
# checkpoint, and activations quantized per token at run time. The projections
# it applies to: attention q, k, v, o and the dense MLP's gate, up, down (not
# the router, the MoE experts, the embedding or lm_head).
FP8_LINEAR = re.compile(r"\.self_attn\.[qkvo]_proj$|\.layers\.\d+\.mlp\.(gate|up|down)_proj$")


def fp8_forward(lin):
    torch = sys.modules["torch"]
    w = lin.weight.detach().float()
    sw = (w.abs().amax(1) / 448.0).clamp_min(1e-12)
    wq = (w / sw.unsqueeze(1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)

    def forward(x):
        shape = x.shape
        xf = x.reshape(-1, shape[-1]).float()
        sx = (xf.abs().amax(1, keepdim=True) / 448.0).clamp_min(1e-12)
        xq = (xf / sx).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        y = (xq.float() @ wq.float().t()) * sx * sw.view(1, -1)
        return y.to(x.dtype).reshape(*shape[:-1], -1)
    return forward


# The engine's W4A16 format (examples/engine/weight_formats.cpp, Note [W4A16 from the
# checkpoint]): symmetric int4 per group of 128 input channels (K when K < 128),
# scale = max |w| / 7 per group, computed in float32, cast back.
def w4a16_forward(lin):
    torch = sys.modules["torch"]
    w = lin.weight.detach().float()
    n, k = w.shape
    g = k if k < 128 else 128
    wg = w.view(n, k // g, g)
    s = (wg.abs().amax(-1) / 7.0).clamp_min(1e-12)
    q = (wg / s.unsqueeze(-1)).round().clamp(-8, 7)
    wdq = (q * s.unsqueeze(-1)).view(n, k)

    def forward(x):
        shape = x.shape
        y = x.reshape(-1, shape[-1]).float() @ wdq.t()
        return y.to(x.dtype).reshape(*shape[:-1], -1)
    return forward


def fp8_logits(model, tokens, make_forward=None):
    """Full-forward logits with FP8_LINEAR projections computed in the engine's FP8
    format (or the format `make_forward` gives)."""
    make_forward = make_forward or fp8_forward
    saved = {}
    for name, mod in model.named_modules():
        if FP8_LINEAR.search(name):
            saved[name] = mod.forward
            mod.forward = make_forward(mod)
    if not saved:
        die("quantized reference: no projection matched FP8_LINEAR")
    try:
        return model(input_ids=tokens, use_cache=False).logits.float().cpu()
    finally:
        for name, mod in model.named_modules():
            if name in saved:
                mod.forward = saved[name]


def count_shards(step_dir):
    index = os.path.join(step_dir, "model.safetensors.index.json")
    if not os.path.exists(index):
        return 1  # a single model.safetensors
    with open(index) as f:
        return len(set(json.load(f)["weight_map"].values()))


def main():
    args = parse_args()
    torch, st, transformers = import_libs()
    from transformers import AutoModelForCausalLM

    t_start = time.time()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    try:
        torch.use_deterministic_algorithms(True)
    except Exception as e:  # noqa: BLE001 - best effort
        print(f"make_reference: note: deterministic algorithms unavailable: {e}", file=sys.stderr)
    try:
        device = torch.device(args.device)
        torch.empty(1, device=device)
    except Exception as e:  # noqa: BLE001
        die(f"device {args.device!r} is not usable: {e}")
    dtype = getattr(torch, args.dtype)

    out = os.path.abspath(args.out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        die(f"cannot create {out}: {e}")
    # Clear what an earlier run of this script left (only our own names).
    for name in os.listdir(out):
        path = os.path.join(out, name)
        if name.startswith("step") and name[4:].isdigit() and os.path.isdir(path):
            shutil.rmtree(path)
    if os.path.exists(os.path.join(out, "reference.safetensors")):
        os.remove(os.path.join(out, "reference.safetensors"))

    config = make_config(transformers, args.arch, args.size, args.tied, args.rope)
    # The float32 master, random init under the seed (transformers' _init_weights:
    # Linear/Embedding ~ N(0, 0.02), RMSNorm weights 1).
    torch.manual_seed(args.seed)
    master = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    master.to(device).eval()
    n_params = sum(p.numel() for p in master.parameters())

    gen = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, config.vocab_size, (B, T), generator=gen, dtype=torch.int64)

    opt = torch.optim.AdamW(master.parameters(), lr=LR)
    refs = {}
    prev_logits = None
    first_logits = None
    print(f"make_reference: {args.arch} {args.size} {args.dtype} params={n_params} "
          f"transformers={transformers.__version__} torch={torch.__version__} device={device} -> {out}")
    def train(updates, what):
        # `updates` AdamW steps on the prompts themselves (an RL-style update);
        # returns the last loss.
        master.train()
        loss_val = None
        for _ in range(updates):
            opt.zero_grad(set_to_none=True)
            loss = master(input_ids=tokens.to(device), labels=tokens.to(device), use_cache=False).loss
            if not torch.isfinite(loss):
                die(f"{what}: loss is {loss.item()}")
            loss.backward()
            opt.step()
            loss_val = loss.item()
        master.eval()
        return loss_val

    if args.warmup > 0:
        train(args.warmup, "warm-up")
    for k in range(args.steps + 1):
        t0 = time.time()
        loss_val = train(UPDATES_PER_STEP, f"step {k}") if k > 0 else None

        step_dir = os.path.join(out, f"step{k}")
        # The checkpoint: the master cast to the chosen dtype.
        if dtype == torch.float32:
            to_save = master
        else:
            to_save = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype)
            to_save.load_state_dict({n: v.to(dtype) for n, v in master.state_dict().items()})
        to_save.save_pretrained(step_dir, max_shard_size=args.shard_size, safe_serialization=True)
        del to_save

        # The oracle: the checkpoint as transformers loads it.
        model = AutoModelForCausalLM.from_pretrained(step_dir, dtype=dtype, attn_implementation="eager")
        model.to(device).eval()
        with torch.no_grad():
            logits = model(input_ids=tokens.to(device), use_cache=False).logits.float().cpu()
            logits_fp8 = fp8_logits(model, tokens.to(device))
            logits_w4a16 = fp8_logits(model, tokens.to(device), w4a16_forward)
            g = model.generate(
                input_ids=tokens[:, :PROMPT].to(device),
                attention_mask=torch.ones(B, PROMPT, dtype=torch.int64, device=device),
                do_sample=False, num_beams=1, max_new_tokens=GEN, min_new_tokens=GEN, use_cache=True,
                temperature=None, top_p=None, top_k=None,
                return_dict_in_generate=True, output_logits=True)
        generated = g.sequences.cpu()
        if tuple(generated.shape) != (B, PROMPT + GEN):
            die(f"step {k}: generate returned shape {tuple(generated.shape)}, expected {(B, PROMPT + GEN)}")
        gen_logits = torch.stack([x.float().cpu() for x in g.logits], dim=1)
        if not torch.isfinite(logits).all():
            die(f"step {k}: non-finite logits")
        del model

        refs[f"step{k}.tokens"] = tokens.clone()
        refs[f"step{k}.logits"] = logits.contiguous()
        refs[f"step{k}.generated"] = generated.contiguous()
        refs[f"step{k}.generated_logits"] = gen_logits.contiguous()
        refs[f"step{k}.logits_fp8"] = logits_fp8.contiguous()
        refs[f"step{k}.logits_w4a16"] = logits_w4a16.contiguous()
        if dtype != torch.float32:
            # transformers' own rounding error: the same checkpoint computed in
            # float32 (gk-hf-check prints the engine's error next to it).
            m32 = AutoModelForCausalLM.from_pretrained(step_dir, dtype=torch.float32, attn_implementation="eager")
            m32.to(device).eval()
            with torch.no_grad():
                refs[f"step{k}.logits_f32"] = m32(input_ids=tokens.to(device), use_cache=False).logits.float().cpu()
            del m32

        shards = count_shards(step_dir)
        d_prev = (logits - prev_logits).abs().max().item() if prev_logits is not None else 0.0
        d_first = (logits - first_logits).abs().max().item() if first_logits is not None else 0.0
        print(f"step {k}: train loss={'-' if loss_val is None else f'{loss_val:.4f}'} max|logit|={logits.abs().max().item():.4g} "
              f"max|dlogit| vs prev={d_prev:.4g} vs step0={d_first:.4g} shards={shards} "
              f"generated[0]={generated[0, PROMPT:].tolist()} ({time.time() - t0:.2f}s)")
        prev_logits = logits
        if first_logits is None:
            first_logits = logits

    # The rotary tables, computed on the CPU in float32: the model's, and one
    # per rope_scaling preset on a copy of its config (written next to the steps).
    rotary_class = type(master.model.rotary_emb)
    positions = config.max_position_embeddings

    def rope_tables(cfg):
        rotary = rotary_class(config=cfg)
        x = torch.zeros(1, positions, cfg.head_dim, dtype=torch.float32)
        cos, sin = rotary(x, torch.arange(positions)[None])
        return cos[0].contiguous(), sin[0].contiguous()

    refs["rope.cos"], refs["rope.sin"] = rope_tables(config)
    shutil.rmtree(os.path.join(out, "rope"), ignore_errors=True)
    for name in ["default"] + sorted(ROPE_PRESETS):
        variant = make_config(transformers, args.arch, args.size, args.tied, None if name == "default" else name)
        variant.save_pretrained(os.path.join(out, "rope", name))
        refs[f"rope.{name}.cos"], refs[f"rope.{name}.sin"] = rope_tables(variant)

    meta = {
        "arch": args.arch, "size": args.size, "dtype": args.dtype, "steps": str(args.steps), "warmup": str(args.warmup),
        "seed": str(args.seed), "tied": str(args.tied).lower(), "shard_size": args.shard_size,
        "rope": args.rope or "default",
        "B": str(B), "T": str(T), "prompt_len": str(PROMPT), "new_tokens": str(GEN),
        "transformers": transformers.__version__, "torch": torch.__version__,
    }
    st.save_file(refs, os.path.join(out, "reference.safetensors"), metadata=meta)
    print(f"make_reference: wrote {len(refs)} tensors to {os.path.join(out, 'reference.safetensors')} "
          f"({time.time() - t_start:.2f}s)")


if __name__ == "__main__":
    main()
