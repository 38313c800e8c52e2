// graphkeep/capture/cuda_graph_addresses.h
//
// The lowest layer of the capture manifest: every word of a captured CUDA
// graph that may be a device address, with the node and parameter it sits in.
//
//   at::cuda::CUDAGraph g(/*keep_graph=*/true);   // keep the template graph
//   ... capture ...
//   gk::cuda::GraphScan scan = gk::cuda::scan_graph(g.raw_cuda_graph());
//   for (const auto& w : scan.words) ... w.address, w.node, w.node_name ...
//   if (!scan.unsupported.empty()) ... the scan is incomplete ...
//
// What is read (through the CUDA driver API, so kernels of every library are
// readable, see the Notes in capture/cuda/cuda_graph_addresses.cpp):
//   kernel nodes   every 8-byte-aligned word (aligned in the device parameter
//                  layout) of every parameter, whether the node carries
//                  `kernelParams` or an `extra` parameter buffer;
//   memcpy nodes   the first byte the copy reads (param_index 0) and writes
//                  (param_index 1): base pointer plus the X/Y/Z start offsets;
//   memset nodes   the first byte written (param_index 0);
//   mem alloc/free the allocation's address (kind `other`, "mem_alloc",
//                  "mem_free", param_index 0);
//   batch mem-op   the address of each wait/write operation (kind `other`,
//                  "batch_mem_op", param_index = operation index);
//   child graphs   recursively, depth-first.
// Conditional nodes (CUDA 13.0 cannot read their body graphs), kernels whose
// parameter layout the driver does not report, and unknown node types are
// listed in GraphScan::unsupported: their addresses are missing from the scan,
// so a manifest built from it must treat a non-empty list as "incomplete".
//
// Only available when graphkeep is built with GRAPHKEEP_CUDA (the definition
// GRAPHKEEP_WITH_CUDA is then set); the header itself needs no CUDA header.
// Graph objects are not thread-safe: do not modify `graph` during a scan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

// The CUDA runtime's graph handle, declared exactly as driver_types.h does
// (`typedef struct CUgraph_st *cudaGraph_t;`), so this header compiles without
// the CUDA headers. Repeating an identical typedef is valid C++, so either
// include order works; the guard merely skips it when driver_types.h is in.
#if !defined(__DRIVER_TYPES_H__)
struct CUgraph_st;
typedef struct CUgraph_st* cudaGraph_t;
#endif

namespace gk::cuda {

// One 8-byte word of a node that may be a device address.
struct GraphAddress {
  std::uint64_t address;
  // Index of the node in walk order: the nodes of a graph in the order
  // cuGraphGetNodes returns them; a child graph's nodes are numbered right
  // after their child-graph node (depth-first), before that node's siblings.
  std::size_t node;
  enum class NodeKind : std::uint8_t { kernel, memcpy, memset, other } kind;
  // Kernel name as the driver reports it (mangled), or "memcpy", "memset",
  // "mem_alloc", "mem_free", "batch_mem_op".
  std::string node_name;
  // Kernel parameter index; for memcpy 0 = source, 1 = destination; for
  // memset, mem_alloc and mem_free 0; for batch_mem_op the operation index.
  std::uint32_t param_index;
  // Offset of the word within the kernel parameter (0 for non-kernel nodes).
  std::uint32_t byte_offset;
};

inline constexpr std::uint32_t kMemcpySrcParam = 0;
inline constexpr std::uint32_t kMemcpyDstParam = 1;
inline constexpr std::uint32_t kMemsetDstParam = 0;

struct GraphScan {
  std::vector<GraphAddress> words;
  std::size_t nodes = 0;         // every node visited, child-graph nodes and their contents included
  std::size_t kernel_nodes = 0;  // kernel nodes among them
  // One line per node whose addresses could not (all) be read, naming the
  // node index, kind and reason (e.g. conditional nodes).
  std::vector<std::string> unsupported;
};

// Note [Default plausibility filter]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Keeps a word w iff 2^32 <= w < 2^57. It is deliberately conservative (it
// would rather keep a non-pointer than drop a pointer):
//  * Device addresses on Linux x86-64/aarch64 are user virtual addresses of
//    the unified address space: cudaMalloc/VMM ranges are reserved far above
//    4 GiB (typically 0x7f..., or 0x2_0000_0000 and up / 0x1x_xxxx_xxxx on
//    some drivers), and user space never exceeds 2^56 (x86-64 5-level
//    paging; aarch64 is at most 2^52). Pinned host memory (0x7f...) passes too.
//  * Dropped: zero, every value < 4 GiB (int32s, sizes, strides, counts,
//    enums, bools, a float pair whose high half is 0), and every value
//    >= 2^57: negative integers, ordinary doubles (1.0 = 0x3ff0...), a float
//    pair whose high float is a normal float >= ~1e-37 or negative.
//  * NOT dropped on alignment: a tensor view of 1-byte elements (int8, fp8,
//    uint8) may start at any byte, so a real pointer can be odd.
//  * Known false positives that pass: two packed int32 fields with a nonzero
//    high half (e.g. dims {4096, 1024}), random 64-bit seeds/offsets. Pass a
//    `plausible` that checks membership in known allocations to remove them.
constexpr bool default_plausible(std::uint64_t word) noexcept {
  return word >= (std::uint64_t{1} << 32) && word < (std::uint64_t{1} << 57);
}

// Every candidate address of every node of `graph`, recursing into child
// graphs. `plausible(addr)` filters words cheaply (e.g. "inside a known
// allocation"); empty = default_plausible. The words are in walk order.
// Driver errors raise gk::InternalError naming the node and the CUresult;
// a null graph raises gk::StateError.
GraphScan scan_graph(cudaGraph_t graph, const std::function<bool(std::uint64_t)>& plausible = {});

// Short name of a node kind: "kernel", "memcpy", "memset", "other".
const char* to_string(GraphAddress::NodeKind kind) noexcept;

}  // namespace gk::cuda
