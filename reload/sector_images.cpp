// Sector images (Note [Sector images] in cuda/patch_scatter.h): a patch's
// element writes turned into writes of whole 32-byte sectors, on the CPU with
// tensor operations and on a CUDA device with two kernels
// (cuda/sector_images.h).
#include "sector_images.h"

#include <graphkeep/core/check.h>
#include <graphkeep/delta/detail/device_upload.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/sector_images.h"
#endif

namespace gk {
namespace {

constexpr std::int64_t kSector = 32;  // bytes (cuda::kSectorBytes)

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

// The tensor operations (Note [Sector images in three passes]), for a CPU
// device. Passes 1 and 2 for the items of one device (`group`), one transfer each:
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

// The entries of `it` outside its whole sectors, [0, b) and [e, count): a
// prefix and a suffix of the ascending indices, as element writes over
// slices of the patch's own tensors.
void append_outside(const ScatterItem& it, std::int64_t b, std::int64_t e, std::vector<ScatterItem>& out) {
  const std::int64_t count = it.indices.numel();
  if (b > 0) out.push_back({it.dst, it.indices.narrow(0, 0, b), it.values.narrow(0, 0, b)});
  if (e < count) out.push_back({it.dst, it.indices.narrow(0, e, count - e), it.values.narrow(0, e, count - e)});
}

// Pass 3, every size known: the item's entries outside the whole sectors
// as element writes (when any), and the touched sectors' images.
void append_sector_writes(const ScatterItem& it, const SectorPlan& p, std::vector<ScatterItem>& out) {
  append_outside(it, p.b, p.e, out);
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

#if defined(GRAPHKEEP_WITH_CUDA)
// Note [Sector images on the device] in cuda/sector_images.h: the images of
// every item of `group` (one CUDA device) in two launches and one
// synchronization; each item's writes go to out[item].
void device_sector_writes(const std::vector<ScatterItem>& items, const std::vector<std::size_t>& group,
                          const std::vector<SectorPlan>& plans, std::vector<std::vector<ScatterItem>>& out) {
  const c10::Device device = items[group.front()].dst.device();
  const c10::cuda::CUDAGuard guard(device);
  void* stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  std::vector<cuda::SectorItem> rows;
  std::vector<cuda::SectorTask> tasks;
  for (std::size_t k = 0; k < group.size(); ++k) {
    const ScatterItem& it = items[group[k]];
    const SectorPlan& p = plans[group[k]];
    cuda::SectorItem& r = rows.emplace_back();
    r.whole = static_cast<unsigned char*>(it.dst.data_ptr()) + p.lead;
    r.indices = it.indices.const_data_ptr();
    r.values = it.values.const_data_ptr();
    r.count = it.indices.numel();
    r.first = p.first, r.sectors = p.whole, r.per = static_cast<std::uint32_t>(p.per);
    r.elem_bytes = static_cast<std::uint16_t>(it.dst.element_size());
    r.index_bytes = static_cast<std::uint16_t>(it.indices.element_size());
    for (std::int64_t b = 0; b < r.count; b += cuda::kSectorTaskEntries)
      tasks.push_back({b, static_cast<std::uint32_t>(k),
                       static_cast<std::uint32_t>(std::min(cuda::kSectorTaskEntries, r.count - b))});
  }
  const auto task_count = static_cast<std::int64_t>(tasks.size());
  GK_CHECK(StateError, task_count < std::numeric_limits<int>::max(), "a patch of ", task_count,
           " sector tasks on ", device);
  const at::Tensor d_rows = detail::upload_rows(rows, device), d_tasks = detail::upload_rows(tasks, device);
  const auto* rp = reinterpret_cast<const cuda::SectorItem*>(d_rows.const_data_ptr());
  const auto* tp = reinterpret_cast<const cuda::SectorTask*>(d_tasks.const_data_ptr());
  at::Tensor counts = at::empty({3 * task_count}, at::TensorOptions(at::kInt).device(device));
  int err = cuda::launch_sector_count(rp, tp, static_cast<int>(task_count), counts.mutable_data_ptr<std::int32_t>(), stream);
  GK_CHECK(StateError, err == 0, "the sector count failed to launch on ", device, " (cudaError ", err, ")");

  // The one synchronization: each task's first slot, each item's split.
  const at::Tensor c = counts.cpu();
  const auto* cp = c.const_data_ptr<std::int32_t>();
  std::vector<std::int64_t> slots(tasks.size());  // each task's first image
  struct Split {
    std::int64_t below = 0, inside = 0, slot = -1, images = 0;
  };
  std::vector<Split> split(group.size());
  std::int64_t total = 0;
  for (std::int64_t t = 0; t < task_count; ++t) {
    Split& s = split[tasks[static_cast<std::size_t>(t)].item];
    if (s.slot < 0) s.slot = total;
    s.below += cp[3 * t + cuda::kBelow], s.inside += cp[3 * t + cuda::kInside], s.images += cp[3 * t + cuda::kOpened];
    slots[static_cast<std::size_t>(t)] = total;
    total += cp[3 * t + cuda::kOpened];
  }
  const at::Tensor d_slots = detail::upload_rows(slots, device);
  const at::Tensor ids = at::empty({total}, at::TensorOptions(at::kInt).device(device));
  const at::Tensor images = at::empty({4 * total}, at::TensorOptions(at::kLong).device(device));
  err = cuda::launch_sector_fill(rp, tp, static_cast<int>(task_count),
                                 reinterpret_cast<const std::int64_t*>(d_slots.const_data_ptr()),
                                 ids.data_ptr<std::int32_t>(), images.data_ptr(), stream);
  GK_CHECK(StateError, err == 0, "the sector images failed to launch on ", device, " (cudaError ", err, ")");

  for (std::size_t k = 0; k < group.size(); ++k) {
    const ScatterItem& it = items[group[k]];
    const SectorPlan& p = plans[group[k]];
    const Split& s = split[k];
    std::vector<ScatterItem>& o = out[group[k]];
    if (s.inside == 0) {  // every change lies in the partial sectors at the ends
      o.push_back(it);
      continue;
    }
    append_outside(it, s.below, s.below + s.inside, o);
    const at::Tensor words = it.dst.view(at::kByte).narrow(0, p.lead, p.whole * kSector).view(at::kLong);
    ScatterItem w{words, ids.narrow(0, s.slot, s.images), images.narrow(0, 4 * s.slot, 4 * s.images)};
    w.sectors = true;
    o.push_back(std::move(w));
  }
}
#endif

}  // namespace

// Note [Sector images in three passes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// On the CPU the images are made with tensor operations, in three passes
// per device rather than item by item: every item's edges (where the whole
// sectors' run of indices begins and ends) in one transfer, every item's
// count of touched sectors in a second (locate_sectors), then the images
// with sizes known (index_copy_ of each sector id to its rank among the
// touched sectors). On a CUDA device two kernels do all of it, with one
// synchronization (Note [Sector images on the device]).
std::vector<ScatterItem> sector_images(const std::vector<ScatterItem>& items) {
  std::vector<SectorPlan> plans = plan_sectors(items);
  // The kernels number sectors in int32: a tensor of 64 GiB or more takes
  // the tensor operations, on any device.
  auto by_kernel = [&](std::size_t i) {
    return items[i].dst.is_cuda() && plans[i].whole <= std::numeric_limits<std::int32_t>::max();
  };
  std::vector<std::vector<std::size_t>> groups;  // per device, and how
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!plans[i].convert) continue;
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& v) {
      return items[v.front()].dst.device() == items[i].dst.device() && by_kernel(v.front()) == by_kernel(i);
    });
    if (g == groups.end()) groups.push_back({i});
    else g->push_back(i);
  }
  std::vector<std::vector<ScatterItem>> writes(items.size());
  for (const std::vector<std::size_t>& group : groups) {
#if defined(GRAPHKEEP_WITH_CUDA)
    if (by_kernel(group.front())) {
      device_sector_writes(items, group, plans, writes);
      continue;
    }
#endif
    locate_sectors(items, group, plans);
    for (std::size_t i : group)
      if (plans[i].convert) append_sector_writes(items[i], plans[i], writes[i]);
  }
  std::vector<ScatterItem> out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (writes[i].empty()) out.push_back(items[i]);  // nothing converted
    for (ScatterItem& w : writes[i]) out.push_back(std::move(w));
  }
  return out;
}

std::size_t sector_image_bytes_bound(const ScatterItem& it) {
  if (it.sectors || !it.indices.defined() || it.dst.dim() != 1) return 0;
  const auto per = kSector / static_cast<std::int64_t>(it.dst.element_size());
  const std::int64_t sectors = std::min<std::int64_t>(it.indices.numel(), it.dst.numel() / std::max<std::int64_t>(per, 1));
  return static_cast<std::size_t>(sectors) * static_cast<std::size_t>(kSector + it.indices.element_size());
}

void use_sector_images(std::vector<ScatterItem>& items, const std::function<bool(const ScatterItem&)>& use) {
  // The items that share bytes with another keep their element writes.
  const std::vector<char> shared = destinations_meeting(items, 1);
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

}  // namespace gk
