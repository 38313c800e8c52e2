// Extracting candidate device addresses from a captured CUDA graph.
//
// Note [Driver API through the runtime's entry points]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The runtime's cudaGraphKernelNodeGetParams fails (cudaErrorInvalidDeviceFunction)
// for kernels of other libraries (cuBLAS, Triton), so everything here goes
// through the driver API (cuGraphKernelNodeGetParams_v2, cuFuncGetParamInfo,
// ...; the CUDA Driver API reference, "Graph Management").
// The driver functions are resolved once with cudaGetDriverEntryPointByVersion
// instead of being linked: calling them directly would make every binary that
// uses scan_graph depend on libcuda.so.1 at load time, so a GPU test binary
// could not even start (and report "skipped") on a machine without a driver.
// The runtime hands back the entry points of the very driver it loaded, each
// at the ABI version named by the cudaTypedefs.h PFN type we cast to.
//
// Note [Kernel parameter words]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// cuGraphKernelNodeGetParams returns node-owned arrays; they are only read.
// The parameter layout (offset and size of each parameter in the device
// parameter buffer) comes from cuFuncGetParamInfo (or cuKernelGetParamInfo
// when `func` is NULL), called with idx = 0, 1, ... until
// CUDA_ERROR_INVALID_VALUE: CUDA 13.0 has no parameter-count API. A node
// carries its argument values either as `kernelParams` (kernelParams[i] points
// to the size_i bytes of parameter i) or as `extra`, key/value pairs
// {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
// CU_LAUNCH_PARAM_END} in ANY order (cuBLAS nvjet puts the size first), where
// `buf` holds the parameters at their device offsets. A word is scanned where
// its device offset is a multiple of 8: a pointer member is always 8-aligned
// in the device layout, whatever the alignment of the host copy (read with
// memcpy). Parameters are scanned whole, so pointers inside by-value structs
// (CUTLASS/cuBLAS Params, TMA descriptors' opaque[0]) are found too.
#include <graphkeep/capture/cuda_graph_addresses.h>

