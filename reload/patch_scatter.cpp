#include "patch_scatter.h"

#include <graphkeep/core/check.h>
#include <graphkeep/reload/copy_slots.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "cuda/patch_scatter.h"
#endif

namespace gk {
namespace {

constexpr std::int64_t kSector = 32;  // bytes (cuda::kSectorBytes)

template <class T, class I>
void scatter_host(const ScatterItem& it) {
  T* dst = static_cast<T*>(it.dst.data_ptr());
  const I* idx = static_cast<const I*>(it.indices.const_data_ptr());
  const T* val = static_cast<const T*>(it.values.const_data_ptr());
  at::parallel_for(0, it.indices.numel(), 1 << 14, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) dst[idx[i]] = val[i];
  });
}

template <class T>
void scatter_host_by_index(const ScatterItem& it) {
  if (it.indices.scalar_type() == at::kLong) scatter_host<T, std::int64_t>(it);
  else scatter_host<T, std::int32_t>(it);
}

// Note [Sector images]: 32-byte elements.
template <class I>
void scatter_host_sectors(const ScatterItem& it) {
  auto* dst = static_cast<unsigned char*>(it.dst.data_ptr());
  const I* idx = static_cast<const I*>(it.indices.const_data_ptr());
  const auto* val = static_cast<const unsigned char*>(it.values.const_data_ptr());
  at::parallel_for(0, it.indices.numel(), 1 << 12, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) std::memcpy(dst + kSector * idx[i], val + kSector * i, kSector);
  });
}

void scatter_host(const ScatterItem& it) {
  if (it.sectors) {
    if (it.indices.scalar_type() == at::kLong) scatter_host_sectors<std::int64_t>(it);
    else scatter_host_sectors<std::int32_t>(it);
    return;
  }
  switch (it.dst.element_size()) {
    case 1: scatter_host_by_index<std::uint8_t>(it); break;
    case 2: scatter_host_by_index<std::uint16_t>(it); break;
    case 4: scatter_host_by_index<std::uint32_t>(it); break;
    case 8: scatter_host_by_index<std::uint64_t>(it); break;
    default: GK_THROW(InternalError, "scatter of ", it.dst.element_size(), "-byte elements");
  }
}

#if defined(GRAPHKEEP_WITH_CUDA)
void launch(const cuda::ScatterBatch& b, c10::Device device) {
  const int err = cuda::launch_patch_scatter(b, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  GK_CHECK(StateError, err == 0, "the patch scatter failed to launch on ", device, " (cudaError ", err, ")");
}
void launch_gather(const cuda::ScatterBatch& b, c10::Device device) {
  const int err = cuda::launch_patch_gather(b, c10::cuda::getCurrentCUDAStream(device.index()).stream());
  GK_CHECK(StateError, err == 0, "the patch gather failed to launch on ", device, " (cudaError ", err, ")");
}

// Appends the tasks of one item (n entries of eb bytes, indices of ib bytes,
// at most `chunk` entries a task) to `batch`, calling flush() when it is full.
template <class Flush>
void add_tasks(cuda::ScatterBatch& batch, void* dst, const void* indices, const void* values, std::uint64_t n,
               std::size_t eb, std::size_t ib, std::uint64_t chunk, Flush&& flush) {
  const auto* idx = static_cast<const unsigned char*>(indices);
  const auto* val = static_cast<const unsigned char*>(values);
  for (std::uint64_t o = 0; o < n; o += chunk) {
    if (batch.full()) flush();
    cuda::ScatterTask& t = batch.task[batch.count++];
    t.dst = dst;
    t.indices = idx + o * ib;
    t.values = val + o * eb;
    t.count = static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, n - o));
    t.elem_bytes = static_cast<std::uint16_t>(eb);
    t.index_bytes = static_cast<std::uint16_t>(ib);
  }
}
#endif

}  // namespace

std::size_t ScatterItem::bytes() const {
  if (sectors) return static_cast<std::size_t>(indices.numel()) * kSector;
  return indices.defined() ? static_cast<std::size_t>(indices.numel()) * dst.element_size() : dst.nbytes();
}

std::vector<char> destinations_meeting(const std::vector<ScatterItem>& items, std::uintptr_t grain) {
  struct Range {
    std::uintptr_t begin, end;
    std::size_t item;
  };
  std::vector<Range> ranges;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto b = reinterpret_cast<std::uintptr_t>(items[i].dst.const_data_ptr());
    ranges.push_back({b / grain * grain, (b + items[i].dst.nbytes() + grain - 1) / grain * grain, i});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& x, const Range& y) { return x.begin < y.begin; });
  // In begin order, a range meets an earlier one where it begins below
  // their furthest end, and a later one where the next begins below its end.
  std::vector<char> meets(items.size(), 0);
  std::uintptr_t reach = 0;
  for (std::size_t k = 0; k < ranges.size(); ++k) {
    meets[ranges[k].item] = (k > 0 && ranges[k].begin < reach) ||
                            (k + 1 < ranges.size() && ranges[k + 1].begin < ranges[k].end);
    reach = std::max(reach, ranges[k].end);
  }
  return meets;
}

