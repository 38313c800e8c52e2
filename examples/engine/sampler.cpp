#include "sampler.h"

#include "fused_ops.h"
#include "ops.h"

#include <graphkeep/core/check.h>

#include <ATen/ATen.h>

#include <limits>

namespace demo {

// Note [Sampling on the device]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A serving step returns token ids, not logits: greedy decoding is an argmax
// inside each decode graph, and sampling is a second, small graph per batch
// size (LlmEngine::decode) over the decode graph's logits, so the
// 31 MiB of float32 logits of an 8B model at batch 64 never cross to the
// host; 256 bytes of int32 do, into pinned memory.
//
// A sampling row draws by the Gumbel-max trick: with g_v = -log(-log(u_v))
// for independent uniform u_v, argmax_v (z_v + g_v) is distributed as
// softmax(z). z is the logits divided by the temperature, sorted (stably,
// descending), with -inf outside the first top_k and outside the fewest
// leading tokens whose probability reaches top_p (a token is kept while the
// probability of the tokens before it is below top_p: the first always is);
// these are transformers' TopK and TopP warpers after its temperature.
//
// The uniforms are a counter-based hash, not a generator's state: u_v of a
// row is mix32(key ^ v) (the lowbias32 finalizer; key = mix32(mix32(
// mix32(seed_lo) ^ seed_hi) ^ position), 24 bits), so a draw depends only on
// the row's seed, its position and its logits: replays, batch sizes and
// graphs cannot change it, a captured graph needs no generator offset, and
// the CPU computes the same bits with int64 ATen ops (CUDA: one kernel,
// fused::gumbel_noise); the logarithms may differ by an ulp between devices.

void SamplingParams::check() const {
  GK_CHECK(gk::StateError, std::isfinite(temperature) && temperature >= 0, "SamplingParams: temperature is ",
           temperature, "; it must be finite and >= 0 (0: greedy)");
  GK_CHECK(gk::StateError, top_k >= 0, "SamplingParams: top_k is ", top_k, "; it must be >= 0 (0: every token)");
  GK_CHECK(gk::StateError, top_p > 0 && top_p <= 1, "SamplingParams: top_p is ", top_p, "; it must be in (0, 1]");
}

SamplingRows SamplingRows::make(std::int64_t rows, c10::Device device) {
  const auto f = at::TensorOptions().dtype(at::kFloat).device(device);
  const auto l = at::TensorOptions().dtype(at::kLong).device(device);
  return {at::zeros({rows}, f), at::zeros({rows}, l), at::ones({rows}, f), at::zeros({rows}, l)};
}

void SamplingRows::set(const SamplingParams& p, std::int64_t n) {
  p.check();
  const std::int64_t rows = temperature.size(0);
  GK_CHECK(gk::StateError, n >= 0 && n <= rows, "SamplingRows::set: ", n, " rows of ", rows);
  at::Tensor t = at::zeros({rows}, at::kFloat), k = at::zeros({rows}, at::kLong), tp = at::ones({rows}, at::kFloat);
  t.narrow(0, 0, n).fill_(p.temperature);
  k.narrow(0, 0, n).fill_(p.top_k);
  tp.narrow(0, 0, n).fill_(p.top_p);
  // seed + b in 64 bits (wrapping), held as int64
  at::Tensor s = at::arange(rows, at::kLong).add_(static_cast<std::int64_t>(p.seed));
  temperature.copy_(t);
  top_k.copy_(k);
  top_p.copy_(tp);
  seed.copy_(s);
}

SamplingRows SamplingRows::narrow(std::int64_t n) const {
  return {temperature.narrow(0, 0, n), top_k.narrow(0, 0, n), top_p.narrow(0, 0, n), seed.narrow(0, 0, n)};
}

namespace detail {
namespace {

constexpr std::int64_t kLow32 = 0xffffffffLL;

// (x * c) mod 2^32 for x in [0, 2^32), in int64 without overflow: c in 16-bit halves.
at::Tensor mul32(const at::Tensor& x, std::int64_t c) {
  const std::int64_t lo = c & 0xffff, hi = (c >> 16) & 0xffff;
  const at::Tensor high = at::bitwise_left_shift(at::bitwise_and(x * hi, 0xffff), 16);
  return at::bitwise_and(x * lo + high, kLow32);
}

at::Tensor xor_shift(const at::Tensor& x, int bits) { return at::bitwise_xor(x, at::bitwise_right_shift(x, bits)); }

}  // namespace

at::Tensor mix32(const at::Tensor& x) {
  at::Tensor h = xor_shift(x, 16);
  h = mul32(h, 0x7feb352d);
  h = xor_shift(h, 15);
  h = mul32(h, 0x846ca68b);
  return xor_shift(h, 16);
}

at::Tensor row_keys(const at::Tensor& seed, const at::Tensor& positions) {
  const at::Tensor lo = at::bitwise_and(seed, kLow32);
  const at::Tensor hi = at::bitwise_and(at::bitwise_right_shift(seed, 32), kLow32);
  at::Tensor k = mix32(lo);
  k = mix32(at::bitwise_xor(k, hi));
  return mix32(at::bitwise_xor(k, at::bitwise_and(positions, kLow32)));
}

at::Tensor gumbel_noise_reference(const at::Tensor& ids, const at::Tensor& keys) {
  const at::Tensor h = mix32(at::bitwise_xor(keys.unsqueeze(1), at::bitwise_and(ids, kLow32)));
  const at::Tensor u = (at::bitwise_right_shift(h, 8).to(at::kFloat) + 0.5) * (1.0 / 16777216.0);
  return at::neg(at::log(at::neg(at::log(u))));
}

}  // namespace detail

at::Tensor greedy_tokens(const at::Tensor& logits) {
  return ops::aten_op("greedy_tokens", {logits}, {logits.size(0)}, logits.options().dtype(at::kInt),
                      [](auto& in, auto& out) { out[0].copy_(in[0].argmax(-1)); });
}

at::Tensor sample_tokens(const at::Tensor& logits, const at::Tensor& positions, const SamplingRows& rows) {
  GK_CHECK(gk::StateError, logits.dim() == 2 && logits.scalar_type() == at::kFloat &&
                               positions.numel() == logits.size(0) && rows.temperature.numel() == logits.size(0),
           "sample_tokens: logits ", logits.sizes(), " must be [B, V] float32 with B positions and B sampling rows");
  return ops::aten_op(
      "sample_tokens", {logits, positions, rows.temperature, rows.top_k, rows.top_p, rows.seed}, {logits.size(0)},
      logits.options().dtype(at::kInt), [](auto& in, auto& out) {
        const at::Tensor& z = in[0];
        const at::Tensor& temp = in[2];
        const std::int64_t V = z.size(1);
        const double inf = std::numeric_limits<double>::infinity();
        const auto [sorted, ids] = (z / temp.clamp_min(1e-6).unsqueeze(1)).sort(/*stable=*/true, -1, /*descending=*/true);
        const at::Tensor rank = at::arange(V, ids.options()).unsqueeze(0);
        const at::Tensor k = at::where(in[3] > 0, in[3].clamp_max(V), V).unsqueeze(1);
        at::Tensor keep = rank < k;
        const at::Tensor p = at::softmax(sorted.masked_fill(keep.logical_not(), -inf), -1);
        keep = keep.logical_and((p.cumsum(-1) - p) < in[4].unsqueeze(1));
        const at::Tensor keys = detail::row_keys(in[5], in[1]);
        const at::Tensor noise =
            fused::supported(z) ? fused::gumbel_noise(ids, keys) : detail::gumbel_noise_reference(ids, keys);
        const at::Tensor choice = (sorted.masked_fill(keep.logical_not(), -inf) + noise).argmax(-1, /*keepdim=*/true);
        const at::Tensor sampled = ids.gather(1, choice).squeeze(1);
        out[0].copy_(at::where(temp > 0, sampled, z.argmax(-1)));
      });
}

}  // namespace demo
