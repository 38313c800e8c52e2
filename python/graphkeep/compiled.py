"""The audit and the guard for the CUDA graphs of ``torch.compile(mode="reduce-overhead")``.

Reduce-overhead records CUDA graph *trees* (``torch._inductor.cudagraph_trees``):
one graph per recording of a compiled function, none of them kept readable, so
:func:`graphkeep.audit` has nothing to scan. This module keeps them readable and
audits each one:

    graphkeep.keep_compiled_graphs()           # before the recording call
    compiled = torch.compile(model, mode="reduce-overhead")
    compiled(x); compiled(x)                   # warm-up, then the recording
    audit = graphkeep.audit_compiled(model)    # every recorded graph, on this thread
    ... reload the weights ...
    graphkeep.guard_compiled(audit, model)     # raises graphkeep.DriftError naming paths
    compiled(x)

What PyTorch checks on its own, and what it does not (docs/torch_compile_audit.md):

* Before each replay a tree compares the data pointers of the static inputs it
  recorded (the parameters and buffers dynamo lifted as inputs) with the
  current ones. A parameter rebound with ``p.data = new`` therefore never
  replays stale: PyTorch records the function again. The old graph and its
  pool memory stay until ``torch._dynamo.reset()`` or
  ``torch._inductor.cudagraph_trees.reset_cudagraph_trees()``: every such
  reload leaks one graph per compiled function, and pays a recording.
* It never checks a pointer that is not an input of the compiled graph: a
  tensor read inside an opaque custom op (a quantization workspace or scale
  that ``process_weights_after_loading`` rebuilt), or an inductor constant.
  Those replay stale, silently. The guard refuses them.

:func:`guard_compiled` refuses both: a moved static input is reported
``superseded`` (PyTorch will record again; reload with ``p.copy_(new)``), any
other stale address ``stale`` (PyTorch would replay it).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Iterator

import torch

from .audit import Manifest, VerifyIssue, VerifyResult, audit
from .collector import Collection, collect
from .errors import DriftError, StateError

__all__ = ["CompiledAudit", "CompiledGraph", "CompiledIssue", "audit_compiled", "guard_compiled",
           "keep_compiled_graphs"]

# Note [Keeping the graph trees readable]
# A tree node makes its graph with ``torch.cuda.CUDAGraph()`` inside
# ``CUDAGraphTreeManager.record_function``, looking the class up on
# ``torch.cuda`` at call time. keep_compiled_graphs() puts a subclass there that
# asks for ``keep_graph=True`` while a thread-local flag is set, and wraps
# record_function to set the flag: graphs the user makes, and the manager's own
# empty graph, are made as before. The C++ base takes its argument in
# ``__init__`` (pybind11), so the subclass forces it there. A kept graph is
# instantiated at its first replay instead of at capture_end; the tree replays
# each new node once at the end of its recording, so nothing else changes.
# The hooks stay installed: PyTorch records again whenever a static input
# moves or a new shape comes.

_tls = threading.local()
_installed: dict[str, Any] = {}


def _recording() -> bool:
    return getattr(_tls, "recording", 0) > 0


def _graph_class() -> type:
    base = _installed.get("base", torch.cuda.CUDAGraph)

    class KeptGraph(base):  # type: ignore[misc, valid-type]
        """``torch.cuda.CUDAGraph`` kept readable while a graph tree records (graphkeep)."""

        def __init__(self, keep_graph: bool = False) -> None:
            kept = bool(keep_graph) or _recording()
            super().__init__(kept)
            self._graphkeep_kept = kept

    KeptGraph.__name__ = KeptGraph.__qualname__ = "CUDAGraph"
    KeptGraph.__module__ = base.__module__
    return KeptGraph


def _trees():
    try:
        from torch._inductor import cudagraph_trees
    except ImportError as e:  # pragma: no cover - torch without inductor
        raise StateError(f"torch.compile's CUDA graph trees are not available in this torch: {e}") from None
    return cudagraph_trees


def keep_compiled_graphs(enable: bool = True) -> None:
    """Makes every graph that ``torch.compile(mode="reduce-overhead")`` records from
    now on readable by :func:`audit_compiled` (``keep_graph=True``; Note [Keeping the
    graph trees readable]). Call it before the compiled function's recording call
    (its second call); graphs recorded before stay unreadable. ``enable=False``
    removes the hooks. Idempotent. Costs the host memory of each kept graph's
    nodes, nothing on the device and nothing per replay."""
    trees = _trees()
    manager = trees.CUDAGraphTreeManager
    if not enable:
        if _installed:
            manager.record_function = _installed["record_function"]
            if torch.cuda.CUDAGraph is _installed["graph"]:
                torch.cuda.CUDAGraph = _installed["base"]
            _installed.clear()
        return
    if _installed:
        return
    original = manager.record_function

    def record_function(self, new_inputs, function_id):
        _tls.recording = getattr(_tls, "recording", 0) + 1
        try:
            return original(self, new_inputs, function_id)
        finally:
            _tls.recording -= 1

    record_function.__wrapped__ = original  # type: ignore[attr-defined]
    _installed["base"] = torch.cuda.CUDAGraph
    _installed["record_function"] = original
    _installed["graph"] = _graph_class()
    manager.record_function = record_function
    torch.cuda.CUDAGraph = _installed["graph"]


def _kept(graph: Any) -> bool:
    """Whether ``graph`` kept its cudaGraph_t: only graphs made through
    keep_compiled_graphs' class say so. (raw_cuda_graph() is not asked: whether it
    refuses a graph that was not kept, or returns the destroyed handle, depends on
    the PyTorch version.)"""
    return bool(getattr(graph, "_graphkeep_kept", False))


@dataclasses.dataclass
class CompiledGraph:
    """One recorded node of a graph tree and its manifest."""

    function: str
    """The compiled function's name (inductor's)."""
    graph_id: int
    """The tree's id of the recording (``GraphID``)."""
    manifest: Manifest
    static_inputs: dict[int, str]
    """Data pointer -> placeholder name of each static input the node recorded (the
    parameters and buffers dynamo lifted as inputs): PyTorch checks these itself."""
    node: Any = dataclasses.field(repr=False, default=None)
    """A weak reference to the tree's node."""


