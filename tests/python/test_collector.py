"""graphkeep.collect on a zoo of object shapes, many taken from real quantization
methods (vLLM-style layers that keep kernel objects, per-expert lists, dicts of
scales and closures next to their parameters). Each case states exactly the
tensors the collector must find, as {path: kind}; a missing or extra tensor, a
wrong path or a wrong kind fails it. Where torch itself knows the answer
(named_parameters, named_buffers of a real model), torch is the oracle."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from torch import nn

import graphkeep


def found(obj, **kw):
    c = graphkeep.collect(obj, **kw)
    return {t.path: t.kind for t in c.tensors}, c


def t(*shape):
    return torch.randn(*shape) if shape else torch.randn(4)


# -- the shapes ------------------------------------------------------------------------------

class Kernel:
    """A kernel object held in a plain attribute (Marlin-style: workspace, permutation)."""

    def __init__(self):
        self.workspace = torch.zeros(16, dtype=torch.int32)
        self.perm = torch.arange(8)
        self.name = "marlin"
        self.tile = (16, 64)


class QuantLinear(nn.Module):
    """process_weights_after_loading keeps derived tensors in every shape real methods use."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(t(8, 8))
        self.kernel = Kernel()                                   # kernel object in an attribute
        self.expert_scales = [t(2), t(2), t(2)]                   # list of per-expert tensors
        self.scales = {"w13": t(3), "w2": t(1)}                   # dict of scales
        s = t(5)
        self.dequant = lambda x: x * s                            # closure capturing a tensor


class BasevLLMParameter(nn.Parameter):
    """A Parameter subclass with attributes, as vLLM's parameters have."""

    def __new__(cls, data, weight_loader=None):
        return super().__new__(cls, data, requires_grad=False)

    def __init__(self, data, weight_loader=None):
        self._weight_loader = weight_loader
        self.output_dim = 0


class QTensor(torch.Tensor):
    """A wrapper tensor subclass (torchao-style): its data lives in inner tensors."""

    @staticmethod
    def __new__(cls, qdata, scale):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=torch.float32)

    def __init__(self, qdata, scale):
        self.qdata = qdata
        self.scale = scale

    def __tensor_flatten__(self):
        return ["qdata", "scale"], None

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)


@dataclasses.dataclass
class Scales:
    input_scale: torch.Tensor
    weight_scale: torch.Tensor
    group: int = 128


class Packed:
    __slots__ = ("qweight", "zeros", "__private", "bits")

    def __init__(self):
        self.qweight = torch.zeros(4, dtype=torch.int32)
        self.zeros = torch.zeros(2)
        self.__private = torch.ones(1)
        self.bits = 4


class SlotsChild(Packed):
    __slots__ = ("extra",)

    def __init__(self):
        super().__init__()
        self.extra = torch.ones(3)


def case(name):
    return pytest.param(name, id=name)


