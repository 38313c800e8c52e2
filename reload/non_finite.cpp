// Note [Refusing non-finite weights]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A diverged trainer writes a valid checkpoint full of NaN. Served, every
// logit is NaN, and worse, whatever the NaN weights wrote into persistent
// state (an engine's KV cache) can outlive them. So a reload, a stage and
// the first load refuse a floating-point checkpoint tensor holding a NaN or
// an infinity, naming it, before PWAL (ReloadOptions::allow_non_finite lets
// them through). The check reads the checkpoint-format parameters once the
// layer's weights are loaded: the bytes the checkpoint delivered, on the
// device they will be served from, whether they were copied or adopted. A
// stage runs it on the staging thread, never in the commit's pause.
//
// Cost: one read of the layer's bytes. torch.isfinite(w).all() writes a
// bool per element and then reduces them, several times one read
// (docs/performance.md, "Figures behind the code"); the kernel here only reads, testing
// each element's exponent bits with 16-byte loads, and writes one word per
// tensor. One launch per batch of up to cuda::kMaxFiniteTasks tensors, one
// synchronization per layer (the answer decides whether PWAL runs), of a
// side stream only (Note [The check on a side stream]).
#include "non_finite.h"

#include <graphkeep/core/check.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(GRAPHKEEP_WITH_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/finite_check.h"
#endif

namespace gk::detail {

ExponentTest exponent_test(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return {2, 0x7F80};
    case at::kHalf: return {2, 0x7C00};
    case at::kFloat: return {4, 0x7F800000u};
    case at::kDouble: return {8, 0x7FF0000000000000ull};
    case at::kFloat8_e4m3fn: return {1, 0x7F};  // no infinity; S.1111.111 is NaN
    case at::kFloat8_e5m2: return {1, 0x7C};
    default: return {};
  }
}

namespace {

// The first element of p[0, n) whose exponent bits are all set, or -1: a
// plain loop over words of the element's width (vectorized by the
// compiler), in parallel chunks that each stop at their first hit.
template <class W>
std::int64_t first_set_exponent(const W* p, std::int64_t n, W mask) {
  std::atomic<std::int64_t> first{std::numeric_limits<std::int64_t>::max()};
  at::parallel_for(0, n, 1 << 16, [&](std::int64_t begin, std::int64_t end) {
    constexpr std::int64_t kStride = 1024;  // elements tested before looking for the hit
    for (std::int64_t s = begin; s < end; s += kStride) {
      const std::int64_t e = std::min(end, s + kStride);
      bool any = false;
      for (std::int64_t i = s; i < e; ++i) any |= (p[i] & mask) == mask;
      if (!any) continue;
      for (std::int64_t i = s; i < e; ++i) {
        if ((p[i] & mask) != mask) continue;
        std::int64_t cur = first.load();
        while (i < cur && !first.compare_exchange_weak(cur, i)) {
        }
        return;
      }
    }
  });
  const std::int64_t f = first.load();
  return f == std::numeric_limits<std::int64_t>::max() ? -1 : f;
}

std::int64_t first_on_cpu(const at::Tensor& t, ExponentTest b) {
  const void* p = t.const_data_ptr();
  const std::int64_t n = t.numel();
  switch (b.bytes) {
    case 1: return first_set_exponent(static_cast<const std::uint8_t*>(p), n, static_cast<std::uint8_t>(b.mask));
    case 2: return first_set_exponent(static_cast<const std::uint16_t*>(p), n, static_cast<std::uint16_t>(b.mask));
    case 4: return first_set_exponent(static_cast<const std::uint32_t*>(p), n, static_cast<std::uint32_t>(b.mask));
    default: return first_set_exponent(static_cast<const std::uint64_t*>(p), n, b.mask);
  }
}

// Any other floating or complex dtype: torch's own test.
std::int64_t first_general(const at::Tensor& t) {
  const at::Tensor bad = at::logical_not(at::isfinite(t)).reshape({-1});
  if (!bad.any().item<bool>()) return -1;
  return bad.nonzero().min().item<std::int64_t>();
}

}  // namespace

struct FiniteScan::Launched {
#if defined(GRAPHKEEP_WITH_CUDA)
  // One device's scans: a side stream that waited for the caller's, the
  // answers (one word per CUDA tensor, in the order they were listed), and
  // the batch being filled, launched as soon as it is full.
  struct Device {
    c10::Device device;
    c10::cuda::CUDAStream side;
    at::Tensor results;               // [capacity] int64, -1 where no bad element
    std::vector<std::size_t> index;   // results[k] answers tensors[index[k]]
    cuda::FiniteBatch batch;          // not yet launched: the last batch.count of `index`
  };
  std::vector<Device> devices;
#endif
};

