"""graphkeep.audit_compiled and guard_compiled: the CUDA graph trees of
torch.compile(mode="reduce-overhead").

Without a GPU: the hooks install and come off cleanly, the refusals (no tree on
this thread, freezing) say what to do, and the guard's verdicts (superseded:
PyTorch records again; stale: PyTorch would replay it) are told apart on a fake
tree whose graphs are hand-made scans (graphkeep.build_manifest, as in
test_audit_cpu.py).

On the GPU (marked gpu; `bash scripts/gpu.sh python`):
(a) a transformers Llama compiled with reduce-overhead: every recorded graph is
    readable, the audit names every parameter; a reload by copy_ is clean and the
    outputs follow the new weights; a .data rebind is named by module path and
    reported superseded, and PyTorch records the function again (the tree grows);
(b) a layer whose opaque custom op reads a workspace that a reload rebuilds:
    PyTorch replays the old workspace silently (the bug is real), the guard
    refuses it as stale, naming the workspace's path;
(c) a tree recorded without keep_compiled_graphs, and an audit from another
    thread, are refused with messages that say how to record or where to call."""

from __future__ import annotations

import threading
import types

import pytest
import torch
from torch import nn

import graphkeep
from graphkeep import compiled as gkc

from test_audit_cpu import FakeScan, span

def gpu(test):
    """Marks a test gpu and skips it without a CUDA device or graphkeep's CUDA parts."""
    for mark in (pytest.mark.gpu,
                 pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
                 pytest.mark.skipif(not graphkeep.with_cuda, reason="graphkeep was built without its CUDA parts")):
        test = mark(test)
    return test


# --- without a GPU -----------------------------------------------------------------------


def test_keep_compiled_graphs_installs_once_and_comes_off():
    from torch._inductor import cudagraph_trees as trees
    base, record = torch.cuda.CUDAGraph, trees.CUDAGraphTreeManager.record_function
    try:
        graphkeep.keep_compiled_graphs()
        kept = torch.cuda.CUDAGraph
        assert kept is not base and issubclass(kept, base), "the graph class must stay a torch.cuda.CUDAGraph"
        assert trees.CUDAGraphTreeManager.record_function is not record
        assert trees.CUDAGraphTreeManager.record_function.__wrapped__ is record
        graphkeep.keep_compiled_graphs()  # idempotent: no second wrapper
        assert torch.cuda.CUDAGraph is kept
        assert trees.CUDAGraphTreeManager.record_function.__wrapped__ is record
    finally:
        graphkeep.keep_compiled_graphs(False)
    assert torch.cuda.CUDAGraph is base and trees.CUDAGraphTreeManager.record_function is record


def test_audit_compiled_without_a_tree_says_where_and_when():
    done = {}

    def other():
        try:
            graphkeep.audit_compiled(nn.Linear(2, 2), device=0)
        except graphkeep.StateError as e:
            done["msg"] = str(e)

    t = threading.Thread(target=other)  # a fresh thread has no tree of its own
    t.start()
    t.join()
    assert "thread-local" in done["msg"] and "second call" in done["msg"], done


def test_audit_compiled_refuses_freezing(monkeypatch):
    from torch._inductor import config
    monkeypatch.setattr(config, "freezing", True)
    with pytest.raises(graphkeep.StateError, match="freezing is on.*no reload reaches"):
        graphkeep.audit_compiled(nn.Linear(2, 2), device=0)


