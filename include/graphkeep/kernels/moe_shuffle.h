// graphkeep/kernels/moe_shuffle.h
//
// Failure site 2: shuffled MoE expert weights (AITER's shuffle_weight,
// vLLM #40390). The checkpoint delivers each expert's w1, w3 ([N, K]) and w2
// ([K, N]) separately; PWAL re-lays them out as *new* tensors in a
// kernel-friendly tiled layout (w1 and w3 tiles interleaved, see
// kernels/cuda/moe_common.h), and the fused experts kernel reads only the
// shuffled tensors. Every PWAL allocates them anew, so without graphkeep a
// captured graph keeps reading the previous weights (wrong output after a
// reload: the "gibberish after the first sync" of NeMo-RL #2895). The
// shuffle only moves elements, so both tensors are declared by_layout(): a
// weight patch writes the changed elements at their shuffled places, with no
// PWAL (Note [Layout derivations] in graphkeep/model/block_derivation.h).
//
// Per token t with top-k experts e_j and gates g_j (moe_common.h route_token):
//   y_t = sum_j g_j * w2[e_j] (softsign(w1[e_j] x_t) * (w3[e_j] x_t))
//
//   gk::kernels::ShuffledMoe moe(/*experts=*/4, /*hidden=*/16, /*inter=*/8, /*topk=*/2, at::kCPU);
//   at::Tensor y = moe.forward(x, logits);   // x: [T, K], logits: [T, E] -> y: [T, K]
#pragma once

#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <torch/nn/module.h>

namespace gk::kernels {

class ShuffledMoe : public torch::nn::Module, public DescribedLayer<ShuffledMoe> {
 public:
  // Checkpoint: w13_weight from experts.<e>.w1 and experts.<e>.w3, w2_weight from experts.<e>.w2.
  ShuffledMoe(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, c10::Device device);

  void process_weights_after_loading() override;
  void declare_derivations(Derivations& d) const override;

  // x: [T, K], logits: [T, E] (float32, on the layer's device) -> [T, K]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& logits);

  const at::Tensor& w13_shuffled() const { return w13_shuffled_; }
  const at::Tensor& w2_shuffled() const { return w2_shuffled_; }

 private:
  at::Tensor w13_weight_;    // [E*2N, K]: per expert w1 rows then w3 rows (checkpoint format)
  at::Tensor w2_weight_;     // [E*K, N]
  at::Tensor w13_shuffled_;  // [E, N/4, K/8, 2, 4, 8]
  at::Tensor w2_shuffled_;   // [E, K/4, N/8, 4, 8]
  int64_t num_experts_, hidden_, inter_, topk_;

  GRAPHKEEP_DESCRIBE_DERIVED(ShuffledMoe, (torch::nn::Module, DescribedLayer<ShuffledMoe>), (w13_weight_, parameter),
                             (w2_weight_, parameter), (w13_shuffled_, derived_weight.by_layout()),
                             (w2_shuffled_, derived_weight.by_layout()),
                             num_experts_, hidden_, inter_, topk_)
};

}  // namespace gk::kernels
