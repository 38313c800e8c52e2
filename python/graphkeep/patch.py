"""Weight patches from a PyTorch trainer: the changed elements of checkpoint tensors,
with content hashes, applied by the engine at O(changed) (docs/delta.md).

    pub = graphkeep.PatchPublisher(dtype=torch.bfloat16)      # the trainer keeps fp32 masters
    eng = graphkeep.LlmEngine(ckpt_dir, weights=pub.publish(model).weights)
    ...  # a training step
    pub_ = pub.publish(model)                                 # a Patch: last publication -> now
    eng.commit(eng.stage(pub_.patch))                         # or pub_.patch.save(path) for another host

Lower level: :func:`make_patch` over two dicts of name -> tensor, :func:`read_patch`,
:meth:`Patch.save`, :meth:`Patch.to`, :func:`content_hash`. A patch names its base
and target versions; the engine refuses one whose base hashes are not what it serves
(:class:`graphkeep.WeightError`, the old weights served bit for bit).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

import torch

from . import _C

__all__ = ["Patch", "PatchEntry", "PatchPublisher", "Publication", "adapter_tensors", "content_hash", "make_patch",
           "read_patch"]

Patch = _C.Patch
PatchEntry = _C.PatchEntry


def _tensor_dict(d: object, arg: str) -> dict:
    if isinstance(d, torch.nn.Module):
        d = d.state_dict()
    if not isinstance(d, Mapping):
        raise TypeError(f"{arg} must be a dict of name -> torch.Tensor or a torch.nn.Module, not {type(d).__name__}")
    out = {}
    for name, t in d.items():
        if not isinstance(name, str):
            raise TypeError(f"{arg}: names must be str, not {type(name).__name__}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{arg}['{name}'] is a {type(t).__name__}, not a torch.Tensor")
        out[name] = t.detach()
    return out


def make_patch(before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor], *, base_id: str = "",
               target_id: str = "", encoding: str = "auto", record_unchanged: bool = False) -> Patch:
    """The patch from ``before`` to ``after`` (the same names, shapes and dtypes), computed
    on the tensors' device. ``base_id`` / ``target_id``: the versions it goes between
    (the engine labels what it serves with the target). ``encoding``: ``"auto"`` (per
    tensor, the smaller of sparse and dense), ``"sparse"`` or ``"dense"``.
    ``record_unchanged``: an entry for every unchanged tensor too, so that applying it
    checks every base hash. A mismatch between the dicts raises
    :class:`graphkeep.WeightError` naming the tensor."""
    if encoding not in ("auto", "sparse", "dense"):
        raise ValueError(f"encoding must be 'auto', 'sparse' or 'dense', not {encoding!r}")
    for arg, v in (("base_id", base_id), ("target_id", target_id)):
        if not isinstance(v, str):
            raise TypeError(f"{arg} must be a str, not {type(v).__name__}")
    return _C.make_patch(_tensor_dict(before, "before"), _tensor_dict(after, "after"), base_id, target_id, encoding,
                         bool(record_unchanged))


def read_patch(path: Union[str, "os.PathLike[str]"]) -> Patch:
    """Reads and validates a patch file (safetensors, docs/delta.md); a bad file raises
    :class:`graphkeep.WeightError` naming it."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    return _C.read_patch(os.fspath(path))


_LORA = re.compile(r"^(?:base_model\.model\.)?(.*\.lora_[AB])(?:\.[^.]+)?\.weight$")


def adapter_tensors(adapter: Union[torch.nn.Module, Mapping[str, torch.Tensor]]) -> dict:
    """A PEFT LoRA adapter's A and B under the engine's names, for :func:`make_patch` and
    :class:`PatchPublisher`: ``adapter`` is a PEFT model (its ``state_dict()``, names
    like ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight``) or
    such a dict, saved or live; the result maps
    ``model.layers.0.self_attn.q_proj.lora_A.weight`` to the tensor (no copy). Other
    entries (the base model's weights) are left out."""
    d = adapter.state_dict() if isinstance(adapter, torch.nn.Module) else adapter
    if not isinstance(d, Mapping):
        raise TypeError(f"adapter must be a PEFT model or a dict of name -> torch.Tensor, not {type(adapter).__name__}")
    out = {}
    for name, t in d.items():
        m = _LORA.match(name) if isinstance(name, str) else None
        if m is not None:
            out[m.group(1) + ".weight"] = t.detach()
    if not out:
        raise ValueError("adapter: no lora_A or lora_B weight in it (not a PEFT LoRA adapter)")
    return out