class OpaqueLayer(nn.Module):
    """A parameter (an input of the compiled graph) and a derived workspace that an
    opaque op reads (not an input)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))
        self.workspace = torch.zeros(16)


class FakeNode(types.SimpleNamespace):
    """A tree node (the guard keeps weak references to them)."""

    __hash__ = object.__hash__


def _fake_tree(monkeypatch, layer):
    """One recorded node reading the weight (a static input) and the workspace, as the
    scan would report them; audit() is replaced by build_manifest over that scan."""
    s = FakeScan()
    n = s.node("gemm")
    s.word(n, span(layer.weight)[0]).word(n, span(layer.workspace)[0] + 8, param=1)
    scan = s.dict()

    def fake_audit(graph, model, static_io=None, *, device=None, collection=None, **_):
        segs = [span(layer.weight), span(layer.workspace)]
        return graphkeep.build_manifest(scan, collection, static_io=static_io, segments=segs, graph=1)

    node = FakeNode(
        graph=types.SimpleNamespace(raw_cuda_graph=lambda: 1, _graphkeep_kept=True), id=types.SimpleNamespace(id=0), children={},
        wrapped_function=types.SimpleNamespace(model=types.SimpleNamespace(__name__="fn0"), constants=(),
                                               placeholders=(types.SimpleNamespace(name="l_self_weight"),)),
        static_input_data_ptrs=[layer.weight.data_ptr()], reconstructed_inputs=[])
    manager = types.SimpleNamespace(roots={0: [node]}, get_roots=lambda: iter([node]))
    monkeypatch.setattr(gkc, "audit", fake_audit)
    from torch._inductor import cudagraph_trees as trees
    monkeypatch.setattr(trees, "get_manager", lambda device, create_if_none_exists=True: manager)
    return node, manager


def test_guard_compiled_tells_superseded_from_stale(monkeypatch):
    layer = OpaqueLayer()
    _fake_tree(monkeypatch, layer)
    a = graphkeep.audit_compiled(layer, device=0)
    assert a.paths() == ["weight", "workspace"] and a.graphs[0].static_inputs == {layer.weight.data_ptr():
                                                                                  "l_self_weight"}
    # a reload into the captured storages: clean
    with torch.no_grad():
        layer.weight.copy_(torch.randn(8, 8))
        layer.workspace.copy_(torch.randn(16))
    assert graphkeep.guard_compiled(a, layer) == []
    # the workspace rebuilt at a new address: PyTorch would replay it (stale)
    old_ws = layer.workspace
    layer.workspace = torch.randn(16)
    with pytest.raises(graphkeep.DriftError) as e:
        graphkeep.guard_compiled(a, layer)
    assert [(i.verdict, i.issue.path) for i in e.value.issues] == [("stale", "workspace")]
    assert e.value.result is not None and e.value.result.stale_paths() == ["workspace"]
    assert "would replay the old memory" in str(e.value) and "superseded" not in str(e.value)
    # and the weight rebound (.data =): PyTorch records again (superseded)
    layer.workspace = old_ws
    old_w = layer.weight.data
    layer.weight.data = torch.randn(8, 8)
    with pytest.raises(graphkeep.DriftError) as e:
        graphkeep.guard_compiled(a, layer)
    assert [(i.verdict, i.issue.path) for i in e.value.issues] == [("superseded", "weight")]
    assert "records the function again" in str(e.value) and "p.copy_(new)" in str(e.value)
    del old_w


def test_guard_compiled_refuses_another_thread(monkeypatch):
    layer = OpaqueLayer()
    _fake_tree(monkeypatch, layer)
    a = graphkeep.audit_compiled(layer, device=0)
    assert graphkeep.guard_compiled(a, layer) == []
    err = []

    def other():
        try:
            graphkeep.guard_compiled(a, layer)
        except graphkeep.StateError as e:
            err.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert err and "thread-local" in err[0], err


def test_audit_compiled_refuses_a_graph_not_kept(monkeypatch):
    layer = OpaqueLayer()
    node, _ = _fake_tree(monkeypatch, layer)

    node.graph = types.SimpleNamespace(raw_cuda_graph=lambda: 1)  # a plain CUDAGraph: not made kept
    with pytest.raises(graphkeep.StateError, match=r"without keep_graph.*keep_compiled_graphs\(\).*reset_cudagraph"):
        graphkeep.audit_compiled(layer, device=0)


# --- on the GPU --------------------------------------------------------------------------

_WS: dict[int, torch.Tensor] = {}


@torch.library.custom_op("graphkeep_test::ws_mm", mutates_args=())
def ws_mm(x: torch.Tensor, key: int) -> torch.Tensor:
    """An opaque op that reads a workspace it finds by key: the workspace is no input
    of the compiled graph (a quantization kernel's cached pointer, in miniature)."""
    return x @ _WS[key]


@ws_mm.register_fake
def _(x, key):
    return x.new_empty(x.shape[0], _WS[key].shape[1])


class WsLinear(nn.Module):
    def __init__(self, n: int, key: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n, device="cuda") / n ** 0.5)
        self.key = key
        self.pwal()

    def pwal(self):
        """process_weights_after_loading: a derived workspace at a new address."""
        self.workspace = (self.weight.detach().t() * 2).contiguous()
        _WS[self.key] = self.workspace

    def forward(self, x):
        return nn.functional.linear(x, self.weight) + torch.ops.graphkeep_test.ws_mm(x, self.key)


@pytest.fixture
def kept_trees():
    torch._dynamo.reset()
    graphkeep.keep_compiled_graphs()
    yield
    graphkeep.keep_compiled_graphs(False)
    torch._dynamo.reset()


