"""The capture manifest's logic without a GPU: graphkeep.build_manifest classifies a
scan (here a fake one, words pointing into real CPU tensors' storages, laid out as
gk::cuda::scan_graph reports them) against the collector and the memory ranges an
audit reads from the caching allocator; Manifest.verify and graphkeep.guard then
check the owners after reloads that keep the storage (copy_, load_state_dict) and
after reloads that rebind it (.data =, a reallocated workspace). The same code runs
on the GPU inside graphkeep.audit (tests/python/test_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import graphkeep

KERNEL, MEMCPY = 0, 1


class Workspace:
    def __init__(self):
        self.buf = torch.zeros(32, dtype=torch.int32)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8, bias=False)
        self.register_buffer("norm", torch.ones(8))
        self.kernel = Workspace()
        self.w_t = self.lin.weight.t()       # a view of the weight (escaped, same storage)


def ptr(t):
    return t.untyped_storage().data_ptr()


def span(t):
    return (ptr(t), ptr(t) + t.untyped_storage().nbytes())


class FakeScan:
    """Words as scan_graph returns them: one row per (node, param, offset, address)."""

    def __init__(self):
        self.rows = []
        self.names = []
        self.unsupported = []

    def node(self, name):
        self.names.append(name)
        return len(self.names) - 1

    def word(self, node, address, param=0, offset=0, kind=KERNEL):
        self.rows.append((address, node, kind, param, offset))
        return self

    def dict(self):
        cols = list(zip(*self.rows)) if self.rows else [(), (), (), (), ()]
        c = [torch.tensor(x, dtype=torch.long) for x in cols]
        return {"address": c[0], "node": c[1], "kind": c[2], "param": c[3], "offset": c[4],
                "node_names": list(self.names), "nodes": len(self.names),
                "kernel_nodes": len(self.names), "unsupported": list(self.unsupported)}


@pytest.fixture
def rig():
    torch.manual_seed(0)
    m = Layer()
    x_in, y_out = torch.zeros(8), torch.zeros(8)
    pool_mem = torch.empty(256, dtype=torch.uint8)     # stands for the graph's private pool
    lib_mem = torch.empty(64, dtype=torch.uint8)       # a cuBLAS workspace
    raw = torch.empty(64, dtype=torch.uint8)           # memory no model tensor owns
    free = torch.empty(64, dtype=torch.uint8)          # a free allocator block
    s = FakeScan()
    gemm, norm, ws, copy = s.node("gemm_kernel"), s.node("rmsnorm_kernel"), s.node("marlin_kernel"), s.node("memcpy")
    s.word(gemm, ptr(m.lin.weight), param=1).word(gemm, ptr(x_in), param=0).word(gemm, ptr(lib_mem) + 16, param=3)
    s.word(gemm, ptr(pool_mem) + 128, param=2)
    s.word(norm, ptr(m.norm), param=1).word(norm, ptr(pool_mem), param=0)
    s.word(ws, ptr(m.kernel.buf) + 4, param=4, offset=8).word(ws, ptr(m.w_t) + 32, param=1)  # w_t: weight's storage
    s.word(ws, ptr(raw) + 8, param=5).word(ws, ptr(free) + 8, param=5, offset=16)
    s.word(copy, ptr(y_out), param=1, kind=MEMCPY)
    s.word(copy, 0x7FFF_0000_0000, param=0, kind=MEMCPY)   # in no segment: not memory a tensor owns
    segments = [span(t) for t in (m.lin.weight, m.norm, m.kernel.buf, x_in, y_out, pool_mem, lib_mem, raw, free)]
    live = [sp for sp in segments if sp != span(free)]
    r = dict(model=m, x_in=x_in, y_out=y_out, pool=pool_mem, lib=lib_mem, raw=raw, free=free, scan=s,
             segments=segments, live=live, names=dict(gemm=gemm, norm=norm, ws=ws, copy=copy))
    return r


def manifest_of(r, scan=None, **kw):
    args = dict(static_io={"in": r["x_in"], "out": r["y_out"]}, segments=r["segments"], pool=[span(r["pool"])],
                live_blocks=r["live"], library=[span(r["lib"])], graph=0x1234)
    args.update(kw)
    return graphkeep.build_manifest((scan or r["scan"]).dict(), graphkeep.collect(r["model"]), **args)


def test_every_class_against_fake_addresses(rig):
    m = manifest_of(rig)
    assert m.counts() == {"parameter": 2, "buffer": 1, "escaped": 1, "static_io": 2, "pool": 2, "library": 1,
                          "unknown": 1, "unstable": 1}
    assert m.words_scanned == 12 and len(m) == 11       # the word in no segment is dropped
    by = {(e["kernel"], e["param"]): (e["cls"], e["owner"]) for e in m.entries()}
    assert by[("gemm_kernel", 1)] == ("parameter", "lin.weight")
    assert by[("marlin_kernel", 1)] == ("parameter", "lin.weight")   # the view's storage belongs to the weight
    assert by[("rmsnorm_kernel", 1)] == ("buffer", "norm")
    assert by[("marlin_kernel", 4)] == ("escaped", "kernel.buf")
    assert by[("gemm_kernel", 0)] == ("static_io", "in") and by[("memcpy", 1)] == ("static_io", "out")
    assert by[("gemm_kernel", 2)][0] == "pool" and by[("gemm_kernel", 3)][0] == "library"
    assert set(m.paths()) == {"lin.weight", "norm", "kernel.buf"} and m.paths("escaped") == ["kernel.buf"]
    assert m.kernels_reading("lin.weight") == ["gemm_kernel", "marlin_kernel"]
    unknown = m.unknown()
    assert len(unknown) == 1 and f"0x{ptr(rig['raw']) + 8:x}" in unknown[0] and "marlin_kernel" in unknown[0]
    assert not m.clean and m.scan_complete


def test_stale_bytes_without_live_blocks_stay_unknown(rig):
    # Negative: without the allocator's live blocks, the stale word into the free block
    # cannot be told from an address, and is unknown (fail closed).
    m = manifest_of(rig, live_blocks=None)
    assert m.count("unstable") == 0 and m.count("unknown") == 2


def test_confirming_capture_marks_unrepeated_words_unstable(rig):
    other = FakeScan()
    for n in rig["scan"].names:
        other.node(n)
    ws = rig["names"]["ws"]
    # the second capture repeats the raw word at the same kernel, param and offset
    other.word(ws, ptr(rig["raw"]) + 8, param=5)
    m = manifest_of(rig, confirm=other.dict())
    assert m.count("unknown") == 1
    other2 = FakeScan()
    for n in rig["scan"].names:
        other2.node(n)
    other2.word(ws, ptr(rig["raw"]) + 8, param=5, offset=8)  # another byte offset: not repeated
    m2 = manifest_of(rig, confirm=other2.dict())
    assert m2.count("unknown") == 0 and m2.count("unstable") == 2


def clean_scan(r):
    s = FakeScan()
    g, w = s.node("gemm_kernel"), s.node("marlin_kernel")
    s.word(g, ptr(r["model"].lin.weight), param=1).word(g, ptr(r["model"].norm), param=2)
    s.word(w, ptr(r["model"].kernel.buf), param=4).word(w, ptr(r["y_out"]), param=0)
    return s


def test_verify_after_in_place_reload_is_clean(rig):
    m = manifest_of(rig, scan=clean_scan(rig))
    assert m.clean
    model = rig["model"]
    with torch.no_grad():
        model.lin.weight.copy_(torch.randn(8, 8))
        model.kernel.buf.fill_(3)
    r = m.verify(model)
    assert r.ok and r.checked == 4 and r.paths_checked == 3, r.describe()
    assert graphkeep.guard(None, m, model).ok


def test_verify_names_a_parameter_rebound_with_data(rig):
    m = manifest_of(rig, scan=clean_scan(rig))
    model = rig["model"]
    model.lin.weight.data = torch.randn(8, 8)         # what a naive reload does
    r = m.verify(model)
    assert not r.ok
    assert [(i.kind, i.path) for i in r.issues] == [("moved", "lin.weight")]   # w_t keeps the old storage alive
    assert r.issues[0].kernels == ["gemm_kernel"]
    with pytest.raises(graphkeep.DriftError, match=r"(?s)replay refused: .*moved: lin\.weight .*gemm_kernel") as e:
        graphkeep.guard(None, m, model)
    assert e.value.result.stale_paths() == ["lin.weight"]
    assert isinstance(e.value, graphkeep.Error) and str(e.value).startswith("graphkeep: replay refused")


def test_verify_names_a_reallocated_workspace_as_expired(rig):
    m = manifest_of(rig, scan=clean_scan(rig))
    model = rig["model"]
    model.kernel.buf = torch.zeros(32, dtype=torch.int32)   # PWAL reallocates; the old one is freed
    r = m.verify(model)
    assert [(i.kind, i.path) for i in r.issues] == [("expired", "kernel.buf")]
    assert "freed" in r.issues[0].detail and r.issues[0].kernels == ["marlin_kernel"]


def test_verify_layout_and_missing(rig):
    m = manifest_of(rig, scan=clean_scan(rig))
    model = rig["model"]
    model.lin.weight.data = model.lin.weight.data.t()      # same storage, another stride
    del model.kernel
    r = m.verify(model)
    kinds = {i.path: i.kind for i in r.issues}
    assert kinds == {"lin.weight": "layout", "kernel.buf": "expired"}
    assert "stride (8, 1) -> (1, 8)" in next(i.detail for i in r.issues if i.path == "lin.weight")


def test_guard_refuses_unknown_addresses_and_incomplete_scans(rig):
    m = manifest_of(rig)                    # one unknown address
    with pytest.raises(graphkeep.DriftError, match="unknown: 0x"):
        graphkeep.guard(None, m, rig["model"])
    s = clean_scan(rig)
    s.unsupported.append("node 7 (conditional): body graphs not readable")
    m2 = manifest_of(rig, scan=s)
    assert m2.verify(rig["model"]).ok and not m2.clean
    with pytest.raises(graphkeep.DriftError, match="could not read 1 node"):
        graphkeep.guard(None, m2, rig["model"])
    with pytest.raises(graphkeep.StateError, match="not of this graph"):
        graphkeep.guard(0x9999, m2, rig["model"])


def test_shared_collection_between_manifests(rig):
    m1 = manifest_of(rig, scan=clean_scan(rig))
    m2 = manifest_of(rig, scan=clean_scan(rig))
    rig["model"].lin.weight.data = torch.randn(8, 8)
    walk = graphkeep.collect(rig["model"])
    assert [i.path for i in m1.verify(walk).issues] == [i.path for i in m2.verify(walk).issues] == ["lin.weight"]


def test_static_io_must_be_tensors(rig):
    with pytest.raises(TypeError, match="static_io 'x' is a int"):
        manifest_of(rig, static_io={"x": 3})


def test_transformers_llama_reloads():
    """A real model: a fake graph that reads every parameter and buffer of a
    transformers Llama. torch's own loader (load_state_dict copies in place) keeps it
    valid; load_state_dict(assign=True) and .data = rebind, and verify names exactly
    the parameters rebound."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = transformers.LlamaForCausalLM(cfg)
    s = FakeScan()
    c = graphkeep.collect(model)
    for rec in c.tensors:
        s.word(s.node(f"kernel_reading_{rec.path}"), rec.storage_ptr, param=1)
    segs = [(r.storage_ptr, r.storage_ptr + r.storage_nbytes) for r in c.tensors]
    m = graphkeep.build_manifest(s.dict(), c, segments=segs, live_blocks=segs)
    del c
    assert m.clean and m.count("parameter") == len(list(model.parameters()))
    new = transformers.LlamaForCausalLM(cfg).state_dict()
    model.load_state_dict(new)
    assert m.verify(model).ok
    model.model.layers[1].mlp.down_proj.weight.data = new["model.layers.1.mlp.down_proj.weight"].clone()
    r = m.verify(model)
    assert [(i.kind, i.path) for i in r.issues] == [("expired", "model.layers.1.mlp.down_proj.weight")]
    assert r.issues[0].kernels == ["kernel_reading_model.layers.1.mlp.down_proj.weight"]
    model.load_state_dict(transformers.LlamaForCausalLM(cfg).state_dict(), assign=True)
    stale = set(m.verify(model).stale_paths())
    assert stale == {n for n, _ in model.named_parameters()}