def content_hash(tensor: torch.Tensor) -> int:
    """The content hash of a tensor (gk-sum64 v1, docs/delta.md): of its elements'
    bytes in row-major order, on its device; the same value on a CPU and a GPU. A
    non-contiguous tensor is copied first (the C++ function refuses one)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, not {type(tensor).__name__}")
    return _C.content_hash(tensor.detach().contiguous())


@dataclass
class Publication:
    """What :meth:`PatchPublisher.publish` returns: ``weights`` (a full publication: the
    served-dtype tensors, for ``LlmEngine(weights=...)``, ``stage()`` or ``reload()``) or
    ``patch`` (from the previous publication), and the version it publishes."""
    version: str
    patch: Optional[Patch] = None
    weights: Optional[dict] = field(default=None, repr=False)

    @property
    def full(self) -> bool:
        return self.weights is not None

    def update(self):
        """What to hand to ``LlmEngine.stage`` or ``reload``: the patch or the weights."""
        return self.weights if self.full else self.patch


class PatchPublisher:
    """The trainer side: keeps the weights it last published, in the dtype the engine
    serves, and publishes each update as a patch from them.

    ``dtype``: what the engine serves (``None``: each tensor's own dtype). A model
    trained in fp32 and served in bf16 publishes its rounding: the patch holds the bf16
    elements that changed, which is what a full reload of the rounded weights serves.
    ``keep``: where the last publication is kept: ``"device"`` (as the trainer's
    tensors; one copy of the served model in device memory, the fastest) or ``"host"``
    (pinned host memory when CUDA is available; each publish copies it to the device to
    compare). ``prefix``: the version label's prefix (``"step-3"``)."""

    def __init__(self, dtype: Optional[torch.dtype] = torch.bfloat16, *, keep: str = "device",
                 prefix: str = "step-") -> None:
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype or None, not {type(dtype).__name__}")
        if keep not in ("device", "host"):
            raise ValueError(f"keep must be 'device' or 'host', not {keep!r}")
        self.dtype = dtype
        self.keep = keep
        self.prefix = prefix
        self._kept: Optional[dict] = None
        self._count = 0
        self._version: Optional[str] = None

    @property
    def version(self) -> Optional[str]:
        """The version last published (None before the first)."""
        return self._version

    @property
    def kept_bytes(self) -> int:
        """Bytes held for the last publication."""
        return sum(t.numel() * t.element_size() for t in (self._kept or {}).values())

    def _served(self, weights: dict) -> dict:
        with torch.no_grad():
            return {n: (t if self.dtype is None else t.to(self.dtype)).contiguous() for n, t in weights.items()}

    def _keep(self, served: dict) -> dict:
        if self.keep == "device":
            return {n: t.clone() for n, t in served.items()}
        pin = torch.cuda.is_available()
        return {n: t.to("cpu", copy=True).pin_memory() if pin else t.to("cpu", copy=True) for n, t in served.items()}

    _BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    def _apply_kept(self, patch, served: dict, given: dict) -> None:
        """The kept copy on the device becomes the published weights without a clone of the
        whole model: a tensor that serving converted (fp32 masters rounded to bf16) is a
        fresh tensor nobody else holds, and is kept as it is; into the others (the caller's
        own tensors, which the caller may change in place) the patch's changed elements are
        written, bit for bit (as integers of the element size): O(changed)."""
        for n, t in served.items():
            g = given[n]
            if t.untyped_storage().data_ptr() != g.untyped_storage().data_ptr():
                self._kept[n] = t
        with torch.no_grad():
            for e in patch.entries:
                if served[e.name] is self._kept[e.name]:
                    continue
                kept = self._kept[e.name]
                bits = self._BITS[kept.element_size()]
                flat = kept.view(-1).view(bits)
                values = e.values.reshape(-1).view(bits)
                if e.indices is None:
                    flat.copy_(values)
                else:
                    flat[e.indices.reshape(-1)] = values

    def publish(self, weights: Union[torch.nn.Module, Mapping[str, torch.Tensor]], *, full: bool = False,
                version: Optional[str] = None) -> Publication:
        """Publishes the weights now (a module's ``state_dict()`` or a dict with Hugging Face
        names): in full the first time or with ``full=True``, else as the patch from the
        last publication (``version`` labels it; default ``prefix`` + a count). A name,
        shape or dtype that differs from the last publication raises
        :class:`graphkeep.WeightError` naming the tensor; the publisher is then unchanged."""
        if version is not None and not isinstance(version, str):
            raise TypeError(f"version must be a str or None, not {type(version).__name__}")
        given = _tensor_dict(weights, "weights")
        served = self._served(given)
        label = version if version is not None else f"{self.prefix}{self._count}"
        if full or self._kept is None:
            pub = Publication(version=label, weights=served)
        else:
            before = self._kept
            if self.keep == "host":
                before = {n: t.to(served[n].device, non_blocking=True) if n in served else t
                          for n, t in before.items()}
            pub = Publication(version=label, patch=make_patch(before, served, base_id=self._version or "",
                                                              target_id=label))
        if pub.patch is not None and self.keep == "device":
            self._apply_kept(pub.patch, served, given)
        else:
            self._kept = self._keep(served)
        self._version = label
        self._count += 1
        return pub
