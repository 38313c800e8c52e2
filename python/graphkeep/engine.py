"""The example engine from Python: serve a Hugging Face decoder under captured graphs,
and hand it new weights from a trainer without recapturing.

    eng = graphkeep.LlmEngine("ckpt/step0", quant="fp8", device="cuda")
    ids = eng.generate(prompts, max_new_tokens=16)          # token ids [B, 16]
    staged = eng.stage(model.state_dict())                 # another thread may decode meanwhile
    report = eng.commit(staged)                            # the pause: copy into captured storage
    eng.weight_version                                     # +1

``LlmEngine`` binds the example engine of the C++ project (examples/engine/llm_engine.h):
a Llama / Qwen3 / Qwen3-MoE decoder read from a model directory (config.json and
safetensors), eager prefill, and decode through graphs captured once for each batch
size (CUDA graphs on a GPU; host graphs with the same burn-in semantics on a CPU).
Weights cross without a copy: a dict's tensors reach the engine as the same tensors,
and with ``adopt_source_tensors=True`` a stage adopts them (a trainer's device
tensors are copied once, at commit, straight into the captured storage). The GIL is
released during every engine call (Note [The GIL around the engine] in
python/src/engine.cpp): a trainer thread can ``stage()`` while the serving thread
decodes; ``commit()`` belongs to the serving thread, between two decode steps.
A bad update (a wrong shape, a missing tensor, another architecture) raises
:class:`graphkeep.WeightError` from ``stage()`` and the engine serves the old weights.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence, Union

import torch

from . import _C
from .errors import StateError

__all__ = ["LlmEngine", "StagedReload", "ReloadReport"]

ReloadReport = _C.ReloadReport
Weights = Union[Mapping[str, torch.Tensor], str, "os.PathLike[str]", "_C.Patch"]


class StagedReload:
    """New weights loaded, processed and checked into new storage, not yet served
    (``gk::StagedReload``). Commit it with :meth:`LlmEngine.commit`, or :meth:`abort` it;
    dropping it aborts it."""

    def __init__(self, staged: "_C._StagedReload", engine: "LlmEngine") -> None:
        self._staged = staged
        self._engine = engine

    @property
    def pending(self) -> bool:
        """True until it is committed or aborted."""
        return self._staged.pending

    @property
    def base_version(self) -> int:
        """The weight version it was staged against; a commit makes it ``base_version + 1``."""
        return self._staged.base_version

    @property
    def staged_bytes(self) -> int:
        """Bytes held by the staged tensors."""
        return self._staged.staged_bytes

    @property
    def report(self) -> ReloadReport:
        """What the stage did (tensors loaded and adopted, ``times.stage_ms``)."""
        return self._staged.report

    def abort(self) -> None:
        """Releases the staged tensors; nothing served changes. Idempotent."""
        self._staged.abort()

    def __repr__(self) -> str:
        state = "pending" if self.pending else "done"
        return f"<graphkeep.StagedReload {state}, base version {self.base_version}, {self.staged_bytes} bytes>"


def _weights_arg(weights: Weights, what: str) -> Union[dict, str, "_C.Patch"]:
    if isinstance(weights, _C.Patch):
        return weights
    if isinstance(weights, (str, os.PathLike)):
        return os.fspath(weights)
    if isinstance(weights, Mapping):
        return dict(weights)
    raise TypeError(f"{what}: weights must be a dict of name -> torch.Tensor, a model directory or a "
                    f"graphkeep.Patch, not {type(weights).__name__}")


class LlmEngine:
    """The example engine (``demo::LlmEngine``) over a Hugging Face model directory.

    ``model_dir`` holds config.json and, unless ``weights`` is given, the safetensors
    weights; ``weights``: a dict of Hugging Face names -> tensors to build from instead
    (a trainer's ``state_dict()``). ``quant``: ``"dense"`` (the checkpoint's dtype),
    ``"fp8"`` (W8A8 made when weights are processed) or ``"w4a16"`` (int4 weights for
    the Marlin-style kernel). ``batch_sizes``: the decode graphs captured (default:
    1, 2, 4, then 8 to 256 in steps of 8); ``max_len``: KV cache length per sequence.
    ``adapter``: a PEFT LoRA adapter directory served with the model, unmerged, inside
    the decode graphs (q/k/v/o/gate/up/down projections; attention only for a MoE model).
    ``adopt_source_tensors``: stages adopt the given tensors instead of copying them
    (they must not be written until the commit; one written since makes the commit
    stale: :class:`graphkeep.StateError`)."""

    def __init__(self, model_dir: Union[str, "os.PathLike[str]"], quant: str = "dense",
                 device: Union[str, torch.device] = "cpu", *, weights: Mapping[str, torch.Tensor] | None = None,
                 batch_sizes: Sequence[int] | None = None, max_len: int = 64,
                 adopt_source_tensors: bool = False,
                 adapter: Union[str, "os.PathLike[str]", None] = None) -> None:
        if adapter is not None and not isinstance(adapter, (str, os.PathLike)):
            raise TypeError(f"adapter must be a PEFT adapter directory (str or os.PathLike), not {type(adapter).__name__}")
        self._e = _C._LlmEngine(os.fspath(model_dir), quant, str(torch.device(device)),
                                list(batch_sizes) if batch_sizes is not None else None, int(max_len),
                                bool(adopt_source_tensors), dict(weights) if weights is not None else None,
                                os.fspath(adapter) if adapter is not None else "")
        self.device = torch.device(device)
        self.quant = quant

    # -- serving ---------------------------------------------------------------------------
    def prefill(self, seq: int, tokens: torch.Tensor) -> torch.Tensor:
        """Eager prefill of sequence ``seq`` (a KV cache row) with ``tokens`` [T] at positions
        0..T-1: logits [T, vocab], float32 on the CPU."""
        return self._e.prefill(seq, torch.as_tensor(tokens, dtype=torch.long))

    def decode_logits(self, tokens: torch.Tensor, positions: torch.Tensor, *, graphs: bool = True) -> torch.Tensor:
        """One decode step of sequences 0..B-1: ``tokens`` [B] at ``positions`` [B]; logits
        [B, vocab] float32 on the CPU. ``graphs``: replay the smallest captured graph of at
        least B rows (checked first: refused with :class:`graphkeep.DriftError` if the
        captured addresses are no longer covered), else run eagerly."""
        t = torch.as_tensor(tokens, dtype=torch.long)
        p = torch.as_tensor(positions, dtype=torch.long)
        return self._e.decode_logits(t, p, True) if graphs else self._e.decode_eager(t, p)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, *, graphs: bool = True,
               temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0) -> torch.Tensor:
        """One decode step: the next token id of each sequence, [B] int64. Through the
        graphs the tokens are chosen on the device and only they come back: greedy
        (``temperature`` 0), or sampled from softmax(logits / temperature) restricted to
        the ``top_k`` most likely tokens (0: all), then to the fewest whose probability
        reaches ``top_p``; row b draws from the stream of ``seed`` + b at its position, so
        the same call draws the same tokens. ``graphs=False``: eager and greedy only."""
        if not graphs:
            if temperature != 0:
                raise ValueError("decode: temperature: sampling (temperature != 0) runs through the graphs only")
            return self.decode_logits(tokens, positions, graphs=False).argmax(-1)
        t = torch.as_tensor(tokens, dtype=torch.long)
        p = torch.as_tensor(positions, dtype=torch.long)
        return self._e.decode(t, p, float(temperature), int(top_k), float(top_p), int(seed), True).long()

    def generate(self, prompts: torch.Tensor | Sequence[Sequence[int]], max_new_tokens: int, *,
                 graphs: bool = True) -> torch.Tensor:
        """Greedy generation: prefills each prompt (row b is sequence b; equal lengths),
        then decodes ``max_new_tokens`` steps for all of them at once. Returns the new
        token ids, [B, max_new_tokens] int64."""
        p = torch.as_tensor(prompts, dtype=torch.long)
        if p.dim() != 2 or p.size(0) < 1 or p.size(1) < 1:
            raise ValueError(f"generate: prompts must be [B, P] with B, P >= 1, got shape {list(p.shape)}")
        if max_new_tokens < 1:
            raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
        B, P = p.shape
        nxt = torch.stack([self.prefill(b, p[b])[P - 1].argmax() for b in range(B)])
        out = []
        for t in range(max_new_tokens):
            out.append(nxt)
            if t + 1 < max_new_tokens:
                nxt = self.decode(nxt, torch.full((B,), P + t, dtype=torch.long), graphs=graphs)
        return torch.stack(out, 1)

    # -- weights ---------------------------------------------------------------------------
    def stage(self, weights: Weights) -> StagedReload:
        """Loads, processes and checks new weights (a dict of Hugging Face names -> tensors,
        a model directory, or a :class:`graphkeep.Patch` against what is served) into new storage, on the calling thread, while other threads
        go on decoding the old weights. Raises :class:`graphkeep.WeightError` (nothing
        changed) for a bad weight set."""
        arg = _weights_arg(weights, "stage")
        if isinstance(arg, _C.Patch):
            return StagedReload(self._e.stage_patch(arg), self)
        return StagedReload(self._e.stage(arg), self)

    def commit(self, staged: StagedReload) -> ReloadReport:
        """Serves the staged weights: copies them into the storage the graphs captured and
        verifies the capture manifests (the pause is ``report.times.commit_ms``). Call it
        from the serving thread, between two decode steps."""
        if not isinstance(staged, StagedReload):
            raise TypeError(f"commit: staged must be a StagedReload from stage(), not {type(staged).__name__}")
        if staged._engine is not self:
            raise StateError("commit: this StagedReload was staged by another engine")
        return self._e.commit(staged._staged)

    def abort(self, staged: StagedReload) -> None:
        """Drops a staged reload (the same as ``staged.abort()``)."""
        staged.abort()

    def reload(self, weights: Weights) -> ReloadReport:
        """Stage and commit in one call, on this thread (decoding must wait)."""
        arg = _weights_arg(weights, "reload")
        if isinstance(arg, _C.Patch):
            return self._e.reload_patch(arg)
        return self._e.reload(arg)

    # -- adapters --------------------------------------------------------------------------
    def stage_adapter(self, adapter_dir: Union[str, "os.PathLike[str]"]) -> StagedReload:
        """Stages a swap of the served LoRA adapter for the PEFT adapter in ``adapter_dir``
        (same rank, scale and target modules): a weight patch of every projection's A and
        B, committed by :meth:`commit` in one pause, so no decode step sees two adapters. A
        bad adapter raises :class:`graphkeep.WeightError` naming the file and the tensor or
        module; the old one stays served."""
        if not isinstance(adapter_dir, (str, os.PathLike)):
            raise TypeError(f"adapter_dir must be a str or os.PathLike, not {type(adapter_dir).__name__}")
        return StagedReload(self._e.stage_adapter(os.fspath(adapter_dir)), self)

    def reload_adapter(self, adapter_dir: Union[str, "os.PathLike[str]"]) -> ReloadReport:
        """:meth:`stage_adapter` and :meth:`commit` in one call."""
        if not isinstance(adapter_dir, (str, os.PathLike)):
            raise TypeError(f"adapter_dir must be a str or os.PathLike, not {type(adapter_dir).__name__}")
        return self._e.reload_adapter(os.fspath(adapter_dir))

    # -- state -----------------------------------------------------------------------------
    @property
    def served(self) -> "_C.ServedWeights":
        """What the engine serves: each checkpoint tensor's content hash, the content
        version and its label (a patch's target version after it is applied)."""
        return self._e.served

    @property
    def weight_version(self) -> int:
        """How many reloads have been committed; readable from any thread."""
        return self._e.weight_version

    @property
    def config(self) -> dict:
        """The model's architecture, as read from config.json."""
        return self._e.config

    @property
    def batch_sizes(self) -> list[int]:
        return self._e.batch_sizes

    @property
    def num_graphs(self) -> int:
        return self._e.num_graphs

    def __repr__(self) -> str:
        c = self.config
        return (f"<graphkeep.LlmEngine {c['model_type']} {c['num_hidden_layers']} layers, {self.quant} on "
                f"{self.device}, {self.num_graphs} graphs, weight version {self.weight_version}>")
