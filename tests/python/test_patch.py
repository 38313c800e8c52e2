"""Weight patches from Python (graphkeep/patch.py): make_patch, files, content hashes,
the trainer-side PatchPublisher, and an RL loop that publishes a patch every step.

Oracles: the content hash is computed again from its definition in plain Python integers
(docs/delta.md), whose splitmix64 outputs are checked against their published values; a patch is applied in plain PyTorch (index assignment) and must
give the target bit for bit; patch files are read back with the `safetensors` package;
the served tokens after each patch equal a fresh engine built from the published
weights (bitwise: same code, same weights)."""

from __future__ import annotations

import pytest
import torch

import graphkeep

safetensors_torch = pytest.importorskip("safetensors.torch")

BLOCK = 64 * 1024
MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def ref_content_hash(t: torch.Tensor) -> int:
    """gk-sum64 v1 (docs/delta.md), from its definition, one word at a time."""
    t = t.contiguous()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    h = _mix(len(data) ^ 0x27D4EB2F165667C5)
    for j in range(0, len(data), 8):
        w = int.from_bytes(data[j:j + 8], "little")
        h = (h + _mix((w + (j // 8 + 1) * 0x9E3779B97F4A7C15) & MASK)) & MASK
    return h


def applied(before: dict, patch) -> dict:
    """The patch applied in plain PyTorch."""
    out = {n: t.clone() for n, t in before.items()}
    for e in patch.entries:
        flat = out[e.name].view(-1)
        if e.encoding == "dense":
            flat.copy_(e.values.reshape(-1))
        else:
            flat[e.indices.long()] = e.values
    return out


def bits(t: torch.Tensor) -> bytes:
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def test_content_hash_is_the_documented_function():
    # splitmix64's first outputs from state 0 (published values) are the terms of zero words
    published = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC]
    assert [_mix((j + 1) * 0x9E3779B97F4A7C15 & MASK) for j in range(4)] == published
    assert graphkeep.content_hash(torch.zeros(32, dtype=torch.uint8)) == \
        (_mix(32 ^ 0x27D4EB2F165667C5) + sum(published)) & MASK
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int8):
        for n in (0, 1, 7, BLOCK // 2 + 3, BLOCK + 1):
            t = (torch.randn(n, generator=g) * 50).to(dtype)
            assert graphkeep.content_hash(t) == ref_content_hash(t), (dtype, n)
    # a non-contiguous view hashes as its row-major elements
    m = torch.randn(64, 33, generator=g)
    assert graphkeep.content_hash(m.t()) == ref_content_hash(m.t().contiguous())
    with pytest.raises(TypeError, match="tensor must be a torch.Tensor"):
        graphkeep.content_hash([1.0])


def test_make_patch_save_read_and_apply_bitwise(tmp_path):
    g = torch.Generator().manual_seed(1)
    before = {"a.weight": torch.randn(40, 24, generator=g).bfloat16(), "b.bias": torch.randn(24, generator=g),
              "c.same": torch.randn(8, generator=g)}
    after = {n: t.clone() for n, t in before.items()}
    after["a.weight"].view(-1)[torch.randperm(960, generator=g)[:20]] += 1
    after["b.bias"].add_(0.5)  # every element: a dense entry
    p = graphkeep.make_patch(before, after, base_id="v0", target_id="v1")
    assert (p.base_version, p.target_version) == ("v0", "v1")
    assert [e.name for e in p.entries] == ["a.weight", "b.bias"]  # c.same unchanged: no entry
    a, b = p.find("a.weight"), p.find("b.bias")
    assert a.encoding == "sparse" and a.count == 20 and a.indices is not None
    assert b.encoding == "dense" and b.indices is None
    assert p.find("c.same") is None
    for e in p.entries:
        assert e.base_hash == ref_content_hash(before[e.name])
        assert e.target_hash == ref_content_hash(after[e.name])
    got = applied(before, p)
    assert all(bits(got[n]) == bits(after[n]) for n in after)
    # every unchanged tensor recorded too, so that applying checks its base
    full = graphkeep.make_patch(before, after, record_unchanged=True)
    assert full.find("c.same") is not None and full.find("c.same").count == 0
    # the file: read back by the safetensors package and by graphkeep
    path = tmp_path / "v0-v1.safetensors"
    p.save(str(path))
    raw = safetensors_torch.load_file(str(path))
    assert any("a.weight" in k for k in raw), sorted(raw)
    q = graphkeep.read_patch(path)
    assert (q.base_version, q.target_version, len(q)) == ("v0", "v1", 2)
    assert str(path) in q.label
    assert all(bits(applied(before, q)[n]) == bits(after[n]) for n in after)
    assert q.to("cpu").payload_bytes == q.to(torch.device("cpu")).payload_bytes == p.payload_bytes
    with pytest.raises(ValueError, match="device: 'gpu0' is not a device"):
        q.to("gpu0")


def test_make_patch_refuses_bad_arguments_naming_them(tmp_path):
    x = {"w": torch.zeros(4)}
    with pytest.raises(TypeError, match="before must be a dict"):
        graphkeep.make_patch([1], x)
    with pytest.raises(TypeError, match=r"after\['w'\] is a int, not a torch.Tensor"):
        graphkeep.make_patch(x, {"w": 3})
    with pytest.raises(TypeError, match="before: names must be str"):
        graphkeep.make_patch({1: torch.zeros(4)}, x)
    with pytest.raises(ValueError, match="encoding must be"):
        graphkeep.make_patch(x, x, encoding="zip")
    with pytest.raises(TypeError, match="target_id must be a str"):
        graphkeep.make_patch(x, x, target_id=3)
    with pytest.raises(graphkeep.WeightError, match="'w'"):
        graphkeep.make_patch(x, {"w": torch.zeros(5)})
    with pytest.raises(TypeError, match="path must be"):
        graphkeep.read_patch(3)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a patch")
    with pytest.raises(graphkeep.WeightError, match="bad.safetensors"):
        graphkeep.read_patch(bad)
    with pytest.raises(ValueError, match="keep must be"):
        graphkeep.PatchPublisher(keep="disk")


def test_publisher_rounds_fp32_masters_to_the_served_dtype():
    g = torch.Generator().manual_seed(2)
    master = {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g)}
    for keep in ("device", "host"):
        pub = graphkeep.PatchPublisher(torch.bfloat16, keep=keep)
        first = pub.publish(master)
        assert first.full and first.version == "step-0" and first.patch is None
        assert all(t.dtype == torch.bfloat16 for t in first.weights.values())
        assert pub.kept_bytes == sum(t.numel() * 2 for t in master.values())
        served = dict(first.weights)
        step = {n: t + 1e-3 * torch.randn(t.shape, generator=g) for n, t in master.items()}
        second = pub.publish(step)
        assert not second.full and second.version == "step-1"
        assert (second.patch.base_version, second.patch.target_version) == ("step-0", "step-1")
        # the patch takes the served bf16 weights to the rounding of the new masters, bit for bit
        got = applied(served, second.patch)
        assert all(bits(got[n]) == bits(step[n].bfloat16()) for n in step)
        # a small step changes only some bf16 elements: the patch is sparse
        assert 0 < sum(e.count for e in second.patch.entries) < sum(t.numel() for t in master.values())
        assert pub.publish(step, full=True).full
        with pytest.raises(graphkeep.WeightError):
            pub.publish({"w": step["w"]})  # a tensor missing
        assert pub.version == "step-2"  # the refused publication changed nothing
        # A chain: the kept copy follows each patch (written in place on the device, a
        # clone on the host), so the next patch's base is the last publication ...
        third = {n: t + 1e-3 * torch.randn(t.shape, generator=g) for n, t in step.items()}
        got3 = applied({n: t.bfloat16() for n, t in step.items()}, pub.publish(third).patch)
        assert all(bits(got3[n]) == bits(third[n].bfloat16()) for n in third)
        fourth = {n: t + 1e-3 * torch.randn(t.shape, generator=g) for n, t in third.items()}
        got4 = applied(got3, pub.publish(fourth).patch)  # (its base: the rounding kept as it was made)
        assert all(bits(got4[n]) == bits(fourth[n].bfloat16()) for n in fourth)
        third = fourth
        # ... and never the trainer's own tensors: weights already in the served dtype are
        # published as they are, then trained in place; the next patch still starts from
        # what was published.
        live = {n: t.bfloat16() for n, t in third.items()}
        published = {n: t.clone() for n, t in live.items()}
        pub.publish(live)
        for t in live.values():
            t.add_(0.25)
        got5 = applied(published, pub.publish(live).patch)
        assert all(bits(got5[n]) == bits(live[n]) for n in live)


transformers = pytest.importorskip("transformers")
PROMPTS = torch.tensor([[3, 17, 42, 5], [9, 1, 77, 200]])
NEW_TOKENS = 5


def tiny_llama(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu",
                                   rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
                                   max_position_embeddings=256, attention_bias=False, mlp_bias=False,
                                   tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return transformers.LlamaForCausalLM(cfg).float()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("quant", ["dense", "fp8"])
def test_rl_loop_publishes_a_patch_each_step(tmp_path, quant, device):
    """fp32 masters trained with AdamW on an LM loss; the engine serves bf16. Each step
    publishes a patch, staged and committed between decode steps; the served tokens
    equal a fresh engine's on the published weights. A patch corrupted in transit is
    refused with the old weights served, and the intact one then applies. On CUDA the
    trainer, the publisher's kept weights and the engine's graphs are on the device."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    model = tiny_llama()
    model.to(torch.bfloat16).save_pretrained(tmp_path / "step0", safe_serialization=True)
    model.float().to(device)
    pub = graphkeep.PatchPublisher(torch.bfloat16)
    first = pub.publish(model)

    def engine(weights):
        return graphkeep.LlmEngine(tmp_path / "step0", quant=quant, device=device, weights=weights,
                                   batch_sizes=[1, 2], max_len=16)

    eng = engine(first.weights)
    assert eng.served is not None and len(eng.served.hashes) == len(first.weights)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(3)
    served = eng.generate(PROMPTS, NEW_TOKENS)
    changed = False
    for step in range(1, 4):
        batch = torch.randint(0, 256, (4, 12), generator=g).to(device)
        loss = model(batch, labels=batch).loss
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        publication = pub.publish(model)
        patch = publication.patch
        assert patch is not None and patch.target_version == f"step-{step}"
        if step == 2:  # corrupted in transit: one value byte flipped in the file
            path = tmp_path / "p.safetensors"
            patch.save(str(path))
            data = bytearray(path.read_bytes())
            data[-3] ^= 0x40
            path.write_bytes(bytes(data))
            with pytest.raises(graphkeep.WeightError) as err:
                eng.commit(eng.stage(graphkeep.read_patch(path)))
            assert "p.safetensors" in str(err.value)
            assert torch.equal(eng.generate(PROMPTS, NEW_TOKENS), served)  # the old weights, still served
        staged = eng.stage(patch)
        assert torch.equal(eng.generate(PROMPTS, NEW_TOKENS), served)  # decoding between stage and commit
        report = eng.commit(staged)
        assert report.patch.applied and report.patch.layers_rerun == 0
        assert report.patch.tensors == len(patch)
        assert (report.patch.blocks_recomputed > 0) == (quant == "fp8")
        # Per layer: every touched layer took the scatter; the FP8 rows were
        # recomputed in the attention and MLP layers, nowhere else.
        landings = report.patch.landings
        assert landings and not any(l.rerun or l.why for l in landings)
        assert sum(l.blocks_recomputed for l in landings) == report.patch.blocks_recomputed
        assert all(l.blocks_recomputed == 0 for l in landings if not l.layer.endswith(("self_attn", "mlp")))
        assert eng.served.label == f"step-{step}"
        got = eng.generate(PROMPTS, NEW_TOKENS)
        fresh = engine(publication_weights(pub, model)).generate(PROMPTS, NEW_TOKENS)
        assert torch.equal(got, fresh), f"step {step}: served tokens differ from a fresh engine"
        changed = changed or not torch.equal(got, served)
        served = got
    assert changed  # the updates changed what is served


def publication_weights(pub, model):
    """What a full publication of the model now would hand over (the same rounding)."""
    return {n: t.detach().to(pub.dtype).contiguous() for n, t in model.state_dict().items()}


def test_the_patch_time_bench_runs_and_its_patches_hold_what_changed(tmp_path):
    """tests/python/bench_patch_time.py (run at 8B on the GPU machine) at tiny shapes on
    the CPU: it asserts that each patch it times holds exactly the changed elements."""
    import json
    import pathlib
    import subprocess
    import sys
    script = pathlib.Path(__file__).with_name("bench_patch_time.py")
    out = tmp_path / "t.json"
    subprocess.run([sys.executable, str(script), "--cpu-check", "--reps", "1", "--out", str(out)], check=True,
                   cwd=tmp_path, capture_output=True, timeout=300)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["what"] for r in rows] == ["make_patch", "publish"]
    assert all(r["changed_elements"] > 0 and r["ms"] > 0 and r["tensors"] == 21 for r in rows)
