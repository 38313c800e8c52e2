// Site 4: the CUTLASS-style grouped-GEMM MoE, its experts object and its
// layer (moe_cutlass.h).
#include <graphkeep/kernels/moe_cutlass.h>

#include "moe_grouped.h"
#include "moe_layer_support.h"

#include <string>
#include <vector>

namespace gk::kernels {
using namespace detail;

// --- the experts object: stride arrays, grouped pipeline ----------------------------

CutlassExperts::CutlassExperts(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk,
                               c10::Device device)
    : MoeExperts(num_experts, hidden, inter, topk), strides_(make_grouped_gemm_strides(num_experts, hidden, inter, device)) {}

at::Tensor CutlassExperts::apply(const MoeCall& call) const {
  const int64_t E = num_experts_, K = hidden_, N = inter_, topk = topk_;
  const at::Tensor& x = call.x;
  GK_CHECK(WeightError,
           x.dim() == 2 && x.size(1) == K && call.logits.dim() == 2 && call.logits.size(0) == x.size(0) &&
               call.logits.size(1) == E && call.w13.sizes() == at::IntArrayRef({E, 2 * N, K}) &&
               call.w2.sizes() == at::IntArrayRef({E, K, N}) && call.w13.scalar_type() == at::kFloat &&
               call.w2.scalar_type() == at::kFloat,
           "CutlassExperts: x must be [T, ", K, "], logits [T, ", E, "], w13 [", E, ", ", 2 * N, ", ", K, "], w2 [", E,
           ", ", K, ", ", N, "] (float32 weights); got ", x.sizes(), ", ", call.logits.sizes(), ", ", call.w13.sizes(),
           " ", call.w13.scalar_type(), ", ", call.w2.sizes(), " ", call.w2.scalar_type());
  check_grouped_gemm_strides(strides_, E);
  return grouped::grouped_mlp(x, call.w13, call.w2, grouped::route(call.logits, E, topk), strides_,
                              grouped::Activation::softsign_gated, E, K, N, topk);
}

// --- the layer ---------------------------------------------------------------------

CutlassMoe::CutlassMoe(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, c10::Device device)
    : num_experts_(num_experts), hidden_(hidden), inter_(inter), topk_(topk) {
  check_routing("CutlassMoe", num_experts, topk);
  w13_weight_ = checkpoint_param("w13_weight", {num_experts, 2 * inter, hidden}, at::kFloat, device);
  w2_weight_ = checkpoint_param("w2_weight", {num_experts, hidden, inter}, at::kFloat, device);
}

void CutlassMoe::process_weights_after_loading() {
  // vLLM rebuilds moe_kernel (and with it the experts object and its strides) on every PWAL.
  experts_ = std::make_unique<CutlassExperts>(num_experts_, hidden_, inter_, topk_, w13_weight_.device());
}

at::Tensor CutlassMoe::forward(const at::Tensor& x, const at::Tensor& logits) {
  return apply_experts("CutlassMoe", experts_.get(), hidden_, num_experts_,
                       {x, logits, w13_weight_, w2_weight_, {}, {}});
}

}  // namespace gk::kernels

GRAPHKEEP_REGISTER_TYPE(gk::kernels::CutlassExperts);
