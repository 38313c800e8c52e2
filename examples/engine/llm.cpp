#include "llm.h"

#include "fused_ops.h"
#include "ops.h"
#include "part_timer.h"

#include <graphkeep/core/check.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/runtime/host_stream.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>

#include <cmath>
#include <limits>
#include <numbers>

namespace demo {
namespace {

// Note [Ops that both backends capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every computation of the forward is one `op`: an ATen body over its input
// and output tensors. On CUDA the body runs at once and the CUDA graph being
// captured records its kernels. On the CPU it becomes a host-graph launch
// (gk::hostrt::launch_aten), which burns in the tensors' pointers exactly as
// a CUDA graph burns in kernel arguments, so a CPU run shows the same
// failures a GPU run would. Outputs come from gk::runtime::empty: the
// capture's private pool while capturing.
// (demo::ops::aten_op, ops.h.)
constexpr auto op = &ops::aten_op;

// transformers' RMSNorm: in float32, then back to the input dtype, times the weight.
at::Tensor rms_norm_math(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor r = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return w * (xf * r).to(x.scalar_type());
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}

at::Tensor linear(const char* name, const at::Tensor& x, const at::Tensor& w) {
  return op(name, {x, w}, {x.size(0), w.size(0)}, x.options(),
            [](auto& in, auto& out) { at::mm_out(out[0], in[0], in[1].t()); });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  return op("rms_norm", {x, w}, x.sizes(), x.options(),
            [eps](auto& in, auto& out) { out[0].copy_(rms_norm_math(in[0], in[1], eps)); });
}

at::Tensor residual(const at::Tensor& a, const at::Tensor& b) {
  return op("add", {a, b}, a.sizes(), a.options(), [](auto& in, auto& out) { at::add_out(out[0], in[0], in[1]); });
}

// t in dtype `dt` (t itself when it already is), as an op.
at::Tensor to_dtype(const char* name, const at::Tensor& t, at::ScalarType dt) {
  if (t.scalar_type() == dt) return t;
  return op(name, {t}, t.sizes(), t.options().dtype(dt), [](auto& in, auto& out) { out[0].copy_(in[0]); });
}

// Fused SwiGLU activation: [T, 2I] (gate, then up) -> silu(gate) * up [T, I].
at::Tensor silu_and_mul(const at::Tensor& h) {
  const int64_t i = h.size(1) / 2;
  return op("silu_and_mul", {h}, {h.size(0), i}, h.options(), [i](auto& in, auto& out) {
    at::mul_out(out[0], at::silu(in[0].narrow(1, 0, i)), in[0].narrow(1, i, i));
  });
}

// One entry per fused parameter: the checkpoint tensors it is made of, in
// order (concatenated along dim 0), relative to the layer's module path.
// "{e}" expands to every expert index.
struct HfTensorRule {
  const char* layer;  // the engine's module (the checkpoint's module path ends with it)
  const char* param;  // the module's parameter
  std::vector<const char*> tensors;
};
// The one table from Hugging Face tensor names to the engine's parameters.
// Tensors not listed here load into plain modules under their own name
// (model.embed_tokens.weight, *.input_layernorm.weight, *.post_attention_layernorm.weight,
// self_attn.q_norm.weight, self_attn.k_norm.weight, model.norm.weight, lm_head.weight).
const std::vector<HfTensorRule>& hf_tensor_table() {
  static const std::vector<HfTensorRule> table{
      {"self_attn", "qkv_proj", {"q_proj.weight", "k_proj.weight", "v_proj.weight"}},
      {"self_attn", "o_proj", {"o_proj.weight"}},
      {"mlp", "gate_up_proj", {"gate_proj.weight", "up_proj.weight"}},
      {"mlp", "down_proj", {"down_proj.weight"}},
      {"mlp (moe)", "gate", {"gate.weight"}},
      {"mlp (moe)", "w13", {"experts.{e}.gate_proj.weight", "experts.{e}.up_proj.weight"}},
      {"mlp (moe)", "w2", {"experts.{e}.down_proj.weight"}},
  };
  return table;
}

const HfTensorRule& rule(std::string_view layer, std::string_view param) {
  for (const HfTensorRule& r : hf_tensor_table())
    if (layer == r.layer && param == r.param) return r;
  GK_THROW(gk::InternalError, "no checkpoint rule for ", layer, ".", param);
}

// The checkpoint param `param` of `layer`, from the table: `rows` are the
// dim-0 sizes of each tensor of the rule (per expert for "{e}" rules).
gk::CheckpointParam checkpoint_param(std::string_view layer, std::string_view param, std::vector<int64_t> rows,
                                     int64_t cols, at::ScalarType dtype, int64_t experts = 0) {
  const HfTensorRule& r = rule(layer, param);
  gk::CheckpointParam cp{std::string(param), {}};
  auto add = [&](const std::string& name, int64_t n) { cp.tensors.push_back({name, {n, cols}, dtype}); };
  if (experts == 0) {
    for (std::size_t i = 0; i < r.tensors.size(); ++i) add(r.tensors[i], rows.at(i));
    return cp;
  }
  for (int64_t e = 0; e < experts; ++e)
    for (std::size_t i = 0; i < r.tensors.size(); ++i) {
      std::string n = r.tensors[i];
      n.replace(n.find("{e}"), 3, std::to_string(e));
      add(n, rows.at(i));
    }
  return cp;
}

// The checkpoint tensors of `layer`'s parameter `param` under the module
// path `prefix`, for messages: "model.layers.0.mlp.gate_proj.weight + model.layers.0.mlp.up_proj.weight".
std::string checkpoint_names(const std::string& prefix, std::string_view layer, std::string_view param) {
  std::string out;
  for (const char* t : rule(layer, param).tensors) out += (out.empty() ? "" : " + ") + prefix + "." + t;
  return out;
}

}  // namespace

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

Plain::Plain(std::vector<int64_t> shape, at::TensorOptions options) {
  weight = register_parameter("weight", at::zeros(shape, options), false);
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
// whole-tensor version peaked at 1.62x the largest layer while staging
// (docs/performance.md). The values are bitwise those of the one-shot version
// (tests/engine_decode_test.cpp builds both).
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
// packed GPTQ-style (q + 8, eight per int32 along K) for MarlinW4A16Kernel,
// whose split-K sum runs in float32 (four slices added in turn).
// tests/hf/make_reference.py computes the same inside transformers.
std::int64_t W4A16Weights::group_size(std::int64_t k) { return k < 128 ? k : 128; }

void W4A16Weights::check_input_size(int64_t k, const std::string& weight, const std::string& k_field) {
  GK_CHECK(gk::WeightError, k % 8 == 0 && k % group_size(k) == 0, weight, ": the w4a16 format needs the input size K = ",
           k, " (", k_field, ") to be a multiple of 8 and of its group size ", group_size(k),
           ": the engine cannot serve this model in w4a16 (dense and fp8 can)");
}

void W4A16Weights::build(const at::Tensor& dense, const std::string& weight) {
  const int64_t n = dense.size(0), k = dense.size(1), g = group_size(k);
  check_input_size(k, weight, "its columns");
  const at::Tensor w = dense.to(at::kFloat).view({n, k / g, g});
  const at::Tensor s = (w.abs().amax(-1) / 7.0).clamp_min(1e-12);                       // [N, G]
  const at::Tensor q = (w / s.unsqueeze(-1)).round().clamp(-8, 7).view({n, k}).to(at::kLong);
  const at::Tensor qweight = gk::quant::pack_int_rows((q + 8).t().contiguous(), 8, 4);  // [K/8, N]
  scales_ = s.t().contiguous();
  g_idx_ = at::floor_divide(at::arange(k, dense.options().dtype(at::kLong)), g).to(at::kInt).contiguous();
  kernel_.emplace(qweight, g_idx_, gk::quant::MarlinSplitK{}, weight);
}

at::Tensor W4A16Weights::apply(const at::Tensor& x) const {
  GK_CHECK(gk::StateError, kernel_.has_value(), "W4A16Weights::apply before PWAL built the weights");
  if (x.scalar_type() == at::kFloat) return kernel_->apply(x, scales_, g_idx_);
  auto cast = [](const at::Tensor& t, at::ScalarType dt) {
    return op("cast", {t}, t.sizes(), t.options().dtype(dt), [](auto& in, auto& out) { out[0].copy_(in[0]); });
  };
  return cast(kernel_->apply(cast(x, at::kFloat), scales_, g_idx_), x.scalar_type());
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
  // w4a16: the Marlin repack is a tile permutation, not declarable yet; a
  // patch re-runs the layer's PWAL.
}

at::Tensor ProjectionWeights::apply(const char* name, const at::Tensor& x, const at::Tensor& dense) const {
  switch (format_) {
    case WeightFormat::fp8: return fp8_.apply(x);
    case WeightFormat::w4a16: return w4a16_.apply(x);
    default: return linear(name, x, dense);
  }
}

Attention::Attention(const HfConfig& c, c10::Device device, WeightFormat format, const std::string& prefix)
    : qkv_(format, checkpoint_names(prefix, "self_attn", "qkv_proj"), c.hidden_size, "hidden_size"),
      o_(format, checkpoint_names(prefix, "self_attn", "o_proj"), c.num_attention_heads * c.head_dim,
         "num_attention_heads * head_dim"),
      hidden_(c.hidden_size),
      heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      eps_(c.rms_norm_eps) {
  const auto opts = at::TensorOptions().dtype(c.dtype).device(device);
  qkv_proj_ = register_parameter("qkv_proj", at::zeros({(heads_ + 2 * kv_heads_) * head_dim_, hidden_}, opts), false);
  o_proj_ = register_parameter("o_proj", at::zeros({hidden_, heads_ * head_dim_}, opts), false);
  if (c.has_qk_norm()) {
    q_norm_ = register_module("q_norm", std::make_shared<Plain>(std::vector<int64_t>{head_dim_}, opts));
    k_norm_ = register_module("k_norm", std::make_shared<Plain>(std::vector<int64_t>{head_dim_}, opts));
  }
}

std::vector<gk::CheckpointParam> Attention::checkpoint_params() const {
  const at::ScalarType dt = qkv_proj_.scalar_type();
  return {checkpoint_param("self_attn", "qkv_proj", {heads_ * head_dim_, kv_heads_ * head_dim_, kv_heads_ * head_dim_},
                           hidden_, dt),
          checkpoint_param("self_attn", "o_proj", {hidden_}, heads_ * head_dim_, dt)};
}

void Attention::process_weights_after_loading() {
  qkv_.build(qkv_proj_);
  o_.build(o_proj_);
}

void Attention::declare_derivations(gk::Derivations& d) const {
  qkv_.declare(d, qkv_proj_);
  o_.declare(d, o_proj_);
}

// Note [Stale KV rows]
// ~~~~~~~~~~~~~~~~~~~~
// Attention runs over the whole static cache of each token's sequence (one
// shape for every step, as a captured graph needs) and masks the positions
// past the token's own to probability 0. The rows there hold whatever an
// earlier request, or a step served under earlier weights, wrote: NaN or Inf
// after a NaN checkpoint. Weighting them 0 is not enough (0 * NaN = NaN in
// probs @ V, and a NaN key makes a NaN score), so those rows are replaced by
// 0 in the gathered keys and values before any arithmetic touches them, and
// their scores are then set to -inf. Rows below the position are unchanged,
// and each output sums the same products in the same order, so the logits
// are bitwise those of an engine whose cache held zeros there; nothing has
// to clear the cache (a reload leaves it alone). tests/online_engine_test.cpp
// poisons every row with NaN and Inf and compares with a fresh engine.
at::Tensor Attention::forward(const at::Tensor& x, const TokenBatch& batch, const KvCache& cache,
                              const RopeTables& rope) {
  const at::Tensor qkv = qkv_.apply("qkv_proj", x, qkv_proj_);
  std::vector<at::Tensor> in{qkv, batch.positions, batch.seqs, cache.k, cache.v, rope.cos, rope.sin};
  const bool qk_norm = q_norm_ != nullptr;
  if (qk_norm) {
    in.push_back(q_norm_->weight);
    in.push_back(k_norm_->weight);
  }
  const int64_t H = heads_, KV = kv_heads_, D = head_dim_, L = cache.max_len;
  const double eps = eps_, scale = 1.0 / std::sqrt(static_cast<double>(D));
  at::Tensor a = op("attention", in, {x.size(0), H * D}, x.options(), [=](auto& t, auto& out) {
    const int64_t T = t[0].size(0);
    const at::ScalarType dt = t[0].scalar_type();
    at::Tensor q = t[0].narrow(1, 0, H * D).reshape({T, H, D});
    at::Tensor k = t[0].narrow(1, H * D, KV * D).reshape({T, KV, D});
    const at::Tensor v = t[0].narrow(1, (H + KV) * D, KV * D).reshape({T, KV, D});
    if (qk_norm) {
      q = rms_norm_math(q, t[7], eps);
      k = rms_norm_math(k, t[8], eps);
    }
    const at::Tensor& pos = t[1];
    const at::Tensor cos = t[5].index_select(0, pos).unsqueeze(1).to(dt);  // [T, 1, D]
    const at::Tensor sin = t[6].index_select(0, pos).unsqueeze(1).to(dt);
    q = q * cos + rotate_half(q) * sin;
    k = k * cos + rotate_half(k) * sin;
    // write this batch's keys and values, then attend over each sequence's cache
    const at::Tensor rows = t[2] * L + pos;
    t[3].index_copy_(0, rows, k);
    t[4].index_copy_(0, rows, v);
    const int64_t S = t[3].size(0) / L, G = H / KV;
    const at::Tensor future = at::arange(L, pos.options()).view({1, L}) > pos.view({T, 1});  // [T, L]
    // Each token's sequence cache, its rows past the token's position set to
    // 0 (Note [Stale KV rows]), [T, L, KV, D] -> [T, H, L, D] (head h reads kv head h / G).
    auto gather = [&](const at::Tensor& c) {
      return c.view({S, L, KV, D}).index_select(0, t[2]).masked_fill(future.view({T, L, 1, 1}), 0).unsqueeze(3)
          .expand({T, L, KV, G, D}).reshape({T, L, H, D}).permute({0, 2, 1, 3});
    };
    const at::Tensor K = gather(t[3]), V = gather(t[4]);
    at::Tensor scores = at::matmul(q.unsqueeze(2), K.transpose(2, 3)) * scale;  // [T, H, 1, L]
    scores = scores.masked_fill(future.view({T, 1, 1, L}), -std::numeric_limits<double>::infinity());
    const at::Tensor p = at::softmax(scores, -1, at::kFloat).to(dt);
    out[0].copy_(at::matmul(p, V).reshape({T, H * D}));
  });
  return o_.apply("o_proj", a, o_proj_);
}

// Note [The fast CUDA path]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// On CUDA, with CausalLM::set_fast_cuda (LlmEngine's default), the decoder
// computes the same model with fewer and larger kernels, each captured in
// the decode graphs like any other:
//   - a residual add and the RMSNorm after it are one kernel
//     (fused::add_rms_norm): the layers pass the residual stream and their
//     MLP's output, and the next norm adds them;
//   - after the fused QKV GEMM, Qwen3's q/k norms, RoPE and the KV-cache
//     write are one kernel (fused::qkv_rope_cache), and attention is one
//     online-softmax kernel that reads, for each token, the cache rows of
//     positions 0..its own of its sequence and no other (fused::decode_attention):
//     a stale row (Note [Stale KV rows]) is never read, so it cannot reach a
//     logit, NaN or not;
//   - SwiGLU's activation is one kernel (fused::silu_and_mul);
//   - the GEMMs are cuBLAS's (at::mm_out on the fused q/k/v and gate/up
//     weights as the checkpoint fills them), and bf16 MoE layers on sm90 /
//     sm100 route on the device and run their experts through
//     at::_grouped_mm (Note [Qwen3-MoE through grouped GEMMs]).
// Every fused kernel keeps the roundings of the ATen ops it replaces
// (transformers' order), so the two paths differ in the order of sums
// (norms, attention: float32 here, the model dtype's GEMM there) and, for the
// MoE, in the dtype the top-k experts are summed in. The GPU test in
// tests/engine_decode_test.cpp compares them within tolerance; the CPU path
// is the reference, unchanged, and what the oracle tests check bitwise.
// The benchmarks' per-part breakdown comes from the mark_part() calls
// (part_timer.h), no-ops unless a PartTimer is active.
at::Tensor Attention::forward_fast(const at::Tensor& x, const TokenBatch& batch, const KvCache& cache,
                                   const RopeTables& rope) {
  mark_part(Part::gemm);
  const at::Tensor qkv = qkv_.apply("qkv_proj", x, qkv_proj_);
  mark_part(Part::attention);
  const fused::HeadShape shape{heads_, kv_heads_, head_dim_, eps_};
  const at::Tensor q = fused::qkv_rope_cache(qkv, batch, cache, rope, shape, q_norm_ ? q_norm_->weight : at::Tensor(),
                                             k_norm_ ? k_norm_->weight : at::Tensor());
  const at::Tensor a = fused::decode_attention(q, batch, cache, shape);
  mark_part(Part::gemm);
  return o_.apply("o_proj", a, o_proj_);
}

Mlp::Mlp(const HfConfig& c, c10::Device device, WeightFormat format, const std::string& prefix)
    : gate_up_(format, checkpoint_names(prefix, "mlp", "gate_up_proj"), c.hidden_size, "hidden_size"),
      down_(format, checkpoint_names(prefix, "mlp", "down_proj"), c.intermediate_size, "intermediate_size"),
      hidden_(c.hidden_size),
      inter_(c.intermediate_size) {
  const auto opts = at::TensorOptions().dtype(c.dtype).device(device);
  gate_up_proj_ = register_parameter("gate_up_proj", at::zeros({2 * inter_, hidden_}, opts), false);
  down_proj_ = register_parameter("down_proj", at::zeros({hidden_, inter_}, opts), false);
}

std::vector<gk::CheckpointParam> Mlp::checkpoint_params() const {
  const at::ScalarType dt = gate_up_proj_.scalar_type();
  return {checkpoint_param("mlp", "gate_up_proj", {inter_, inter_}, hidden_, dt),
          checkpoint_param("mlp", "down_proj", {hidden_}, inter_, dt)};
}

void Mlp::process_weights_after_loading() {
  gate_up_.build(gate_up_proj_);
  down_.build(down_proj_);
}

void Mlp::declare_derivations(gk::Derivations& d) const {
  gate_up_.declare(d, gate_up_proj_);
  down_.declare(d, down_proj_);
}

at::Tensor Mlp::forward(const at::Tensor& x) {
  return down_.apply("down_proj", silu_and_mul(gate_up_.apply("gate_up_proj", x, gate_up_proj_)), down_proj_);
}

at::Tensor Mlp::forward_fast(const at::Tensor& x) {
  mark_part(Part::gemm);
  const at::Tensor h = gate_up_.apply("gate_up_proj", x, gate_up_proj_);
  mark_part(Part::mlp_act);
  const at::Tensor a = fused::silu_and_mul(h);
  mark_part(Part::gemm);
  return down_.apply("down_proj", a, down_proj_);
}

SparseMoe::SparseMoe(const HfConfig& c, c10::Device device)
    : hidden_(c.hidden_size),
      inter_(c.moe_intermediate_size),
      num_experts_(c.num_experts),
      topk_(c.num_experts_per_tok),
      norm_topk_(c.norm_topk_prob) {
  const auto opts = at::TensorOptions().dtype(c.dtype).device(device);
  gate_ = register_parameter("gate", at::zeros({num_experts_, hidden_}, opts), false);
  w13_ = register_parameter("w13", at::zeros({num_experts_ * 2 * inter_, hidden_}, opts), false);
  w2_ = register_parameter("w2", at::zeros({num_experts_ * hidden_, inter_}, opts), false);
}

std::vector<gk::CheckpointParam> SparseMoe::checkpoint_params() const {
  const at::ScalarType dt = gate_.scalar_type();
  return {checkpoint_param("mlp (moe)", "gate", {num_experts_}, hidden_, dt),
          checkpoint_param("mlp (moe)", "w13", {inter_, inter_}, hidden_, dt, num_experts_),
          checkpoint_param("mlp (moe)", "w2", {hidden_}, inter_, dt, num_experts_)};
}

void SparseMoe::process_weights_after_loading() {
  // A fresh experts object, and with it fresh stride arrays, on every load.
  experts_ = std::make_unique<gk::kernels::SwigluExperts>(num_experts_, hidden_, inter_, topk_, norm_topk_,
                                                          w13_.device());
}

// Note [Qwen3-MoE through the grouped kernel]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The router logits come from a dense projection in the model dtype, as in
// transformers; x and the logits are cast to float32 (the kernel's input
// type), the kernel routes (softmax in float32, torch.topk's order, ties
// included, renormalized), runs only the chosen experts over the model-dtype
// weights (read as the parameters' [E, 2I, H] / [E, H, I] views, widened
// exactly) in float32, and its float32 output is cast back. In float32 this
// is transformers' computation up to the order of the sums; in bf16 and
// float16 transformers rounds the routing weights, each expert's output and
// the sum to the model dtype, which the kernel does not: in bf16 the logits
// differ by about that rounding (5e-3 relative measured on the tiny model,
// tolerance 3e-2; tests/hf/README.md; float16 has no transformers reference
// here). Every dtype the engine reads (float32, bfloat16, float16) has the
// kernel path: there is no dense fallback.
at::Tensor SparseMoe::forward(const at::Tensor& x) {
  GK_CHECK(gk::StateError, experts_ != nullptr, "SparseMoe: forward before process_weights_after_loading");
  const at::Tensor logits = linear("router", x, gate_);
  const int64_t E = num_experts_, I = inter_, Hd = hidden_;
  const at::Tensor xf = to_dtype("moe_x_f32", x, at::kFloat);
  const at::Tensor lf = to_dtype("router_f32", logits, at::kFloat);
  const at::Tensor y = experts_->apply({xf, lf, w13_.view({E, 2 * I, Hd}), w2_.view({E, Hd, I}), {}, {}});
  return to_dtype("moe_out", y, x.scalar_type());
}

// Note [Qwen3-MoE through grouped GEMMs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// In bf16 on sm90 / sm100 (fused::grouped_mm_supported), the fast path runs a
// MoE layer as serving engines do: the router GEMM, then routing on the
// device with no host sync (softmax in float32, top-k, renormalized; the T k
// (token, expert) pairs sorted stably by expert, the rows per expert counted
// with scatter_add_ and their cumulative sum as the groups' offsets), the
// tokens' rows gathered in that order, at::_grouped_mm over w13 (each
// expert's [2I, H] block, transposed: no copy), the fused SwiGLU activation,
// at::_grouped_mm over w2, the rows put back in (token, rank) order and
// summed with their gates in float32. Every intermediate is a per-call
// tensor of the capture's pool (the grouped GEMM's own argument buffers
// too); no derived tensor outlives a call, so nothing new needs a slot.
// Other dtypes and GPUs keep the SwigluExperts kernel (_grouped_mm's
// fallback copies the offsets to the host, which a capture cannot do).
at::Tensor SparseMoe::forward_fast(const at::Tensor& x) {
  mark_part(Part::moe);
  if (!fused::grouped_mm_supported(x)) return forward(x);
  const at::Tensor logits = linear("router", x, gate_);
  const int64_t E = num_experts_, I = inter_, Hd = hidden_;
  return fused::moe_grouped_mm(x, logits, w13_.view({E, 2 * I, Hd}), w2_.view({E, Hd, I}), topk_, norm_topk_);
}

DecoderLayer::DecoderLayer(const HfConfig& c, c10::Device device, WeightFormat format, const std::string& prefix)
    : eps_(c.rms_norm_eps) {
  const auto opts = at::TensorOptions().dtype(c.dtype).device(device);
  input_layernorm_ = register_module("input_layernorm", std::make_shared<Plain>(std::vector<int64_t>{c.hidden_size}, opts));
  self_attn_ = register_module("self_attn", std::make_shared<Attention>(c, device, format, prefix + ".self_attn"));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", std::make_shared<Plain>(std::vector<int64_t>{c.hidden_size}, opts));
  if (c.is_moe())
    moe_ = register_module("mlp", std::make_shared<SparseMoe>(c, device));
  else
    mlp_ = register_module("mlp", std::make_shared<Mlp>(c, device, format, prefix + ".mlp"));
}

at::Tensor DecoderLayer::forward(const at::Tensor& x, const TokenBatch& batch, const KvCache& cache,
                                 const RopeTables& rope) {
  const at::Tensor h = residual(x, self_attn_->forward(rms_norm(x, input_layernorm_->weight, eps_), batch, cache, rope));
  const at::Tensor n = rms_norm(h, post_attention_layernorm_->weight, eps_);
  return residual(h, moe_ ? moe_->forward(n) : mlp_->forward(n));
}

std::pair<at::Tensor, at::Tensor> DecoderLayer::forward_fast(const at::Tensor& x, const at::Tensor& delta,
                                                             const TokenBatch& batch, const KvCache& cache,
                                                             const RopeTables& rope) {
  mark_part(Part::norm);
  const fused::Normed in = fused::add_rms_norm(x, delta, input_layernorm_->weight, eps_);
  const at::Tensor a = self_attn_->forward_fast(in.normed, batch, cache, rope);
  mark_part(Part::norm);
  const fused::Normed post = fused::add_rms_norm(in.residual, a, post_attention_layernorm_->weight, eps_);
  return {post.residual, moe_ ? moe_->forward_fast(post.normed) : mlp_->forward_fast(post.normed)};
}

CausalLM::CausalLM(const HfConfig& c, c10::Device device, WeightFormat format)
    : config_(c), device_(device), format_(format) {
  const auto opts = at::TensorOptions().dtype(c.dtype).device(device);
  auto model = register_module("model", std::make_shared<torch::nn::Module>());
  embed_tokens_ = model->register_module(
      "embed_tokens", std::make_shared<Plain>(std::vector<int64_t>{c.vocab_size, c.hidden_size}, opts));
  auto list = model->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers_.push_back(std::make_shared<DecoderLayer>(c, device, format, "model.layers." + std::to_string(i)));
    list->push_back(layers_.back());
  }
  norm_ = model->register_module("norm", std::make_shared<Plain>(std::vector<int64_t>{c.hidden_size}, opts));
  if (!c.tie_word_embeddings)
    lm_head_ = register_module("lm_head", std::make_shared<Plain>(std::vector<int64_t>{c.vocab_size, c.hidden_size}, opts));
}

at::Tensor CausalLM::embed(const at::Tensor& ids) {
  return op("embedding", {embed_tokens_->weight, ids}, {ids.size(0), config_.hidden_size},
            embed_tokens_->weight.options(),
            [](auto& in, auto& out) { at::index_select_out(out[0], in[0], 0, in[1]); });
}

at::Tensor CausalLM::lm_head(const at::Tensor& x) {
  const at::Tensor& head = lm_head_ ? lm_head_->weight : embed_tokens_->weight;
  return op("lm_head", {x, head}, {x.size(0), config_.vocab_size}, x.options().dtype(at::kFloat),
            [](auto& in, auto& out) { out[0].copy_(at::mm(in[0], in[1].t())); });
}

at::Tensor CausalLM::forward(const at::Tensor& ids, const TokenBatch& batch, const std::vector<KvCache>& caches,
                             const RopeTables& rope) {
  GK_CHECK(gk::StateError, caches.size() == layers_.size(), "CausalLM: ", caches.size(), " caches for ",
           layers_.size(), " layers");
  if (fast_cuda_ && fused::supported(embed_tokens_->weight)) return forward_fast(ids, batch, caches, rope);
  at::Tensor x = embed(ids);
  for (std::size_t i = 0; i < layers_.size(); ++i) x = layers_[i]->forward(x, batch, caches[i], rope);
  return lm_head(rms_norm(x, norm_->weight, config_.rms_norm_eps));
}

at::Tensor CausalLM::forward_fast(const at::Tensor& ids, const TokenBatch& batch, const std::vector<KvCache>& caches,
                                  const RopeTables& rope) {
  mark_part(Part::embedding);
  at::Tensor x = embed(ids), delta;
  for (std::size_t i = 0; i < layers_.size(); ++i)
    std::tie(x, delta) = layers_[i]->forward_fast(x, delta, batch, caches[i], rope);
  mark_part(Part::norm);
  const fused::Normed out = fused::add_rms_norm(x, delta, norm_->weight, config_.rms_norm_eps);
  mark_part(Part::lm_head);
  at::Tensor logits = lm_head(out.normed);
  mark_part(Part::idle);
  return logits;
}

std::vector<gk::CheckpointTensor> expected_checkpoint(torch::nn::Module& model) {
  std::vector<gk::CheckpointTensor> out;
  std::vector<std::pair<std::string, torch::nn::Module*>> modules{{"", &model}};
  for (const auto& item : model.named_modules("", /*include_self=*/false)) modules.emplace_back(item.key(), item.value().get());
  for (auto& [prefix, m] : modules) {
    const std::string p = prefix.empty() ? "" : prefix + ".";
    if (auto* layer = dynamic_cast<gk::ReloadableLayer*>(m)) {
      for (const auto& cp : layer->checkpoint_params())
        for (gk::CheckpointTensor t : cp.tensors) {
          t.name = p + t.name;
          out.push_back(std::move(t));
        }
    } else {
      for (const auto& item : m->named_parameters(/*recurse=*/false))
        out.push_back({p + item.key(), item.value().sizes().vec(), item.value().scalar_type()});
    }
  }
  return out;
}

}  // namespace demo
