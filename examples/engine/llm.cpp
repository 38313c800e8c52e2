// The example engine's model (llm.h): embedding, decoder layers, final norm
// and lm_head, eager or through the fast CUDA path.
#include "llm.h"

#include "fused_ops.h"
#include "layer_ops.h"
#include "part_timer.h"

#include <graphkeep/core/check.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>

namespace demo {
using namespace layer_ops;

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

std::vector<gk::NamedTensor> CausalLM::adapter_tensors() const {
  std::vector<gk::NamedTensor> out;
  for (std::size_t l = 0; l < layers_.size(); ++l) layers_[l]->append_adapter("model.layers." + std::to_string(l), out);
  return out;
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

}  // namespace demo
