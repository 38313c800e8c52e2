// bench/bench_parts.h: the GPU time per part of one eager decode step of the
// example engine (demo::PartTimer: the parts queued behind a sleep kernel,
// so they run back to back as in the graph), for the benches that report it.
//
//   std::map<std::string, double> ms = gkbench::eager_parts(eng, device, tokens, pos);
//   // {"attention": 0.41, "gemms": 3.2, ...}; empty off CUDA
#pragma once

#include "engine/llm_engine.h"
#include "engine/part_timer.h"

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <string>

namespace gkbench {

// One eager forward of `eng` on `device` at tokens and positions `pos`
// (host int64 [batch]), the second of two (the first warms up); `then`
// runs inside the timing with the logits and the positions on the device
// (the samplers, timed as their own part). Empty off CUDA.
inline std::map<std::string, double> eager_parts(
    demo::LlmEngine& eng, c10::Device device, const at::Tensor& tokens, const at::Tensor& pos,
    const std::function<void(const at::Tensor& logits, const at::Tensor& positions)>& then = {}) {
  std::map<std::string, double> parts;
  if (!device.is_cuda()) return parts;
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor ids = tokens.to(device), positions = pos.to(device), seqs = at::arange(tokens.numel(), longs);
  for (int rep = 0; rep < 2; ++rep) {
    demo::PartTimer timer(device);
    const at::Tensor logits = eng.model().forward(ids, {positions, seqs}, eng.kv_caches(), eng.rope_tables());
    if (then) then(logits, positions);
    parts = timer.finish();
  }
  return parts;
}

}  // namespace gkbench
