"""The recursive collector for Python objects: every tensor a model can reach.

A captured graph reads every tensor a model's forward touched, not only its
parameters. A quantization method keeps kernel objects in plain attributes,
lists of per-expert tensors, dicts of scales, closures over a workspace; a
loader's copy-back (``load_state_dict``, ``weight_loader``) covers only the
registered parameters and buffers. :func:`collect` walks everything a model
reaches and reports each tensor with its path, its storage and its kind:

* ``"parameter"`` / ``"buffer"``: registered on a module (its
  ``named_parameters()`` / ``named_buffers()`` name), what copy-back covers;
* ``"escaped"``: any other tensor (derived in ``process_weights_after_loading``,
  held by a kernel object, a list, a dict, a closure): copy-back does not cover
  it, so a reload that rebuilds it leaves captured graphs reading the old one.

    >>> c = graphkeep.collect(model)
    >>> [t.path for t in c.escaped()]
    ['layers.0.mlp.quant_method.workspace', 'layers.0.mlp.scales[w13]']
    >>> c.stops                      # where a limit stopped the walk
    []

What it walks: ``nn.Module`` trees (registered parameters, buffers and
submodules, then plain attributes); lists, tuples, dicts and sets;
dataclasses and objects with ``__dict__`` or ``__slots__``;
``functools.partial`` objects, bound methods and the closure cells of
functions; ``Parameter`` and tensor subclasses (the Python attributes of a
tensor, and the inner tensors of a wrapper subclass through
``__tensor_flatten__``); reference cycles (each object once; a tensor reached
again is an alias of its first path). Paths follow the C++ collector's
vocabulary: ``.name`` for attributes and submodules, ``[i]`` for sequence
elements, ``[key]`` for dict entries, ``{i}`` for set elements,
``.<closure name>`` for closure cells.

What it does not walk: torch's own objects other than modules and tensors
(optimizers, streams, graphs, dtypes, devices, ``torch._C`` objects), module
hooks, functions' globals and defaults, modules and classes. Objects it cannot
look into (extension objects without ``__dict__`` or ``__slots__``) are listed
in :attr:`Collection.opaque`: raw memory a graph reads may be held there.
The walk is bounded by ``max_depth`` and ``max_count``; where a bound stopped
it is listed in :attr:`Collection.stops`.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from typing import Any, Iterator

import torch

__all__ = ["CollectedTensor", "Collection", "collect"]

# Attributes every nn.Module has (its registries and hooks): walked through
# the registries (parameters, buffers, submodules), not as plain attributes.
_MODULE_INTERNALS = frozenset(torch.nn.Module().__dict__)

# Leaves: values that hold no tensor and are not looked into.
_LEAF_TYPES = (type(None), bool, int, float, complex, str, bytes, bytearray, range, slice, memoryview,
               enum.Enum, type, types.ModuleType, types.BuiltinFunctionType, types.BuiltinMethodType,
               types.CodeType, types.FrameType, types.GeneratorType, torch.dtype, torch.device,
               torch.Size, torch.layout, torch.memory_format)


@dataclasses.dataclass
class CollectedTensor:
    """One tensor the collector reached."""

    path: str
    """The first path it was reached by (a parameter's or buffer's registered name first)."""
    kind: str
    """``"parameter"``, ``"buffer"`` or ``"escaped"``."""
    tensor: torch.Tensor
    storage_ptr: int
    """Address of the tensor's storage (0 when it has none: meta, sparse, a wrapper subclass)."""
    storage_nbytes: int
    type_name: str
    """The tensor's class (``Parameter``, a subclass's name, ``Tensor``)."""
    aliases: list[str] = dataclasses.field(default_factory=list)
    """Other paths reaching the same tensor object (tied weights, attributes, cycles)."""
    storage_owner: str | None = None
    """For an escaped tensor that shares a parameter's or buffer's storage (a view of
    it): that parameter's path. An in-place copy into the parameter updates it too."""
    _layout: tuple | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def covered(self) -> bool:
        """Whether a loader's copy-back covers it (a parameter or buffer)."""
        return self.kind != "escaped"

    def layout(self) -> tuple:
        """(device, dtype, shape, stride, storage_offset): what a captured kernel burned in,
        as the collector saw it (like ``storage_ptr``, a snapshot taken by the walk)."""
        if self._layout is None:
            t = self.tensor
            self._layout = (str(t.device), t.dtype, tuple(t.shape), tuple(t.stride()) if t.layout == torch.strided
                            else (), t.storage_offset() if t.layout == torch.strided else 0)
        return self._layout


