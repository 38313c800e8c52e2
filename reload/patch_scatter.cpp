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
#endif

}  // namespace

std::size_t ScatterItem::bytes() const {
  if (sectors) return static_cast<std::size_t>(indices.numel()) * kSector;
  return indices.defined() ? static_cast<std::size_t>(indices.numel()) * dst.element_size() : dst.nbytes();
}

namespace {

// Where an item's whole sectors lie, and (after the device's answers) which
// of its entries fall inside them and how many sectors those touch.
struct SectorPlan {
  bool convert = false;
  std::int64_t lead = 0, first = 0, per = 0, whole = 0;  // bytes, elements, elements, sectors
  std::int64_t b = 0, e = 0, count = 0;                   // the interior's entries [b, e) and their sectors
  at::Tensor rel, sector, starts;                          // per interior entry: element, sector, starts one
};

// The items whose destination has whole sectors to write: alignment only,
// on the host.
std::vector<SectorPlan> plan_sectors(const std::vector<ScatterItem>& items) {
  std::vector<SectorPlan> plans(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const ScatterItem& it = items[i];
    GK_INTERNAL_ASSERT(it.indices.defined() && !it.sectors && it.dst.dim() == 1 && it.dst.is_contiguous(),
                       "sector_images: a sparse element item over a contiguous 1-D destination");
    const std::int64_t eb = static_cast<std::int64_t>(it.dst.element_size());
    const std::int64_t n = it.dst.numel();
    const auto addr = reinterpret_cast<std::uintptr_t>(it.dst.const_data_ptr());
    const auto storage = reinterpret_cast<std::uintptr_t>(it.dst.storage().data());
    // The word views below need the storage itself 8-byte aligned (an
    // allocator's block is; a from_blob tensor may not be).
    if (it.indices.numel() == 0 || addr % static_cast<std::uintptr_t>(eb) != 0 || storage % 8 != 0) continue;
    SectorPlan& p = plans[i];
    p.lead = static_cast<std::int64_t>((kSector - addr % kSector) % kSector);
    p.first = p.lead / eb, p.per = kSector / eb;  // elements before the first whole sector, per sector
    p.whole = n > p.first ? (n - p.first) / p.per : 0;
    p.convert = p.whole > 0;
  }
  return plans;
}

// Passes 1 and 2 for the items of one device (`group`), one transfer each:
// each interior's entries [b, e) (a contiguous run of the ascending
// indices), then how many sectors each touches.
void locate_sectors(const std::vector<ScatterItem>& items, const std::vector<std::size_t>& group,
                    std::vector<SectorPlan>& plans) {
  std::vector<at::Tensor> edges;
  for (std::size_t i : group) {
    const SectorPlan& p = plans[i];
    edges.push_back(at::searchsorted(items[i].indices, at::Scalar(p.first)));
    edges.push_back(at::searchsorted(items[i].indices, at::Scalar(p.first + p.whole * p.per)));
  }
  const at::Tensor be = at::stack(edges).to(at::kLong).cpu();
  const auto* bep = be.const_data_ptr<std::int64_t>();
  std::vector<at::Tensor> counts;
  std::vector<std::size_t> counted;
  for (std::size_t k = 0; k < group.size(); ++k) {
    SectorPlan& p = plans[group[k]];
    p.b = bep[2 * k], p.e = bep[2 * k + 1];
    p.convert = p.b < p.e;
    if (!p.convert) continue;
    const std::int64_t m = p.e - p.b;
    p.rel = items[group[k]].indices.narrow(0, p.b, m) - p.first;   // element within the interior
    p.sector = at::div(p.rel, p.per, /*rounding_mode=*/"trunc");    // ascending, index dtype kept
    p.starts = at::ones({m}, p.rel.options().dtype(at::kBool));     // where a new sector starts
    if (m > 1) {
      at::Tensor later = p.starts.narrow(0, 1, m - 1);
      at::ne_out(later, p.sector.narrow(0, 1, m - 1), p.sector.narrow(0, 0, m - 1));
    }
    counts.push_back(p.starts.sum());
    counted.push_back(group[k]);
  }
  if (counted.empty()) return;
  const at::Tensor cs = at::stack(counts).cpu();
  for (std::size_t k = 0; k < counted.size(); ++k)
    plans[counted[k]].count = cs[static_cast<std::int64_t>(k)].item<std::int64_t>();
}

// Pass 3, every size known: the item's entries outside the whole sectors
// as an element write (when any), and the touched sectors' images.
void append_sector_writes(const ScatterItem& it, const SectorPlan& p, std::vector<ScatterItem>& out) {
  const std::int64_t count = it.indices.numel();
  if (p.b > 0 || p.e < count)
    out.push_back({it.dst, at::cat({it.indices.narrow(0, 0, p.b), it.indices.narrow(0, p.e, count - p.e)}),
                   at::cat({it.values.narrow(0, 0, p.b), it.values.narrow(0, p.e, count - p.e)})});
  // Each entry's rank among the touched sectors, and the touched sectors.
  const at::Tensor inverse = at::cumsum(p.starts, 0) - 1;  // int64
  const at::Tensor sectors = at::empty({p.count}, p.sector.options()).index_copy_(0, inverse, p.sector);
  const at::Tensor words = it.dst.view(at::kByte).narrow(0, p.lead, p.whole * kSector).view(at::kLong);
  const at::Tensor images = words.view({p.whole, kSector / 8}).index_select(0, sectors);  // the served bytes
  images.view(it.dst.scalar_type()).view({-1}).index_copy_(0, inverse * p.per + p.rel.remainder(p.per),
                                                            it.values.narrow(0, p.b, p.e - p.b));
  ScatterItem s{words, sectors, images.view({-1})};
  s.sectors = true;
  out.push_back(std::move(s));
}

}  // namespace

