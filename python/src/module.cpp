// graphkeep._C: the extension module of the Python package graphkeep.
//
// What it binds (the Python-facing API and its docs are in
// python/graphkeep/*.py and _C.pyi; this file stays thin):
//   - the error family: every gk::Error leaving a binding becomes the
//     graphkeep.Error subclass of its kind (graphkeep/errors.py), with the
//     same message (Note [Errors cross as the same message]);
//   - the CUDA graph scan (gk::cuda::scan_graph) for graphkeep.audit, and
//     the caching allocator's segments and blocks, as column tensors;
//   - weight patches and content hashes (patch.cpp);
//   - the example engine (engine.cpp).
//
// Tensors cross through torch's casters (Note [pybind11 headers: torch's
// copy] in python/CMakeLists.txt).
#include "bindings.h"

#include <graphkeep/core/check.h>
#include <graphkeep/reload/errors.h>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <graphkeep/capture/cuda_graph_addresses.h>

#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <mutex>
#include <shared_mutex>
#endif

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace gkpy {
namespace {

// Note [Errors cross as the same message]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A gk::Error becomes an instance of the Python class of its ErrorKind
// (graphkeep.DeclarationError, WeightError, MismatchError, DriftError,
// StateError, InternalError; all subclasses of graphkeep.Error, itself a
// RuntimeError). str(exc) is the C++ what() unchanged ("graphkeep: <message>"
// and the source location), exc.message is message(), exc.where is
// (function, file, line), and a MismatchError carries paths(). The classes
// are Python classes (graphkeep/errors.py) so that the package's Python code
// raises the same family; the translator looks them up once, at import.
struct ErrorClasses {
  std::array<py::object, 6> by_kind;  // indexed by gk::ErrorKind
};

ErrorClasses& error_classes() {
  static auto* classes = new ErrorClasses();  // leaked: outlives interpreter teardown
  return *classes;
}

std::size_t kind_index(gk::ErrorKind k) { return static_cast<std::size_t>(k); }

void raise_gk(const gk::Error& e, const py::object& paths) {
  const py::object& cls = error_classes().by_kind.at(kind_index(e.kind()));
  py::dict kw;
  const gk::SourceLocation& w = e.where();
  kw["where"] = py::make_tuple(w.function ? w.function : "", w.file ? w.file : "", w.line);
  kw["what"] = py::str(e.what());
  if (!paths.is_none()) kw["paths"] = paths;
  py::object inst = cls(py::str(e.message()), **kw);
  PyErr_SetObject(cls.ptr(), inst.ptr());
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const gk::MismatchError& e) {
    raise_gk(e, py::cast(e.paths()));
  } catch (const gk::Error& e) {
    raise_gk(e, py::none());
  } catch (const c10::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

// Raises the C++ error of `kind` with `message` through GK_THROW, as the
// library does: the tests check what arrives in Python.
[[noreturn]] void raise_for_test(const std::string& kind, const std::string& message,
                                 const std::vector<std::string>& paths) {
  if (kind == "declaration") {
    GK_THROW(gk::DeclarationError, message);
  } else if (kind == "weights") {
    GK_THROW(gk::WeightError, message);
  } else if (kind == "mismatch") {
    throw gk::MismatchError(message, paths, gk::SourceLocation{__func__, __FILE__, __LINE__});
  } else if (kind == "drift") {
    GK_THROW(gk::DriftError, message);
  } else if (kind == "state") {
    GK_THROW(gk::StateError, message);
  } else if (kind == "internal") {
    GK_INTERNAL_ASSERT(false, message);
  } else if (kind == "c10") {
    TORCH_CHECK(false, message);
  } else if (kind == "c10_value") {
    TORCH_CHECK_VALUE(false, message);
  }
  GK_THROW(gk::StateError, "unknown error kind '", kind,
           "' (declaration, weights, mismatch, drift, state, internal, c10, c10_value)");
}

#if defined(GRAPHKEEP_WITH_CUDA)
at::Tensor int64_column(const std::vector<std::int64_t>& v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong));
}

// gk::cuda::scan_graph over the integer torch's raw_cuda_graph() returns:
// every plausible word (Note [Default plausibility filter]) as columns.
py::dict scan_graph(std::uintptr_t raw) {
  gk::cuda::GraphScan scan;
  {
    py::gil_scoped_release nogil;
    scan = gk::cuda::scan_graph(reinterpret_cast<cudaGraph_t>(raw));
  }
  const std::size_t n = scan.words.size();
  std::vector<std::int64_t> address(n), node(n), kind(n), param(n), offset(n);
  std::vector<std::string> node_names(scan.nodes);
  for (std::size_t i = 0; i < n; ++i) {
    const gk::cuda::GraphAddress& w = scan.words[i];
    address[i] = static_cast<std::int64_t>(w.address);
    node[i] = static_cast<std::int64_t>(w.node);
    kind[i] = static_cast<std::int64_t>(w.kind);
    param[i] = static_cast<std::int64_t>(w.param_index);
    offset[i] = static_cast<std::int64_t>(w.byte_offset);
    if (w.node < node_names.size() && node_names[w.node].empty()) node_names[w.node] = w.node_name;
  }
  py::dict out;
  out["address"] = int64_column(address);
  out["node"] = int64_column(node);
  out["kind"] = int64_column(kind);
  out["param"] = int64_column(param);
  out["offset"] = int64_column(offset);
  out["node_names"] = node_names;
  out["nodes"] = scan.nodes;
  out["kernel_nodes"] = scan.kernel_nodes;
  out["unsupported"] = scan.unsupported;
  return out;
}

// The caching allocator's view of `device` now: every segment (range, private
// pool id) and every block (range, live = allocated or active), sorted by
// address, as the C++ CUDA backend reads it (capture/cuda/cuda_replay.cpp).
py::dict allocator_state(int device) {
  std::vector<std::int64_t> seg_begin, seg_end, seg_pool0, seg_pool1, blk_begin, blk_end, blk_live;
  {
    py::gil_scoped_release nogil;
    const auto snap = c10::cuda::CUDACachingAllocator::snapshot({0, 0}, /*include_traces=*/false);
    for (const auto& seg : snap.segments) {
      if (seg.device != device) continue;
      seg_begin.push_back(static_cast<std::int64_t>(seg.address));
      seg_end.push_back(static_cast<std::int64_t>(seg.address + seg.total_size));
      seg_pool0.push_back(static_cast<std::int64_t>(seg.owner_private_pool_id.first));
      seg_pool1.push_back(static_cast<std::int64_t>(seg.owner_private_pool_id.second));
      std::int64_t offset = static_cast<std::int64_t>(seg.address);
      for (const auto& b : seg.blocks) {
        blk_begin.push_back(offset);
        blk_end.push_back(offset + static_cast<std::int64_t>(b.size));
        blk_live.push_back(b.allocated || b.active ? 1 : 0);
        offset += static_cast<std::int64_t>(b.size);
      }
    }
  }
  py::dict out;
  out["segment_begin"] = int64_column(seg_begin);
  out["segment_end"] = int64_column(seg_end);
  out["segment_pool"] = py::make_tuple(int64_column(seg_pool0), int64_column(seg_pool1));
  out["block_begin"] = int64_column(blk_begin);
  out["block_end"] = int64_column(blk_end);
  out["block_live"] = int64_column(blk_live).to(at::kBool);
  return out;
}

// cuBLAS and cuBLASLt workspaces ATen keeps per (handle, stream): a captured
// GEMM reads them, and no model tensor owns them.
std::vector<py::tuple> library_workspaces() {
  std::vector<py::tuple> out;
  auto add = [&](at::cuda::WorkspaceMapWithMutex& m, std::size_t size, const char* what) {
    std::shared_lock<std::shared_mutex> lock(m.mutex);
    for (const auto& [key, ptr] : m.map) {
      const auto b = reinterpret_cast<std::uintptr_t>(ptr.get());
      if (b != 0) out.push_back(py::make_tuple(what, b, b + size));
    }
  };
  add(at::cuda::cublas_handle_stream_to_workspace(), at::cuda::getChosenWorkspaceSize(), "cuBLAS workspace");
  add(at::cuda::cublaslt_handle_stream_to_workspace(), at::cuda::getCUDABlasLtWorkspaceSize(), "cuBLASLt workspace");
  return out;
}
#endif

}  // namespace
}  // namespace gkpy