FiniteScan::~FiniteScan() {
#if defined(GRAPHKEEP_WITH_CUDA)
  // Not waited for (an exception in between): the scans still read the
  // tensors; let them finish before the caller may free those.
  for (const Launched::Device& d : launched_->devices) d.side.synchronize();
#endif
}

FiniteScan::FiniteScan(const std::vector<at::Tensor>& tensors)
    : first_(tensors.size(), -1), launched_(std::make_unique<Launched>()) {
#if defined(GRAPHKEEP_WITH_CUDA)
  // Launches d's batch on its side stream, answering into the results after
  // those already launched.
  const auto launch_batch = [](Launched::Device& d) {
    if (d.batch.count == 0) return;
    c10::cuda::CUDAGuard guard(d.device);
    const std::size_t at = d.index.size() - static_cast<std::size_t>(d.batch.count);
    auto* out = reinterpret_cast<unsigned long long*>(d.results.mutable_data_ptr<std::int64_t>()) + at;
    const int err = cuda::launch_first_non_finite(d.batch, out, d.side.stream());
    d.batch.count = 0;
    GK_CHECK(StateError, err == 0, "the non-finite weight check failed to launch on ", d.device, " (cudaError ",
             err, ")");
  };
#endif
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (!t.defined() || t.numel() == 0) continue;
    if (!at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type())) continue;
    const ExponentTest b = exponent_test(t.scalar_type());
    if (b.bytes == 0 || !t.is_contiguous() || !(t.is_cpu() || t.is_cuda())) {
      first_[i] = first_general(t);
      continue;
    }
    if (t.is_cpu()) {
      first_[i] = first_on_cpu(t, b);
      continue;
    }
#if defined(GRAPHKEEP_WITH_CUDA)
    // Note [The check on a side stream]
    // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    // The scan waits for what the caller's stream has enqueued so far (the
    // loads that wrote these tensors) through an event, and runs on a pool
    // stream; the host then waits for that stream alone. Waiting on the
    // caller's stream instead would also wait for everything queued behind
    // the loads, and the host's work for the next layer would no longer
    // overlap the device's (measured: docs/performance.md, "Figures behind
    // the code"). The event still covers whatever was queued *before* the
    // loads: a streaming reload that committed layer L-1 before scanning
    // layer L drained its queue at every layer (the scan waited for L-1's
    // copy-back, the host for the scan). So a streaming reload enqueues
    // L-1's copy-back between this constructor and wait() (Note [Copy back one
    // layer late] in weight_stream.cpp). Each batch is launched as soon as
    // it is full, so the device scans while the host lists the next one (a
    // resident MoE source lists 18,000 tensors).
    auto& devices = launched_->devices;
    auto d = std::find_if(devices.begin(), devices.end(), [&](const Launched::Device& x) { return x.device == t.device(); });
    if (d == devices.end()) {
      c10::cuda::CUDAGuard guard(t.device());
      const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(t.device().index());
      const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, t.device().index());
      at::cuda::CUDAEvent loaded;
      loaded.record(caller);
      loaded.block(side);
      c10::cuda::CUDAStreamGuard on_side(side);
      const auto capacity = static_cast<std::int64_t>(tensors.size() - i);
      devices.push_back({t.device(), side, at::full({capacity}, -1, at::TensorOptions().dtype(at::kLong).device(t.device())), {}, {}});
      d = devices.end() - 1;
    }
    d->batch.task[d->batch.count++] = {t.const_data_ptr(), static_cast<std::uint64_t>(t.numel()), b.bytes, b.mask};
    d->index.push_back(i);
    if (d->batch.count == cuda::kMaxFiniteTasks) launch_batch(*d);
#else
    first_[i] = first_general(t);
#endif
  }
#if defined(GRAPHKEEP_WITH_CUDA)
  for (Launched::Device& d : launched_->devices) launch_batch(d);
#endif
}

std::vector<std::int64_t> FiniteScan::wait() {
#if defined(GRAPHKEEP_WITH_CUDA)
  for (Launched::Device& d : launched_->devices) {
    c10::cuda::CUDAStreamGuard on_side(d.side);
    const at::Tensor host = d.results.narrow(0, 0, static_cast<std::int64_t>(d.index.size())).cpu();  // this side stream only
    const auto* v = host.const_data_ptr<std::int64_t>();
    for (std::size_t k = 0; k < d.index.size(); ++k)
      if (v[k] != -1) first_[d.index[k]] = v[k];
  }
  launched_->devices.clear();
#endif
  return first_;
}

std::vector<std::int64_t> first_non_finite(const std::vector<at::Tensor>& tensors) {
  return FiniteScan(tensors).wait();
}

}  // namespace gk::detail
