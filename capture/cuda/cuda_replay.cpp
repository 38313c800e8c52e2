// The CUDA replay backend: at::cuda::CUDAGraph(keep_graph=true), captured on
// a side stream; its addresses come from walking the kept graph with the
// driver API (cuda_graph_addresses.cpp), filtered to memory the caching
// allocator or a library workspace owns.
#include <graphkeep/core/check.h>
#include <graphkeep/capture/cuda_graph_addresses.h>
#include <graphkeep/capture/replay.h>

#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <pthread.h>

#include <algorithm>
#include <alloca.h>
#include <cstring>
#include <mutex>
#include <optional>
#include <shared_mutex>

namespace gk {
namespace {

// Note [Stale bytes in kernel parameters]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A kernel node's parameter bytes are copied by the driver from the host
// arguments of the launch, padding included. A by-value argument built by an
// implicit copy constructor copies members, not padding, so its padding holds
// whatever the stack slot held before: ATen's elementwise kernels take a
// lambda whose capture of an empty functor (1 byte) is followed by 7 bytes of
// padding at an 8-aligned device offset. The scan reads every 8-aligned word
// (Note [Kernel parameter words] in cuda_graph_addresses.cpp), so a stale
// device pointer left there by earlier eager work - a live 8-byte tensor
// outside the graph's pool, say - looks like an address the graph reads, and
// track() refuses the graph (fail closed: a false refusal, never a missed
// address). Seen on the H200 in about 1 engine start of 6 (docs/gpu-runs.md).
//
// Three defences, because the stale bytes come from two places and take two
// forms:
//  - Earlier work (eager prefill, PWAL, the previous graph's scan): capture()
//    zeroes kScrubBytes of the unused stack below its frame before the
//    forward runs; the frames of the forward, the dispatcher and the launch
//    stubs all live in that region. tests/cuda_graph_test.cpp shows the stale
//    pointer (a dirtied stack, captured without the scrub) and its absence
//    through this backend.
//  - Host code that runs during the capture itself at the same stack depth.
//    ATen's OffsetCalculator leaves the stride and divisor entries of unused
//    dimensions uninitialized, and they travel in the parameter; the H200
//    runs flagged such words in elementwise and reduction kernels after the
//    scrub was in place. ReloadEngine::track(graph, forward) captures once
//    more (recapture()) when a graph reads raw addresses that nothing owns,
//    and refuses only those that the second capture reads again in the same
//    kernel, parameter and byte.
//  - Words that repeat anyway: at 8B shapes the stale words were half a
//    pointer (a small integer next to the upper 4 bytes of a pointer, which
//    every pointer nearby shares), identical in both captures, and pointing
//    into free caching-allocator blocks. in_live_allocation() below lets
//    track() treat a raw word into memory no live allocation covers as stale.
// Words caught by the last two become AddressClass::unstable in the manifest
// (Note [Confirming raw addresses] in reload/capture_tracking.cpp).
constexpr std::size_t kScrubBytes = std::size_t{512} << 10;
// Never scrub closer than this to the end of the thread's stack.
constexpr std::size_t kScrubReserve = std::size_t{64} << 10;

// The bytes of this thread's stack below `here` that may be scrubbed.
std::size_t scrubbable_below(std::uintptr_t here) {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return 0;
  void* low = nullptr;
  std::size_t size = 0;
  const bool ok = pthread_attr_getstack(&attr, &low, &size) == 0;
  pthread_attr_destroy(&attr);
  const auto lo = reinterpret_cast<std::uintptr_t>(low);
  if (!ok || here <= lo + kScrubReserve) return 0;
  return std::min(kScrubBytes, here - lo - kScrubReserve);
}

[[gnu::noinline]] void scrub_stack_below() {
  unsigned char marker = 0;
  const std::size_t bytes = scrubbable_below(reinterpret_cast<std::uintptr_t>(&marker));
  if (bytes == 0) return;
  auto* p = static_cast<unsigned char*>(alloca(bytes));
  std::memset(p, 0, bytes);
  asm volatile("" : : "r"(p) : "memory");  // the stores must happen
}

struct Ranges {
  std::vector<AddressRange> r;  // sorted by begin
  void sort() {
    std::sort(r.begin(), r.end(), [](const AddressRange& a, const AddressRange& b) { return a.begin < b.begin; });
  }
  bool contains(std::uintptr_t a) const {
    auto it = std::upper_bound(r.begin(), r.end(), a, [](std::uintptr_t x, const AddressRange& y) { return x < y.begin; });
    return it != r.begin() && std::prev(it)->contains(a);
  }
};

class CudaReplay final : public ReplayBackend {
 public:
  CudaReplay(std::string name, std::optional<at::cuda::MempoolId_t> pool)
      : name_(std::move(name)), share_(pool), graph_(std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true)) {}

