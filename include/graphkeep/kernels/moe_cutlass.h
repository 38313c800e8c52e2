// graphkeep/kernels/moe_cutlass.h
//
// Failure site 4: a CUTLASS-style grouped MoE GEMM (CUTLASS FP8 MoE, here in
// fp32) whose experts object, CutlassExperts, owns per-expert stride arrays
// in device memory (GroupedGemmStrides: ab_strides1 aliased as c_strides2,
// ab_strides2, c_strides1; moe_experts.h). The layer's PWAL rebuilds the
// experts object, as vLLM's compressed-tensors FP8 MoE does on every reload
// (vLLM #41670), so without graphkeep a captured graph reads the strides of a
// destroyed object: freed memory, an illegal access once it is reused.
//
//   gk::kernels::CutlassMoe moe(/*experts=*/4, /*hidden=*/16, /*inter=*/8, /*topk=*/2, at::kCPU);
//   at::Tensor y = moe.forward(x, logits);   // x: [T, K], logits: [T, E] -> y: [T, K]
#pragma once

#include <graphkeep/kernels/moe_experts.h>
#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <torch/nn/module.h>

#include <memory>

namespace gk::kernels {

// Site 4's experts. w13: float [E, 2N, K] (rows: w1 then w3), w2: float
// [E, K, N]; softsign-gated activation.
class CutlassExperts final : public MoeExperts {
 public:
  CutlassExperts(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, c10::Device device);

  at::Tensor apply(const MoeCall& call) const override;

  const GroupedGemmStrides& strides() const { return strides_; }

 private:
  GroupedGemmStrides strides_;

  GRAPHKEEP_DESCRIBE_DERIVED(CutlassExperts, (MoeExperts), strides_)
};

// Site 4's layer: checkpoint w13_weight / w2_weight in the kernel's format; PWAL
// builds a new CutlassExperts.
class CutlassMoe : public torch::nn::Module, public DescribedLayer<CutlassMoe> {
 public:
  CutlassMoe(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, c10::Device device);

  void process_weights_after_loading() override;

  // x: [T, K], logits: [T, E] (float32, on the layer's device) -> [T, K]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& logits);

  const MoeExperts& experts() const { return *experts_; }

 private:
  at::Tensor w13_weight_;  // [E, 2N, K], checkpoint format = kernel format
  at::Tensor w2_weight_;   // [E, K, N]
  std::unique_ptr<MoeExperts> experts_;  // a CutlassExperts, rebuilt by every PWAL
  int64_t num_experts_, hidden_, inter_, topk_;

  GRAPHKEEP_DESCRIBE_DERIVED(CutlassMoe, (torch::nn::Module, DescribedLayer<CutlassMoe>), (w13_weight_, parameter),
                             (w2_weight_, parameter), experts_, num_experts_, hidden_, inter_, topk_)
};

}  // namespace gk::kernels
