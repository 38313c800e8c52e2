"""The capture manifest for any PyTorch CUDA graph, and the guard before replay.

A ``torch.cuda.CUDAGraph`` burns in the address of every tensor its kernels read.
A weight reload that copies into the same storages (``p.copy_(new)``) keeps the
graph valid; one that rebinds a tensor (``p.data = new``, a quantization method
that reallocates a workspace or a scale in ``process_weights_after_loading``)
leaves the graph reading the old, stale or freed, memory, silently.
:func:`audit` reads what the graph really reads and names its owners;
:meth:`Manifest.verify` and :func:`guard` check them again after a reload.

    g = torch.cuda.CUDAGraph(keep_graph=True)          # keep the graph to read it
    with torch.cuda.graph(g):
        out = model(static_in)
    m = graphkeep.audit(g, model, static_io={"in": static_in, "out": out})
    print(m.describe())        # every address: parameter/buffer/escaped path, pool, I/O
    ... reload the weights ...
    graphkeep.guard(g, m, model)   # raises graphkeep.DriftError naming each stale path
    g.replay()

How addresses are read and classified (the C++ track's rules,
include/graphkeep/reload/manifest.h):

* The scan (``gk::cuda::scan_graph``, the driver API) reads every 8-byte word of
  every kernel node's parameters, memcpy and memset nodes' pointers, child
  graphs recursively; words that cannot be device addresses are dropped
  (Note [Default plausibility filter]), and so is every word that lies in no
  caching-allocator segment, library workspace, collected tensor or static
  buffer (not memory a tensor can own).
* Each address is then, in this order: ``parameter`` / ``buffer`` / ``escaped``
  (inside the storage of a tensor :func:`graphkeep.collect` reached, named by
  its path; a storage shared by a parameter and an escaped view belongs to the
  parameter), ``static_io`` (inside a tensor given as ``static_io``),
  ``pool`` (inside the graph's private memory pool), ``library`` (a cuBLAS or
  cuBLASLt workspace), else ``unknown``.
* Stale bytes: a kernel node's parameter bytes may hold leftover host bytes
  that look like a device address (Note [Stale bytes in kernel parameters] in
  capture/cuda/cuda_replay.cpp). An unknown word that points into no live
  caching-allocator block is ``unstable``, not an address; with
  ``confirm_with=`` (a second capture of the same forward), an unknown word
  the other capture does not repeat (same kernel, parameter, byte offset and
  address) is ``unstable`` too (Note [Confirming raw addresses] in
  reload/capture_tracking.cpp). Unstable words are not verified.

Everything but the scan and the allocator's state is plain Python over plain
data (:func:`build_manifest`), so it runs and is tested without a GPU.
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from typing import Any, Iterable, Mapping, Sequence

import torch

from .collector import Collection, CollectedTensor, collect
from .errors import DriftError, StateError

__all__ = ["CLASSES", "Manifest", "VerifyIssue", "VerifyResult", "audit", "build_manifest", "guard"]

# Address classes, in the order they are tried; the codes index this tuple.
CLASSES = ("parameter", "buffer", "escaped", "static_io", "pool", "library", "unknown", "unstable")
_CODE = {c: i for i, c in enumerate(CLASSES)}
_KIND_NAMES = ("kernel", "memcpy", "memset", "other")


@dataclasses.dataclass(frozen=True)
class _Owner:
    """A tensor that owns captured addresses, as it was at capture."""

    path: str
    kind: str  # parameter, buffer, escaped
    storage_ptr: int
    storage_nbytes: int
    layout: tuple  # (device, dtype, shape, stride, storage_offset)
    storage_ref: Any  # torch.UntypedStorage weak reference handle (int), or None


@dataclasses.dataclass
class VerifyIssue:
    """One stale path (or unknown address) found by :meth:`Manifest.verify`."""

    kind: str
    """``moved`` (the path holds a tensor with another storage: the graph reads the old
    one), ``expired`` (and the captured storage has been freed: the graph reads freed
    memory), ``layout`` (same storage, another shape/stride/dtype/offset), ``missing``
    (the path holds no tensor any more), ``unknown`` (an address no tensor, pool or
    buffer owned at capture)."""
    path: str
    """The owner's path ("" for unknown)."""
    detail: str
    kernels: list[str]
    """The kernels (node names) that read it."""
    nodes: list[int]
    """Their node indices in the scan's walk order."""

    def __str__(self) -> str:
        head = f"{self.kind}: {self.path}" if self.path else f"{self.kind}:"
        shown = ", ".join(_short(k) for k in self.kernels[:4])
        more = f" and {len(self.kernels) - 4} more" if len(self.kernels) > 4 else ""
        return f"{head} {self.detail}; read by {len(self.kernels)} kernel(s): {shown}{more}"


