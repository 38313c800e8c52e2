// graphkeep/quant/w8a8.h
//
// Failure site 13: compressed-tensors W8A8 (WNA8O8) int8 with static input
// scales. vLLM's scheme, in process_weights_after_loading, clones the scales
// into *new* tensors that it keeps on the scheme object:
//
//   input_scale  [S] (one per logical shard)  -> _input_scale  = max over shards (static per-tensor)
//   weight_scale [S] (per-tensor per shard)   -> _weight_scale = per output channel (convert_to_channelwise)
//
// Every PWAL allocates them anew, so without graphkeep a captured graph keeps
// reading the old scales (wrong output). Here the scheme declares them
// gk::scale and a reload copies the new values into the captured storage.
//
// The computation (two launches, like vLLM's scaled_int8_quant + scaled_mm):
//   xq[m, k]  = clamp(round_half_even(x[m, k] / input_scale), -128, 127)      (int8)
//   y[m, n]   = float(sum_k xq[m, k] * w[n, k]) * input_scale * weight_scale[n]
// with both scales read from device memory inside the kernels.
//
//   gk::quant::W8A8Int8Linear lin(/*in=*/64, {"q_proj", "k_proj"}, {32, 16}, at::kCPU);
//   ... gk::load_weights(...)  (q_proj.weight [32, 64] int8, q_proj.weight_scale [1], q_proj.input_scale [1], ...)
//   at::Tensor y = lin.forward(x);   // x: [M, 64] float32 -> [M, 48]
#pragma once

#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gk::quant {

// The scheme object.
class CompressedTensorsW8A8Int8 {
 public:
  CompressedTensorsW8A8Int8() = default;
  // PWAL: weight_scale [S] and input_scale [S] (one per logical shard),
  // shard_rows: the output rows of each shard.
  CompressedTensorsW8A8Int8(const at::Tensor& weight_scale, const at::Tensor& input_scale,
                            std::vector<int64_t> shard_rows, int64_t size_k);

  // x: [M, K] float32, weight: the layer's [N, K] int8 -> [M, N]
  at::Tensor apply(const at::Tensor& x, const at::Tensor& weight) const;

  const at::Tensor& input_scale() const { return input_scale_; }
  const at::Tensor& weight_scale() const { return weight_scale_; }

 private:
  at::Tensor input_scale_;   // [1] float32, vLLM's _input_scale
  at::Tensor weight_scale_;  // [N] float32 per output channel, vLLM's _weight_scale
  std::vector<int64_t> shard_rows_;
  int64_t size_k_ = 0, size_n_ = 0;

  GRAPHKEEP_DESCRIBE(CompressedTensorsW8A8Int8, (input_scale_, gk::scale), (weight_scale_, gk::scale), shard_rows_,
                     size_k_, size_n_)
};

// A fused linear layer (e.g. q_proj and k_proj as one) with the scheme.
class W8A8Int8Linear : public torch::nn::Module, public DescribedLayer<W8A8Int8Linear> {
 public:
  // Checkpoint tensors per shard s: <shard_names[s]>.weight [shard_rows[s], in]
  // int8, <name>.weight_scale [1] and <name>.input_scale [1] float32.
  W8A8Int8Linear(int64_t in, std::vector<std::string> shard_names, std::vector<int64_t> shard_rows,
                 c10::Device device);

  void process_weights_after_loading() override;

  at::Tensor forward(const at::Tensor& x);  // [M, in] -> [M, sum(shard_rows)]

  const CompressedTensorsW8A8Int8& scheme() const { return *scheme_; }

 private:
  at::Tensor weight_;        // [N, in] int8
  at::Tensor weight_scale_;  // [S] float32, one per shard (checkpoint format)
  at::Tensor input_scale_;   // [S] float32, one per shard (checkpoint format)
  std::unique_ptr<CompressedTensorsW8A8Int8> scheme_;
  int64_t in_;
  std::vector<std::string> shard_names_;
  std::vector<int64_t> shard_rows_;

  GRAPHKEEP_DESCRIBE_DERIVED(W8A8Int8Linear, (torch::nn::Module, DescribedLayer<W8A8Int8Linear>),
                             (weight_, gk::parameter), (weight_scale_, gk::parameter), (input_scale_, gk::parameter),
                             scheme_, in_, shard_names_, shard_rows_)
};

}  // namespace gk::quant
