"""graphkeep for PyTorch: keep captured CUDA graphs valid across weight reloads.

* :func:`collect` — every tensor a model reaches (parameters, buffers, and the
  escaped tensors a loader's copy-back does not cover), with paths and storages.
* :func:`audit` — the capture manifest of any ``torch.cuda.CUDAGraph`` captured
  with ``keep_graph=True``: every address its kernels read, and who owns it;
  :meth:`Manifest.verify` and :func:`guard` check it again after a reload.
* :func:`audit_compiled`, :func:`guard_compiled` — the same for the CUDA graph trees
  of ``torch.compile(mode="reduce-overhead")``, kept readable by
  :func:`keep_compiled_graphs`.
* :class:`LlmEngine` — the C++ example engine, with online reload from a Python
  trainer: ``stage(state_dict)`` on one thread, ``commit(staged)`` on the serving one.
* :func:`make_patch`, :class:`PatchPublisher` — weight patches from a trainer: the
  elements that changed, with content hashes; ``LlmEngine.stage(patch)`` applies one.
* :class:`Error` and its subclasses — the C++ library's error family.
"""

import torch  # noqa: F401  (loads libtorch and libtorch_python before the extension)

from .errors import (DeclarationError, DriftError, Error, InternalError, MismatchError, StateError,
                     WeightError)
from . import _C
from .collector import CollectedTensor, Collection, collect
from .audit import CLASSES, Manifest, VerifyIssue, VerifyResult, audit, build_manifest, guard, scan
from .compiled import (CompiledAudit, CompiledGraph, CompiledIssue, audit_compiled, guard_compiled,
                       keep_compiled_graphs)
from .engine import LlmEngine, ReloadReport, StagedReload
from .patch import (Patch, PatchEntry, PatchPublisher, Publication, adapter_tensors, content_hash, make_patch,
                    read_patch)

__version__ = "0.1.0"
with_cuda: bool = _C.with_cuda
"""Whether the extension was built with graphkeep's CUDA parts (the graph scan)."""

__all__ = [
    "CLASSES", "CollectedTensor", "Collection", "CompiledAudit", "CompiledGraph", "CompiledIssue", "DeclarationError", "DriftError", "Error", "InternalError",
    "LlmEngine", "Manifest", "MismatchError", "Patch", "PatchEntry", "PatchPublisher", "Publication", "ReloadReport",
    "StagedReload", "StateError", "VerifyIssue", "VerifyResult", "WeightError", "adapter_tensors", "audit",
    "audit_compiled", "build_manifest", "collect",
    "content_hash", "guard", "guard_compiled", "keep_compiled_graphs", "make_patch", "read_patch", "scan", "with_cuda",
]
