// examples/engine/llm.h
//
// The example engine's model: a Llama / Qwen3 / Qwen3-MoE decoder read from a
// Hugging Face config, with the shapes real serving engines give it, built on
// graphkeep's layer contract so its weights reload under captured graphs.
//
//   lm_head(norm(x_L)),  x_{l+1} = h + mlp(post_attention_layernorm(h)),
//                        h = x_l + self_attn(input_layernorm(x_l))
//
// Module paths mirror the checkpoint's tensor names ("model.layers.3.self_attn",
// "model.norm", "lm_head"), so a Hugging Face directory loads without renaming;
// what each layer fuses from the checkpoint is the one table kHfTensorTable in
// llm.cpp:
//   self_attn.qkv_proj     = [q_proj; k_proj; v_proj]   one storage (fused QKV)
//   mlp.gate_up_proj       = [gate_proj; up_proj]       one storage (fused gate_up)
//   mlp.w13 / mlp.w2       = every expert's [gate; up] / down, one storage each (MoE)
//
// Weight formats, chosen per run (WeightFormat):
//   dense  the checkpoint's dtype through cuBLAS (or ATen on the CPU);
//   fp8    W8A8 made in PWAL from the checkpoint: float8_e4m3fn weights with
//          a float32 scale per output channel, activations quantized per token
//          at run time (dynamic scale); at::_scaled_mm on CUDA, an exact CPU
//          twin (Note [FP8 CPU twin] in llm.cpp);
//   w4a16  int4 weights with a float32 scale per group of 128 input channels
//          (fewer when the layer is narrower), packed in PWAL from the
//          checkpoint, through graphkeep's Marlin-style split-K kernel
//          (gk::quant::MarlinW4A16Kernel: its lock workspace, permutation and
//          packed weights are derived per PWAL too).
// The router, norms, embedding and lm_head stay dense; the MoE experts, in
// every format, run through graphkeep's grouped MoE kernel
// (gk::kernels::SwigluExperts) on the checkpoint-dtype weights, or in bf16 on
// an H100/H200-class GPU through at::_grouped_mm.
// On CUDA the decoder can run its fast path (set_fast_cuda; LlmEngine turns
// it on): fused norms, RoPE and KV writes, attention over each sequence's
// positions only, routing on the device (Note [The fast CUDA path] in llm.cpp).
// PWAL builds the quantized weights, scales and kernel state at new addresses
// on every reload: they are derived tensors, declared with their roles, and
// graphkeep copies them back into the storage the graphs captured.
//
//   demo::HfConfig cfg = demo::read_hf_config(dir);
//   auto lm = std::make_shared<demo::CausalLM>(cfg, device, demo::WeightFormat::fp8);
//   ... gk::load_weights(*lm, source); then demo::LlmEngine (llm_engine.h) serves it.
#pragma once

#include "hf_config.h"

#include <graphkeep/kernels/moe_experts.h>
#include <graphkeep/model/layer.h>
#include <graphkeep/quant/marlin.h>
#include <graphkeep/registry.h>

#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace demo {

enum class WeightFormat { dense, fp8, w4a16 };
WeightFormat parse_weight_format(std::string_view name);  // "dense" (or "bf16"), "fp8", "w4a16"
std::string_view to_string(WeightFormat f);

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

// Rotary tables [max_len, head_dim] float32: cos and sin of position * inv_freq,
// each frequency twice (the rotate_half convention).
struct RopeTables {
  at::Tensor cos, sin;
};
RopeTables make_rope_tables(const HfConfig& c, std::int64_t max_len, c10::Device device);

// A module with one plain parameter "weight" (embedding, norms, lm_head):
// reloaded as is, no PWAL.
class Plain : public torch::nn::Module {
 public:
  Plain(std::vector<std::int64_t> shape, at::TensorOptions options);
  at::Tensor weight;
};

// FP8 W8A8 weights of one projection, built by PWAL from its dense
// checkpoint-format parameter.
class Fp8Weights {
 public:
  // dense: [N, K] -> qweight [N, K] e4m3, scale [N], quantized
  // chunk_elements at a time (Note [FP8 quantization in chunks] in llm.cpp).
  static constexpr std::int64_t kChunkElements = std::int64_t{1} << 23;  // 32 MiB of float32
  void build(const at::Tensor& dense, std::int64_t chunk_elements = kChunkElements);
  at::Tensor apply(const at::Tensor& x) const;    // x [T, K] model dtype -> [T, N] model dtype
  bool built() const { return qweight_.defined(); }
  const at::Tensor& qweight() const { return qweight_; }
  const at::Tensor& scale() const { return scale_; }
  // rows [M, K] -> {e4m3 [M, K], float32 [M]}: what build() makes of them.
  static std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& rows);
  // Declares qweight_ and scale_ as derived row by row from `dense` (Note
  // [Declared derivations] in graphkeep/registry/role.h).
  void declare(gk::Derivations& d, const at::Tensor& dense) const;

 private:
  at::Tensor qweight_;  // [N, K] float8_e4m3fn
  at::Tensor scale_;    // [N] float32, dequantization scale per output channel
  GRAPHKEEP_DESCRIBE(Fp8Weights, (qweight_, gk::derived_weight.by_blocks()), (scale_, gk::scale.by_blocks()))
};