@dataclasses.dataclass
class CompiledIssue:
    """One stale path of one recorded graph, found by :func:`guard_compiled`."""

    verdict: str
    """``superseded``: a static input moved; PyTorch will record the function again
    at its next call and keep the old graph until a tree reset. ``stale``: an address
    PyTorch does not check (an opaque op's workspace, a constant) moved or was freed;
    PyTorch would replay it. ``unknown``: an address nobody owned at capture."""
    function: str
    graph_id: int
    issue: VerifyIssue

    def __str__(self) -> str:
        return f"{self.verdict} ({self.function}, graph {self.graph_id}): {self.issue}"


@dataclasses.dataclass
class CompiledAudit:
    """What :func:`audit_compiled` read: every kept recording of every tree on one device."""

    device: int
    graphs: list[CompiledGraph]
    thread: int
    """The thread that audited (the trees are thread-local)."""

    def paths(self, kind: str | None = None) -> list[str]:
        """Every owner path any recorded graph reads."""
        out: set[str] = set()
        for g in self.graphs:
            out.update(g.manifest.paths(kind))
        return sorted(out)

    @property
    def clean(self) -> bool:
        return all(g.manifest.clean for g in self.graphs)

    def describe(self, max_lines: int = 10) -> str:
        lines = [f"{len(self.graphs)} recorded graph(s) on cuda:{self.device}"]
        for g in self.graphs:
            lines.append(f"  {g.function} (graph {g.graph_id}): " + g.manifest.describe(max_lines).replace("\n", "\n    "))
        return "\n".join(lines)


def _nodes(manager: Any) -> Iterator[Any]:
    stack = list(manager.get_roots())
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        for children in node.children.values():
            stack.extend(children)


def _manager(device: int, *, who: str) -> Any:
    trees = _trees()
    try:
        manager = trees.get_manager(device, create_if_none_exists=False)
    except (AssertionError, KeyError, AttributeError):
        manager = None
    if manager is None or manager.roots is None:
        raise StateError(
            f"{who}: no CUDA graph tree on cuda:{device} in this thread (thread {threading.get_ident()}). "
            "The trees of torch.compile(mode=\"reduce-overhead\") are thread-local: call it on the thread that "
            "runs the compiled model, after the recording call (the second call)")
    return manager


def _function_name(node: Any) -> str:
    model = getattr(getattr(node, "wrapped_function", None), "model", None)
    return getattr(model, "__name__", None) or type(model).__name__


def _static_inputs(node: Any) -> dict[int, str]:
    ptrs = getattr(node, "static_input_data_ptrs", []) or []
    holders = getattr(getattr(node, "wrapped_function", None), "placeholders", ()) or ()
    out: dict[int, str] = {}
    for i, p in enumerate(ptrs):
        if p:
            out[int(p)] = holders[i].name if i < len(holders) else f"input {i}"
    return out


def _audit_node(node: Any, model: Any, collection: Collection, device: int) -> CompiledGraph:
    graph = node.graph
    name, gid = _function_name(node), int(getattr(node.id, "id", node.id))
    if graph is None:
        raise StateError(f"audit_compiled: graph {gid} of {name} was freed (a tree reset or shutdown)")
    if not _kept(graph):
        raise StateError(
            f"audit_compiled: graph {gid} of {name} was recorded without keep_graph, so its kernels' addresses "
            "cannot be read (CUDA has no getter for an instantiated graph's node parameters). Call "
            "graphkeep.keep_compiled_graphs() before the recording, then record again: "
            "torch._inductor.cudagraph_trees.reset_cudagraph_trees() (or torch._dynamo.reset()), then call the "
            "compiled model twice")
    statics: dict[str, torch.Tensor] = {}
    for i, t in enumerate(getattr(node, "reconstructed_inputs", []) or []):
        if isinstance(t, torch.Tensor) and t.is_cuda:
            statics[f"input {i}"] = t
    for i, t in enumerate(getattr(getattr(node, "wrapped_function", None), "constants", ()) or ()):
        if isinstance(t, torch.Tensor) and t.is_cuda:
            statics[f"constant {i}"] = t
    manifest = audit(graph, model, static_io=statics, device=device, collection=collection)
    return CompiledGraph(name, gid, manifest, _static_inputs(node), weakref.ref(node))