@dataclasses.dataclass
class VerifyResult:
    """What :meth:`Manifest.verify` found."""

    checked: int
    """Captured addresses checked (every one that is not unstable)."""
    paths_checked: int
    issues: list[VerifyIssue]
    ms: float
    """Time taken, the model's walk included."""

    @property
    def ok(self) -> bool:
        return not self.issues

    def __bool__(self) -> bool:
        return self.ok

    def stale_paths(self) -> list[str]:
        return [i.path for i in self.issues if i.path]

    def describe(self, max_lines: int = 20) -> str:
        if self.ok:
            return f"verified {self.checked} captured addresses of {self.paths_checked} paths: all still owned as at capture"
        lines = [f"{len(self.issues)} issue(s) among {self.checked} captured addresses; replay would read stale or "
                 "unknown memory:"]
        lines += [f"  {i}" for i in self.issues[:max_lines]]
        if len(self.issues) > max_lines:
            lines.append(f"  ... and {len(self.issues) - max_lines} more")
        return "\n".join(lines)


def _short(kernel: str, n: int = 80) -> str:
    return kernel if len(kernel) <= n else kernel[: n - 3] + "..."


def _ranges(pairs: Iterable[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = sorted((b, e) for b, e in pairs if e > b)
    if not pairs:
        return torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long)
    t = torch.tensor(pairs, dtype=torch.long)
    return t[:, 0].contiguous(), t[:, 1].contiguous()


def _locate(addr: torch.Tensor, begin: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """Index of the range holding each address (ranges sorted, disjoint), or -1."""
    if begin.numel() == 0:
        return torch.full_like(addr, -1)
    i = torch.searchsorted(begin, addr, right=True) - 1
    ok = (i >= 0) & (addr < end[i.clamp(min=0)])
    return torch.where(ok, i, torch.full_like(i, -1))


def _inside(addr: torch.Tensor, pairs: Iterable[tuple[int, int]]) -> torch.Tensor:
    b, e = _ranges(pairs)
    # overlapping ranges (segments never overlap; static buffers may): merge first
    if b.numel() > 1:
        merged: list[list[int]] = []
        for lo, hi in zip(b.tolist(), e.tolist()):
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        b, e = _ranges((lo, hi) for lo, hi in merged)
    return _locate(addr, b, e) >= 0


def _static_buffers(static_io: Any) -> list[tuple[str, torch.Tensor]]:
    if static_io is None:
        return []
    if isinstance(static_io, torch.Tensor):
        return [("static_io", static_io)]
    if isinstance(static_io, Mapping):
        items = list(static_io.items())
    elif isinstance(static_io, Sequence):
        items = [(f"static_io[{i}]", t) for i, t in enumerate(static_io)]
    else:
        raise TypeError(f"static_io must be a tensor, a sequence or a dict of tensors, not {type(static_io).__name__}")
    out = []
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"static_io '{name}' is a {type(t).__name__}, not a tensor")
        out.append((str(name), t))
    return out


class Manifest:
    """Every address a captured graph reads, with its class and owner (see the module doc).

    Made by :func:`audit` (or :func:`build_manifest`). Columns are CPU int64 tensors,
    one row per captured word: ``address``, ``node``, ``param`` (kernel parameter index),
    ``offset`` (byte offset in it), ``cls`` (an index into :data:`CLASSES`) and
    ``owner`` (an index into the owners, -1 when none).
    """

    def __init__(self, *, graph: int, address: torch.Tensor, node: torch.Tensor, param: torch.Tensor,
                 offset: torch.Tensor, node_kind: torch.Tensor, node_names: list[str], cls: torch.Tensor,
                 owner: torch.Tensor, owners: list[_Owner], static_names: list[str], words_scanned: int,
                 nodes: int, kernel_nodes: int, unsupported: list[str], scan_ms: float, classify_ms: float) -> None:
        self.graph = graph
        self.address, self.node, self.param, self.offset = address, node, param, offset
        self.node_kind, self.node_names = node_kind, node_names
        self.cls, self.owner, self.owners = cls, owner, owners
        self.static_names = static_names
        self.words_scanned, self.nodes, self.kernel_nodes = words_scanned, nodes, kernel_nodes
        self.unsupported = unsupported
        self.scan_ms, self.classify_ms = scan_ms, classify_ms
        refs = [o.storage_ref for o in owners if o.storage_ref is not None]
        self._finalizer = weakref.finalize(self, _free_refs, refs)
        # what verify() checks, computed once: the owners the graph reads, and the unknown rows
        owned = (cls <= _CODE["escaped"]) & (owner >= 0)
        self._used = sorted(set(owner[owned].tolist()))
        self._unknown_rows = (cls == _CODE["unknown"]).nonzero().flatten().tolist()
        self._checked = int((cls != _CODE["unstable"]).sum())

    # -- what the graph reads ------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.address.numel())

    def count(self, cls: str) -> int:
        return int((self.cls == _CODE[cls]).sum())

    def counts(self) -> dict[str, int]:
        binc = torch.bincount(self.cls, minlength=len(CLASSES)).tolist()
        return {c: n for c, n in zip(CLASSES, binc)}

    @property
    def scan_complete(self) -> bool:
        """False when the scan could not read some nodes (conditional nodes, unknown
        node types): their addresses are missing, so the manifest cannot vouch for them."""
        return not self.unsupported

    @property
    def clean(self) -> bool:
        """True when every address has an owner (no unknown address) and the scan is complete."""
        return self.count("unknown") == 0 and self.scan_complete

    def paths(self, kind: str | None = None) -> list[str]:
        """The owners' paths the graph reads (parameters, buffers, escaped tensors)."""
        used = sorted(set(self.owner[(self.owner >= 0) & (self.cls <= _CODE["escaped"])].tolist()))
        return [self.owners[i].path for i in used if kind is None or self.owners[i].kind == kind]

    def kernels_reading(self, path: str) -> list[str]:
        """The node names (mangled kernel names, memcpy, memset) that read ``path``'s storage."""
        return self._kernels(self._owner_rows(path))[0]

    def entries(self, cls: str | None = None) -> list[dict]:
        """The rows as dicts (address, node, kernel, param, offset, cls, owner)."""
        rows = range(len(self)) if cls is None else (self.cls == _CODE[cls]).nonzero().flatten().tolist()
        out = []
        for r in rows:
            o = int(self.owner[r])
            c = CLASSES[int(self.cls[r])]
            name = (self.owners[o].path if c in ("parameter", "buffer", "escaped") and o >= 0
                    else self.static_names[o] if c == "static_io" and o >= 0 else "")
            n = int(self.node[r])
            out.append({"address": int(self.address[r]), "node": n, "kernel": self.node_names[n],
                        "param": int(self.param[r]), "offset": int(self.offset[r]), "cls": c, "owner": name})
        return out

    def unknown(self) -> list[str]:
        """The unknown addresses, one readable line each."""
        return [f"node {e['node']} ({_short(e['kernel'])}) param {e['param']} +{e['offset']}: 0x{e['address']:x} "
                "lies in no collected tensor, static buffer, pool or library workspace"
                for e in self.entries("unknown")]

    def describe(self, max_lines: int = 20) -> str:
        c = self.counts()
        lines = [f"graph 0x{self.graph:x}: {self.nodes} nodes ({self.kernel_nodes} kernels), {len(self)} addresses: "
                 + ", ".join(f"{n} {k}" for k, n in c.items() if n)]
        if self.unsupported:
            lines.append(f"  INCOMPLETE scan: {len(self.unsupported)} node(s) not readable: "
                         + "; ".join(self.unsupported[:3]))
        for kind in ("parameter", "buffer", "escaped"):
            ps = self.paths(kind)
            if ps:
                shown = ", ".join(ps[:max_lines])
                lines.append(f"  {kind} ({len(ps)}): {shown}{' ...' if len(ps) > max_lines else ''}")
        unk = self.unknown()
        lines += [f"  unknown: {u}" for u in unk[:max_lines]]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<graphkeep.Manifest {self.describe().splitlines()[0]}>"

    # -- verification --------------------------------------------------------------------
    def _owner_rows(self, path: str) -> torch.Tensor:
        idx = [i for i, o in enumerate(self.owners) if o.path == path]
        if not idx:
            return torch.empty(0, dtype=torch.long)
        mask = torch.isin(self.owner, torch.tensor(idx)) & (self.cls <= _CODE["escaped"])
        return mask.nonzero().flatten()

    def _kernels(self, rows: torch.Tensor) -> tuple[list[str], list[int]]:
        nodes = sorted(set(self.node[rows].tolist()))
        names: list[str] = []
        for n in nodes:
            if self.node_names[n] not in names:
                names.append(self.node_names[n])
        return names, nodes

    def verify(self, model: Any) -> VerifyResult:
        """Checks that every captured address is still owned by the same path, with the
        same storage and layout (``model``: the model, or a :class:`graphkeep.Collection`
        of it, to share one walk between the manifests of several graphs)."""
        t0 = time.perf_counter()
        now = model if isinstance(model, Collection) else collect(model)
        issues: list[VerifyIssue] = []
        for o in self._used:
            cap = self.owners[o]
            kind, detail = _compare(cap, now.get(cap.path))
            if kind is None:
                continue
            rows = ((self.owner == o) & (self.cls <= _CODE["escaped"])).nonzero().flatten()
            names, nodes = self._kernels(rows)
            issues.append(VerifyIssue(kind, cap.path, detail, names, nodes))
        for r in self._unknown_rows:
            n = int(self.node[r])
            issues.append(VerifyIssue("unknown", "", f"0x{int(self.address[r]):x} (param {int(self.param[r])} "
                                      f"+{int(self.offset[r])}) had no owner at capture", [self.node_names[n]], [n]))
        return VerifyResult(checked=self._checked, paths_checked=len(self._used), issues=issues,
                            ms=(time.perf_counter() - t0) * 1e3)


def _free_refs(refs: list[int]) -> None:
    for r in refs:
        torch.UntypedStorage._free_weak_ref(r)


def _expired(cap: _Owner) -> bool:
    return cap.storage_ref is not None and bool(torch.UntypedStorage._expired(cap.storage_ref))


def _compare(cap: _Owner, cur: CollectedTensor | None) -> tuple[str | None, str]:
    freed = " (the captured storage has been freed: the graph reads freed memory)"
    if cur is None:
        if _expired(cap):
            return "expired", "holds no tensor any more" + freed
        return "missing", "holds no tensor any more; the graph reads its old storage"
    if cur.storage_ptr != cap.storage_ptr or cur.storage_nbytes != cap.storage_nbytes:
        what = (f"now uses storage 0x{cur.storage_ptr:x} ({cur.storage_nbytes} bytes), the graph reads "
                f"0x{cap.storage_ptr:x} ({cap.storage_nbytes} bytes)")
        return ("expired", what + freed) if _expired(cap) else ("moved", what)
    if _expired(cap):
        # Same address, another storage: the captured one was freed and the allocator
        # gave its bytes to the new tensor. The graph reads the right bytes by chance
        # only (what else the allocator puts there next is up to it): not the same storage.
        return "expired", (f"was reallocated: the captured storage was freed and a new one of the same size "
                           f"happens to sit at the same address 0x{cap.storage_ptr:x}")
    layout = cur.layout()
    if layout != cap.layout:
        names = ("device", "dtype", "shape", "stride", "storage offset")
        diffs = [f"{n} {a} -> {b}" for n, a, b in zip(names, cap.layout, layout) if a != b]
        return "layout", "same storage, changed " + ", ".join(diffs)
    return None, ""


def _owner_table(collection: Collection) -> tuple[list[_Owner], torch.Tensor, torch.Tensor, torch.Tensor]:
    """One owner per distinct storage (a parameter or buffer before an escaped view of
    it), and the storages' sorted ranges -> owner index."""
    rank = {"parameter": 0, "buffer": 1, "escaped": 2}
    best: dict[int, CollectedTensor] = {}
    for t in collection.tensors:
        if not t.storage_ptr or not t.storage_nbytes:
            continue
        cur = best.get(t.storage_ptr)
        if cur is None or rank[t.kind] < rank[cur.kind] or (
                t.kind == cur.kind and t.storage_nbytes > cur.storage_nbytes):
            best[t.storage_ptr] = t
    owners: list[_Owner] = []
    spans: list[tuple[int, int, int]] = []
    for ptr, t in best.items():
        ref = t.tensor.untyped_storage()._weak_ref()
        owners.append(_Owner(t.path, t.kind, ptr, t.storage_nbytes, t.layout(), ref))
        spans.append((ptr, ptr + t.storage_nbytes, len(owners) - 1))
    spans.sort()
    # storages never overlap; if they did (one allocation viewed through two storages)
    # the first one by address wins for the shared bytes
    if not spans:
        e = torch.empty(0, dtype=torch.long)
        return owners, e, e, e
    t = torch.tensor(spans, dtype=torch.long)
    return owners, t[:, 0].contiguous(), t[:, 1].contiguous(), t[:, 2].contiguous()


def build_manifest(scan: Mapping[str, Any], collection: Collection, *, static_io: Any = None,
                   segments: Sequence[tuple[int, int]] = (), pool: Sequence[tuple[int, int]] = (),
                   live_blocks: Sequence[tuple[int, int]] | None = None,
                   library: Sequence[tuple[int, int]] = (), confirm: Mapping[str, Any] | None = None,
                   graph: int = 0, scan_ms: float = 0.0) -> Manifest:
    """Classifies the words of ``scan`` (what ``graphkeep._C.scan_graph`` returns: the
    columns ``address``, ``node``, ``kind``, ``param``, ``offset``, and ``node_names``,
    ``nodes``, ``kernel_nodes``, ``unsupported``) against ``collection`` and the memory
    ranges given: ``segments`` (every caching-allocator segment; a word in none of them,
    nor in a tensor, static buffer or library range, is dropped), ``pool`` (the graph's
    private pool), ``live_blocks`` (the allocated blocks; None: every unknown word is
    taken as live), ``library`` (library workspaces). ``confirm``: the scan of a second
    capture of the same forward (unknown words it does not repeat are unstable).
    :func:`audit` gathers these from the GPU; tests give them by hand."""
    t0 = time.perf_counter()
    address = scan["address"].to(torch.long)
    node, kind = scan["node"].to(torch.long), scan["kind"].to(torch.long)
    param, offset = scan["param"].to(torch.long), scan["offset"].to(torch.long)
    owners, obeg, oend, oidx = _owner_table(collection)
    statics = _static_buffers(static_io)
    static_pairs = []
    for name, t in statics:
        if t.numel() > 0:
            ptr, n = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
            static_pairs.append((ptr, ptr + n))

    # keep only words inside memory a tensor can own
    keep = _inside(address, list(segments) + list(library) + static_pairs +
                   list(zip(obeg.tolist(), oend.tolist())))
    address, node, kind, param, offset = (c[keep] for c in (address, node, kind, param, offset))

    n = address.numel()
    cls = torch.full((n,), _CODE["unknown"], dtype=torch.long)
    owner = torch.full((n,), -1, dtype=torch.long)
    hit = _locate(address, obeg, oend)
    has = hit >= 0
    if has.any():
        owner[has] = oidx[hit[has]]
        codes = torch.tensor([_CODE[o.kind] for o in owners], dtype=torch.long)
        cls[has] = codes[owner[has]]
    rest = ~has
    if static_pairs and rest.any():
        # per buffer, so the owner names the buffer (static buffers are few)
        for i, (b, e) in enumerate(static_pairs):
            m = rest & (address >= b) & (address < e)
            cls[m], owner[m] = _CODE["static_io"], i
            rest = rest & ~m
    for name, pairs in (("pool", pool), ("library", library)):
        if pairs and rest.any():
            m = rest & _inside(address, pairs)
            cls[m] = _CODE[name]
            rest = rest & ~m
    unk = rest
    if unk.any() and live_blocks is not None:
        dead = unk & ~_inside(address, live_blocks)
        cls[dead] = _CODE["unstable"]
        unk = unk & ~dead
    if unk.any() and confirm is not None:
        names = confirm["node_names"]
        seen = {(names[int(nd)], int(p), int(o), int(a)) for a, nd, p, o in
                zip(confirm["address"].tolist(), confirm["node"].tolist(), confirm["param"].tolist(),
                    confirm["offset"].tolist())}
        for r in unk.nonzero().flatten().tolist():
            key = (scan["node_names"][int(node[r])], int(param[r]), int(offset[r]), int(address[r]))
            if key not in seen:
                cls[r] = _CODE["unstable"]
    return Manifest(graph=graph, address=address, node=node, param=param, offset=offset, node_kind=kind,
                    node_names=list(scan["node_names"]), cls=cls, owner=owner, owners=owners,
                    static_names=[name for name, t in statics if t.numel() > 0],
                    words_scanned=int(scan["address"].numel()), nodes=int(scan["nodes"]),
                    kernel_nodes=int(scan["kernel_nodes"]), unsupported=list(scan["unsupported"]),
                    scan_ms=scan_ms, classify_ms=(time.perf_counter() - t0) * 1e3)


def _cuda_extension():
    from . import _C
    if not _C.with_cuda:
        raise StateError("graphkeep was built without CUDA (its torch had no CUDA, or no nvcc was found): "
                         "audit() needs the CUDA graph scan")
    return _C


def _raw_graph(graph: Any) -> int:
    if isinstance(graph, int):
        return graph
    try:
        return int(graph.raw_cuda_graph())
    except RuntimeError as e:
        raise StateError(f"cannot read the graph: {e} (capture it with torch.cuda.CUDAGraph(keep_graph=True))") \
            from None


def scan(graph: Any) -> dict:
    """The raw scan of a ``torch.cuda.CUDAGraph(keep_graph=True)`` (or a ``cudaGraph_t`` as
    an int): the columns :func:`build_manifest` takes, and ``ms``, the time it took."""
    c = _cuda_extension()
    t0 = time.perf_counter()
    out = c.scan_graph(_raw_graph(graph))
    out["ms"] = (time.perf_counter() - t0) * 1e3
    return out


def audit(graph: Any, model: Any, static_io: Any = None, *, confirm_with: Any = None,
          device: int | torch.device | None = None, collection: Collection | None = None) -> Manifest:
    """The capture manifest of ``graph``, a ``torch.cuda.CUDAGraph`` captured with
    ``keep_graph=True``: every address its nodes read, classified against ``model``
    (walked by :func:`graphkeep.collect`; pass ``collection`` to reuse a walk),
    ``static_io`` (a tensor, a list or a dict name -> tensor: the graph's persistent
    inputs and outputs), the graph's pool, and library workspaces. ``confirm_with``:
    a second graph captured from the same forward, to tell stale parameter bytes from
    addresses (see the module doc)."""
    c = _cuda_extension()
    raw = _raw_graph(graph)
    t0 = time.perf_counter()
    words = c.scan_graph(raw)
    scan_ms = (time.perf_counter() - t0) * 1e3
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
    state = c.allocator_state(dev.index if dev.index is not None else torch.cuda.current_device())
    seg_pairs = list(zip(state["segment_begin"].tolist(), state["segment_end"].tolist()))
    pool_pairs: list[tuple[int, int]] = []
    if hasattr(graph, "pool"):
        pid = tuple(int(x) for x in graph.pool())
        p0, p1 = state["segment_pool"]
        for (b, e), a, bb in zip(seg_pairs, p0.tolist(), p1.tolist()):
            if (a, bb) == pid:
                pool_pairs.append((b, e))
    live = state["block_live"]
    live_pairs = list(zip(state["block_begin"][live].tolist(), state["block_end"][live].tolist()))
    library = [(b, e) for _, b, e in c.library_workspaces()]
    confirm = c.scan_graph(_raw_graph(confirm_with)) if confirm_with is not None else None
    return build_manifest(words, collection if collection is not None else collect(model), static_io=static_io,
                          segments=seg_pairs, pool=pool_pairs, live_blocks=live_pairs, library=library,
                          confirm=confirm, graph=raw, scan_ms=scan_ms)


def guard(graph: Any, manifest: Manifest, model: Any) -> VerifyResult:
    """Raises :class:`graphkeep.DriftError` if replaying ``graph`` now would read stale or
    unknown memory: an address whose owner moved, was freed or changed layout since
    ``manifest`` was taken, an address no one owned at capture, or a scan that could
    not read every node. Returns the (clean) verification otherwise. Call it before
    ``graph.replay()`` after every reload."""
    if graph is not None and _raw_graph(graph) != manifest.graph:
        raise StateError(f"guard: the manifest is of graph 0x{manifest.graph:x}, not of this graph "
                         f"(0x{_raw_graph(graph):x}); audit each graph you replay")
    result = manifest.verify(model)
    if not manifest.scan_complete:
        raise DriftError(f"replay refused: the scan of graph 0x{manifest.graph:x} could not read "
                         f"{len(manifest.unsupported)} node(s) ({'; '.join(manifest.unsupported[:3])}), so "
                         "their addresses are unchecked", result=result)
    if not result.ok:
        raise DriftError("replay refused: " + result.describe(), result=result)
    return result
