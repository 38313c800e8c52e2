// examples/engine/layers.h: the example engine's decoder layers, each a
// gk::ReloadableLayer whose derived tensors are declared with their roles
// (and, for FP8, their derivations): fused attention and MLP, Qwen3-MoE's
// sparse block, and the decoder layer around them (llm.h assembles them).
//
//   auto attn = std::make_shared<demo::Attention>(cfg, device, demo::WeightFormat::fp8, "model.layers.0.self_attn");
//   at::Tensor y = attn->forward(x, batch, cache, rope);
#pragma once

#include "hf_config.h"
#include "lora_projection.h"
#include "rope.h"
#include "weight_formats.h"

#include <graphkeep/kernels/moe_experts.h>
#include <graphkeep/model/layer.h>
#include <graphkeep/registry.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace demo {

// Where a batch of tokens sits in the KV cache: token t is at position
// positions[t] of sequence seqs[t] (both [T] int64 on the model's device).
// The decoder writes each token's key and value there, then attends over
// positions 0..positions[t] of that sequence.
struct TokenBatch {
  at::Tensor positions, seqs;
};

// One layer's cache: [max_seqs * max_len, kv_heads, head_dim] for keys and
// values, row = seq * max_len + position. Owned by the runner (static I/O of
// the graphs), not by the model: a reload never touches it.
struct KvCache {
  at::Tensor k, v;
  std::int64_t max_len = 0;
};

// A module with one plain parameter "weight" (embedding, norms, lm_head):
// reloaded as is, no PWAL.
class Plain : public torch::nn::Module {
 public:
  Plain(std::vector<std::int64_t> shape, at::TensorOptions options);
  at::Tensor weight;
};

// Self-attention with fused QKV, Qwen3's per-head q/k norms (child modules
// q_norm / k_norm, absent for Llama), RoPE, grouped-query attention over the
// KV cache, and o_proj.
class Attention : public torch::nn::Module, public gk::ReloadableLayer {
 public:
  // prefix: the module's path ("model.layers.0.self_attn"), for messages.
  Attention(const HfConfig& c, c10::Device device, WeightFormat format, const std::string& prefix);
  std::vector<gk::CheckpointParam> checkpoint_params() const override;
  void process_weights_after_loading() override;
  gk::ObjectRef registered_members() override { return gk::ObjectRef::of(*this); }
  void declare_derivations(gk::Derivations& d) const override;

  // x [T, hidden] -> [T, hidden]; writes the batch's keys and values into `cache`.
  at::Tensor forward(const at::Tensor& x, const TokenBatch& batch, const KvCache& cache, const RopeTables& rope);
  // The same through the fused CUDA kernels (Note [The fast CUDA path]).
  at::Tensor forward_fast(const at::Tensor& x, const TokenBatch& batch, const KvCache& cache, const RopeTables& rope);
  // The served adapter's A and B (views), under their checkpoint names below `prefix`.
  void append_adapter(const std::string& prefix, std::vector<gk::NamedTensor>& out) const;

 private:
  at::Tensor qkv_proj_;  // [(H + 2 KV) D, hidden]
  at::Tensor o_proj_;    // [hidden, H D]
  ProjectionWeights qkv_, o_;
  LoraProjection qkv_lora_, o_lora_;  // a served adapter's A and B (lora.h)
  std::shared_ptr<Plain> q_norm_, k_norm_;  // Qwen3 only
  std::int64_t hidden_ = 0, heads_ = 0, kv_heads_ = 0, head_dim_ = 0;
  double eps_ = 1e-6;

  GRAPHKEEP_DESCRIBE_DERIVED(Attention, (torch::nn::Module, gk::ReloadableLayer), (qkv_proj_, gk::parameter),
                             (o_proj_, gk::parameter), qkv_, o_, qkv_lora_, o_lora_,
                             q_norm_, k_norm_,  // child modules: the engine reloads their parameters
                             hidden_, heads_, kv_heads_, head_dim_, eps_)
};

// The SwiGLU MLP: down(silu(gate(x)) * up(x)), gate and up fused.
class Mlp : public torch::nn::Module, public gk::ReloadableLayer {
 public:
  Mlp(const HfConfig& c, c10::Device device, WeightFormat format, const std::string& prefix);
  std::vector<gk::CheckpointParam> checkpoint_params() const override;
  void process_weights_after_loading() override;
  gk::ObjectRef registered_members() override { return gk::ObjectRef::of(*this); }
  void declare_derivations(gk::Derivations& d) const override;
  at::Tensor forward(const at::Tensor& x);
  at::Tensor forward_fast(const at::Tensor& x);  // the activation fused (CUDA)
  void append_adapter(const std::string& prefix, std::vector<gk::NamedTensor>& out) const;

