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
// what each layer fuses from the checkpoint is the one table in hf_names.cpp
// (hf_names.h):
//   self_attn.qkv_proj     = [q_proj; k_proj; v_proj]   one storage (fused QKV)
//   mlp.gate_up_proj       = [gate_proj; up_proj]       one storage (fused gate_up)
//   mlp.w13 / mlp.w2       = every expert's [gate; up] / down, one storage each (MoE)
//
// Weight formats, chosen per run (WeightFormat):
//   dense  the checkpoint's dtype through cuBLAS (or ATen on the CPU);
//   fp8    W8A8 made in PWAL from the checkpoint: float8_e4m3fn weights with
//          a float32 scale per output channel, activations quantized per token
//          at run time (dynamic scale); at::_scaled_mm on CUDA, an exact CPU
//          twin (Note [FP8 CPU twin] in weight_formats.cpp);
//   w4a16  int4 weights with a float32 scale per group of 128 input channels
//          (fewer when the layer is narrower), packed in PWAL from the
//          checkpoint, through graphkeep's Marlin-style split-K kernel
//          (gk::quant::marlin_w4a16_apply: its lock workspace, permutation and
//          packed weights are derived per PWAL too, the packed weights and
//          scales declared by groups, so a patch re-runs no PWAL).
// The router, norms, embedding and lm_head stay dense; the MoE experts, in
// every format, run through graphkeep's grouped MoE kernel
// (gk::kernels::SwigluExperts) on the checkpoint-dtype weights, or in bf16 on
// an H100/H200-class GPU through at::_grouped_mm.
// On CUDA the decoder can run its fast path (set_fast_cuda; LlmEngine turns
// it on): fused norms, RoPE and KV writes, attention over each sequence's
// positions only, routing on the device (Note [The fast CUDA path] in layers.cpp).
// PWAL builds the quantized weights, scales and kernel state at new addresses
// on every reload: they are derived tensors, declared with their roles, and
// graphkeep copies them back into the storage the graphs captured.
//
// The pieces: weight_formats.h (the formats), layers.h (the layers), rope.h,
// hf_names.h (the name table); this header assembles the model.
//
//   demo::HfConfig cfg = demo::read_hf_config(dir);
//   auto lm = std::make_shared<demo::CausalLM>(cfg, device, demo::WeightFormat::fp8);
//   ... gk::load_weights(*lm, source); then demo::LlmEngine (llm_engine.h) serves it.
#pragma once

#include "hf_config.h"
#include "hf_names.h"
#include "layers.h"
#include "rope.h"
#include "weight_formats.h"

#include <torch/nn/module.h>

#include <memory>
#include <vector>

namespace demo {

class CausalLM : public torch::nn::Module {
 public:
  CausalLM(const HfConfig& config, c10::Device device, WeightFormat format);

  // ids [T] int64 -> logits [T, vocab] float32. caches: one per layer.
  // On CUDA with fast_cuda() the fast path, else the reference ops.
  at::Tensor forward(const at::Tensor& ids, const TokenBatch& batch, const std::vector<KvCache>& caches,
                     const RopeTables& rope);

  // The fast CUDA path (Note [The fast CUDA path] in layers.cpp): off by
  // default; no effect on the CPU, where the reference ops always run.
  void set_fast_cuda(bool on) { fast_cuda_ = on; }
  bool fast_cuda() const { return fast_cuda_; }

  const HfConfig& config() const { return config_; }
  // The served LoRA adapter's A and B (views of the parameters the graphs
  // read), under their checkpoint names; empty without an adapter.
  std::vector<gk::NamedTensor> adapter_tensors() const;
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

}  // namespace demo
