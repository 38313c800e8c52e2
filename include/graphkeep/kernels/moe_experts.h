// graphkeep/kernels/moe_experts.h
//
// Polymorphic MoE experts objects, as vLLM's FusedMoEPermuteExpertsUnpermute:
// a layer's PWAL *rebuilds* the experts object (a fresh
// std::unique_ptr<MoeExperts> of a concrete type picked at run time), and the
// object owns per-expert stride arrays that its grouped GEMMs read from
// device memory. Without graphkeep, a captured graph keeps reading the
// strides of the experts object that the reload destroyed (vLLM #41670: an
// illegal memory access on H200).
//
//   Failure site 4, CutlassExperts (CUTLASS FP8 MoE, here in fp32): per
//   expert e, int64 [E]
//     ab_strides1 = K   A and B of GEMM1 [M,K] x w13[e]:[2N,K]^T -> [M,2N]
//     c_strides1  = 2N  C of GEMM1
//     ab_strides2 = N   A and B of GEMM2 [M,N] x w2[e]:[K,N]^T -> [M,K]
//     c_strides2  = K   C of GEMM2: the *same tensor* as ab_strides1 (one
//                       slot, two paths), exactly as vLLM allocates it
//
//   Failure site 10, CutlassW4A8Experts (CUTLASS W4A8 MoE): int4 weights packed
//   8 per int32 word with per-group scales (dequantized in the kernel), int8
//   activations with per-row scales; per expert e, int64 [E]
//     a_strides1 = K, c_strides1 = 2N, s_strides1 = 2N   (GEMM1)
//     a_strides2 = N, c_strides2 = K,  s_strides2 = K    (GEMM2)
//   (s_strides: the row stride of the group-scale matrices [K/G, 2N] and
//   [N/G, K] that PWAL transposes the checkpoint scales into).
//
// SwigluExperts (below) runs site 4's pipeline with Qwen3-MoE's routing and
// activation, for the example engine's Qwen3-MoE layer.
//
// The pipeline of all three (kernels/cuda/moe_grouped.cu, CPU twins in
// kernels/moe_experts.cpp): route top-k and group the rows by expert ->
// gather (site 10: quantize to int8) -> grouped GEMM1 -> softsign-gated
// activation (site 10: + quantize; SwigluExperts: SiLU-gated) -> grouped
// GEMM2 -> unpermute and reduce.
// The per-call temporaries come from the capture pool, as in vLLM.
#pragma once

#include <graphkeep/registry.h>

#include <ATen/core/Tensor.h>

namespace gk::kernels {

// The per-call arguments of an experts object: not stored.
struct MoeCall {
  at::Tensor x;        // [T, K] float32
  at::Tensor logits;   // [T, E] float32 router logits
  at::Tensor w13, w2;  // kernel-format weights (see each experts type)
  at::Tensor w13_scales, w2_scales;  // W4A8 group scales; undefined otherwise
};

class MoeExperts {
 public:
  MoeExperts() = default;
  MoeExperts(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk)
      : num_experts_(num_experts), hidden_(hidden), inter_(inter), topk_(topk) {}
  virtual ~MoeExperts() = default;

  // y [T, K] = sum over each token's top-k experts of gate * expert MLP.
  virtual at::Tensor apply(const MoeCall& call) const = 0;

  int64_t num_experts() const { return num_experts_; }
  int64_t hidden() const { return hidden_; }
  int64_t inter() const { return inter_; }
  int64_t topk() const { return topk_; }

 protected:
  int64_t num_experts_ = 0, hidden_ = 0, inter_ = 0, topk_ = 0;

  GRAPHKEEP_DESCRIBE(MoeExperts, num_experts_, hidden_, inter_, topk_)
};

// Site 4. w13: float [E, 2N, K] (rows: w1 then w3), w2: float [E, K, N].
class CutlassExperts final : public MoeExperts {
 public:
  CutlassExperts(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, c10::Device device);

  at::Tensor apply(const MoeCall& call) const override;

  const at::Tensor& ab_strides1() const { return ab_strides1_; }
  const at::Tensor& ab_strides2() const { return ab_strides2_; }
  const at::Tensor& c_strides1() const { return c_strides1_; }
  const at::Tensor& c_strides2() const { return c_strides2_; }

 private:
  at::Tensor ab_strides1_;  // int64 [E] = K
  at::Tensor ab_strides2_;  // int64 [E] = N
  at::Tensor c_strides1_;   // int64 [E] = 2N
  at::Tensor c_strides2_;   // int64 [E] = K, aliases ab_strides1_

