// The example engine's weight formats (weight_formats.h).
#include "weight_formats.h"

#include "layer_ops.h"

#include <graphkeep/core/check.h>
#include <graphkeep/reload/errors.h>

#include <ATen/ATen.h>

#include <algorithm>

namespace demo {
using namespace layer_ops;

WeightFormat parse_weight_format(std::string_view name) {
  if (name == "dense" || name == "bf16" || name == "none") return WeightFormat::dense;
  if (name == "fp8") return WeightFormat::fp8;
  if (name == "w4a16") return WeightFormat::w4a16;
  GK_THROW(gk::StateError, "unknown weight format '", name, "' (dense, fp8 or w4a16)");
}

std::string_view to_string(WeightFormat f) {
  switch (f) {
    case WeightFormat::fp8: return "fp8";
    case WeightFormat::w4a16: return "w4a16";
    default: return "dense";
  }
}

// Note [FP8 CPU twin]
// ~~~~~~~~~~~~~~~~~~~
// W8A8 with a scale per output channel (weights, made in PWAL) and per token
// (activations, at run time):
//   sw[n] = max_k |W[n,k]| / 448,  Wq = e4m3(W / sw)       (PWAL)
//   sx[t] = max_k |x[t,k]| / 448,  xq = e4m3(x / sx)       (each call)
//   y[t,n] = sx[t] * sw[n] * sum_k xq[t,k] Wq[n,k]
// On CUDA the sum is at::_scaled_mm (cuBLASLt, float32 accumulation). On the
// CPU the e4m3 values are widened to float32, where each product is exact (4
// significant bits each), and summed by at::mm in float32: the same value up
// to the order of the additions. tests/hf/make_reference.py computes the same
// quantization inside transformers for the oracle.
//
// Note [FP8 quantization in chunks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The scale is per output channel, so rows quantize independently: build()
// widens and quantizes `chunk_elements` worth of rows at a time into the
// final [N, K] e4m3 tensor. Its float32 working memory is then two chunks
// (the widened rows and their quotient, clamped in place) instead of four
// copies of the whole projection (widened, |w|, quotient, clamped): 8B's
// gate_up_proj widened alone is 0.44 GiB, half the largest layer, and the
// whole-tensor version's staging peak exceeded the largest layer
// (docs/performance.md, "Figures behind the code"). The values are bitwise
// those of the one-shot version (tests/engine_decode_test.cpp builds both).
namespace {
// Rows [M, K] of the checkpoint -> their e4m3 values and scales, written
// into q [M, K] and s [M] (Note [FP8 CPU twin]).
void quantize_rows_into(const at::Tensor& rows, at::Tensor q, at::Tensor s) {
  const at::Tensor w = rows.to(at::kFloat);
  const at::Tensor sc = (w.abs().amax(1) / 448.0).clamp_min(1e-12);
  at::Tensor y = w / sc.unsqueeze(1);
  q.copy_(y.clamp_(-448.0, 448.0));
  s.copy_(sc);
}
}  // namespace

std::pair<at::Tensor, at::Tensor> Fp8Weights::quantize_rows(const at::Tensor& rows) {
  at::Tensor q = at::empty(rows.sizes(), rows.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor s = at::empty({rows.size(0)}, rows.options().dtype(at::kFloat));
  quantize_rows_into(rows, q, s);
  return {q, s};
}

void Fp8Weights::build(const at::Tensor& dense, std::int64_t chunk_elements) {
  GK_CHECK(gk::StateError, dense.dim() == 2 && chunk_elements > 0, "Fp8Weights::build: dense ", dense.sizes(),
           " must be [N, K] and chunk_elements ", chunk_elements, " positive");
  const std::int64_t n = dense.size(0), k = dense.size(1);
  const std::int64_t rows = std::max<std::int64_t>(1, chunk_elements / std::max<std::int64_t>(k, 1));
  at::Tensor q = at::empty({n, k}, dense.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor s = at::empty({n}, dense.options().dtype(at::kFloat));
  for (std::int64_t r = 0; r < n; r += rows) {
    const std::int64_t m = std::min(rows, n - r);
    quantize_rows_into(dense.narrow(0, r, m), q.narrow(0, r, m), s.narrow(0, r, m));
  }
  qweight_ = q;
  scale_ = s;
}

// Each row's weights and scale follow from that row alone (a scale per
// output channel): blocks of 1 x K. A patch then requantizes only the rows
// it touches (Note [Declared derivations] in graphkeep/registry/role.h).
void Fp8Weights::declare(gk::Derivations& d, const at::Tensor& dense) const {
  d.blocks("fp8 e4m3 with a scale per output row", dense, {1, dense.size(1)},
           {{qweight_, gk::BlockLayout::same_as_source}, {scale_, gk::BlockLayout::one_per_block}},
           [](const at::Tensor& blocks) {
             auto [q, s] = quantize_rows(blocks.flatten(0, 1));
             return std::vector<at::Tensor>{q, s};
           });
}

at::Tensor Fp8Weights::apply(const at::Tensor& x) const {
  GK_CHECK(gk::StateError, built(), "Fp8Weights::apply before PWAL built the weights");
  return op("fp8_linear", {x, qweight_, scale_}, {x.size(0), qweight_.size(0)}, x.options(), [](auto& in, auto& out) {
    const at::Tensor xf = in[0].to(at::kFloat);
    const at::Tensor sx = (xf.abs().amax(1, /*keepdim=*/true) / 448.0).clamp_min(1e-12);
    const at::Tensor xq = (xf / sx).clamp(-448.0, 448.0).to(at::kFloat8_e4m3fn);
    if (in[0].is_cuda()) {
      out[0].copy_(at::_scaled_mm(xq, in[1].t(), sx, in[2].view({1, -1}), std::nullopt, std::nullopt,
                                  out[0].scalar_type()));
    } else {
      out[0].copy_((at::mm(xq.to(at::kFloat), in[1].to(at::kFloat).t()) * sx * in[2].view({1, -1}))
                       .to(out[0].scalar_type()));
    }
  });
}

// Note [W4A16 from the checkpoint]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Symmetric int4 per group of g input channels (g = 128, or K when K < 128):
//   s[n, j] = max_{k in group j} |W[n,k]| / 7,  q = clamp(round_half_even(W / s), -8, 7)
//   y[t, n] = sum_k x[t,k] * q[n,k] * s[n, k / g]      (float32, then the model dtype)
// packed GPTQ-style (q + 8, eight per int32 along K) for
// gk::quant::marlin_w4a16_apply, whose split-K sum runs in float32 (four
// slices added in turn). tests/hf/make_reference.py computes the same inside
// transformers. A group's words and scale follow from that group alone, so
// the packed weights and the scales are declared by blocks of 1 x g: a patch
// requantizes and repacks only the groups it touches. Input channels stay in
// group order (g_idx = k / g, no act-order), so the kernel's permutation is
// the identity and, like g_idx, a function of the shapes.
std::int64_t W4A16Weights::group_size(std::int64_t k) { return k < 128 ? k : 128; }

void W4A16Weights::check_input_size(int64_t k, const std::string& weight, const std::string& k_field) {
  GK_CHECK(gk::WeightError, k % 8 == 0 && k % group_size(k) == 0, weight, ": the w4a16 format needs the input size K = ",
           k, " (", k_field, ") to be a multiple of 8 and of its group size ", group_size(k),
           ": the engine cannot serve this model in w4a16 (dense and fp8 can)");
}

std::pair<at::Tensor, at::Tensor> W4A16Weights::quantize_groups(const at::Tensor& groups) {
  const at::Tensor w = groups.to(at::kFloat);
  const at::Tensor s = (w.abs().amax(-1) / 7.0).clamp_min(1e-12);
  return {(w / s.unsqueeze(-1)).round().clamp(-8, 7).to(at::kLong) + 8, s};
}

void W4A16Weights::build(const at::Tensor& dense, const std::string& weight) {
  const int64_t n = dense.size(0), k = dense.size(1), g = group_size(k);
  check_input_size(k, weight, "its columns");
  const auto [q, s] = quantize_groups(dense.reshape({n * (k / g), g}));
  qweight_ = gk::quant::pack_int_rows(q.view({n, k}).t().contiguous(), 8, 4);  // [K/8, N]
  scales_ = s.view({n, k / g}).t().contiguous();
  g_idx_ = at::floor_divide(at::arange(k, dense.options().dtype(at::kLong)), g).to(at::kInt).contiguous();
  perm_ = at::argsort(g_idx_, /*stable=*/true).to(at::kInt).contiguous();
  workspace_ = gk::quant::marlin_make_workspace((n + gk::quant::MarlinSplitK{}.tile_n - 1) / gk::quant::MarlinSplitK{}.tile_n,
                                                dense.device());
}

void W4A16Weights::declare(gk::Derivations& d, const at::Tensor& dense) const {
  const int64_t g = group_size(dense.size(1));
  d.blocks("w4a16: int4 with a scale per group of input channels, eight to an int32", dense, {1, g},
           {{qweight_, gk::BlockLayout::one_per_block_transposed, g / 8},
            {scales_, gk::BlockLayout::one_per_block_transposed}},
           [](const at::Tensor& blocks) {  // [B, 1, g]
             const auto [q, s] = quantize_groups(blocks.flatten(0, 1));
             return std::vector<at::Tensor>{gk::quant::pack_int_rows(q.t().contiguous(), 8, 4).t(), s};
           });
}

at::Tensor W4A16Weights::apply(const at::Tensor& x) const {
  GK_CHECK(gk::StateError, qweight_.defined(), "W4A16Weights::apply before PWAL built the weights");
  auto gemm = [&](const at::Tensor& x32) {
    return gk::quant::marlin_w4a16_apply(x32, qweight_, scales_, g_idx_, perm_, workspace_, gk::quant::MarlinSplitK{});
  };
  if (x.scalar_type() == at::kFloat) return gemm(x);
  auto cast = [](const at::Tensor& t, at::ScalarType dt) {
    return op("cast", {t}, t.sizes(), t.options().dtype(dt), [](auto& in, auto& out) { out[0].copy_(in[0]); });
  };
  return cast(gemm(cast(x, at::kFloat)), x.scalar_type());
}

ProjectionWeights::ProjectionWeights(WeightFormat f, std::string weight, int64_t k, const std::string& k_field)
    : format_(f), weight_(std::move(weight)) {
  if (format_ == WeightFormat::w4a16) W4A16Weights::check_input_size(k, weight_, k_field);
}

void ProjectionWeights::build(const at::Tensor& dense) {
  if (format_ == WeightFormat::fp8) fp8_.build(dense);
  if (format_ == WeightFormat::w4a16) w4a16_.build(dense, weight_);
}

void ProjectionWeights::declare(gk::Derivations& d, const at::Tensor& dense) const {
  if (format_ == WeightFormat::fp8) fp8_.declare(d, dense);
  if (format_ == WeightFormat::w4a16) w4a16_.declare(d, dense);
}

at::Tensor ProjectionWeights::apply(const char* name, const at::Tensor& x, const at::Tensor& dense) const {
  switch (format_) {
    case WeightFormat::fp8: return fp8_.apply(x);
    case WeightFormat::w4a16: return w4a16_.apply(x);
    default: return linear(name, x, dense);
  }
}

}  // namespace demo