def graph_reading_everything(model):
    """A fake capture of `model` whose kernels read every tensor it reaches."""
    c = graphkeep.collect(model)
    s = FakeScan()
    for rec in c.tensors:
        s.word(s.node(f"kernel_reading_{rec.path}"), rec.storage_ptr + 4, param=1, offset=8)
    segs = [(r.storage_ptr, r.storage_ptr + r.storage_nbytes) for r in c.tensors]
    return graphkeep.build_manifest(s.dict(), c, segments=segs, live_blocks=segs)


def test_vllm_like_layer_names_the_reallocated_workspace():
    import vllm_like
    model = vllm_like.VllmLikeModel()
    vllm_like.load(model, vllm_like.checkpoint(seed=0))
    m = graph_reading_everything(model)
    assert m.clean
    assert set(m.paths("escaped")) == {"layers.0.quant_method.workspace", "layers.1.quant_method.workspace"}
    # vLLM's reload: PWAL reallocates the int8 weight, the scale and the workspace
    vllm_like.load(model, vllm_like.checkpoint(seed=1))
    r = m.verify(model)
    assert {(i.path, i.kind) for i in r.issues} == {
        (f"layers.{k}.{n}", "expired") for k in (0, 1) for n in ("weight", "weight_scale", "quant_method.workspace")}
    with pytest.raises(graphkeep.DriftError, match=r"layers\.0\.quant_method\.workspace"):
        graphkeep.guard(None, m, model)


def test_vllm_like_layer_in_place_reload_is_clean_and_correct():
    import vllm_like
    model = vllm_like.VllmLikeModel()
    vllm_like.load(model, vllm_like.checkpoint(seed=0))
    m = graph_reading_everything(model)
    new = vllm_like.checkpoint(seed=1)
    vllm_like.reload_in_place(model, new)
    assert graphkeep.guard(None, m, model).ok
    fresh = vllm_like.VllmLikeModel()
    vllm_like.load(fresh, new)
    x = torch.randn(3, 64)
    assert torch.equal(model(x), fresh(x))