@dataclasses.dataclass
class Collection:
    """What :func:`collect` found."""

    tensors: list[CollectedTensor]
    stops: list[str]
    """One line per place a bound stopped the walk ("path: why")."""
    opaque: list[str]
    """Objects the walk could not look into ("path (type)")."""
    visited: int
    """Objects visited (what ``max_count`` bounds)."""

    def __post_init__(self) -> None:
        self._by_path: dict[str, CollectedTensor] = {}
        for t in self.tensors:
            self._by_path[t.path] = t
            for a in t.aliases:
                self._by_path.setdefault(a, t)

    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self) -> Iterator[CollectedTensor]:
        return iter(self.tensors)

    def __contains__(self, path: str) -> bool:
        return path in self._by_path

    def __getitem__(self, path: str) -> CollectedTensor:
        """The tensor at ``path`` (an alias path works too); KeyError if none."""
        return self._by_path[path]

    def get(self, path: str) -> CollectedTensor | None:
        return self._by_path.get(path)

    def parameters(self) -> list[CollectedTensor]:
        return [t for t in self.tensors if t.kind == "parameter"]

    def buffers(self) -> list[CollectedTensor]:
        return [t for t in self.tensors if t.kind == "buffer"]

    def escaped(self) -> list[CollectedTensor]:
        return [t for t in self.tensors if t.kind == "escaped"]

    def paths(self, kind: str | None = None) -> list[str]:
        """The tensors' paths, of one kind or all."""
        return [t.path for t in self.tensors if kind is None or t.kind == kind]

    @property
    def complete(self) -> bool:
        """True when no bound stopped the walk."""
        return not self.stops

    def describe(self) -> str:
        lines = [f"{len(self.tensors)} tensors: {len(self.parameters())} parameters, "
                 f"{len(self.buffers())} buffers, {len(self.escaped())} escaped; {self.visited} objects visited"]
        lines += [f"  escaped: {t.path} ({t.type_name}{', view of ' + t.storage_owner if t.storage_owner else ''})"
                  for t in self.escaped()]
        lines += [f"  stopped: {s}" for s in self.stops]
        lines += [f"  opaque: {o}" for o in self.opaque]
        return "\n".join(lines)


def _storage_of(t: torch.Tensor) -> tuple[int, int]:
    if t.is_sparse or t.layout != torch.strided or t.device.type == "meta":
        return 0, 0
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except (RuntimeError, NotImplementedError):  # a wrapper subclass has no real storage
        return 0, 0


def _is_wrapper_subclass(t: torch.Tensor) -> bool:
    return type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(type(t), "__tensor_flatten__")


def _is_torch_internal(obj: Any) -> bool:
    mod = type(obj).__module__ or ""
    return mod == "torch" or mod.startswith("torch.") or mod.startswith("torch._")


def _key_text(k: Any) -> str:
    return str(k) if isinstance(k, (str, int)) else repr(k)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _slot_names(cls: type) -> Iterator[tuple[str, str]]:
    """(attribute name, name as declared) of every slot of ``cls`` and its bases."""
    for c in cls.__mro__:
        slots = c.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        for s in slots:
            if s in ("__dict__", "__weakref__"):
                continue
            private = s.startswith("__") and not s.endswith("__")  # mangled: _Class__name
            yield (f"_{c.__name__.lstrip('_')}{s}" if private else s), s