def _tree_size(device=0):
    return len(list(gkc._nodes(gkc._manager(device, who="test"))))


@gpu
@pytest.mark.usefixtures("kept_trees")
def test_compiled_llama_audit_copy_reload_clean_and_rebind_superseded():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=64, tie_word_embeddings=False)
    make = lambda: transformers.LlamaForCausalLM(cfg).to("cuda").eval()  # noqa: E731
    model = make()
    ids = torch.randint(0, 256, (2, 8), device="cuda")
    fn = torch.compile(lambda i: model(input_ids=i, use_cache=False).logits, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            fn(ids)
    a = graphkeep.audit_compiled(model)
    print(a.describe())
    assert a.graphs and all(g.manifest.kernel_nodes > 0 for g in a.graphs)
    assert set(a.paths("parameter")) == {n for n, _ in model.named_parameters()}, a.describe()
    assert a.clean, a.describe()

    # a reload by copy_ (load_state_dict): clean, and the outputs follow the new weights
    model.load_state_dict(make().state_dict())
    assert graphkeep.guard_compiled(a, model) == []
    with torch.no_grad():
        got = fn(ids).clone()
        eager = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, eager, rtol=2e-3, atol=2e-3)

    # a .data rebind: named by module path, superseded; PyTorch records again
    name = "model.layers.1.mlp.down_proj.weight"
    before = _tree_size()
    model.get_parameter(name).data = model.get_parameter(name).data.clone() * 2
    with pytest.raises(graphkeep.DriftError, match=name.replace(".", r"\.")) as e:
        graphkeep.guard_compiled(a, model)
    assert {(i.verdict, i.issue.path) for i in e.value.issues} == {("superseded", name)}, str(e.value)
    with torch.no_grad():
        for _ in range(2):
            got = fn(ids).clone()
        eager = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, eager, rtol=2e-3, atol=2e-3)
    assert _tree_size() > before, "PyTorch was expected to record the function again"
    # the new recording is audited by the next guard; the old one still reads the old tensor
    with pytest.raises(graphkeep.DriftError, match="superseded"):
        graphkeep.guard_compiled(a, model)
    assert len(a.graphs) == _tree_size()


@gpu
@pytest.mark.usefixtures("kept_trees")
def test_compiled_opaque_workspace_replays_stale_and_guard_refuses():
    torch.manual_seed(0)
    model = nn.Sequential(WsLinear(64, key=1), nn.ReLU(), WsLinear(64, key=2)).cuda()
    x = torch.randn(4, 64, device="cuda")
    fn = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            fn(x)
    a = graphkeep.audit_compiled(fn)
    print(a.describe())
    assert {"0.workspace", "2.workspace"} <= set(a.paths("escaped")), a.describe()

    # the vLLM-style reload: weights copied in place, PWAL rebuilds the workspaces
    old = [model[0].workspace, model[2].workspace]  # kept alive: the stale replay reads them
    with torch.no_grad():
        for layer in (model[0], model[2]):
            layer.weight.copy_(torch.randn_like(layer.weight) / 8)
            layer.pwal()
        got = fn(x).clone()
        eager = model(x)
    assert not torch.allclose(got, eager, rtol=1e-3, atol=1e-3), \
        "the compiled replay read the new workspaces: the test shows nothing"
    with pytest.raises(graphkeep.DriftError) as e:
        graphkeep.guard_compiled(a, fn)
    found = {(i.verdict, i.issue.path) for i in e.value.issues}
    assert found == {("stale", "0.workspace"), ("stale", "2.workspace")}, str(e.value)
    assert "would replay the old memory" in str(e.value)

    # graphkeep's way: copy into the captured workspaces, and the replay is right
    for layer, w in zip((model[0], model[2]), old):
        w.copy_(layer.workspace)
        layer.workspace = w
        _WS[layer.key] = w
    assert graphkeep.guard_compiled(a, fn) == []
    with torch.no_grad():
        got = fn(x).clone()
        eager = model(x)
    torch.testing.assert_close(got, eager, rtol=1e-3, atol=1e-3)


@gpu
def test_compiled_tree_recorded_without_keep_graph_is_refused():
    torch._dynamo.reset()
    graphkeep.keep_compiled_graphs(False)
    model = nn.Linear(32, 32).cuda()
    x = torch.randn(4, 32, device="cuda")
    fn = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            fn(x)
    with pytest.raises(graphkeep.StateError, match=r"without keep_graph.*keep_compiled_graphs"):
        graphkeep.audit_compiled(model)
    torch._dynamo.reset()
