"""A vLLM-shaped quantized linear layer, for the audit's tests (CPU and GPU).

Like vLLM's linear methods: create_weights() registers the checkpoint-format
parameters on the layer, a loader copies the checkpoint into them, and
process_weights_after_loading() (PWAL) derives what the kernel reads, at new
addresses: an int8 weight and a per-channel scale replace the parameters
(``replace_parameter``), and the method object keeps a workspace of its own.
Run again on a reload, PWAL reallocates all three, and a captured graph goes on
reading the old ones: what the audit must name. ``reload_in_place`` is the fix
graphkeep's engine applies: copy the new values into the captured tensors and
point the fields back at them."""

from __future__ import annotations

import torch
from torch import nn


class Int8LinearMethod:
    def __init__(self):
        self.workspace = None  # the kernel's scratch, derived in PWAL

    def create_weights(self, layer, out_features, in_features, device):
        layer.register_parameter("weight", nn.Parameter(torch.empty(out_features, in_features, device=device),
                                                        requires_grad=False))

    def process_weights_after_loading(self, layer):
        w = layer.weight.data
        scale = w.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127.0
        q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
        # replace_parameter: the derived tensors become the layer's parameters
        layer.register_parameter("weight", nn.Parameter(q, requires_grad=False))
        layer.register_parameter("weight_scale", nn.Parameter(scale.t().contiguous(), requires_grad=False))
        self.workspace = torch.zeros(w.shape[0], device=w.device)

    def apply(self, layer, x):
        y = (x @ layer.weight.t().float()) * layer.weight_scale
        return y + self.workspace


class VllmLikeLinear(nn.Module):
    def __init__(self, out_features, in_features, device):
        super().__init__()
        self.quant_method = Int8LinearMethod()
        self.quant_method.create_weights(self, out_features, in_features, device)

    def forward(self, x):
        return self.quant_method.apply(self, x)


class VllmLikeModel(nn.Module):
    def __init__(self, dims=(64, 96, 64), device="cpu"):
        super().__init__()
        self.layers = nn.ModuleList(VllmLikeLinear(o, i, device) for i, o in zip(dims, dims[1:]))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def checkpoint(model_dims=(64, 96, 64), seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return {f"layers.{i}.weight": (torch.randn(o, i_, generator=g) / i_ ** 0.5).to(device)
            for i, (i_, o) in enumerate(zip(model_dims, model_dims[1:]))}


def load(model, weights):
    """vLLM's reload: fresh checkpoint-format parameters, the loader's copy, then PWAL."""
    for i, layer in enumerate(model.layers):
        w = weights[f"layers.{i}.weight"]
        layer.quant_method.create_weights(layer, w.shape[0], w.shape[1], w.device)
        layer.weight.data.copy_(w)
        layer.quant_method.process_weights_after_loading(layer)


def _derived(layer):
    return {"weight": layer.weight, "weight_scale": layer.weight_scale, "workspace": layer.quant_method.workspace}


def reload_in_place(model, weights):
    """The same reload, keeping every captured storage: PWAL's new values are copied into
    the tensors the graph read, and the fields point back at them."""
    captured = [_derived(layer) for layer in model.layers]
    load(model, weights)
    with torch.no_grad():
        for layer, old in zip(model.layers, captured):
            new = _derived(layer)
            for k in old:
                old[k].copy_(new[k])
            layer.register_parameter("weight", old["weight"])
            layer.register_parameter("weight_scale", old["weight_scale"])
            layer.quant_method.workspace = old["workspace"]