#include <graphkeep/core/check.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace gk::cuda {
namespace {

// ---------------------------------------------------------------------------
// Driver entry points
// ---------------------------------------------------------------------------
struct Driver {
  PFN_cuGetErrorName_v6000 GetErrorName = nullptr;
  PFN_cuGraphGetNodes_v10000 GraphGetNodes = nullptr;
  PFN_cuGraphNodeGetType_v10000 GraphNodeGetType = nullptr;
  PFN_cuGraphKernelNodeGetParams_v12000 GraphKernelNodeGetParams = nullptr;
  PFN_cuGraphMemcpyNodeGetParams_v10000 GraphMemcpyNodeGetParams = nullptr;
  PFN_cuGraphMemsetNodeGetParams_v10000 GraphMemsetNodeGetParams = nullptr;
  PFN_cuGraphChildGraphNodeGetGraph_v10000 GraphChildGraphNodeGetGraph = nullptr;
  PFN_cuGraphMemAllocNodeGetParams_v11040 GraphMemAllocNodeGetParams = nullptr;
  PFN_cuGraphMemFreeNodeGetParams_v11040 GraphMemFreeNodeGetParams = nullptr;
  PFN_cuGraphBatchMemOpNodeGetParams_v11070 GraphBatchMemOpNodeGetParams = nullptr;
  PFN_cuFuncGetParamInfo_v12040 FuncGetParamInfo = nullptr;
  PFN_cuKernelGetParamInfo_v12040 KernelGetParamInfo = nullptr;
  PFN_cuFuncGetName_v12030 FuncGetName = nullptr;
  PFN_cuKernelGetName_v12030 KernelGetName = nullptr;
};

template <class Fn>
void resolve(Fn& fn, const char* symbol, unsigned int cuda_version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t rc =
      cudaGetDriverEntryPointByVersion(symbol, &p, cuda_version, cudaEnableDefault, &status);
  GK_CHECK(gk::InternalError, rc == cudaSuccess && status == cudaDriverEntryPointSuccess && p,
           "gk::cuda::scan_graph: cannot resolve the CUDA driver function ", symbol,
           " (ABI of CUDA ", cuda_version / 1000, ".", (cuda_version % 1000) / 10,
           "): cudaGetDriverEntryPointByVersion returned ", cudaGetErrorName(rc),
           " with query status ", static_cast<int>(status),
           "; the installed NVIDIA driver is too old or no driver is loaded");
  fn = reinterpret_cast<Fn>(p);
}

Driver load_driver() {
  Driver d;
  resolve(d.GetErrorName, "cuGetErrorName", 6000);
  resolve(d.GraphGetNodes, "cuGraphGetNodes", 10000);
  resolve(d.GraphNodeGetType, "cuGraphNodeGetType", 10000);
  resolve(d.GraphKernelNodeGetParams, "cuGraphKernelNodeGetParams", 12000);  // _v2
  resolve(d.GraphMemcpyNodeGetParams, "cuGraphMemcpyNodeGetParams", 10000);
  resolve(d.GraphMemsetNodeGetParams, "cuGraphMemsetNodeGetParams", 10000);
  resolve(d.GraphChildGraphNodeGetGraph, "cuGraphChildGraphNodeGetGraph", 10000);
  resolve(d.GraphMemAllocNodeGetParams, "cuGraphMemAllocNodeGetParams", 11040);
  resolve(d.GraphMemFreeNodeGetParams, "cuGraphMemFreeNodeGetParams", 11040);
  resolve(d.GraphBatchMemOpNodeGetParams, "cuGraphBatchMemOpNodeGetParams", 11070);
  resolve(d.FuncGetParamInfo, "cuFuncGetParamInfo", 12040);
  resolve(d.KernelGetParamInfo, "cuKernelGetParamInfo", 12040);
  resolve(d.FuncGetName, "cuFuncGetName", 12030);
  resolve(d.KernelGetName, "cuKernelGetName", 12030);
  return d;
}

// Resolved on first use; a failed resolution throws and is retried next call.
const Driver& driver() {
  static const Driver d = load_driver();
  return d;
}

std::string result_name(const Driver& d, CUresult rc) {
  const char* name = nullptr;
  if (d.GetErrorName != nullptr && d.GetErrorName(rc, &name) == CUDA_SUCCESS && name != nullptr) {
    return std::string(name) + " (" + std::to_string(static_cast<int>(rc)) + ")";
  }
  return "CUresult " + std::to_string(static_cast<int>(rc));
}

const char* node_type_name(CUgraphNodeType t) {
  switch (t) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return "kernel";
    case CU_GRAPH_NODE_TYPE_MEMCPY: return "memcpy";
    case CU_GRAPH_NODE_TYPE_MEMSET: return "memset";
    case CU_GRAPH_NODE_TYPE_HOST: return "host";
    case CU_GRAPH_NODE_TYPE_GRAPH: return "child graph";
    case CU_GRAPH_NODE_TYPE_EMPTY: return "empty";
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: return "event wait";
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: return "event record";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL: return "external semaphore signal";
    case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT: return "external semaphore wait";
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: return "mem alloc";
    case CU_GRAPH_NODE_TYPE_MEM_FREE: return "mem free";
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: return "batch mem-op";
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: return "conditional";
    default: return "unknown";
  }
}

// ---------------------------------------------------------------------------
// The walk
// ---------------------------------------------------------------------------
struct ParamSlot {
  std::size_t offset;
  std::size_t size;
  bool tensor_info = false;  // laid out as ATen's TensorInfo (Note [ATen's TensorInfo])
};

// Note [ATen's TensorInfo]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// ATen's older CUDA kernels (index_select, index_add, gather, scatter,
// embedding backward, ...) take at::cuda::detail::TensorInfo<T, IndexType>
// by value: {T* data; IndexType sizes[25]; IndexType strides[25]; int dims}.
// Its constructor fills only the first `dims` sizes and strides; the rest
// are whatever the host's stack held, and a stack word can be a stale device
// address. Scanned whole, such a parameter reported an address that no tensor
// owns in an engine's embedding lookup (docs/gpu-runs.md, 2026-12-06 06:12:
// strides[15] of index_select's index operand, under Python only, where the
// stack held different garbage). So a parameter of a kernel whose mangled name
// carries the class name TensorInfo, 216 bytes (32-bit indices) or 416
// (64-bit), with `dims` (the int after the strides) in [0, 25], is read as
// that struct: its one pointer, `data`, is scanned, its sizes and strides are
// not. Anything else about the parameter (another size, an implausible dims)
// scans it whole, as every other parameter is.
constexpr std::size_t kTensorInfoMaxDims = 25;

