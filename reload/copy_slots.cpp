#include <graphkeep/check.h>
#include <graphkeep/reload/copy_slots.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "reload/cuda/batched_copy.h"
#endif

namespace gk {

namespace {

#if defined(GRAPHKEEP_WITH_CUDA)
bool batchable(const at::Tensor& d, const at::Tensor& s) {
  return d.is_cuda() && s.is_cuda() && d.device() == s.device() && d.scalar_type() == s.scalar_type() &&
         d.numel() == s.numel() && d.is_contiguous() && s.is_contiguous() && !d.is_same(s);
}

// Splits every batchable pair into tasks of at most kCopyChunk bytes and
// runs them in one launch on the current stream of `device`.
void launch_tasks(const std::vector<cuda::CopyTask>& tasks, c10::Device device) {
  const auto bytes = static_cast<int64_t>(tasks.size() * sizeof(cuda::CopyTask));
  at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host.data_ptr(), tasks.data(), static_cast<std::size_t>(bytes));
  // non_blocking from pinned memory: the caching host allocator keeps `host`
  // alive until the stream has consumed it.
  const at::Tensor dev = host.to(at::TensorOptions().device(device), /*non_blocking=*/true);
  const int err = cuda::launch_batched_copy(static_cast<const cuda::CopyTask*>(dev.const_data_ptr()),
                                            static_cast<std::int64_t>(tasks.size()),
                                            c10::cuda::getCurrentCUDAStream(device.index()).stream());
  GK_CHECK(StateError, err == 0, "graphkeep: the batched slot copy failed to launch (cudaError ", err, ")");
}
#endif

}  // namespace

void copy_slots(const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src) {
  GK_CHECK(StateError, dst.size() == src.size(), "gk::copy_slots: ", dst.size(), " destinations but ", src.size(),
           " sources");
#if defined(GRAPHKEEP_WITH_CUDA)
  std::vector<cuda::CopyTask> tasks;
  c10::Device device(at::kCPU);
  for (std::size_t i = 0; i < dst.size(); ++i) {
    const at::Tensor& d = dst[i];
    const at::Tensor& s = src[i];
    if (!batchable(d, s) || (!tasks.empty() && d.device() != device)) {
      d.copy_(s);
      continue;
    }
    device = d.device();
    const auto* from = static_cast<const unsigned char*>(s.const_data_ptr());
    auto* to = static_cast<unsigned char*>(d.data_ptr());
    const auto total = static_cast<std::uint64_t>(d.nbytes());
    for (std::uint64_t o = 0; o < total; o += cuda::kCopyChunk)
      tasks.push_back({from + o, to + o, std::min<std::uint64_t>(cuda::kCopyChunk, total - o)});
  }
  if (!tasks.empty()) launch_tasks(tasks, device);
#else
  for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
#endif
}

}  // namespace gk