  at::cuda::MempoolId_t pool_id() const { return graph_->pool(); }

  // A fresh graph in the same pool (graphs sharing it keep sharing it); the
  // old one is destroyed after the new capture holds the pool.
  void recapture(const std::function<void()>& forward) override {
    GK_CHECK(StateError, captured_, "recapture of CUDA graph '", name_, "' before its first capture");
    std::unique_ptr<at::cuda::CUDAGraph> old = std::move(graph_);
    share_ = old->pool();
    graph_ = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true);
    captured_ = false;
    scan_ = {};
    segments_ = {};
    pool_ = {};
    library_ = {};
    capture(forward);
  }

  void capture(const std::function<void()>& forward) override {
    GK_CHECK(StateError, !captured_, "CUDA graph '", name_, "' is already captured");
    device_ = c10::Device(c10::kCUDA, c10::cuda::current_device());
    c10::cuda::device_synchronize();
    at::cuda::CUDAStream side = at::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index());
    scrub_stack_below();  // Note [Stale bytes in kernel parameters]
    {
      c10::cuda::CUDAStreamGuard guard(side);
      if (share_)
        graph_->capture_begin(*share_);
      else
        graph_->capture_begin();
      try {
        forward();
      } catch (...) {
        try {
          graph_->capture_end();
        } catch (...) {
        }
        throw;
      }
      graph_->capture_end();
    }
    graph_->instantiate();
    captured_ = true;
    record_memory();
    scan_ = cuda::scan_graph(graph_->raw_cuda_graph(), [this](std::uint64_t w) {
      const auto a = static_cast<std::uintptr_t>(w);
      return cuda::default_plausible(w) && (segments_.contains(a) || library_.contains(a));
    });
  }

  void replay() override {
    GK_CHECK(StateError, captured_, "replay of CUDA graph '", name_, "' before capture");
    graph_->replay();
  }
  bool captured() const override { return captured_; }

  std::vector<CapturedAddress> addresses() const override {
    std::vector<CapturedAddress> out;
    out.reserve(scan_.words.size());
    for (const cuda::GraphAddress& w : scan_.words)
      out.push_back({static_cast<std::uintptr_t>(w.address), w.node, w.node_name, 0,
                     w.kind == cuda::GraphAddress::NodeKind::memcpy && w.param_index == cuda::kMemcpyDstParam,
                     w.kind == cuda::GraphAddress::NodeKind::kernel ? static_cast<int>(w.param_index) : -1,
                     w.byte_offset});
    return out;
  }
  bool in_private_pool(std::uintptr_t address) const override { return pool_.contains(address); }
  std::vector<AddressRange> library_ranges() const override { return library_.r; }
  std::string name() const override { return name_; }
  c10::Device device() const override { return device_; }

  std::vector<bool> in_live_allocation(const std::vector<std::uintptr_t>& addresses) const override {
    std::vector<bool> live(addresses.size(), true);
    if (addresses.empty()) return live;
    const auto snap = c10::cuda::CUDACachingAllocator::snapshot({0, 0}, /*include_traces=*/false);
    for (std::size_t i = 0; i < addresses.size(); ++i) {
      const std::uintptr_t a = addresses[i];
      for (const auto& seg : snap.segments) {
        if (a < seg.address || a >= seg.address + seg.total_size) continue;
        std::uintptr_t offset = seg.address;
        for (const auto& b : seg.blocks) {
          if (a < offset + b.size) {
            live[i] = b.allocated || b.active;
            break;
          }
          offset += b.size;
        }
        break;
      }
    }
    return live;
  }

  std::string describe_address(std::uintptr_t address) const override {
    const auto snap = c10::cuda::CUDACachingAllocator::snapshot({0, 0}, /*include_traces=*/false);
    const auto mine = graph_->pool();
    for (const auto& seg : snap.segments) {
      if (address < seg.address || address >= seg.address + seg.total_size) continue;
      std::string out = detail::concat("caching-allocator segment 0x", std::hex, seg.address, std::dec, " (", seg.total_size,
                               " bytes, ", seg.is_large ? "large" : "small", " pool, stream ", seg.stream, ", ",
                               seg.owner_private_pool_id == mine                         ? "this graph's private pool"
                               : seg.owner_private_pool_id == at::cuda::MempoolId_t{0, 0} ? "no private pool"
                                                                                           : "another private pool",
                               " (", seg.owner_private_pool_id.first, ",", seg.owner_private_pool_id.second, ")");
      std::size_t offset = seg.address;
      for (const auto& b : seg.blocks) {
        if (address < offset + b.size) {
          out += detail::concat("; block at +", offset - seg.address, " of ", b.size, " bytes (", b.requested_size,
                        " requested), ", b.allocated ? "allocated" : b.active ? "active" : "free");
          break;
        }
        offset += b.size;
      }
      const bool recorded = segments_.contains(address), in_pool = pool_.contains(address);
      return out + detail::concat("); at capture this segment was ", recorded ? "" : "not yet ", "allocated",
                          recorded ? (in_pool ? ", in this graph's pool" : ", outside this graph's pool") : "");
    }
    return "in no caching-allocator segment";
  }

 private:
  void record_memory() {
    const auto pool = graph_->pool();
    const auto snap = c10::cuda::CUDACachingAllocator::snapshot({0, 0}, /*include_traces=*/false);
    for (const auto& seg : snap.segments) {
      if (seg.device != device_.index()) continue;
      AddressRange r{"segment", static_cast<std::uintptr_t>(seg.address),
                     static_cast<std::uintptr_t>(seg.address + seg.total_size)};
      segments_.r.push_back(r);
      if (seg.owner_private_pool_id == pool) pool_.r.push_back(r);
    }
    segments_.sort();
    pool_.sort();
    auto add_workspaces = [&](at::cuda::WorkspaceMapWithMutex& m, std::size_t size, const char* what) {
      std::shared_lock<std::shared_mutex> lock(m.mutex);
      for (const auto& [key, ptr] : m.map) {
        const auto b = reinterpret_cast<std::uintptr_t>(ptr.get());
        if (b != 0) library_.r.push_back({what, b, b + size});
      }
    };
    add_workspaces(at::cuda::cublas_handle_stream_to_workspace(), at::cuda::getChosenWorkspaceSize(),
                   "cuBLAS workspace");
    add_workspaces(at::cuda::cublaslt_handle_stream_to_workspace(), at::cuda::getCUDABlasLtWorkspaceSize(),
                   "cuBLASLt workspace");
    library_.sort();
  }

  std::string name_;
  std::optional<at::cuda::MempoolId_t> share_;  // the pool of another graph, shared
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  bool captured_ = false;
  c10::Device device_{c10::kCUDA, 0};
  cuda::GraphScan scan_;
  Ranges segments_, pool_, library_;
};

}  // namespace

std::unique_ptr<ReplayBackend> make_cuda_replay(std::string name, const ReplayBackend* share_pool_with) {
  std::optional<at::cuda::MempoolId_t> pool;
  if (share_pool_with != nullptr) {
    const auto* other = dynamic_cast<const CudaReplay*>(share_pool_with);
    GK_CHECK(StateError, other != nullptr && other->captured(), "CUDA graph '", name, "': share_pool_with must be a ",
             "captured CUDA graph ('", share_pool_with->name(), "' is not)");
    pool = other->pool_id();
  }
  return std::make_unique<CudaReplay>(std::move(name), pool);
}

}  // namespace gk
