// gk::overlaid_content_hashes (Note [Hashing through the writes] in
// overlaid_hash.h): the overlays matched to the tensors by address, then the
// change of each tensor's hash through OverlayLoad::delta, in the CUDA
// kernel or on the host (the same code).
#include <graphkeep/core/check.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/hashing/overlaid_hash.h>
#include <graphkeep/hashing/overlay_load.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "device_hashes.h"

#if defined(GRAPHKEEP_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

namespace gk {
namespace {

namespace x = detail::sum64;

std::uint64_t address_of(const at::Tensor& t) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(t.const_data_ptr()));
}

void check_overlay(const HashOverlay& o, std::size_t i) {
  GK_CHECK(WeightError, o.unit == 1 || o.unit == 2 || o.unit == 4 || o.unit == 8 || o.unit == 32,
           "gk::overlaid_content_hashes: overlay ", i, " has unit ", o.unit, "; the unit is 1, 2, 4, 8 or 32 bytes");
  GK_CHECK(WeightError, o.dst.defined() && o.dst.is_contiguous(), "gk::overlaid_content_hashes: overlay ", i,
           "'s dst is undefined or not contiguous");
  GK_CHECK(WeightError, o.indices.defined() && o.indices.dim() == 1 && o.indices.is_contiguous() &&
                            (o.indices.scalar_type() == at::kInt || o.indices.scalar_type() == at::kLong),
           "gk::overlaid_content_hashes: overlay ", i, "'s indices must be a contiguous 1-D int32 or int64 tensor");
  GK_CHECK(WeightError, o.values.defined() && o.values.is_contiguous() &&
                            o.values.nbytes() == static_cast<std::size_t>(o.indices.numel()) * static_cast<std::size_t>(o.unit),
           "gk::overlaid_content_hashes: overlay ", i, " has ", o.indices.numel(), " indices of ", o.unit,
           " bytes each but ", o.values.defined() ? o.values.nbytes() : 0, " bytes of values");
  GK_CHECK(WeightError, o.indices.device() == o.dst.device() && o.values.device() == o.dst.device(),
           "gk::overlaid_content_hashes: overlay ", i, "'s dst, indices and values are on ", o.dst.device(), ", ",
           o.indices.device(), " and ", o.values.device(), "; they must be on one device");
}

x::OverlaySource source_of(const HashOverlay& o) {
  x::OverlaySource s;
  s.base = address_of(o.dst);
  s.indices = o.indices.const_data_ptr();
  s.values = static_cast<const unsigned char*>(o.values.const_data_ptr());
  s.count = static_cast<std::uint64_t>(o.indices.numel());
  s.unit = static_cast<std::uint32_t>(o.unit);
  s.index_bytes = static_cast<std::uint32_t>(o.indices.element_size());
  return s;
}

// Per tensor, the positions of the overlays whose bytes meet its bytes, in
// the overlays' order: overlays sorted by first byte, and a running maximum
// of their ends to stop the backward scan.
std::vector<std::vector<std::size_t>> match(const std::vector<at::Tensor>& tensors,
                                            const std::vector<HashOverlay>& overlays) {
  std::vector<std::size_t> order(overlays.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  auto begin_of = [&](std::size_t i) { return address_of(overlays[i].dst); };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return begin_of(a) < begin_of(b); });
  std::vector<std::uint64_t> max_end(order.size());
  for (std::size_t k = 0; k < order.size(); ++k) {
    const std::uint64_t end = begin_of(order[k]) + overlays[order[k]].dst.nbytes();
    max_end[k] = k == 0 ? end : std::max(max_end[k - 1], end);
  }
  std::vector<std::vector<std::size_t>> out(tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].nbytes() == 0) continue;
    const std::uint64_t lo = address_of(tensors[t]), hi = lo + tensors[t].nbytes();
    auto k = static_cast<std::size_t>(
        std::lower_bound(order.begin(), order.end(), hi, [&](std::size_t i, std::uint64_t v) { return begin_of(i) < v; }) -
        order.begin());
    while (k > 0 && max_end[k - 1] > lo) {
      --k;
      const HashOverlay& o = overlays[order[k]];
      if (begin_of(order[k]) + o.dst.nbytes() > lo && o.dst.device() == tensors[t].device() && o.indices.numel() > 0)
        out[t].push_back(order[k]);
    }
    std::sort(out[t].begin(), out[t].end());
  }
  return out;
}

// `t` with the overlays `which` applied, as a new tensor of bytes (tensor
// operations: the path for a tensor more than kMaxOverlaySources overlap).
at::Tensor applied_copy(const at::Tensor& t, const std::vector<HashOverlay>& overlays,
                        const std::vector<std::size_t>& which) {
  at::Tensor bytes = t.reshape({-1}).view(at::kByte).clone();
  const auto t0 = static_cast<std::int64_t>(address_of(t));
  for (std::size_t i : which) {
    const HashOverlay& o = overlays[i];
    const at::Tensor pos = ((o.indices.to(at::kLong) * o.unit + (static_cast<std::int64_t>(address_of(o.dst)) - t0))
                                .unsqueeze(1) +
                            at::arange(o.unit, o.indices.options().dtype(at::kLong)))
                               .reshape({-1});
    const at::Tensor keep = pos.ge(0).logical_and(pos.lt(bytes.numel()));
    bytes.index_put_({pos.masked_select(keep)}, o.values.reshape({-1}).view(at::kByte).masked_select(keep));
  }
  return bytes;
}

