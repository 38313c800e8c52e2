"""graphkeep.audit and guard on real CUDA graphs (marked gpu: skipped without a CUDA
device or without graphkeep's CUDA parts). Run on the GPU machine with
scripts/gpu-python.sh.

(a) A transformers Llama captured with torch.cuda.graph: the manifest is clean and
    names every parameter; after an in-place reload (load_state_dict copies) guard
    passes and the replay equals an eager forward of the new weights; after one
    parameter is rebound with .data =, the audit names exactly it, guard refuses,
    and replaying anyway gives wrong logits (the bug is real).
(b) The vLLM-like layer (tests/python/vllm_like.py), whose PWAL reallocates its
    int8 weight, scale and workspace: the audit names the workspace's path and
    guard refuses; graphkeep's in-place reload keeps it clean and correct."""

from __future__ import annotations

import pytest
import torch

import graphkeep

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not graphkeep.with_cuda, reason="graphkeep was built without its CUDA parts"),
]


def capture(fn, pool=None):
    """torch.cuda.graph with keep_graph=True (the audit reads the kept graph), after a
    warm-up on a side stream as torch's docs ask."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.no_grad(), torch.cuda.graph(g, pool=pool):
        out = fn()
    g.instantiate()
    torch.cuda.synchronize()
    return g, out


@pytest.fixture
def llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=128, rope_scaling=None, tie_word_embeddings=False)
    make = lambda: transformers.LlamaForCausalLM(cfg).to("cuda").eval()  # noqa: E731
    return make


def test_llama_audit_clean_after_copy_reload_and_names_rebound_parameter(llama):
    model = llama()
    ids = torch.randint(0, 512, (2, 16), device="cuda")
    fwd = lambda: model(input_ids=ids, use_cache=False).logits  # noqa: E731
    g, out = capture(fwd)
    g2, _ = capture(fwd)        # a second capture of the same forward, to confirm raw words
    m = graphkeep.audit(g, model, static_io={"input_ids": ids, "logits": out}, confirm_with=g2)
    print(m.describe())
    assert m.clean, m.describe()
    assert set(m.paths("parameter")) == {n for n, _ in model.named_parameters()}, m.describe()
    assert m.nodes > 0 and m.kernel_nodes > 0 and m.count("pool") > 0

    # in-place reload (torch's own loader copies into the parameters)
    new = llama().state_dict()
    model.load_state_dict(new)
    assert graphkeep.guard(g, m, model).ok
    g.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        eager = fwd()
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)

    # rebinding one parameter: the graph still reads the old tensor
    name = "model.layers.1.mlp.down_proj.weight"
    model.get_parameter(name).data = new[name].clone() * 2
    r = m.verify(model)
    assert r.stale_paths() == [name], r.describe()
    assert r.issues[0].kernels, "the issue must name the kernels that read it"
    with pytest.raises(graphkeep.DriftError, match=name.replace(".", r"\.")):
        graphkeep.guard(g, m, model)
    g.replay()                  # what happens without the guard
    torch.cuda.synchronize()
    with torch.no_grad():
        eager = fwd()
    assert not torch.allclose(out, eager, rtol=1e-3, atol=1e-3), "replay read the new weight: the test shows nothing"


def test_vllm_like_layer_audit_names_the_workspace_and_guard_refuses():
    import vllm_like
    dims = (256, 512, 256)
    model = vllm_like.VllmLikeModel(dims, device="cuda")
    vllm_like.load(model, vllm_like.checkpoint(dims, seed=0, device="cuda"))
    x = torch.randn(8, 256, device="cuda")
    g, out = capture(lambda: model(x))
    m = graphkeep.audit(g, model, static_io={"x": x, "out": out})
    print(m.describe())
    assert m.clean, m.describe()
    ws = {"layers.0.quant_method.workspace", "layers.1.quant_method.workspace"}
    assert set(m.paths("escaped")) == ws

    # vLLM's reload: PWAL reallocates weight, scale and workspace
    new = vllm_like.checkpoint(dims, seed=1, device="cuda")
    vllm_like.load(model, new)
    r = m.verify(model)
    assert ws <= set(r.stale_paths()), r.describe()
    with pytest.raises(graphkeep.DriftError, match=r"layers\.0\.quant_method\.workspace"):
        graphkeep.guard(g, m, model)

    # graphkeep's way on a fresh capture: copy into the captured tensors
    model2 = vllm_like.VllmLikeModel(dims, device="cuda")
    vllm_like.load(model2, vllm_like.checkpoint(dims, seed=0, device="cuda"))
    g2, out2 = capture(lambda: model2(x))
    m2 = graphkeep.audit(g2, model2, static_io={"x": x, "out": out2})
    vllm_like.reload_in_place(model2, new)
    assert graphkeep.guard(g2, m2, model2).ok
    g2.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        eager = model(x)        # model holds the same new weights, loaded the vLLM way
    torch.testing.assert_close(out2, eager, rtol=1e-5, atol=1e-5)


def test_scan_of_an_empty_handle_is_an_error():
    with pytest.raises(graphkeep.StateError):
        graphkeep.scan(0)


def test_engine_on_cuda_adopts_the_trainers_device_tensors(tmp_path):
    """The GRPO-like hand-over on the GPU: the trainer's CUDA tensors are adopted by
    stage() (no load copy) and the tokens served after commit, through CUDA graphs,
    equal a fresh engine's built from the same tensors."""
    from test_engine import PROMPTS, NEW_TOKENS, make_policy, weights_of
    model = make_policy().to("cuda")
    model.save_pretrained(tmp_path / "step0", safe_serialization=True)
    eng = graphkeep.LlmEngine(tmp_path / "step0", quant="fp8", device="cuda", batch_sizes=[1, 2, 4], max_len=32,
                              adopt_source_tensors=True)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2)
    for step in range(1, 3):
        loss = model(PROMPTS.cuda(), labels=PROMPTS.cuda()).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        weights = weights_of(model)
        staged = eng.stage(weights)
        assert staged.report.tensors_adopted > 0
        report = eng.commit(staged)
        assert report.weight_version == step and report.drift == 0 and report.addresses_verified > 0
        fresh = graphkeep.LlmEngine(tmp_path / "step0", quant="fp8", device="cuda", batch_sizes=[4], max_len=32,
                                    weights={n: t.clone() for n, t in weights.items()})
        assert torch.equal(eng.generate(PROMPTS, NEW_TOKENS), fresh.generate(PROMPTS, NEW_TOKENS))
