// graphkeep/kernels/moe_wna16.h
//
// Failure site 11: kernel-owned scratch buffers (vLLM's RDNA3 WNA16 MoE keeps
// rdna3_w1_buf and rdna3_act_buf on the layer, allocated by PWAL). The kernel
// stages each token's bf16-rounded activations in act_buf and each chosen
// expert's dequantized w13 in w1_buf, then computes from the scratch; it
// writes every scratch element before reading it within the launch, so the
// contents never matter, only the address (role gk::scratch, init preserve).
// Without graphkeep the reload frees the captured scratch and a replay
// *writes* through the freed address into whatever the allocator has put
// there since: silent corruption of another tensor.
//
//   gk::kernels::Rdna3Wna16Moe moe(/*experts=*/4, /*hidden=*/16, /*inter=*/8, /*topk=*/2,
//                                  /*max_tokens=*/8, at::kCPU);
//   at::Tensor y = moe.forward(x, logits);   // x: [T <= max_tokens, K], logits: [T, E] -> [T, K]
#pragma once

#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <torch/nn/module.h>

namespace gk::kernels {

// The kernel object PWAL rebuilds, with its scratch.
class Rdna3Wna16Kernel {
 public:
  Rdna3Wna16Kernel() = default;
  Rdna3Wna16Kernel(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, int64_t max_tokens,
                   c10::Device device);

  // w13_q: int8 [E, 2N, K], w13_scale: [E, 2N], w2_q: int8 [E, K, N], w2_scale: [E, K].
  at::Tensor apply(const at::Tensor& x, const at::Tensor& logits, const at::Tensor& w13_q,
                   const at::Tensor& w13_scale, const at::Tensor& w2_q, const at::Tensor& w2_scale) const;

  const at::Tensor& w1_buf() const { return rdna3_w1_buf_; }
  const at::Tensor& act_buf() const { return rdna3_act_buf_; }

 private:
  at::Tensor rdna3_w1_buf_;   // float [max_tokens, 2N, K]
  at::Tensor rdna3_act_buf_;  // float [max_tokens, K]
  int64_t num_experts_ = 0, hidden_ = 0, inter_ = 0, topk_ = 0, max_tokens_ = 0;

  GRAPHKEEP_DESCRIBE(Rdna3Wna16Kernel, (rdna3_w1_buf_, scratch), (rdna3_act_buf_, scratch), num_experts_, hidden_,
                     inter_, topk_, max_tokens_)
};

class Rdna3Wna16Moe : public torch::nn::Module, public DescribedLayer<Rdna3Wna16Moe> {
 public:
  Rdna3Wna16Moe(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, int64_t max_tokens,
                c10::Device device);

  void process_weights_after_loading() override;

  // x: [T, K], logits: [T, E] (float32, on the layer's device), T <= max_tokens -> [T, K]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& logits);

  const Rdna3Wna16Kernel& kernel() const { return kernel_; }

 private:
  at::Tensor w13_qweight_;  // int8 [E, 2N, K]
  at::Tensor w13_scales_;   // float [E, 2N]
  at::Tensor w2_qweight_;   // int8 [E, K, N]
  at::Tensor w2_scales_;    // float [E, K]
  Rdna3Wna16Kernel kernel_;  // rebuilt by every PWAL, with fresh scratch
  int64_t num_experts_, hidden_, inter_, topk_, max_tokens_;

  GRAPHKEEP_DESCRIBE_DERIVED(Rdna3Wna16Moe, (torch::nn::Module, DescribedLayer<Rdna3Wna16Moe>),
                             (w13_qweight_, parameter), (w13_scales_, parameter), (w2_qweight_, parameter),
                             (w2_scales_, parameter), kernel_, num_experts_, hidden_, inter_, topk_, max_tokens_)
};

}  // namespace gk::kernels