// The byte offset of `dims` in a TensorInfo parameter of `size` bytes, or 0
// where `size` is neither layout's.
constexpr std::size_t tensor_info_dims_offset(std::size_t size) {
  if (size == 216) return 8 + 2 * kTensorInfoMaxDims * 4;  // 32-bit indices
  if (size == 416) return 8 + 2 * kTensorInfoMaxDims * 8;  // 64-bit indices
  return 0;
}

struct KernelInfo {
  std::string name;
  std::vector<ParamSlot> params;
  bool layout_known = false;
  std::string layout_error;  // why the layout is unknown
};

// Kernel parameters are limited to 32764 bytes, so never more params than this.
constexpr std::size_t kMaxParams = 32768;
// More `extra` entries than this means a corrupt array.
constexpr std::size_t kMaxExtraEntries = 64;

class Walker {
 public:
  Walker(const Driver& d, const std::function<bool(std::uint64_t)>& plausible)
      : d_(d), plausible_(plausible) {}

  GraphScan take() { return std::move(scan_); }

  void walk(CUgraph graph, std::size_t depth) {
    GK_CHECK(gk::InternalError, depth < 64, "gk::cuda::scan_graph: child graphs nested ", depth,
             " deep; a cycle?");
    std::size_t count = 0;
    check(d_.GraphGetNodes(graph, nullptr, &count), "cuGraphGetNodes (count)", nullptr);
    std::vector<CUgraphNode> nodes(count);
    if (count != 0) {
      check(d_.GraphGetNodes(graph, nodes.data(), &count), "cuGraphGetNodes", nullptr);
      nodes.resize(count);
    }
    for (CUgraphNode node : nodes) visit(node, depth);
  }

 private:
  // Throws gk::InternalError naming the call, the node and the CUresult.
  void check(CUresult rc, const char* call, const char* node_kind) const {
    if (rc == CUDA_SUCCESS) return;
    if (node_kind == nullptr) {
      throw gk::InternalError(gk::detail::concat("gk::cuda::scan_graph: ", call, " failed with ",
                                              result_name(d_, rc), " (after ", scan_.nodes,
                                              " nodes were visited)"));
    }
    throw gk::InternalError(gk::detail::concat("gk::cuda::scan_graph: ", call, " failed for node ",
                                            current_, " (", node_kind, " node) with ",
                                            result_name(d_, rc)));
  }

  void add(std::uint64_t word, GraphAddress::NodeKind kind, const std::string& name,
           std::uint32_t param, std::uint32_t offset) {
    if (word == 0) return;
    if (plausible_ ? !plausible_(word) : !default_plausible(word)) return;
    scan_.words.push_back(GraphAddress{word, current_, kind, name, param, offset});
  }

  void unsupported(const char* kind, const std::string& what) {
    scan_.unsupported.push_back(
        gk::detail::concat("node ", current_, " (", kind, "): ", what));
  }