// W4A16 weights of one projection: symmetric int4 per group of input
// channels (Note [W4A16 from the checkpoint] in llm.cpp), packed for
// gk::quant::MarlinW4A16Kernel.
class W4A16Weights {
 public:
  // dense: [N, K]; `weight` names its checkpoint tensors (for messages).
  void build(const at::Tensor& dense, const std::string& weight);
  at::Tensor apply(const at::Tensor& x) const;    // x [T, K] model dtype -> [T, N] model dtype
  static std::int64_t group_size(std::int64_t k);
  // Refuses an input size K the format cannot group (a gk::WeightError
  // naming `weight` and `k_field`, the config field K comes from).
  static void check_input_size(std::int64_t k, const std::string& weight, const std::string& k_field);

 private:
  std::optional<gk::quant::MarlinW4A16Kernel> kernel_;
  at::Tensor scales_;  // [K / group, N] float32
  at::Tensor g_idx_;   // [K] int32: the group of each input channel
  GRAPHKEEP_DESCRIBE(W4A16Weights, kernel_, (scales_, gk::scale), (g_idx_, gk::metadata.from_shapes()))
};

// One projection's kernel-format weights in the run's format (nothing for dense).
class ProjectionWeights {
 public:
  ProjectionWeights() = default;
  // `weight`: the checkpoint tensors it is made of ("model.layers.0.mlp.down_proj.weight"),
  // for messages; `k` its input size, which the config field(s) `k_field` give. A
  // format that cannot take K is refused here, before any weight is read.
  ProjectionWeights(WeightFormat f, std::string weight, std::int64_t k, const std::string& k_field);
  void build(const at::Tensor& dense);  // PWAL
  // The block derivations of the format's members from `dense` (fp8: per row).
  void declare(gk::Derivations& d, const at::Tensor& dense) const;
  // y = x W^T in the run's format; `dense` is the checkpoint-format parameter.
  at::Tensor apply(const char* name, const at::Tensor& x, const at::Tensor& dense) const;

 private:
  WeightFormat format_ = WeightFormat::dense;
  std::string weight_;
  Fp8Weights fp8_;
  W4A16Weights w4a16_;
  GRAPHKEEP_DESCRIBE(ProjectionWeights, format_, weight_, fp8_, w4a16_)
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

 private:
  at::Tensor qkv_proj_;  // [(H + 2 KV) D, hidden]
  at::Tensor o_proj_;    // [hidden, H D]
  ProjectionWeights qkv_, o_;
  std::shared_ptr<Plain> q_norm_, k_norm_;  // Qwen3 only
  std::int64_t hidden_ = 0, heads_ = 0, kv_heads_ = 0, head_dim_ = 0;
  double eps_ = 1e-6;

  GRAPHKEEP_DESCRIBE_DERIVED(Attention, (torch::nn::Module, gk::ReloadableLayer), (qkv_proj_, gk::parameter),
                             (o_proj_, gk::parameter), qkv_, o_,
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

 private:
  at::Tensor gate_up_proj_;  // [2 I, hidden]
  at::Tensor down_proj_;     // [hidden, I]
  ProjectionWeights gate_up_, down_;
  std::int64_t hidden_ = 0, inter_ = 0;

  GRAPHKEEP_DESCRIBE_DERIVED(Mlp, (torch::nn::Module, gk::ReloadableLayer), (gate_up_proj_, gk::parameter),
                             (down_proj_, gk::parameter), gate_up_, down_, hidden_, inter_)
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
  // [Qwen3-MoE through grouped GEMMs] in llm.cpp); else forward().
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

 private:
  std::shared_ptr<Plain> input_layernorm_, post_attention_layernorm_;
  std::shared_ptr<Attention> self_attn_;
  std::shared_ptr<Mlp> mlp_;
  std::shared_ptr<SparseMoe> moe_;
  double eps_;
};

class CausalLM : public torch::nn::Module {
 public:
  CausalLM(const HfConfig& config, c10::Device device, WeightFormat format);

  // ids [T] int64 -> logits [T, vocab] float32. caches: one per layer.
  // On CUDA with fast_cuda() the fast path, else the reference ops.
  at::Tensor forward(const at::Tensor& ids, const TokenBatch& batch, const std::vector<KvCache>& caches,
                     const RopeTables& rope);

  // The fast CUDA path (Note [The fast CUDA path] in llm.cpp): off by
  // default; no effect on the CPU, where the reference ops always run.
  void set_fast_cuda(bool on) { fast_cuda_ = on; }
  bool fast_cuda() const { return fast_cuda_; }

  const HfConfig& config() const { return config_; }
  c10::Device device() const { return device_; }
  WeightFormat format() const { return format_; }

 private:
  HfConfig config_;
  c10::Device device_;
  WeightFormat format_;
  std::shared_ptr<Plain> embed_tokens_, norm_, lm_head_;
  std::vector<std::shared_ptr<DecoderLayer>> layers_;
  bool fast_cuda_ = false;

  at::Tensor forward_fast(const at::Tensor& ids, const TokenBatch& batch, const std::vector<KvCache>& caches,
                          const RopeTables& rope);
  at::Tensor embed(const at::Tensor& ids);
  at::Tensor lm_head(const at::Tensor& x);
};

// Every checkpoint tensor the model expects, with its full name, shape and
// dtype (for gk::HfCheckpointSource::check).
std::vector<gk::CheckpointTensor> expected_checkpoint(torch::nn::Module& model);

}  // namespace demo
