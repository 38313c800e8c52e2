// Rotary tables (rope.h).
#include "rope.h"

#include <graphkeep/core/check.h>

#include <ATen/ATen.h>

#include <cmath>
#include <numbers>

namespace demo {

// Note [Rope scaling as transformers computes it]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// transformers 4.57's modeling_rope_utils.py, op for op in float32 on the
// CPU (the same ATen kernels, with Python's scalars as the same doubles), so
// the tables are bitwise transformers' (gk-hf-check compares them):
//   default  inv_freq = 1 / theta^(arange(0, D, 2) / D)
//   linear   inv_freq = default / factor
//   dynamic  theta' = theta * (factor * s / M - (factor - 1))^(D / (D - 2)), s = max(seq_len, M)
//            with M = max_position_embeddings; then as default with theta'.
//            transformers recomputes it in the forward once a sequence grows
//            past M; the engine's positions stay below M (its max_len is
//            checked against M at start-up and on every reload), so s = M.
//   llama3   wavelen = 2 pi / inv_freq (the default's); with L = original_max_position_embeddings,
//            low = L / low_freq_factor, high = L / high_freq_factor:
//            wavelen > low: inv_freq / factor; wavelen < high: unchanged;
//            otherwise (1 - s) inv_freq / factor + s inv_freq, s = (L / wavelen - low_freq_factor)
//                                                                   / (high_freq_factor - low_freq_factor)
// Python's `a / tensor` is tensor.reciprocal() * a, and `1 - tensor` is
// rsub; both are written that way here. attention_scaling is 1 for all four.
namespace {
at::Tensor rope_inv_freq(const HfConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  double theta = c.rope_theta;
  if (rs.type == "dynamic") {
    const double d = static_cast<double>(c.head_dim), m = static_cast<double>(c.max_position_embeddings);
    theta = theta * std::pow(rs.factor * m / m - (rs.factor - 1), d / (d - 2));
  }
  const at::Tensor exps = at::arange(0, c.head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(c.head_dim);
  at::Tensor inv_freq = at::reciprocal(at::pow(theta, exps));
  if (rs.type == "linear") inv_freq.div_(rs.factor);
  if (rs.type == "llama3") {
    const double low_wavelen = static_cast<double>(rs.original_max_position_embeddings) / rs.low_freq_factor;
    const double high_wavelen = static_cast<double>(rs.original_max_position_embeddings) / rs.high_freq_factor;
    const at::Tensor wavelen = inv_freq.reciprocal() * (2 * std::numbers::pi);
    const at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq);
    const at::Tensor smooth = (wavelen.reciprocal() * rs.original_max_position_embeddings - rs.low_freq_factor) /
                              (rs.high_freq_factor - rs.low_freq_factor);
    const at::Tensor smoothed = at::rsub(smooth, 1) * scaled / rs.factor + smooth * scaled;
    const at::Tensor medium = at::logical_not(wavelen < high_wavelen) * at::logical_not(wavelen > low_wavelen);
    inv_freq = at::where(medium, smoothed, scaled);
  }
  return inv_freq;
}
}  // namespace

RopeTables make_rope_tables(const HfConfig& c, int64_t max_len, c10::Device device) {
  // angles = position * inv_freq (Note [Rope scaling as transformers computes it])
  const at::Tensor inv_freq = rope_inv_freq(c);
  const at::Tensor pos = at::arange(max_len, at::kLong).to(at::kFloat);
  const at::Tensor freqs = at::outer(pos, inv_freq);
  const at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(device).contiguous(), emb.sin().to(device).contiguous()};
}

}  // namespace demo
