#include "part_timer.h"

#include <graphkeep/core/check.h>

#ifdef GRAPHKEEP_WITH_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <utility>
#include <vector>

namespace demo {

const char* to_string(Part p) {
  switch (p) {
    case Part::embedding: return "embedding";
    case Part::norm: return "norms";
    case Part::gemm: return "gemms";
    case Part::attention: return "attention";
    case Part::mlp_act: return "mlp_activation";
    case Part::moe: return "moe";
    case Part::lm_head: return "lm_head";
    case Part::sampling: return "sampling";
    case Part::lora: return "lora";
    default: return "idle";
  }
}

struct PartTimer::Impl {
  Impl(c10::Device d, double ms) : device(d), sleep_ms(ms) {}
  c10::Device device;
  double sleep_ms;  // before the first mark, on its stream
#ifdef GRAPHKEEP_WITH_CUDA
  std::vector<std::pair<Part, std::unique_ptr<c10::cuda::CUDAEvent>>> marks;
#endif
  Part open = Part::idle;
};

namespace {
thread_local PartTimer::Impl* active = nullptr;
}  // namespace

void mark_part(Part p) {
  PartTimer::Impl* t = active;
  if (t == nullptr || p == t->open) return;
#ifdef GRAPHKEEP_WITH_CUDA
  if (t->device.is_cuda()) {
    // The stream the forward runs on (the engine's serving stream, say).
    const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(t->device.index());
    if (t->marks.empty()) {
      const c10::cuda::CUDAGuard guard(t->device);
      const c10::cuda::CUDAStreamGuard on(stream);
      int khz = 0;
      if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, t->device.index()) != cudaSuccess || khz <= 0)
        khz = 2'000'000;  // an H200's 1.98 GHz, rounded up
      at::cuda::sleep(static_cast<std::int64_t>(t->sleep_ms * static_cast<double>(khz)));
    }
    auto e = std::make_unique<c10::cuda::CUDAEvent>(cudaEventDefault);
    e->record(stream);
    t->marks.emplace_back(p, std::move(e));
  }
#endif
  t->open = p;
}

PartTimer::PartTimer(c10::Device device, double sleep_ms) : impl_(std::make_unique<Impl>(device, sleep_ms)) {
  GK_CHECK(gk::StateError, active == nullptr, "PartTimer: another timer is active on this thread");
  active = impl_.get();
}

PartTimer::~PartTimer() {
  if (active == impl_.get()) active = nullptr;
}

std::map<std::string, double> PartTimer::finish() {
  mark_part(Part::idle);
  active = nullptr;
  std::map<std::string, double> ms;
#ifdef GRAPHKEEP_WITH_CUDA
  auto& m = impl_->marks;
  if (!m.empty()) m.back().second->synchronize();
  for (std::size_t i = 0; i + 1 < m.size(); ++i)
    if (m[i].first != Part::idle) ms[to_string(m[i].first)] += m[i].second->elapsed_time(*m[i + 1].second);
#endif
  return ms;
}

}  // namespace demo