class _Walk:
    def __init__(self, max_depth: int, max_count: int) -> None:
        self.max_depth = max_depth
        self.max_count = max_count
        self.records: dict[int, CollectedTensor] = {}  # id(tensor) -> record
        self.order: list[int] = []
        self.registered: dict[int, tuple[str, str]] = {}  # id(tensor) -> (kind, path) from the modules
        self.prepassed: set[int] = set()
        self.seen: set[int] = set()
        self.keep: list[Any] = []  # keeps every visited object alive, so ids stay unique
        self.stops: list[str] = []
        self.opaque: list[str] = []
        self.visited = 0
        self.count_stopped = False

    # -- tensors ---------------------------------------------------------------------------
    def tensor(self, t: torch.Tensor, path: str, kind: str | None = None) -> None:
        key = id(t)
        rec = self.records.get(key)
        if rec is not None:
            if path != rec.path and path not in rec.aliases:
                rec.aliases.append(path)
            return
        self.keep.append(t)
        reg = self.registered.get(key)
        if reg is not None:
            kind, canonical = reg
            aliases = [path] if path != canonical else []
            path = canonical
        else:
            kind = kind or "escaped"
            aliases = []
        ptr, nbytes = _storage_of(t)
        rec = CollectedTensor(path=path, kind=kind, tensor=t, storage_ptr=ptr, storage_nbytes=nbytes,
                              type_name=type(t).__name__, aliases=aliases)
        rec.layout()
        self.records[key] = rec
        self.order.append(key)

    def register(self, t: torch.Tensor, kind: str, path: str) -> None:
        """A module's parameter or buffer: its registered name is its path, whatever
        path reached it first."""
        key = id(t)
        if key in self.registered:
            rec = self.records.get(key)
            if rec is not None and path != rec.path and path not in rec.aliases:
                rec.aliases.append(path)
            return
        self.registered[key] = (kind, path)
        rec = self.records.get(key)
        if rec is not None:  # reached earlier through another path: upgrade
            old = rec.path
            rec.kind, rec.path = kind, path
            if old != path and old not in rec.aliases:
                rec.aliases.insert(0, old)

    # -- the walk --------------------------------------------------------------------------
    def visit(self, obj: Any, path: str, depth: int) -> None:
        if isinstance(obj, _LEAF_TYPES):
            return
        if isinstance(obj, torch.Tensor):
            self.visit_tensor(obj, path, depth)
            return
        key = id(obj)
        if key in self.seen:
            return
        if depth > self.max_depth:
            self.stops.append(f"{path or '<root>'}: depth limit {self.max_depth} reached at a "
                              f"{type(obj).__name__}")
            return
        if self.visited >= self.max_count:
            if not self.count_stopped:
                self.stops.append(f"{path or '<root>'}: object limit {self.max_count} reached; "
                                  "objects after it were not visited")
                self.count_stopped = True
            return
        self.seen.add(key)
        self.keep.append(obj)
        self.visited += 1
        if isinstance(obj, torch.nn.Module):
            self.visit_module(obj, path, depth)
        elif isinstance(obj, dict):
            for k, v in list(obj.items()):
                self.visit(v, f"{path}[{_key_text(k)}]", depth + 1)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(list(obj)):
                self.visit(v, f"{path}[{i}]", depth + 1)
        elif isinstance(obj, (set, frozenset)):
            for i, v in enumerate(list(obj)):
                self.visit(v, f"{path}{{{i}}}", depth + 1)
        elif isinstance(obj, functools.partial):
            self.visit(obj.func, _join(path, "func"), depth + 1)
            for i, v in enumerate(obj.args):
                self.visit(v, f"{_join(path, 'args')}[{i}]", depth + 1)
            for k, v in obj.keywords.items():
                self.visit(v, f"{_join(path, 'keywords')}[{k}]", depth + 1)
        elif isinstance(obj, types.MethodType):
            self.visit(obj.__self__, _join(path, "__self__"), depth + 1)
            self.visit(obj.__func__, path, depth + 1)
        elif isinstance(obj, types.FunctionType):
            for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
                try:
                    value = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                self.visit(value, _join(path, f"<closure {name}>"), depth + 1)
        elif _is_torch_internal(obj):
            return  # torch's own objects: not looked into
        else:
            self.visit_object(obj, path, depth)

    def visit_tensor(self, t: torch.Tensor, path: str, depth: int, kind: str | None = None) -> None:
        first = id(t) not in self.records
        if _is_wrapper_subclass(t) and _storage_of(t)[0] == 0:
            # a wrapper subclass: its data lives in its inner tensors
            if id(t) in self.seen:
                return
            self.seen.add(id(t))
            self.keep.append(t)
            reg = self.registered.get(id(t))
            if reg is not None:
                kind, path = reg
            try:
                names = t.__tensor_flatten__()[0]
            except Exception:  # noqa: BLE001  (a subclass's own method)
                self.opaque.append(f"{path} ({type(t).__name__}: __tensor_flatten__ failed)")
                return
            for n in names:
                inner = getattr(t, n, None)
                if isinstance(inner, torch.Tensor):
                    self.visit_tensor(inner, _join(path, n), depth + 1, kind)
            return
        self.tensor(t, path, kind)
        if first:
            attrs = getattr(t, "__dict__", None)
            if attrs:
                for name, v in list(attrs.items()):
                    self.visit(v, _join(path, name), depth + 1)

    def prepass(self, m: torch.nn.Module, path: str) -> None:
        if id(m) in self.prepassed:
            return
        for name, sub in m.named_modules(remove_duplicate=False):
            self.prepassed.add(id(sub))
        for name, p in m.named_parameters(remove_duplicate=False):
            self.register(p, "parameter", _join(path, name))
        for name, b in m.named_buffers(remove_duplicate=False):
            if b is not None:
                self.register(b, "buffer", _join(path, name))

    def visit_module(self, m: torch.nn.Module, path: str, depth: int) -> None:
        self.prepass(m, path)
        for name, p in m._parameters.items():
            if p is not None:
                self.visit_tensor(p, _join(path, name), depth + 1, "parameter")
        for name, b in m._buffers.items():
            if b is not None:
                self.visit_tensor(b, _join(path, name), depth + 1, "buffer")
        for name, sub in m._modules.items():
            if sub is not None:
                self.visit(sub, _join(path, name), depth + 1)
        for name, v in list(m.__dict__.items()):
            if name not in _MODULE_INTERNALS:
                self.visit(v, _join(path, name), depth + 1)

    def visit_object(self, obj: Any, path: str, depth: int) -> None:
        attrs = getattr(obj, "__dict__", None)
        slots = list(_slot_names(type(obj)))
        if not isinstance(attrs, dict) and not slots:
            self.opaque.append(f"{path or '<root>'} ({type(obj).__module__}.{type(obj).__qualname__})")
            return
        if isinstance(attrs, dict):
            for name, v in list(attrs.items()):
                self.visit(v, _join(path, name), depth + 1)
        missing = object()
        for attr, declared in slots:
            v = getattr(obj, attr, missing)
            if v is not missing:
                self.visit(v, _join(path, declared), depth + 1)