std::size_t device_headroom(c10::Device device) {
#if defined(GRAPHKEEP_WITH_CUDA)
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device);
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const std::int64_t cached = st.reserved_bytes[agg].current - st.allocated_bytes[agg].current;
    return free + static_cast<std::size_t>(std::max<std::int64_t>(cached, 0));
  }
#endif
  (void)device;
  return 0;
}

void wait_for(const std::vector<ScatterItem>& items) {
  std::vector<c10::Device> devices;
  for (const ScatterItem& it : items)
    if (!it.dst.device().is_cpu() && std::find(devices.begin(), devices.end(), it.dst.device()) == devices.end())
      devices.push_back(it.dst.device());
  for (const c10::Device& d : devices) c10::impl::VirtualGuardImpl(d.type()).getStream(d).synchronize();
}


void scatter_items(const std::vector<ScatterItem>& items) {
  std::vector<at::Tensor> dense_dst, dense_src;
  for (const ScatterItem& it : items) {
    GK_INTERNAL_ASSERT(it.dst.is_contiguous() && it.values.device() == it.dst.device() &&
                           it.values.element_size() == it.dst.element_size(),
                       "scatter item: a non-contiguous destination, or values on another device or of another size");
    if (!it.indices.defined()) {
      dense_dst.push_back(it.dst);
      dense_src.push_back(it.values);
    }
  }
  if (!dense_dst.empty()) copy_slots(dense_dst, dense_src);
#if defined(GRAPHKEEP_WITH_CUDA)
  cuda::ScatterBatch batch;
  c10::Device device(c10::kCUDA, -1);
  c10::cuda::OptionalCUDAGuard guard;
  auto flush = [&] {
    if (batch.count > 0) launch(batch, device);
    batch.count = 0;
  };
#endif
  for (const ScatterItem& it : items) {
    if (!it.indices.defined() || it.indices.numel() == 0) continue;
    if (!it.dst.is_cuda()) {
      scatter_host(it);
      continue;
    }
#if defined(GRAPHKEEP_WITH_CUDA)
    if (it.dst.device() != device) {
      flush();
      device = it.dst.device();
      guard.set_device(device);
    }
    add_tasks(batch, it.dst.data_ptr(), it.indices.const_data_ptr(), it.values.const_data_ptr(),
              static_cast<std::uint64_t>(it.indices.numel()), it.sectors ? cuda::kSectorBytes : it.dst.element_size(),
              it.indices.element_size(), it.sectors ? cuda::kSectorChunk : cuda::kScatterChunk, flush);
#else
    GK_THROW(StateError, "a CUDA tensor in a build without CUDA");
#endif
  }
#if defined(GRAPHKEEP_WITH_CUDA)
  flush();
#endif
}

void gather_items(std::vector<ScatterItem>& items) {
#if defined(GRAPHKEEP_WITH_CUDA)
  // Per device, one buffer for every value and one launch per 1,000 tasks.
  std::map<c10::DeviceIndex, std::int64_t> bytes;
  auto padded = [](std::int64_t b) { return (b + 15) / 16 * 16; };
  for (const ScatterItem& it : items)
    if (!it.values.defined() && it.indices.defined() && it.dst.is_cuda())
      bytes[it.dst.device().index()] += padded(it.indices.numel() * static_cast<std::int64_t>(it.dst.element_size()));
  for (const auto& [index, total] : bytes) {
    const c10::Device device(c10::kCUDA, index);
    const c10::cuda::CUDAGuard guard(device);
    const at::Tensor buffer = at::empty({total}, at::TensorOptions(at::kByte).device(device));
    std::int64_t at_byte = 0;
    cuda::ScatterBatch batch;
    auto flush = [&] {
      if (batch.count > 0) launch_gather(batch, device);
      batch.count = 0;
    };
    for (ScatterItem& it : items) {
      if (it.values.defined() || !it.indices.defined() || it.dst.device() != device) continue;
      const std::int64_t n = it.indices.numel(), eb = static_cast<std::int64_t>(it.dst.element_size());
      it.values = buffer.narrow(0, at_byte, n * eb).view(it.dst.scalar_type());
      at_byte += padded(n * eb);
      add_tasks(batch, it.dst.data_ptr(), it.indices.const_data_ptr(), it.values.data_ptr(),
                static_cast<std::uint64_t>(n), it.dst.element_size(), it.indices.element_size(), cuda::kScatterChunk,
                flush);
    }
    flush();
  }
#endif
  for (ScatterItem& it : items)
    if (!it.values.defined() && it.indices.defined()) it.values = it.dst.index_select(0, it.indices);
}

}  // namespace gk