  GRAPHKEEP_DESCRIBE_DERIVED(CutlassExperts, (MoeExperts), (ab_strides1_, metadata), (ab_strides2_, metadata),
                             (c_strides1_, metadata), (c_strides2_, metadata))
};

// Qwen3-MoE / Mixtral experts (the example engine's SparseMoe):
// site 4's grouped pipeline and stride arrays (ab_strides1 aliased as
// c_strides2, ab_strides2, c_strides1: the same slots, the same failure when
// a captured graph reads the strides of a destroyed object), with
// transformers' Qwen3MoeSparseMoeBlock semantics:
//   route    p = softmax(logits) over all E experts, in float32; the top-k of
//            p in torch.topk's order on the CPU, ties included
//            (graphkeep/numerics/softmax_topk.h); gates = p of the chosen
//            experts, divided by their sum when norm_topk_prob;
//   GEMM1    [M,K] x w13[e]:[2N,K]^T -> [M,2N]   (rows: gate_proj, then up_proj)
//   act      h = silu(gate) * up
//   GEMM2    [M,N] x w2[e]:[K,N]^T -> [M,K]       (down_proj)
//   reduce   y[t] = sum_j gate_j * c2[row of (t, j)], in top-k rank order.
// x, logits and y are float32, and so is all arithmetic. w13 [E, 2N, K] and
// w2 [E, K, N] (contiguous, one dtype) may be float32, bfloat16 or float16:
// the GEMMs widen each weight exactly on load, so a model in bf16 needs no
// float32 copy of its experts. CPU twin and CUDA kernel agree bit for bit;
// against transformers in float32 the results differ only by the order of
// the sums (about 1e-7 relative).
class SwigluExperts final : public MoeExperts {
 public:
  SwigluExperts(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, bool norm_topk_prob,
                c10::Device device);

  at::Tensor apply(const MoeCall& call) const override;

  bool norm_topk_prob() const { return norm_topk_prob_; }
  const at::Tensor& ab_strides1() const { return ab_strides1_; }
  const at::Tensor& ab_strides2() const { return ab_strides2_; }
  const at::Tensor& c_strides1() const { return c_strides1_; }
  const at::Tensor& c_strides2() const { return c_strides2_; }

 private:
  at::Tensor ab_strides1_;  // int64 [E] = K
  at::Tensor ab_strides2_;  // int64 [E] = N
  at::Tensor c_strides1_;   // int64 [E] = 2N
  at::Tensor c_strides2_;   // int64 [E] = K, aliases ab_strides1_
  bool norm_topk_prob_ = true;  // renormalize the top-k gates (configuration: checked across PWAL)

  GRAPHKEEP_DESCRIBE_DERIVED(SwigluExperts, (MoeExperts), (ab_strides1_, metadata), (ab_strides2_, metadata),
                             (c_strides1_, metadata), (c_strides2_, metadata), norm_topk_prob_)
};

// Site 10. w13: int32 [E, 2N, K/8] packed int4 (moe_common.h int4_at),
// w2: int32 [E, K, N/8]; w13_scales: float [E, K/G, 2N], w2_scales: [E, N/G, K].
class CutlassW4A8Experts final : public MoeExperts {
 public:
  CutlassW4A8Experts(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, int64_t group,
                     c10::Device device);

  at::Tensor apply(const MoeCall& call) const override;

  const at::Tensor& s_strides1() const { return s_strides1_; }
  int64_t group() const { return group_; }

 private:
  at::Tensor a_strides1_;  // int64 [E] = K
  at::Tensor a_strides2_;  // int64 [E] = N
  at::Tensor c_strides1_;  // int64 [E] = 2N
  at::Tensor c_strides2_;  // int64 [E] = K
  at::Tensor s_strides1_;  // int64 [E] = 2N
  at::Tensor s_strides2_;  // int64 [E] = K
  int64_t group_ = 0;      // quantization group size along the reduction dim

  GRAPHKEEP_DESCRIBE_DERIVED(CutlassW4A8Experts, (MoeExperts), (a_strides1_, metadata), (a_strides2_, metadata),
                             (c_strides1_, metadata), (c_strides2_, metadata), (s_strides1_, metadata),
                             (s_strides2_, metadata), group_)
};

}  // namespace gk::kernels