  void visit(CUgraphNode node, std::size_t depth) {
    current_ = scan_.nodes++;
    CUgraphNodeType type{};
    check(d_.GraphNodeGetType(node, &type), "cuGraphNodeGetType", "unknown");
    switch (type) {
      case CU_GRAPH_NODE_TYPE_KERNEL:
        ++scan_.kernel_nodes;
        kernel(node);
        break;
      case CU_GRAPH_NODE_TYPE_MEMCPY: memcpy_node(node); break;
      case CU_GRAPH_NODE_TYPE_MEMSET: {
        CUDA_MEMSET_NODE_PARAMS p{};
        check(d_.GraphMemsetNodeGetParams(node, &p), "cuGraphMemsetNodeGetParams", "memset");
        add(p.dst, GraphAddress::NodeKind::memset, memset_name_, kMemsetDstParam, 0);
        break;
      }
      case CU_GRAPH_NODE_TYPE_GRAPH: {
        CUgraph child = nullptr;
        check(d_.GraphChildGraphNodeGetGraph(node, &child), "cuGraphChildGraphNodeGetGraph",
              "child graph");
        if (child != nullptr) walk(child, depth + 1);
        break;
      }
      case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
        CUDA_MEM_ALLOC_NODE_PARAMS p{};
        check(d_.GraphMemAllocNodeGetParams(node, &p), "cuGraphMemAllocNodeGetParams",
              "mem alloc");
        add(p.dptr, GraphAddress::NodeKind::other, mem_alloc_name_, 0, 0);
        break;
      }
      case CU_GRAPH_NODE_TYPE_MEM_FREE: {
        CUdeviceptr p = 0;
        check(d_.GraphMemFreeNodeGetParams(node, &p), "cuGraphMemFreeNodeGetParams", "mem free");
        add(p, GraphAddress::NodeKind::other, mem_free_name_, 0, 0);
        break;
      }
      case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: {
        CUDA_BATCH_MEM_OP_NODE_PARAMS p{};
        check(d_.GraphBatchMemOpNodeGetParams(node, &p), "cuGraphBatchMemOpNodeGetParams",
              "batch mem-op");
        for (unsigned int i = 0; i < p.count && p.paramArray != nullptr; ++i) {
          const CUstreamBatchMemOpParams& op = p.paramArray[i];
          switch (op.operation) {
            case CU_STREAM_MEM_OP_WAIT_VALUE_32:
            case CU_STREAM_MEM_OP_WAIT_VALUE_64:
              add(op.waitValue.address, GraphAddress::NodeKind::other, batch_name_, i, 0);
              break;
            case CU_STREAM_MEM_OP_WRITE_VALUE_32:
            case CU_STREAM_MEM_OP_WRITE_VALUE_64:
              add(op.writeValue.address, GraphAddress::NodeKind::other, batch_name_, i, 0);
              break;
            case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
            case CU_STREAM_MEM_OP_BARRIER:
              break;
            default:
              unsupported("batch mem-op", gk::detail::concat("operation ", i, " has unknown type ",
                                                          static_cast<int>(op.operation),
                                                          "; its address was not read"));
          }
        }
        break;
      }
      case CU_GRAPH_NODE_TYPE_CONDITIONAL:
        unsupported("conditional",
                    "CUDA 13.0 cannot read the body graphs of a conditional node; the "
                    "addresses they use are not in the scan");
        break;
      case CU_GRAPH_NODE_TYPE_HOST:  // host callback: its userData is host memory
      case CU_GRAPH_NODE_TYPE_EMPTY:
      case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL:
      case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT:
        break;
      default:
        unsupported(node_type_name(type),
                    gk::detail::concat("node type ", static_cast<int>(type),
                                    " is unknown to graphkeep; its addresses were not read"));
    }
  }

  // The first byte a memcpy reads or writes. Array operands carry no address.
  static std::uint64_t memcpy_start(CUmemorytype type, const void* host, CUdeviceptr device,
                                    std::size_t x, std::size_t y, std::size_t z,
                                    std::size_t pitch, std::size_t height) {
    std::uint64_t base = 0;
    switch (type) {
      case CU_MEMORYTYPE_HOST: base = reinterpret_cast<std::uintptr_t>(host); break;
      case CU_MEMORYTYPE_DEVICE:
      case CU_MEMORYTYPE_UNIFIED: base = device; break;
      default: return 0;  // CU_MEMORYTYPE_ARRAY
    }
    if (base == 0) return 0;
    return base + x + y * pitch + z * pitch * height;
  }

  void memcpy_node(CUgraphNode node) {
    CUDA_MEMCPY3D p{};
    check(d_.GraphMemcpyNodeGetParams(node, &p), "cuGraphMemcpyNodeGetParams", "memcpy");
    add(memcpy_start(p.srcMemoryType, p.srcHost, p.srcDevice, p.srcXInBytes, p.srcY, p.srcZ,
                     p.srcPitch, p.srcHeight),
        GraphAddress::NodeKind::memcpy, memcpy_name_, kMemcpySrcParam, 0);
    add(memcpy_start(p.dstMemoryType, p.dstHost, p.dstDevice, p.dstXInBytes, p.dstY, p.dstZ,
                     p.dstPitch, p.dstHeight),
        GraphAddress::NodeKind::memcpy, memcpy_name_, kMemcpyDstParam, 0);
  }

  // Name and parameter layout of a kernel, cached per handle for this scan
  // (a graph typically launches the same kernel many times).
  const KernelInfo& kernel_info(CUfunction func, CUkernel kern) {
    auto& cache = func != nullptr ? func_cache_ : kern_cache_;
    const void* key = func != nullptr ? static_cast<const void*>(func)
                                      : static_cast<const void*>(kern);
    if (auto it = cache.find(key); it != cache.end()) return it->second;

    KernelInfo info;
    const char* name = nullptr;
    const CUresult name_rc =
        func != nullptr ? d_.FuncGetName(&name, func) : d_.KernelGetName(&name, kern);
    info.name = name_rc == CUDA_SUCCESS && name != nullptr ? name : "<unnamed kernel>";

    info.layout_known = true;
    for (std::size_t i = 0;; ++i) {
      std::size_t offset = 0, size = 0;
      const CUresult rc = func != nullptr ? d_.FuncGetParamInfo(func, i, &offset, &size)
                                          : d_.KernelGetParamInfo(kern, i, &offset, &size);
      if (rc == CUDA_ERROR_INVALID_VALUE) break;  // past the last parameter
      if (rc != CUDA_SUCCESS) {
        info.layout_known = false;
        info.params.clear();
        info.layout_error = gk::detail::concat(func != nullptr ? "cuFuncGetParamInfo" : "cuKernelGetParamInfo",
                                            "(", i, ") failed with ", result_name(d_, rc));
        break;
      }
      if (i >= kMaxParams) {
        info.layout_known = false;
        info.params.clear();
        info.layout_error = gk::detail::concat("the driver reports more than ", kMaxParams,
                                            " parameters");
        break;
      }
      info.params.push_back(ParamSlot{offset, size});
    }
    // Itanium mangling spells a class name as its length and the name.
    if (info.name.find("10TensorInfo") != std::string::npos)
      for (ParamSlot& s : info.params) s.tensor_info = tensor_info_dims_offset(s.size) != 0;
    return cache.emplace(key, std::move(info)).first->second;
  }

  // Scans the `size` bytes at `data` holding parameter `index`, which sits at
  // device offset `offset`: every word whose device offset is 8-aligned.
  void scan_param(const KernelInfo& k, std::uint32_t index, std::size_t offset,
                  const unsigned char* data, std::size_t size, bool tensor_info = false) {
    if (tensor_info && size == k.params[index].size && offset % 8 == 0) {
      std::int32_t dims = -1;
      std::memcpy(&dims, data + tensor_info_dims_offset(size), sizeof dims);
      if (dims >= 0 && static_cast<std::size_t>(dims) <= kTensorInfoMaxDims) {
        size = 8;  // Note [ATen's TensorInfo]: `data` alone
      }
    }
    const std::size_t end = offset + size;
    for (std::size_t w = (offset + 7) & ~std::size_t{7}; w + 8 <= end; w += 8) {
      std::uint64_t word = 0;
      std::memcpy(&word, data + (w - offset), sizeof word);
      add(word, GraphAddress::NodeKind::kernel, k.name, index,
          static_cast<std::uint32_t>(w - offset));
    }
  }

  void kernel(CUgraphNode node) {
    CUDA_KERNEL_NODE_PARAMS p;  // the _v2 struct (cuda.h #defines the _v2 entry point)
    std::memset(&p, 0, sizeof p);
    check(d_.GraphKernelNodeGetParams(node, &p), "cuGraphKernelNodeGetParams_v2", "kernel");
    if (p.func == nullptr && p.kern == nullptr) {
      unsupported("kernel", "the node has neither a CUfunction nor a CUkernel; not scanned");
      return;
    }
    const KernelInfo& k = kernel_info(p.func, p.kern);

    if (p.kernelParams != nullptr) {
      if (!k.layout_known) {
        unsupported("kernel", gk::detail::concat("kernel ", k.name, ": ", k.layout_error,
                                              "; its parameters were not scanned"));
        return;
      }
      for (std::size_t i = 0; i < k.params.size(); ++i) {
        const ParamSlot& s = k.params[i];
        if (s.size == 0) continue;
        const void* value = p.kernelParams[i];  // node-owned: read only
        if (value == nullptr) {
          unsupported("kernel", gk::detail::concat("kernel ", k.name, ": kernelParams[", i,
                                                "] is null; that parameter was not scanned"));
          continue;
        }
        scan_param(k, static_cast<std::uint32_t>(i), s.offset,
                   static_cast<const unsigned char*>(value), s.size, s.tensor_info);
      }
      return;
    }

    if (p.extra != nullptr) {
      scan_extra(k, p.extra);
      return;
    }

    if (k.layout_known && !k.params.empty()) {
      unsupported("kernel", gk::detail::concat("kernel ", k.name, " has ", k.params.size(),
                                            " parameters but the node carries neither "
                                            "kernelParams nor extra; not scanned"));
    }
  }

  // `extra`: key/value pairs in any order, ended by CU_LAUNCH_PARAM_END.
  void scan_extra(const KernelInfo& k, void* const* extra) {
    const unsigned char* buffer = nullptr;
    const std::size_t* size_ptr = nullptr;
    bool ended = false;
    for (std::size_t i = 0; i < kMaxExtraEntries; i += 2) {
      const void* key = extra[i];
      if (key == CU_LAUNCH_PARAM_END) {
        ended = true;
        break;
      }
      const void* value = extra[i + 1];
      if (key == CU_LAUNCH_PARAM_BUFFER_POINTER) {
        buffer = static_cast<const unsigned char*>(value);
      } else if (key == CU_LAUNCH_PARAM_BUFFER_SIZE) {
        size_ptr = static_cast<const std::size_t*>(value);
      }
      // Any other key is a pair we do not need; skip its value.
    }
    if (!ended) {
      unsupported("kernel", gk::detail::concat("kernel ", k.name, ": the extra array has no "
                                            "CU_LAUNCH_PARAM_END within ", kMaxExtraEntries,
                                            " entries; not scanned"));
      return;
    }
    if (buffer == nullptr || size_ptr == nullptr) {
      if (k.layout_known && !k.params.empty()) {
        unsupported("kernel", gk::detail::concat("kernel ", k.name, ": the extra array lacks ",
                                              buffer == nullptr ? "CU_LAUNCH_PARAM_BUFFER_POINTER"
                                                                : "CU_LAUNCH_PARAM_BUFFER_SIZE",
                                              "; not scanned"));
      }
      return;
    }
    const std::size_t buffer_size = *size_ptr;

    if (!k.layout_known) {
      // The buffer holds the parameters at their device offsets: scan it
      // whole as one parameter (a superset of the per-parameter scan).
      scan_param(k, 0, 0, buffer, buffer_size);
      return;
    }
    for (std::size_t i = 0; i < k.params.size(); ++i) {
      const ParamSlot& s = k.params[i];
      if (s.size == 0) continue;
      if (s.offset >= buffer_size) {
        unsupported("kernel", gk::detail::concat("kernel ", k.name, ": parameter ", i,
                                              " (offset ", s.offset, ") lies past the end of "
                                              "the ", buffer_size, "-byte extra buffer; not scanned"));
        continue;
      }
      std::size_t size = s.size;
      if (s.offset + size > buffer_size) {
        unsupported("kernel", gk::detail::concat("kernel ", k.name, ": parameter ", i,
                                              " is cut off by the ", buffer_size,
                                              "-byte extra buffer; only its first ",
                                              buffer_size - s.offset, " bytes were scanned"));
        size = buffer_size - s.offset;
      }
      scan_param(k, static_cast<std::uint32_t>(i), s.offset, buffer + s.offset, size, s.tensor_info);
    }
  }

  const Driver& d_;
  const std::function<bool(std::uint64_t)>& plausible_;
  GraphScan scan_;
  std::size_t current_ = 0;
  std::unordered_map<const void*, KernelInfo> func_cache_, kern_cache_;
  const std::string memcpy_name_ = "memcpy", memset_name_ = "memset",
                    mem_alloc_name_ = "mem_alloc", mem_free_name_ = "mem_free",
                    batch_name_ = "batch_mem_op";
};

}  // namespace

const char* to_string(GraphAddress::NodeKind kind) noexcept {
  switch (kind) {
    case GraphAddress::NodeKind::kernel: return "kernel";
    case GraphAddress::NodeKind::memcpy: return "memcpy";
    case GraphAddress::NodeKind::memset: return "memset";
    case GraphAddress::NodeKind::other: return "other";
  }
  return "other";
}

GraphScan scan_graph(cudaGraph_t graph, const std::function<bool(std::uint64_t)>& plausible) {
  GK_CHECK(gk::StateError, graph != nullptr,
           "gk::cuda::scan_graph: the graph is null; capture with "
           "at::cuda::CUDAGraph(/*keep_graph=*/true) so raw_cuda_graph() stays valid");
  Walker walker(driver(), plausible);
  walker.walk(graph, 0);  // cudaGraph_t and CUgraph are the same type
  return walker.take();
}

}  // namespace gk::cuda
