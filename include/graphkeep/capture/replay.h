// graphkeep/capture/replay.h
//
// Replay backends: one interface over a real CUDA graph and the host graph
// that stands in for it on machines without a GPU. Both burn in the
// addresses their kernels use at capture and reuse them at every replay.
//
//   gk::HostReplay g;                        // or gk::CudaReplay on a GPU
//   g.capture([&] { out = model.forward(in); });
//   g.replay();                              // same pointers as at capture
//   for (auto& a : g.addresses()) ...        // what the capture manifest checks
#pragma once

#include <graphkeep/runtime/host_stream.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gk {

// One address a captured graph uses.
struct CapturedAddress {
  std::uintptr_t address = 0;
  std::size_t node = 0;         // index of the launch / graph node
  std::string node_name;        // kernel name
  std::size_t bytes = 0;        // the accessed extent when known (host), else 0
  bool write = false;
  // Where a CUDA kernel node holds the address: the kernel parameter's index
  // and the word's byte offset within it (-1 and 0 when not a kernel
  // parameter, or on the host backend). For error messages.
  int param = -1;
  std::uint32_t byte_offset = 0;
};

// A named range of device (or host) memory.
struct AddressRange {
  std::string name;
  std::uintptr_t begin = 0, end = 0;
  bool contains(std::uintptr_t a) const noexcept { return a >= begin && a < end; }
};

class ReplayBackend {
 public:
  ReplayBackend() = default;
  // A copy is another graph: it gets a lifetime of its own.
  ReplayBackend(const ReplayBackend&) : alive_(std::make_shared<const char>(0)) {}
  ReplayBackend& operator=(const ReplayBackend&) { return *this; }
  virtual ~ReplayBackend() = default;

  // Expires when this backend is destroyed. An engine that tracks the graph
  // holds it weakly, so a graph destroyed while tracked (declared after the
  // engine in user code, say) is noticed and dropped, never used through a
  // dangling pointer (ReloadReport::graphs_destroyed names it).
  std::weak_ptr<const void> lifetime() const noexcept { return alive_; }

  // Captures everything `forward` launches (on this thread / current stream).
  virtual void capture(const std::function<void()>& forward) = 0;
  // Drops the captured graph and captures `forward` again into a fresh one
  // (same memory pool). ReloadEngine::track(graph, forward) calls it to tell
  // the addresses a graph really reads from stale bytes in kernel parameters
  // (Note [Stale bytes in kernel parameters] in capture/cuda/cuda_replay.cpp).
  virtual void recapture(const std::function<void()>& forward) = 0;
  virtual void replay() = 0;
  virtual bool captured() const = 0;
  // Every address the captured graph uses: the independent oracle.
  virtual std::vector<CapturedAddress> addresses() const = 0;
  // True when `address` lies in memory the graph owns (its private pool).
  virtual bool in_private_pool(std::uintptr_t address) const = 0;
  // Persistent workspaces of libraries the graph calls (cuBLAS), which a
  // captured kernel may read without any model tensor owning them.
  virtual std::vector<AddressRange> library_ranges() const { return {}; }
  // What the backend knows of an address no model tensor owns, for error
  // messages: on CUDA, the caching-allocator segment and block holding it
  // (pool, stream, sizes, allocated or free) as the allocator sees it now.
  // Empty when it knows nothing.
  virtual std::string describe_address(std::uintptr_t /*address*/) const { return {}; }
  // For each address: false when the backend knows that no live allocation
  // covers it now (on CUDA: it lies in a free caching-allocator block), true
  // otherwise (unknown included). track() uses it to tell stale bytes from
  // reads (Note [Confirming raw addresses] in reload/capture_tracking.cpp).
  virtual std::vector<bool> in_live_allocation(const std::vector<std::uintptr_t>& addresses) const {
    return std::vector<bool>(addresses.size(), true);
  }
  virtual std::string name() const = 0;
  virtual c10::Device device() const = 0;

 private:
  std::shared_ptr<const char> alive_ = std::make_shared<const char>(0);
};

// The host backend: records hostrt launches and replays them.
class HostReplay final : public ReplayBackend {
 public:
  explicit HostReplay(std::string name = "host-graph") : name_(std::move(name)) {}
  void capture(const std::function<void()>& forward) override;
  void recapture(const std::function<void()>& forward) override;
  void replay() override;
  bool captured() const override { return captured_; }
  std::vector<CapturedAddress> addresses() const override;
  bool in_private_pool(std::uintptr_t address) const override;
  std::string name() const override { return name_; }
  c10::Device device() const override { return c10::kCPU; }
  const hostrt::Recording& recording() const noexcept { return rec_; }

 private:
  std::string name_;
  hostrt::Recording rec_;
  bool captured_ = false;
};

// The CUDA backend (GRAPHKEEP_CUDA builds): at::cuda::CUDAGraph with
// keep_graph=true, captured on a side stream; addresses() walks the graph's
// nodes with the driver API. capture() zeroes the unused stack below it
// first, so no stale pointer left there by earlier work can pass for an
// address the graph reads (Note [Stale bytes in kernel parameters] in
// capture/cuda/cuda_replay.cpp).
//
// Serving engines capture one decode graph per batch size into one shared
// memory pool (capture the largest first, replay one at a time): pass an
// already captured graph as `share_pool_with`, and this graph allocates from
// that graph's private pool. The host backend has a pool per recording and
// ignores it.
std::unique_ptr<ReplayBackend> make_cuda_replay(std::string name = "cuda-graph",
                                                const ReplayBackend* share_pool_with = nullptr);

// A backend for `device`: HostReplay on CPU, the CUDA graph on CUDA.
std::unique_ptr<ReplayBackend> make_replay(c10::Device device, std::string name,
                                           const ReplayBackend* share_pool_with = nullptr);

}  // namespace gk