def _model(model: Any) -> Any:
    return getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule wraps the module


def audit_compiled(model: Any, device: int | torch.device | None = None) -> CompiledAudit:
    """The manifests of every graph ``torch.compile(mode="reduce-overhead")`` recorded
    on ``device`` (default: the current one) in this thread, classified against
    ``model`` (the module, or what ``torch.compile`` returned). Each graph's copied
    inputs and inductor's constants are its static buffers. Needs
    :func:`keep_compiled_graphs` before the recording; refuses ``freezing=True``,
    whose constants are copies of the parameters that a reload does not reach."""
    try:
        from torch._inductor import config as inductor_config
        if getattr(inductor_config, "freezing", False):
            raise StateError("audit_compiled: torch._inductor.config.freezing is on: inductor folded the parameters "
                             "into constants of its own, which no reload reaches (every graph would serve the old "
                             "weights). Compile without freezing to reload weights")
    except ImportError:  # pragma: no cover
        pass
    dev = device.index if isinstance(device, torch.device) else device
    dev = torch.cuda.current_device() if dev is None else int(dev)
    manager = _manager(dev, who="audit_compiled")
    module = _model(model)
    collection = collect(module)
    graphs = [_audit_node(n, module, collection, dev) for n in _nodes(manager)]
    if not graphs:
        raise StateError(f"audit_compiled: the CUDA graph tree on cuda:{dev} holds no recording yet: call the "
                         "compiled model twice (a warm-up, then the recording) before auditing")
    return CompiledAudit(dev, graphs, threading.get_ident())


def _verdict(issue: VerifyIssue, graph: CompiledGraph) -> str:
    if issue.kind == "unknown":
        return "unknown"
    owner = next((o for o in graph.manifest.owners if o.path == issue.path), None)
    if owner is not None and any(owner.storage_ptr <= p < owner.storage_ptr + owner.storage_nbytes
                                 for p in graph.static_inputs):
        return "superseded"
    return "stale"


def guard_compiled(audit: CompiledAudit, model: Any) -> list[CompiledIssue]:
    """Raises :class:`graphkeep.DriftError` when a recorded graph of ``audit`` reads a
    path that moved, was freed or changed layout since the audit (or an address nobody
    owned), naming each path and saying whether PyTorch would record again
    (``superseded``) or replay it stale (``stale``). Graphs recorded since the audit
    are audited now and added to it (their addresses are the current ones); one that
    was recorded without keep_graph is refused. Returns [] when every graph is
    clean. Call it after every reload, on the thread that runs the model.

    The error's ``issues`` lists every :class:`CompiledIssue`, ``results`` every
    graph's :class:`graphkeep.VerifyResult`, and ``result`` the first one that
    failed."""
    if threading.get_ident() != audit.thread:
        raise StateError(f"guard_compiled: the audit was taken on thread {audit.thread}, this is thread "
                         f"{threading.get_ident()}: the CUDA graph trees are thread-local, guard on the thread "
                         "that runs the compiled model")
    manager = _manager(audit.device, who="guard_compiled")
    module = _model(model)
    now = collect(module)
    known = {id(g.node()): g for g in audit.graphs if g.node is not None and g.node() is not None}
    issues: list[CompiledIssue] = []
    results: list[VerifyResult] = []
    for node in _nodes(manager):
        g = known.get(id(node))
        if g is None:  # recorded after the audit
            audit.graphs.append(_audit_node(node, module, now, audit.device))
            continue
        result = g.manifest.verify(now)
        results.append(result)
        issues += [CompiledIssue(_verdict(i, g), g.function, g.graph_id, i) for i in result.issues]
        if not g.manifest.scan_complete:
            raise DriftError(f"replay refused: the scan of graph {g.graph_id} of {g.function} could not read "
                             f"{len(g.manifest.unsupported)} node(s), so their addresses are unchecked", result=result)
    if issues:
        lines = [f"replay refused: {len(issues)} stale address owner(s) in the recorded graphs of torch.compile:"]
        lines += [f"  {i}" for i in issues[:20]]
        if len(issues) > 20:
            lines.append(f"  ... and {len(issues) - 20} more")
        if any(i.verdict == "superseded" for i in issues):
            lines.append("  superseded: PyTorch sees the moved input and records the function again at its next "
                         "call, keeping the old graph and its memory until a tree reset; reload with p.copy_(new) "
                         "to keep the recorded graphs")
        if any(i.verdict == "stale" for i in issues):
            lines.append("  stale: PyTorch does not check these (they are not inputs of the compiled graph) and "
                         "would replay the old memory")
        # result: the first graph's verification with issues; issues and results: all of them
        err = DriftError("\n".join(lines), result=next((r for r in results if not r.ok), None))
        err.issues = issues  # type: ignore[attr-defined]
        err.results = results  # type: ignore[attr-defined]
        raise err
    return issues
