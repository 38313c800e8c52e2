// examples/engine/tiny_lm.h
//
// The example engine's model: a small transformer-shaped language model built
// from graphkeep's layers, the way a libtorch engine would assemble them.
//
//   embed -> N x [ MLA-style attention: q = Wq x, c = Wc x (Marlin W4A16
//                  quantized linears), absorbed W_UK_T / W_UV (site 1),
//                  o = Wo attn (W4A16); x += o
//                  MoE MLP: router logits = R x, grouped experts with
//                  per-expert stride arrays (site 4, CUTLASS-style); x += moe ]
//        -> RMS norm -> lm_head -> logits
//
// Weights are synthetic and deterministic: TinyLM::checkpoint(seed, step) is
// the same tensors for the same (seed, step) on every run and machine;
// step > 0 is a "trainer update" (a deterministic perturbation).
#pragma once

#include <graphkeep/kernels/mla_attention.h>
#include <graphkeep/kernels/moe_cutlass.h>
#include <graphkeep/quant/marlin.h>
#include <graphkeep/sources/weight_source.h>

#include <torch/nn/module.h>

#include <memory>
#include <vector>

namespace demo {

struct TinyLMConfig {
  int64_t vocab = 128;
  int64_t dim = 64;
  int64_t heads = 4;
  int64_t head_dim = 16;  // dn = dv
  int64_t latent = 32;
  int64_t experts = 4;
  int64_t inter = 32;
  int64_t topk = 2;
  int64_t layers = 2;
  int64_t group_size = 16;
};

// A module holding one plain parameter (reloaded as is: no PWAL).
class Plain : public torch::nn::Module {
 public:
  Plain(std::vector<int64_t> shape, c10::Device device, double fill = 0.0);
  at::Tensor weight;
};

class Block : public torch::nn::Module {
 public:
  Block(const TinyLMConfig& c, c10::Device device);
  at::Tensor forward(const at::Tensor& x);

  std::shared_ptr<gk::quant::MarlinW4A16Linear> wq, wc, wo;
  std::shared_ptr<gk::kernels::MlaAttention> attn;
  std::shared_ptr<Plain> router;
  std::shared_ptr<gk::kernels::CutlassMoe> moe;
};

class TinyLM : public torch::nn::Module {
 public:
  TinyLM(const TinyLMConfig& config, c10::Device device);

  // ids: [B] int64 on the model's device -> logits [B, vocab] float32
  at::Tensor forward(const at::Tensor& ids);

  // Every checkpoint tensor of this model (CPU tensors), for (seed, step).
  std::vector<gk::NamedTensor> checkpoint(uint64_t seed, int64_t step);

  const TinyLMConfig& config() const { return config_; }
  c10::Device device() const { return device_; }

 private:
  TinyLMConfig config_;
  c10::Device device_;
  std::shared_ptr<Plain> embed_, norm_, lm_head_;
  std::vector<std::shared_ptr<Block>> blocks_;
};

}  // namespace demo
