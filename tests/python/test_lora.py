"""LoRA adapters served by the example engine inside its decode graphs, against PEFT.

The oracle is PEFT on transformers (PyPI `peft`), nobody here wrote it: a tiny
Llama, Qwen3 or Qwen3-MoE with a LoRA adapter on the projections, its float32 logits
against the engine's (prefill and the decode graphs, CPU host graphs here), before and
after an adapter swap without recapture; after the swap, bitwise equal to a fresh
engine loaded with the new adapter. Bad adapters are refused with the old one served
bit for bit."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import graphkeep

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

PROMPTS = torch.tensor([[3, 17, 42, 5], [9, 1, 77, 20]])
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def base_model(arch, seed=0):
    torch.manual_seed(seed)
    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                  max_position_embeddings=64, attention_bias=False, tie_word_embeddings=False, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)
    if arch == "llama":
        cfg = transformers.LlamaConfig(intermediate_size=96, mlp_bias=False, **common)
        return transformers.LlamaForCausalLM(cfg).float()
    if arch == "qwen3":
        cfg = transformers.Qwen3Config(intermediate_size=96, **common)
        return transformers.Qwen3ForCausalLM(cfg).float()
    cfg = transformers.Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=32, num_experts=4,
                                      num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                                      mlp_only_layers=[], **common)
    return transformers.Qwen3MoeForCausalLM(cfg).float()


def adapter(model, targets, out_dir, seed, rank=4, alpha=8):
    """A PEFT adapter with random A and B (PEFT starts B at zero), saved to out_dir; the
    PEFT model is returned for its logits."""
    cfg = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0)
    pm = peft.get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    pm.save_pretrained(out_dir)
    return pm


def peft_logits(pm, tokens):
    with torch.no_grad():
        return pm(tokens).logits.float()


def engine_logits(eng, tokens):
    """Prefill of every row but its last token, then one decode step of the last tokens
    through the graphs: [B, T, vocab] float32 (the rows' prefill logits and the step's)."""
    B, T = tokens.shape
    out = []
    for b in range(B):
        out.append(eng.prefill(b, tokens[b, :-1]))
    step = eng.decode_logits(tokens[:, -1], torch.full((B,), T - 1, dtype=torch.long))
    return torch.stack([torch.cat([out[b], step[b:b + 1]]) for b in range(B)])


def close(a, b, tol=1e-5):
    d = (a - b).abs()
    return bool(torch.isfinite(d).all()) and float(d.max()) <= tol * max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_adapter_served_and_swapped_equals_peft(tmp_path, arch):
    targets = ATTENTION if arch == "qwen3_moe" else ALL
    model = base_model(arch)
    model.save_pretrained(tmp_path / "base", safe_serialization=True)
    pm1 = adapter(base_model(arch), targets, tmp_path / "a1", seed=1)
    pm2 = adapter(base_model(arch), targets, tmp_path / "a2", seed=2)
    want1, want2 = peft_logits(pm1, PROMPTS), peft_logits(pm2, PROMPTS)
    without = peft_logits(model, PROMPTS)
    assert not close(want1, without)  # the adapter changes the logits (the test is not vacuous)

    eng = graphkeep.LlmEngine(tmp_path / "base", device="cpu", batch_sizes=[2], max_len=16, adapter=tmp_path / "a1")
    got1 = engine_logits(eng, PROMPTS)
    assert close(got1, want1), f"{arch}: max |d| {float((got1 - want1).abs().max()):.3g} against PEFT, adapter 1"

    # The swap: one patch of every A and B, staged while serving, then one commit.
    version = eng.weight_version
    staged = eng.stage_adapter(tmp_path / "a2")
    assert torch.equal(engine_logits(eng, PROMPTS), got1)  # staging changed nothing served
    report = eng.commit(staged)
    assert report.patch.applied and report.patch.layers_rerun == 0 and report.drift == 0
    assert eng.weight_version == version + 1
    got2 = engine_logits(eng, PROMPTS)
    assert close(got2, want2), f"{arch}: max |d| {float((got2 - want2).abs().max()):.3g} against PEFT, adapter 2"
    fresh = graphkeep.LlmEngine(tmp_path / "base", device="cpu", batch_sizes=[2], max_len=16, adapter=tmp_path / "a2")
    assert torch.equal(got2, engine_logits(fresh, PROMPTS))  # bitwise a fresh engine's
    # And back, in one call.
    eng.reload_adapter(tmp_path / "a1")
    assert torch.equal(engine_logits(eng, PROMPTS), got1)


@pytest.mark.parametrize("quant", ["fp8", "w4a16"])
def test_adapter_on_quantized_weights_swaps_to_a_fresh_engines_bits(tmp_path, quant):
    """The adapter is unmerged: on FP8 or W4A16 base weights it adds the same low-rank
    update to the quantized projection's output. Its swap equals a fresh engine loaded
    with the new adapter, bit for bit, and changes what is served."""
    model = base_model("llama")
    model.save_pretrained(tmp_path / "base", safe_serialization=True)
    adapter(base_model("llama"), ALL, tmp_path / "a1", seed=1)
    adapter(base_model("llama"), ALL, tmp_path / "a2", seed=2)
    kw = dict(device="cpu", batch_sizes=[2], max_len=16, quant=quant)
    eng = graphkeep.LlmEngine(tmp_path / "base", adapter=tmp_path / "a1", **kw)
    got1 = engine_logits(eng, PROMPTS)
    plain = engine_logits(graphkeep.LlmEngine(tmp_path / "base", **kw), PROMPTS)
    assert not torch.equal(got1, plain)
    report = eng.reload_adapter(tmp_path / "a2")
    # FP8 and W4A16 layers declare every derived tensor (Note [Declared
    # derivations]): the swap is the adapter's scatter alone, no PWAL.
    assert report.patch.layers_rerun == 0 and report.patch.layers_scattered > 0
    got2 = engine_logits(eng, PROMPTS)
    assert not torch.equal(got2, got1)
    fresh = graphkeep.LlmEngine(tmp_path / "base", adapter=tmp_path / "a2", **kw)
    assert torch.equal(got2, engine_logits(fresh, PROMPTS))


def test_a_trained_adapter_published_as_patches_equals_peft(tmp_path):
    """The RL loop with LoRA: only the adapter trains (AdamW on an LM loss, through PEFT);
    each step the PatchPublisher publishes the adapter's A and B as a patch, staged and
    committed between decode steps; the served logits follow PEFT's within 1e-5 and equal
    a fresh engine loaded with the adapter saved at that step, bit for bit."""
    model = base_model("llama")
    model.save_pretrained(tmp_path / "base", safe_serialization=True)
    pm = adapter(base_model("llama"), ALL, tmp_path / "step0", seed=1)
    eng = graphkeep.LlmEngine(tmp_path / "base", device="cpu", batch_sizes=[2], max_len=16, adapter=tmp_path / "step0")
    pub = graphkeep.PatchPublisher(dtype=None)
    assert pub.publish(graphkeep.adapter_tensors(pm)).full  # what the engine was started with
    opt = torch.optim.AdamW([p for n, p in pm.named_parameters() if "lora_" in n], lr=1e-2)
    g = torch.Generator().manual_seed(5)
    for step in range(1, 3):
        batch = torch.randint(0, 128, (2, 8), generator=g)
        loss = pm(batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        patch = pub.publish(graphkeep.adapter_tensors(pm)).patch
        assert patch is not None and all(".lora_" in e.name for e in patch.entries)
        report = eng.commit(eng.stage(patch))
        assert report.patch.layers_rerun == 0 and eng.served.label == f"step-{step}"
        got = engine_logits(eng, PROMPTS)
        assert close(got, peft_logits(pm, PROMPTS)), f"step {step}: against PEFT"
        pm.save_pretrained(tmp_path / f"step{step}")
        fresh = graphkeep.LlmEngine(tmp_path / "base", device="cpu", batch_sizes=[2], max_len=16,
                                    adapter=tmp_path / f"step{step}")
        assert torch.equal(got, engine_logits(fresh, PROMPTS))
    with pytest.raises(ValueError, match="no lora_A or lora_B"):
        graphkeep.adapter_tensors(model)


def test_bad_adapters_are_refused_and_the_old_one_stays_served(tmp_path):
    model = base_model("llama")
    model.save_pretrained(tmp_path / "base", safe_serialization=True)
    adapter(base_model("llama"), ALL, tmp_path / "good", seed=1)
    eng = graphkeep.LlmEngine(tmp_path / "base", device="cpu", batch_sizes=[2], max_len=16, adapter=tmp_path / "good")
    before = engine_logits(eng, PROMPTS)

    def variant(name, edit_tensors=None, edit_config=None, **make):
        d = tmp_path / name
        if make:
            adapter(base_model("llama"), make.pop("targets", ALL), d, seed=3, **make)
        else:
            shutil.copytree(tmp_path / "good", d)
        if edit_tensors is not None:
            from safetensors.torch import load_file, save_file
            t = load_file(str(d / "adapter_model.safetensors"))
            edit_tensors(t)
            save_file(t, str(d / "adapter_model.safetensors"))
        if edit_config is not None:
            c = json.loads((d / "adapter_config.json").read_text())
            edit_config(c)
            (d / "adapter_config.json").write_text(json.dumps(c))
        return d

    q_a = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    cases = [
        (variant("missing", edit_tensors=lambda t: t.pop(q_a)), r"model\.layers\.0\.self_attn\.q_proj\.lora_A\.weight.*missing"),
        (variant("rank", rank=8), r"rank is 8 but the graphs were captured with rank 4"),
        (variant("targets", targets=["q_proj", "v_proj"]), r"targets q_proj, v_proj but the graphs were captured for"),
        (variant("alien", edit_config=lambda c: c.update(target_modules=["q_proj", "lm_head"])),
         r"target module 'lm_head' is not a projection of the model"),
        (variant("dtype", edit_tensors=lambda t: t.update({q_a: t[q_a].double()})), r"is (Double|Float) but the adapter's other tensors are (Double|Float)"),
        (variant("nan", edit_tensors=lambda t: t[q_a].view(-1).__setitem__(3, float("nan"))), r"non-finite value"),
        (variant("config_rank", edit_config=lambda c: c.update(r=5)), r"adapter_config\.json says r = 5"),
    ]
    truncated = variant("truncated")
    data = (truncated / "adapter_model.safetensors").read_bytes()
    (truncated / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    cases.append((truncated, r"truncated.*adapter_model\.safetensors|adapter_model\.safetensors"))
    for d, msg in cases:
        with pytest.raises(graphkeep.WeightError, match=msg):
            eng.reload_adapter(d)
        assert torch.equal(engine_logits(eng, PROMPTS), before), f"{d.name}: the old adapter is not served bitwise"
    with pytest.raises(graphkeep.WeightError, match="serves no adapter"):
        graphkeep.LlmEngine(tmp_path / "base", device="cpu", batch_sizes=[2], max_len=16).reload_adapter(
            tmp_path / "good")
    # A MoE model's MLP projections are every expert's: refused, naming them.
    moe = base_model("qwen3_moe")
    moe.save_pretrained(tmp_path / "moe", safe_serialization=True)
    adapter(base_model("qwen3_moe"), ALL, tmp_path / "moe_all", seed=4)
    with pytest.raises(graphkeep.WeightError, match=r"every expert's \(model\.layers\.0\.mlp\.experts\.<e>\."):
        graphkeep.LlmEngine(tmp_path / "moe", device="cpu", batch_sizes=[2], max_len=16, adapter=tmp_path / "moe_all")
    with pytest.raises(TypeError, match="adapter must be"):
        graphkeep.LlmEngine(tmp_path / "base", device="cpu", adapter=3)
    # and a good adapter still goes through afterwards
    eng.reload_adapter(variant("next", rank=4))
    assert not torch.equal(engine_logits(eng, PROMPTS), before)