PYBIND11_MODULE(_C, m) {
  m.doc() = "graphkeep's extension module; use the package graphkeep, not this module.";
  py::object errors = py::module_::import("graphkeep.errors");
  auto& classes = gkpy::error_classes();
  classes.by_kind[gkpy::kind_index(gk::ErrorKind::declaration)] = errors.attr("DeclarationError");
  classes.by_kind[gkpy::kind_index(gk::ErrorKind::weights)] = errors.attr("WeightError");
  classes.by_kind[gkpy::kind_index(gk::ErrorKind::mismatch)] = errors.attr("MismatchError");
  classes.by_kind[gkpy::kind_index(gk::ErrorKind::drift)] = errors.attr("DriftError");
  classes.by_kind[gkpy::kind_index(gk::ErrorKind::state)] = errors.attr("StateError");
  classes.by_kind[gkpy::kind_index(gk::ErrorKind::internal)] = errors.attr("InternalError");
  py::register_local_exception_translator(&gkpy::translate);

#if defined(GRAPHKEEP_WITH_CUDA)
  m.attr("with_cuda") = true;
  m.def("scan_graph", &gkpy::scan_graph, py::arg("raw_cuda_graph"));
  m.def("allocator_state", &gkpy::allocator_state, py::arg("device"));
  m.def("library_workspaces", &gkpy::library_workspaces);
#else
  m.attr("with_cuda") = false;
#endif
  m.def("_raise_for_test", &gkpy::raise_for_test, py::arg("kind"), py::arg("message"),
        py::arg("paths") = std::vector<std::string>{});
  gkpy::bind_patch(m);  // before the engine, whose methods take and return its types
  gkpy::bind_engine(m);
}