// The host: the change through the walked writes, block by block in
// parallel, and through the exclusive ones, write by write (the same
// functions as the kernels').
std::uint64_t host_delta(const at::Tensor& t, const std::vector<x::OverlaySource>& sources,
                         const std::vector<x::OverlaySource>& exclusive) {
  const auto* p = static_cast<const unsigned char*>(t.const_data_ptr());
  const std::size_t n = t.nbytes();
  std::uint64_t d = 0;
  if (!sources.empty())
    d = detail::sum_blocks(n, [&](std::uint64_t first, std::uint64_t last) {
      x::OverlayLoad<x::HostLoad> load{x::HostLoad{}, sources.data(), static_cast<int>(sources.size())};
      return load.delta(p, n, 8 * first, std::min<std::uint64_t>(n, 8 * last));
    });
  for (const x::OverlaySource& s : exclusive)
    for (std::uint64_t k = x::owned_from(s, address_of(t), 0), e = x::owned_from(s, address_of(t), n); k < e; ++k)
      for (std::uint32_t part = 0; part < x::parts_per_write(s); ++part)
        d += x::exclusive_part_delta(s, k, part, p, n, x::HostLoad{});
  return d;
}

}  // namespace

std::vector<std::uint64_t> overlaid_content_hashes(const std::vector<at::Tensor>& tensors,
                                                   const std::vector<std::uint64_t>& hashes,
                                                   const std::vector<HashOverlay>& overlays) {
  GK_CHECK(WeightError, hashes.size() == tensors.size(), "gk::overlaid_content_hashes: ", tensors.size(),
           " tensors but ", hashes.size(), " hashes; give each tensor's content hash now");
  for (std::size_t i = 0; i < tensors.size(); ++i) detail::check_hashable(tensors[i], i);
  for (std::size_t i = 0; i < overlays.size(); ++i) check_overlay(overlays[i], i);
  const std::vector<std::vector<std::size_t>> which = match(tensors, overlays);
  // Each tensor's hash: its hash now where no write meets it; its hash now
  // plus the change through its writes; or, where too many lists of writes
  // meet it, the whole hash of a copy with the writes made.
  std::vector<std::uint64_t> out = hashes;
  std::vector<at::Tensor> copies;
  std::vector<std::size_t> copied;
  std::vector<std::vector<x::OverlaySource>> sources(tensors.size()), exclusive(tensors.size());
  std::map<c10::DeviceIndex, std::vector<std::size_t>> by_device;
  std::vector<std::size_t> on_host;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    if (which[t].empty()) continue;
    for (std::size_t i : which[t]) {
      const x::OverlaySource s = source_of(overlays[i]);
      (overlays[i].exclusive && x::aligned_words(s, address_of(tensors[t])) ? exclusive[t] : sources[t]).push_back(s);
    }
    if (sources[t].size() > static_cast<std::size_t>(x::kMaxOverlaySources)) {
      copies.push_back(applied_copy(tensors[t], overlays, which[t]));
      copied.push_back(t);
      continue;
    }
    if (tensors[t].is_cuda()) by_device[tensors[t].device().index()].push_back(t);
    else on_host.push_back(t);
  }
  // The host's: the tensors in parallel (a MoE patch's are many and small),
  // each one's blocks in parallel where it is large.
  at::parallel_for(0, static_cast<std::int64_t>(on_host.size()), 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      const std::size_t t = on_host[static_cast<std::size_t>(i)];
      out[t] = hashes[t] + host_delta(tensors[t], sources[t], exclusive[t]);
    }
  });
#if defined(GRAPHKEEP_WITH_CUDA)
  // One launch per device for every tensor of it that writes meet; the
  // copies' whole hashes launched before the first wait.
  std::vector<detail::DeviceLaunch> launches;
  std::vector<detail::HashBytes> inputs;
  if (!by_device.empty())
    for (const at::Tensor& t : tensors) inputs.push_back(detail::bytes_of(t));
  for (auto& [index, ts] : by_device)
    launches.push_back(detail::launch_device_hashes(inputs, ts, c10::Device(c10::kCUDA, index),
                                                    c10::cuda::getCurrentCUDAStream(index), &sources, &hashes,
                                                    nullptr, &exclusive));
  const std::vector<std::uint64_t> whole = content_hashes(copies);
  for (detail::DeviceLaunch& l : launches) detail::read_device_hashes(l, out);
#else
  GK_INTERNAL_ASSERT(by_device.empty(), "CUDA tensors passed the checks of a build without CUDA");
  const std::vector<std::uint64_t> whole = content_hashes(copies);
#endif
  for (std::size_t i = 0; i < copied.size(); ++i) out[copied[i]] = whole[i];
  return out;
}

}  // namespace gk