def build(name):
    """Returns (object, {path: kind} expected)."""
    if name == "linear":
        return nn.Linear(4, 3), {"weight": "parameter", "bias": "parameter"}
    if name == "linear_no_bias":
        return nn.Linear(4, 3, bias=False), {"weight": "parameter"}
    if name == "batchnorm_buffers":
        return nn.BatchNorm1d(4), {"weight": "parameter", "bias": "parameter", "running_mean": "buffer",
                                   "running_var": "buffer", "num_batches_tracked": "buffer"}
    if name == "sequential":
        return nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1, bias=False)), {
            "0.weight": "parameter", "0.bias": "parameter", "2.weight": "parameter"}
    if name == "modulelist_experts":
        m = nn.Module()
        m.experts = nn.ModuleList(nn.Linear(2, 2, bias=False) for _ in range(3))
        return m, {f"experts.{i}.weight": "parameter" for i in range(3)}
    if name == "kernel_object_attribute":
        m = nn.Linear(2, 2, bias=False)
        m.kernel = Kernel()
        return m, {"weight": "parameter", "kernel.workspace": "escaped", "kernel.perm": "escaped"}
    if name == "per_expert_list":
        m = nn.Module()
        m.w13 = nn.Parameter(t(4, 2, 2))
        m.w13_list = [t(2), t(2), t(2), t(2)]
        return m, {"w13": "parameter", **{f"w13_list[{i}]": "escaped" for i in range(4)}}
    if name == "dict_of_scales":
        m = nn.Module()
        m.scales = {"w13": t(3), "w2": t(1), 7: t(1)}
        return m, {"scales[w13]": "escaped", "scales[w2]": "escaped", "scales[7]": "escaped"}
    if name == "closure":
        ws = t(6)

        def apply(x):
            return x + ws
        m = nn.Module()
        m.apply_fn = apply
        return m, {"apply_fn.<closure ws>": "escaped"}
    if name == "quant_method_all_shapes":
        return QuantLinear(), {"weight": "parameter", "kernel.workspace": "escaped", "kernel.perm": "escaped",
                               "expert_scales[0]": "escaped", "expert_scales[1]": "escaped",
                               "expert_scales[2]": "escaped", "scales[w13]": "escaped", "scales[w2]": "escaped",
                               "dequant.<closure s>": "escaped"}
    if name == "cycle":
        m = nn.Linear(2, 2, bias=False)
        k = Kernel()
        k.layer = m           # back-reference: a cycle through a plain attribute
        k.me = k              # a self-cycle
        m.kernel = k
        return m, {"weight": "parameter", "kernel.workspace": "escaped", "kernel.perm": "escaped"}
    if name == "parameter_subclass":
        m = nn.Module()
        m.weight = BasevLLMParameter(t(4, 4))
        m.weight._weight_loader = lambda p, w: p.data.copy_(w)
        return m, {"weight": "parameter"}
    if name == "parameter_subclass_with_tensor_attr":
        m = nn.Module()
        m.weight = BasevLLMParameter(t(4, 4))
        m.weight.marlin_perm = torch.arange(4)    # a tensor hung on the parameter object
        return m, {"weight": "parameter", "weight.marlin_perm": "escaped"}
    if name == "wrapper_subclass":
        m = nn.Module()
        m.qw = QTensor(torch.zeros(4, dtype=torch.int8), torch.ones(1))
        return m, {"qw.qdata": "escaped", "qw.scale": "escaped"}
    if name == "tied_weights":
        m = nn.Module()
        m.embed = nn.Embedding(5, 3)
        m.head = nn.Linear(3, 5, bias=False)
        m.head.weight = m.embed.weight
        return m, {"embed.weight": "parameter"}
    if name == "partial":
        m = nn.Module()
        a, b = t(2), t(3)
        m.fn = functools.partial(torch.add, a, alpha=1, other=b)
        return m, {"fn.args[0]": "escaped", "fn.keywords[other]": "escaped"}
    if name == "dataclass":
        m = nn.Module()
        m.meta = Scales(t(1), t(4))
        return m, {"meta.input_scale": "escaped", "meta.weight_scale": "escaped"}
    if name == "slots":
        m = nn.Module()
        m.packed = SlotsChild()
        return m, {"packed.qweight": "escaped", "packed.zeros": "escaped", "packed.__private": "escaped",
                   "packed.extra": "escaped"}
    if name == "tuple_and_set":
        m = nn.Module()
        x, y = t(1), t(2)
        m.pair = (x, (y, 3))
        m.tags = {x}          # the same tensor again: an alias, not a new one
        return m, {"pair[0]": "escaped", "pair[1][0]": "escaped"}
    if name == "view_of_parameter":
        m = nn.Linear(4, 4, bias=False)
        m.w_t = m.weight.t()
        return m, {"weight": "parameter", "w_t": "escaped"}
    if name == "bound_method":
        m = nn.Module()
        k = Kernel()
        m.run = k.__init__     # a bound method: its object is walked
        return m, {"run.__self__.workspace": "escaped", "run.__self__.perm": "escaped"}
    if name == "torch_internals_not_descended":
        m = nn.Linear(2, 2, bias=False)
        hidden = nn.Parameter(t(3))
        m.opt = torch.optim.SGD([hidden], lr=0.1)   # torch's own object: not looked into
        m.dtype_, m.device_, m.size_ = torch.float16, torch.device("cpu"), torch.Size([2])
        m.gen = torch.Generator()
        return m, {"weight": "parameter"}
    if name == "unregistered_module_in_list":
        m = nn.Module()
        m.helpers = [nn.Linear(2, 2, bias=False)]   # a plain list: not a submodule
        return m, {"helpers[0].weight": "parameter"}
    if name == "non_persistent_buffer":
        m = nn.Module()
        m.register_buffer("inv_freq", t(4), persistent=False)
        m.register_buffer("nothing", None)
        return m, {"inv_freq": "buffer"}
    if name == "nested_containers":
        root = {"layers": [{"w": t(2)}, {"w": t(2), "extra": [t(1)]}], "cfg": {"n": 2}}
        return root, {"[layers][0][w]": "escaped", "[layers][1][w]": "escaped", "[layers][1][extra][0]": "escaped"}
    if name == "parameter_reached_first_elsewhere":
        # a sibling's kernel holds the second layer's weight before the walk reaches that
        # layer: the tensor is still reported as that parameter, with the alias
        m = nn.Module()
        m.a = nn.Module()
        m.b = nn.Linear(2, 2, bias=False)
        m.a.kernel = Kernel()
        m.a.kernel.w = m.b.weight
        return {"first": m.a, "model": m}, {"[first].kernel.workspace": "escaped", "[first].kernel.perm": "escaped",
                                            "[model].b.weight": "parameter"}
    raise KeyError(name)


