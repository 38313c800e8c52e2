// examples/engine/rope.h: rotary position tables as transformers computes
// them, every rope_scaling preset the engine serves (Note [Rope scaling as
// transformers computes it] in rope.cpp).
//
//   demo::RopeTables rope = demo::make_rope_tables(cfg, max_len, device);
#pragma once

#include "hf_config.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace demo {

// Rotary tables [max_len, head_dim] float32: cos and sin of position * inv_freq,
// each frequency twice (the rotate_half convention).
struct RopeTables {
  at::Tensor cos, sin;
};
RopeTables make_rope_tables(const HfConfig& c, std::int64_t max_len, c10::Device device);

}  // namespace demo
