// The example engine's layers (layers.h).
#include "layers.h"

#include "fused_ops.h"
#include "hf_names.h"
#include "layer_ops.h"
#include "part_timer.h"

#include <graphkeep/core/check.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/runtime/host_stream.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

namespace demo {
using namespace layer_ops;
using hf_names::checkpoint_names;
using hf_names::checkpoint_param;

Plain::Plain(std::vector<int64_t> shape, at::TensorOptions options) {
  weight = register_parameter("weight", at::zeros(shape, options), false);
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
  // The adapter first: a joined A adds its rows to the base weight's
  // parameter (Note [LoRA in the decode graphs]).
  const bool dense = format == WeightFormat::dense;
  qkv_lora_ = LoraProjection(*this, "qkv_proj", c.adapter,
                             {{"q_proj", heads_ * head_dim_}, {"k_proj", kv_heads_ * head_dim_},
                              {"v_proj", kv_heads_ * head_dim_}},
                             hidden_, opts, dense);
  o_lora_ = LoraProjection(*this, "o_proj", c.adapter, {{"o_proj", hidden_}}, heads_ * head_dim_, opts, dense);
  qkv_proj_ = register_parameter(
      "qkv_proj", at::zeros({(heads_ + 2 * kv_heads_) * head_dim_ + qkv_lora_.joined_rows(), hidden_}, opts), false);
  o_proj_ = register_parameter("o_proj", at::zeros({hidden_ + o_lora_.joined_rows(), heads_ * head_dim_}, opts), false);
  if (c.has_qk_norm()) {
    q_norm_ = register_module("q_norm", std::make_shared<Plain>(std::vector<int64_t>{head_dim_}, opts));
    k_norm_ = register_module("k_norm", std::make_shared<Plain>(std::vector<int64_t>{head_dim_}, opts));
  }
}

std::vector<gk::CheckpointParam> Attention::checkpoint_params() const {
  const at::ScalarType dt = qkv_proj_.scalar_type();
  std::vector<gk::CheckpointParam> out{
      checkpoint_param("self_attn", "qkv_proj", {heads_ * head_dim_, kv_heads_ * head_dim_, kv_heads_ * head_dim_},
                       hidden_, dt),
      checkpoint_param("self_attn", "o_proj", {hidden_}, heads_ * head_dim_, dt)};
  qkv_lora_.append_checkpoint_params(out);
  o_lora_.append_checkpoint_params(out);
  return out;
}

void Attention::process_weights_after_loading() {
  qkv_.build(qkv_lora_.base_weight(qkv_proj_));
  o_.build(o_lora_.base_weight(o_proj_));
}

void Attention::declare_derivations(gk::Derivations& d) const {
  qkv_.declare(d, qkv_lora_.base_weight(qkv_proj_));
  o_.declare(d, o_lora_.base_weight(o_proj_));
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
  const at::Tensor qkv = qkv_lora_.project("qkv_proj", "qkv_lora", x, qkv_, qkv_proj_);
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
  return o_lora_.project("o_proj", "o_lora", a, o_, o_proj_);
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
  const at::Tensor qkv = qkv_lora_.project("qkv_proj", "qkv_lora", x, qkv_, qkv_proj_);
  mark_part(Part::attention);
  const fused::HeadShape shape{heads_, kv_heads_, head_dim_, eps_};
  const at::Tensor q = fused::qkv_rope_cache(qkv, batch, cache, rope, shape, q_norm_ ? q_norm_->weight : at::Tensor(),
                                             k_norm_ ? k_norm_->weight : at::Tensor());
  const at::Tensor a = fused::decode_attention(q, batch, cache, shape);
  mark_part(Part::gemm);
  return o_lora_.project("o_proj", "o_lora", a, o_, o_proj_);
}

void Attention::append_adapter(const std::string& prefix, std::vector<gk::NamedTensor>& out) const {
  qkv_lora_.append_tensors(prefix, qkv_proj_, out);
  o_lora_.append_tensors(prefix, o_proj_, out);
}

Mlp::Mlp(const HfConfig& c, c10::Device device, WeightFormat format, const std::string& prefix)
    : gate_up_(format, checkpoint_names(prefix, "mlp", "gate_up_proj"), c.hidden_size, "hidden_size"),
      down_(format, checkpoint_names(prefix, "mlp", "down_proj"), c.intermediate_size, "intermediate_size"),
      hidden_(c.hidden_size),
      inter_(c.intermediate_size) {
  const auto opts = at::TensorOptions().dtype(c.dtype).device(device);
  const bool dense = format == WeightFormat::dense;  // (as in Attention)
  gate_up_lora_ = LoraProjection(*this, "gate_up_proj", c.adapter, {{"gate_proj", inter_}, {"up_proj", inter_}},
                                 hidden_, opts, dense);
  down_lora_ = LoraProjection(*this, "down_proj", c.adapter, {{"down_proj", hidden_}}, inter_, opts, dense);
  gate_up_proj_ =
      register_parameter("gate_up_proj", at::zeros({2 * inter_ + gate_up_lora_.joined_rows(), hidden_}, opts), false);
  down_proj_ = register_parameter("down_proj", at::zeros({hidden_ + down_lora_.joined_rows(), inter_}, opts), false);
}

std::vector<gk::CheckpointParam> Mlp::checkpoint_params() const {
  const at::ScalarType dt = gate_up_proj_.scalar_type();
  std::vector<gk::CheckpointParam> out{checkpoint_param("mlp", "gate_up_proj", {inter_, inter_}, hidden_, dt),
                                       checkpoint_param("mlp", "down_proj", {hidden_}, inter_, dt)};
  gate_up_lora_.append_checkpoint_params(out);
  down_lora_.append_checkpoint_params(out);
  return out;
}

void Mlp::process_weights_after_loading() {
  gate_up_.build(gate_up_lora_.base_weight(gate_up_proj_));
  down_.build(down_lora_.base_weight(down_proj_));
}

void Mlp::declare_derivations(gk::Derivations& d) const {
  gate_up_.declare(d, gate_up_lora_.base_weight(gate_up_proj_));
  down_.declare(d, down_lora_.base_weight(down_proj_));
}

void Mlp::append_adapter(const std::string& prefix, std::vector<gk::NamedTensor>& out) const {
  gate_up_lora_.append_tensors(prefix, gate_up_proj_, out);
  down_lora_.append_tensors(prefix, down_proj_, out);
}

at::Tensor Mlp::forward(const at::Tensor& x) {
  const at::Tensor a = silu_and_mul(gate_up_lora_.project("gate_up_proj", "gate_up_lora", x, gate_up_, gate_up_proj_));
  return down_lora_.project("down_proj", "down_lora", a, down_, down_proj_);
}

at::Tensor Mlp::forward_fast(const at::Tensor& x) {
  mark_part(Part::gemm);
  const at::Tensor h = gate_up_lora_.project("gate_up_proj", "gate_up_lora", x, gate_up_, gate_up_proj_);
  mark_part(Part::mlp_act);
  const at::Tensor a = fused::silu_and_mul(h);
  mark_part(Part::gemm);
  return down_lora_.project("down_proj", "down_lora", a, down_, down_proj_);
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
  if (c.is_moe()) {
    if (c.adapter) {
      for (const char* p : {"gate_proj", "up_proj", "down_proj"}) {
        GK_CHECK(gk::WeightError, !c.adapter->targets_module(p), "the adapter targets ", p, ", which in ",
                 c.model_type, " is every expert's (", prefix, ".mlp.experts.<e>.", p,
                 "): the engine serves adapters on the attention projections of a MoE model (q_proj, k_proj, "
                 "v_proj, o_proj) only");
      }
    }
    moe_ = register_module("mlp", std::make_shared<SparseMoe>(c, device));
  }
  else
    mlp_ = register_module("mlp", std::make_shared<Mlp>(c, device, format, prefix + ".mlp"));
}

void DecoderLayer::append_adapter(const std::string& prefix, std::vector<gk::NamedTensor>& out) const {
  self_attn_->append_adapter(prefix + ".self_attn", out);
  if (mlp_) mlp_->append_adapter(prefix + ".mlp", out);
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

}  // namespace demo