CASES = ["linear", "linear_no_bias", "batchnorm_buffers", "sequential", "modulelist_experts",
         "kernel_object_attribute", "per_expert_list", "dict_of_scales", "closure", "quant_method_all_shapes",
         "cycle", "parameter_subclass", "parameter_subclass_with_tensor_attr", "wrapper_subclass", "tied_weights",
         "partial", "dataclass", "slots", "tuple_and_set", "view_of_parameter", "bound_method",
         "torch_internals_not_descended", "unregistered_module_in_list", "non_persistent_buffer",
         "nested_containers", "parameter_reached_first_elsewhere"]


@pytest.mark.parametrize("name", CASES)
def test_zoo_finds_exactly_the_expected_tensors(name):
    obj, want = build(name)
    got, c = found(obj)
    assert got == want
    assert c.stops == []
    for rec in c.tensors:   # storage reported is the tensor's own
        if rec.storage_ptr:
            assert rec.storage_ptr == rec.tensor.untyped_storage().data_ptr()
            assert rec.storage_nbytes == rec.tensor.untyped_storage().nbytes()


def test_zoo_has_at_least_20_shapes():
    assert len(CASES) >= 20


def test_aliases_and_view_owner():
    m = nn.Module()
    m.embed = nn.Embedding(5, 3)
    m.head = nn.Linear(3, 5, bias=False)
    m.head.weight = m.embed.weight
    m.kernel = Kernel()
    m.kernel.w = m.embed.weight
    m.w_t = m.embed.weight.t()
    c = graphkeep.collect(m)
    w = c["embed.weight"]
    assert set(w.aliases) == {"head.weight", "kernel.w"}
    assert c["head.weight"] is w and c["kernel.w"] is w
    assert c["w_t"].storage_owner == "embed.weight"
    assert c["kernel.workspace"].storage_owner is None
    assert not c["w_t"].covered and w.covered


def test_parameter_subclass_kind_and_type():
    obj, _ = build("parameter_subclass")
    c = graphkeep.collect(obj)
    assert c["weight"].type_name == "BasevLLMParameter"
    assert c["weight"].kind == "parameter"


def test_depth_limit_reports_where_it_stopped():
    deep = [t(1)]
    for _ in range(30):
        deep = [deep]
    got, c = found({"deep": deep, "near": t(1)}, max_depth=10)
    assert got == {"[near]": "escaped"}
    assert len(c.stops) == 1 and "depth limit 10" in c.stops[0]
    assert c.stops[0].startswith("[deep]" + "[0]" * 10)
    got, c = found({"deep": deep}, max_depth=64)
    assert got == {"[deep]" + "[0]" * 31: "escaped"} and c.complete


def test_count_limit_reports_where_it_stopped():
    class Box:
        def __init__(self):
            self.x = t(1)
    boxes = [Box() for _ in range(50)]
    got, c = found(boxes, max_count=11)   # the list and 10 boxes
    assert got == {f"[{i}].x": "escaped" for i in range(10)}
    assert len(c.stops) == 1 and c.stops[0].startswith("[10]: object limit 11")
    with pytest.raises(ValueError, match="max_count"):
        graphkeep.collect(boxes, max_count=0)


def test_prefix_names_like_the_whole_model():
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    whole = {t.path for t in graphkeep.collect(m).tensors}
    part = {t.path for t in graphkeep.collect(m[1], prefix="1").tensors}
    assert part == {p for p in whole if p.startswith("1.")}


def test_opaque_objects_are_listed():
    import array
    m = nn.Module()
    m.raw = array.array("f", [1.0])   # no __dict__, no __slots__: cannot be looked into
    c = graphkeep.collect(m)
    assert c.opaque == ["raw (array.array)"]


def test_transformers_llama_matches_torch_named_parameters():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                   tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(cfg)
    c = graphkeep.collect(model)
    # the oracle: torch's own registries (tied weights once, as named_parameters gives them)
    assert set(c.paths("parameter")) == {n for n, _ in model.named_parameters()}
    assert set(c.paths("buffer")) == {n for n, _ in model.named_buffers()}
    assert c["lm_head.weight"] is c["model.embed_tokens.weight"]
    # transformers keeps the rotary frequencies in a plain attribute too: the buffer's
    # own tensor (an alias of it) or, if a copy, an escaped tensor
    rot = [(n, mod) for n, mod in model.named_modules() if hasattr(mod, "original_inv_freq")]
    assert rot
    want_escaped = set()
    for n, mod in rot:
        if mod.original_inv_freq is mod.inv_freq:
            assert f"{n}.original_inv_freq" in c[f"{n}.inv_freq"].aliases
        else:
            want_escaped.add(f"{n}.original_inv_freq")
    assert {t.path for t in c.escaped()} == want_escaped
    assert c.stops == []