 private:
  at::Tensor gate_up_proj_;  // [2 I, hidden]
  at::Tensor down_proj_;     // [hidden, I]
  ProjectionWeights gate_up_, down_;
  LoraProjection gate_up_lora_, down_lora_;  // a served adapter's A and B (lora.h)
  std::int64_t hidden_ = 0, inter_ = 0;

  GRAPHKEEP_DESCRIBE_DERIVED(Mlp, (torch::nn::Module, gk::ReloadableLayer), (gate_up_proj_, gk::parameter),
                             (down_proj_, gk::parameter), gate_up_, down_, gate_up_lora_, down_lora_, hidden_, inter_)
};

// Qwen3-MoE's sparse block: a router (gate), softmax over the experts in
// float32, top-k, renormalized when norm_topk_prob; each chosen expert is a
// SwiGLU MLP. The experts' weights are one storage each for w13 and w2. The
// router is a dense projection; the rest runs through graphkeep's grouped
// MoE kernel, gk::kernels::SwigluExperts (Qwen3-MoE's routing and SiLU-gated
// activation, float32 math, the weights read in the model's dtype), whose
// experts object PWAL rebuilds on every load, as vLLM does: its per-expert
// stride arrays are derived tensors at new addresses each time, which
// graphkeep copies back into the storage the graphs captured
// (model.layers.<i>.mlp.experts_.strides_.ab_strides1 and the others).
class SparseMoe : public torch::nn::Module, public gk::ReloadableLayer {
 public:
  SparseMoe(const HfConfig& c, c10::Device device);
  std::vector<gk::CheckpointParam> checkpoint_params() const override;
  void process_weights_after_loading() override;
  gk::ObjectRef registered_members() override { return gk::ObjectRef::of(*this); }
  at::Tensor forward(const at::Tensor& x);
  // bf16 on sm90 / sm100: routing on the device and at::_grouped_mm (Note
  // [Qwen3-MoE through grouped GEMMs] in layers.cpp); else forward().
  at::Tensor forward_fast(const at::Tensor& x);

 private:
  at::Tensor gate_;  // [E, hidden] router
  at::Tensor w13_;   // [E * 2 I, hidden]: expert e's gate rows, then its up rows
  at::Tensor w2_;    // [E * hidden, I]
  std::unique_ptr<gk::kernels::MoeExperts> experts_;  // a SwigluExperts, rebuilt by every PWAL
  std::int64_t hidden_ = 0, inter_ = 0, num_experts_ = 0, topk_ = 0;
  bool norm_topk_ = true;

  GRAPHKEEP_DESCRIBE_DERIVED(SparseMoe, (torch::nn::Module, gk::ReloadableLayer), (gate_, gk::parameter),
                             (w13_, gk::parameter), (w2_, gk::parameter), experts_, hidden_, inter_, num_experts_,
                             topk_, norm_topk_)
};

class DecoderLayer : public torch::nn::Module {
 public:
  DecoderLayer(const HfConfig& c, c10::Device device, WeightFormat format, const std::string& prefix);
  at::Tensor forward(const at::Tensor& x, const TokenBatch& batch, const KvCache& cache, const RopeTables& rope);
  // The fast path carries the residual stream: the layer's input is
  // x + delta (delta undefined: x), and it returns {its residual, its MLP's
  // output}, whose sum is its output; the add is fused into the next norm.
  std::pair<at::Tensor, at::Tensor> forward_fast(const at::Tensor& x, const at::Tensor& delta, const TokenBatch& batch,
                                                 const KvCache& cache, const RopeTables& rope);
  // The served adapter's A and B (views), under their checkpoint names below `prefix` ("model.layers.0").
  void append_adapter(const std::string& prefix, std::vector<gk::NamedTensor>& out) const;

 private:
  std::shared_ptr<Plain> input_layernorm_, post_attention_layernorm_;
  std::shared_ptr<Attention> self_attn_;
  std::shared_ptr<Mlp> mlp_;
  std::shared_ptr<SparseMoe> moe_;
  double eps_;
};

}  // namespace demo
