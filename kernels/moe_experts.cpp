// The grouped-GEMM stride arrays of site 4 (moe_experts.h) and the Qwen3-MoE
// / Mixtral experts (SwigluExperts) on the grouped pipeline (moe_grouped.h).
#include <graphkeep/kernels/moe_experts.h>

#include <graphkeep/core/check.h>

#include "moe_grouped.h"

#include <ATen/ATen.h>

#include <cstdint>

namespace gk::kernels {

// Built as vLLM builds them: ab_strides1 = K is also c_strides2 (one tensor).
GroupedGemmStrides make_grouped_gemm_strides(int64_t E, int64_t K, int64_t N, c10::Device device) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  GroupedGemmStrides s;
  s.ab_strides1 = at::full({E}, K, opts);
  s.ab_strides2 = at::full({E}, N, opts);
  s.c_strides1 = at::full({E}, 2 * N, opts);
  s.c_strides2 = s.ab_strides1;
  return s;
}

void check_grouped_gemm_strides(const GroupedGemmStrides& s, int64_t E) {
  grouped::check_strides(s.ab_strides1, E, "ab_strides1");
  grouped::check_strides(s.ab_strides2, E, "ab_strides2");
  grouped::check_strides(s.c_strides1, E, "c_strides1");
  grouped::check_strides(s.c_strides2, E, "c_strides2");
}

SwigluExperts::SwigluExperts(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, bool norm_topk_prob,
                             c10::Device device)
    : MoeExperts(num_experts, hidden, inter, topk),
      strides_(make_grouped_gemm_strides(num_experts, hidden, inter, device)),
      norm_topk_prob_(norm_topk_prob) {
  GK_CHECK(DeclarationError, topk >= 1 && topk <= num_experts, "SwigluExperts: need 1 <= topk <= experts, got topk ",
           topk, " and ", num_experts, " experts");
}

at::Tensor SwigluExperts::apply(const MoeCall& call) const {
  const int64_t E = num_experts_, K = hidden_, N = inter_, topk = topk_;
  const at::Tensor& x = call.x;
  GK_CHECK(WeightError,
           x.dim() == 2 && x.size(1) == K && x.scalar_type() == at::kFloat && x.is_contiguous() &&
               call.logits.dim() == 2 && call.logits.size(0) == x.size(0) && call.logits.size(1) == E &&
               call.logits.scalar_type() == at::kFloat && call.logits.is_contiguous(),
           "SwigluExperts: x must be a contiguous float32 [T, ", K, "] and logits [T, ", E, "]; got ", x.sizes(), " ",
           x.scalar_type(), " and ", call.logits.sizes(), " ", call.logits.scalar_type());
  const at::ScalarType wt = call.w13.scalar_type();
  GK_CHECK(WeightError,
           call.w13.sizes() == at::IntArrayRef({E, 2 * N, K}) && call.w2.sizes() == at::IntArrayRef({E, K, N}) &&
               call.w2.scalar_type() == wt && (wt == at::kFloat || wt == at::kBFloat16 || wt == at::kHalf) &&
               call.w13.is_contiguous() && call.w2.is_contiguous() && call.w13.device() == x.device() &&
               call.w2.device() == x.device(),
           "SwigluExperts: w13 must be a contiguous [", E, ", ", 2 * N, ", ", K, "] and w2 [", E, ", ", K, ", ", N,
           "], both float32, bfloat16 or float16, on ", x.device(), "; got ", call.w13.sizes(), " ",
           call.w13.scalar_type(), " and ", call.w2.sizes(), " ", call.w2.scalar_type());
  check_grouped_gemm_strides(strides_, E);
  return grouped::grouped_mlp(x, call.w13, call.w2, grouped::route_softmax(call.logits, E, topk, norm_topk_prob_),
                              strides_, grouped::Activation::silu_gated, E, K, N, topk);
}

}  // namespace gk::kernels

GRAPHKEEP_REGISTER_TYPE(gk::kernels::SwigluExperts);
