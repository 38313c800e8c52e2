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
// This header: the experts interface (MoeExperts, MoeCall), the grouped-GEMM
// stride arrays of failure site 4 (GroupedGemmStrides, one aggregate for
// every experts object that holds them), and the Qwen3-MoE / Mixtral experts
// (SwigluExperts), whose layer is the example engine's SparseMoe. The
// experts of the failure sites live with their layers: CutlassExperts (site
// 4) in moe_cutlass.h, CutlassW4A8Experts (site 10) in moe_w4a8.h.
//
//   auto experts = std::make_unique<gk::kernels::SwigluExperts>(E, K, N, topk, /*norm_topk_prob=*/true, device);
//   at::Tensor y = experts->apply({x, logits, w13, w2, {}, {}});   // x [T, K] -> y [T, K]
//
// The pipeline of all of them (kernels/moe_grouped.h, CUDA kernels in
// kernels/cuda/moe_grouped.cu): route top-k and group the rows by expert ->
// gather (site 10: quantize to int8) -> grouped GEMM1 -> gated activation
// (site 10: + quantize; SwigluExperts: SiLU-gated) -> grouped GEMM2 ->
// unpermute and reduce. The per-call temporaries come from the capture pool,
// as in vLLM.
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

// Site 4's per-expert stride arrays, int64 [E] each, as vLLM's CUTLASS MoE
// allocates them:
//   ab_strides1 = K   A and B of GEMM1 [M,K] x w13[e]:[2N,K]^T -> [M,2N]
//   ab_strides2 = N   A and B of GEMM2 [M,N] x w2[e]:[K,N]^T -> [M,K]
//   c_strides1  = 2N  C of GEMM1
//   c_strides2  = K   C of GEMM2: the *same tensor* as ab_strides1 (one
//                     slot, two paths)
// Every PWAL builds new ones with its new experts object; the grouped GEMMs
// read them from device memory per group.
struct GroupedGemmStrides {
  at::Tensor ab_strides1;
  at::Tensor ab_strides2;
  at::Tensor c_strides1;
  at::Tensor c_strides2;
};
// Functions of E, K and N alone: a weight patch leaves them as they are
// (Note [Declared derivations] in graphkeep/registry/role.h).
GRAPHKEEP_AGGREGATE(GroupedGemmStrides, (ab_strides1, gk::metadata.from_shapes()),
                    (ab_strides2, gk::metadata.from_shapes()), (c_strides1, gk::metadata.from_shapes()),
                    (c_strides2, gk::metadata.from_shapes()));

// The strides of E experts of hidden size K and intermediate size N on `device`.
GroupedGemmStrides make_grouped_gemm_strides(int64_t E, int64_t K, int64_t N, c10::Device device);
// Throws gk::StateError unless each is a contiguous int64 [E].
void check_grouped_gemm_strides(const GroupedGemmStrides& s, int64_t E);

// Qwen3-MoE / Mixtral experts (the example engine's SparseMoe): site 4's
// grouped pipeline and stride arrays (the same slots, the same failure when a
// captured graph reads the strides of a destroyed object), with
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
  const GroupedGemmStrides& strides() const { return strides_; }

 private:
  GroupedGemmStrides strides_;
  bool norm_topk_prob_ = true;  // renormalize the top-k gates (configuration: checked across PWAL)

  GRAPHKEEP_DESCRIBE_DERIVED(SwigluExperts, (MoeExperts), strides_, norm_topk_prob_)
};

}  // namespace gk::kernels
