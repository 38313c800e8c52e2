#include <graphkeep/core/check.h>
#include <graphkeep/reload/copy_slots.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "byte_copies.h"
#include "cuda/batched_copy.h"
#endif

namespace gk {

namespace {

// Why a pair is not one byte range copied to another (none: it is; a CUDA
// pair then goes through the batched kernel, a small CPU pair through
// memcpy). One check for every caller: copy_slots' hot path asks only
// whether a pair batches, SlotCopyPlan names the reason.
enum class Unbatchable { none, undefined, device, dtype, size, layout, same_tensor };

Unbatchable why_unbatchable(const at::Tensor& d, const at::Tensor& s) {
  if (!d.defined() || !s.defined()) return Unbatchable::undefined;
  if (d.device() != s.device()) return Unbatchable::device;
  if (d.scalar_type() != s.scalar_type()) return Unbatchable::dtype;
  if (d.numel() != s.numel()) return Unbatchable::size;
  if (!d.is_contiguous() || !s.is_contiguous()) return Unbatchable::layout;
  if (d.is_same(s)) return Unbatchable::same_tensor;
  return Unbatchable::none;
}

// Small CPU pairs that are one byte range each: memcpy, without copy_'s
// dispatch and TensorIterator (most of a reload's slots on a CPU are a few
// hundred bytes: the setup cost more than the copy). Larger ones keep
// copy_, which copies in parallel.
bool host_bytes(const at::Tensor& d, const at::Tensor& s) {
  constexpr std::size_t kSmall = std::size_t{1} << 20;
  if (!d.is_cpu() || why_unbatchable(d, s) != Unbatchable::none) return false;
  const auto* a = static_cast<const unsigned char*>(d.const_data_ptr());
  const auto* b = static_cast<const unsigned char*>(s.const_data_ptr());
  const auto n = static_cast<std::size_t>(d.nbytes());
  return n > 0 && n <= kSmall && (a + n <= b || b + n <= a);  // copy_ refuses a partial overlap; an empty tensor has no pointer
}

#if defined(GRAPHKEEP_WITH_CUDA)

std::string describe(Unbatchable why, const at::Tensor& d, const at::Tensor& s) {
  switch (why) {
    case Unbatchable::none: return {};
    case Unbatchable::undefined: return "an undefined tensor";
    case Unbatchable::device: return detail::concat("devices differ (", d.device(), " <- ", s.device(), ")");
    case Unbatchable::dtype: return detail::concat("dtypes differ (", d.scalar_type(), " <- ", s.scalar_type(), ")");
    case Unbatchable::size: return detail::concat("sizes differ (", d.sizes(), " <- ", s.sizes(), ")");
    case Unbatchable::layout: return "a tensor is not contiguous";
    case Unbatchable::same_tensor: return "the pair is one tensor";
  }
  return "?";
}

bool batchable(const at::Tensor& d, const at::Tensor& s) {
  return d.is_cuda() && why_unbatchable(d, s) == Unbatchable::none;
}

// Splits one batchable pair into tasks of at most kCopyChunk bytes, each
// added to `open()`: a batch with room for one more task.
template <class Open>
void add_tasks(const at::Tensor& d, const at::Tensor& s, Open&& open) {
  const auto* from = static_cast<const unsigned char*>(s.const_data_ptr());
  auto* to = static_cast<unsigned char*>(d.mutable_data_ptr());
  const auto total = static_cast<std::uint64_t>(d.nbytes());
  for (std::uint64_t o = 0; o < total; o += cuda::kCopyChunk)
    open().add(from + o, to + o, static_cast<std::uint32_t>(std::min(cuda::kCopyChunk, total - o)));
}

void launch(const cuda::CopyBatch& batch, c10::Device device, void* stream) {
  const int err = cuda::launch_batched_copy(batch, stream);
  GK_CHECK(StateError, err == 0, "the batched slot copy failed to launch on ", device, " (cudaError ", err,
           ")");
}

#endif

}  // namespace

void copy_slots(const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src) {
  GK_CHECK(StateError, dst.size() == src.size(), "gk::copy_slots: ", dst.size(), " destinations but ", src.size(),
           " sources");
#if defined(GRAPHKEEP_WITH_CUDA)
  // One CopyBatch at a time, launched when full, when the device changes,
  // and at the end (Note [Copy tasks travel as kernel parameters] in
  // reload/cuda/batched_copy.h).
  detail::ByteCopies launcher;
#endif
  for (std::size_t i = 0; i < dst.size(); ++i) {
#if defined(GRAPHKEEP_WITH_CUDA)
    if (batchable(dst[i], src[i])) {
      launcher.add(dst[i].device(), src[i].const_data_ptr(), dst[i].mutable_data_ptr(),
                   static_cast<std::uint64_t>(dst[i].nbytes()));
      continue;
    }
#endif
    if (host_bytes(dst[i], src[i])) {
      std::memcpy(dst[i].mutable_data_ptr(), src[i].const_data_ptr(), dst[i].nbytes());
      continue;
    }
#if defined(GRAPHKEEP_WITH_CUDA)
    launcher.flush();  // keep copy_'s order among pairs that overlap
#endif
    dst[i].copy_(src[i]);
  }
#if defined(GRAPHKEEP_WITH_CUDA)
  launcher.flush();
#endif
}

// ---------------------------------------------------------------------------
struct SlotCopyPlan::Impl {
  std::vector<c10::Storage> keep;              // every pair's storage, alive as long as the plan
  std::vector<at::Tensor> host_dst, host_src;  // pairs copied with copy_ (CPU, or a build without CUDA)
  std::size_t pairs = 0, bytes = 0;
#if defined(GRAPHKEEP_WITH_CUDA)
  std::vector<cuda::CopyBatch> batches;
  c10::Device device{c10::kCUDA, -1};
#endif
};

SlotCopyPlan::SlotCopyPlan(const std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src)
    : impl_(std::make_unique<Impl>()) {
  GK_CHECK(StateError, dst.size() == src.size(), "gk::SlotCopyPlan: ", dst.size(), " destinations but ", src.size(),
           " sources");
  Impl& p = *impl_;
  p.pairs = dst.size();
  for (std::size_t i = 0; i < dst.size(); ++i) {
    const at::Tensor& d = dst[i];
    const at::Tensor& s = src[i];
    GK_CHECK(StateError, d.defined() && s.defined() && d.has_storage() && s.has_storage(), "gk::SlotCopyPlan: pair ",
             i, " has an undefined tensor or one without storage");
    p.keep.push_back(d.storage());
    p.keep.push_back(s.storage());
    p.bytes += d.nbytes();
#if defined(GRAPHKEEP_WITH_CUDA)
    if (d.is_cuda() || s.is_cuda()) {
      const Unbatchable why = why_unbatchable(d, s);
      GK_CHECK(StateError, why == Unbatchable::none, "gk::SlotCopyPlan: pair ", i,
               " cannot be batched: ", describe(why, d, s), " (copy such pairs with gk::copy_slots)");
      GK_CHECK(StateError, p.device.index() < 0 || d.device() == p.device, "gk::SlotCopyPlan: pair ", i, " is on ",
               d.device(), " but earlier pairs are on ", p.device, "; make one plan per device");
      p.device = d.device();
      add_tasks(d, s, [&]() -> cuda::CopyBatch& {
        if (p.batches.empty() || p.batches.back().full()) p.batches.emplace_back();
        return p.batches.back();
      });
      continue;
    }
#endif
    p.host_dst.push_back(d);
    p.host_src.push_back(s);
  }
}

SlotCopyPlan::~SlotCopyPlan() = default;
SlotCopyPlan::SlotCopyPlan(SlotCopyPlan&&) noexcept = default;
SlotCopyPlan& SlotCopyPlan::operator=(SlotCopyPlan&&) noexcept = default;

void SlotCopyPlan::run() const {
  const Impl& p = *impl_;
#if defined(GRAPHKEEP_WITH_CUDA)
  if (!p.batches.empty()) {
    c10::cuda::CUDAGuard guard(p.device);
    void* stream = c10::cuda::getCurrentCUDAStream(p.device.index()).stream();
    for (const cuda::CopyBatch& b : p.batches) launch(b, p.device, stream);
  }
#endif
  for (std::size_t i = 0; i < p.host_dst.size(); ++i) p.host_dst[i].copy_(p.host_src[i]);
}

std::size_t SlotCopyPlan::pairs() const noexcept { return impl_->pairs; }
std::size_t SlotCopyPlan::bytes() const noexcept { return impl_->bytes; }
std::size_t SlotCopyPlan::launches() const noexcept {
#if defined(GRAPHKEEP_WITH_CUDA)
  return impl_->batches.size();
#else
  return 0;
#endif
}

}  // namespace gk