def collect(obj: Any, *, prefix: str = "", max_depth: int = 64, max_count: int = 100_000) -> Collection:
    """Walks ``obj`` (a model, a layer, any object) and returns every tensor it reaches.

    ``prefix`` is prepended to every path (``collect(model.layers[0], prefix="layers.0")``
    names tensors as ``collect(model)`` would). ``max_depth`` bounds how deep the walk
    descends, ``max_count`` how many objects it visits; where either stopped it is
    listed in :attr:`Collection.stops` (then the collection may miss tensors).
    """
    if max_depth < 0 or max_count < 1:
        raise ValueError(f"collect: max_depth must be >= 0 and max_count >= 1 (got {max_depth}, {max_count})")
    w = _Walk(max_depth, max_count)
    w.visit(obj, prefix, 0)
    tensors = [w.records[k] for k in w.order]
    owners: dict[int, str] = {}
    for t in tensors:
        if t.kind != "escaped" and t.storage_ptr and t.storage_nbytes:
            owners.setdefault(t.storage_ptr, t.path)
    for t in tensors:
        if t.kind == "escaped" and t.storage_ptr and t.storage_nbytes:
            t.storage_owner = owners.get(t.storage_ptr)
    return Collection(tensors=tensors, stops=w.stops, opaque=w.opaque, visited=w.visited)