// Note [Sector images in three passes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each image needs two sizes from the device: where the whole sectors' run
// of indices begins and ends, and how many sectors it touches. Asked item
// by item (a searchsorted copied to the host, then unique_consecutive),
// that was three synchronizations per write, 600 for an 8B model's 1 %
// patch, each waiting for everything queued before it. Here every item's
// edges come back in one transfer, then every item's sector count in a
// second (locate_sectors); the images are then made with sizes known on
// the host (index_copy_ of each sector id to its rank among the touched
// sectors, instead of unique_consecutive): two synchronizations per device
// for the whole patch, whatever its number of writes.
std::vector<ScatterItem> sector_images(const std::vector<ScatterItem>& items) {
  std::vector<SectorPlan> plans = plan_sectors(items);
  std::vector<std::vector<std::size_t>> by_device;  // one transfer per device and pass
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!plans[i].convert) continue;
    auto g = std::find_if(by_device.begin(), by_device.end(),
                          [&](const auto& v) { return items[v.front()].dst.device() == items[i].dst.device(); });
    if (g == by_device.end()) by_device.push_back({i});
    else g->push_back(i);
  }
  for (const std::vector<std::size_t>& group : by_device) locate_sectors(items, group, plans);
  std::vector<ScatterItem> out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (plans[i].convert) append_sector_writes(items[i], plans[i], out);
    else out.push_back(items[i]);
  }
  return out;
}

std::size_t sector_image_bytes_bound(const ScatterItem& it) {
  if (it.sectors || !it.indices.defined() || it.dst.dim() != 1) return 0;
  const auto per = kSector / static_cast<std::int64_t>(it.dst.element_size());
  const std::int64_t sectors = std::min<std::int64_t>(it.indices.numel(), it.dst.numel() / std::max<std::int64_t>(per, 1));
  return static_cast<std::size_t>(sectors) * static_cast<std::size_t>(kSector + it.indices.element_size());
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

void use_sector_images(std::vector<ScatterItem>& items, const std::function<bool(const ScatterItem&)>& use) {
  // Byte ranges of every destination, to find the items that share bytes.
  struct Range {
    std::uintptr_t begin, end;
    std::size_t item;
  };
  std::vector<Range> ranges;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const auto b = reinterpret_cast<std::uintptr_t>(items[i].dst.const_data_ptr());
    ranges.push_back({b, b + items[i].dst.nbytes(), i});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& x, const Range& y) { return x.begin < y.begin; });
  std::vector<char> shared(items.size(), 0);
  std::uintptr_t reach = 0;
  std::size_t reach_item = 0;
  for (std::size_t k = 0; k < ranges.size(); ++k) {
    if (k > 0 && ranges[k].begin < reach) shared[ranges[k].item] = shared[reach_item] = 1;
    if (ranges[k].end > reach) reach = ranges[k].end, reach_item = ranges[k].item;
  }
  // The items to convert, all at once (Note [Sector images in three passes]);
  // the others keep their place.
  std::vector<ScatterItem> out, convert;
  for (std::size_t i = 0; i < items.size(); ++i) {
    ScatterItem& it = items[i];
    if (shared[i] || it.sectors || !it.indices.defined() || !use(it)) out.push_back(std::move(it));
    else convert.push_back(std::move(it));
  }
  for (ScatterItem& p : sector_images(convert)) out.push_back(std::move(p));
  items = std::move(out);
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
    const auto n = static_cast<std::uint64_t>(it.indices.numel());
    const std::size_t ib = it.indices.element_size(), eb = it.sectors ? cuda::kSectorBytes : it.dst.element_size();
    const std::uint64_t chunk = it.sectors ? cuda::kSectorChunk : cuda::kScatterChunk;
    const auto* idx = static_cast<const unsigned char*>(it.indices.const_data_ptr());
    const auto* val = static_cast<const unsigned char*>(it.values.const_data_ptr());
    for (std::uint64_t o = 0; o < n; o += chunk) {
      if (batch.full()) flush();
      cuda::ScatterTask& t = batch.task[batch.count++];
      t.dst = it.dst.data_ptr();
      t.indices = idx + o * ib;
      t.values = val + o * eb;
      t.count = static_cast<std::uint32_t>(std::min<std::uint64_t>(chunk, n - o));
      t.elem_bytes = static_cast<std::uint16_t>(eb);
      t.index_bytes = static_cast<std::uint16_t>(ib);
    }
#else
    GK_THROW(StateError, "a CUDA tensor in a build without CUDA");
#endif
  }
#if defined(GRAPHKEEP_WITH_CUDA)
  flush();
#endif
}

}  // namespace gk
