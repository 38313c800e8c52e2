// Site 4: the CUTLASS-style grouped-GEMM MoE layer (moe_cutlass.h).
#include <graphkeep/kernels/moe_cutlass.h>
#include <graphkeep/runtime/device.h>

#include "cuda/moe_launch.h"
#include "moe_layer_support.h"

#include <string>
#include <vector>

namespace gk::kernels {
using namespace detail;

// --- site 4: CUTLASS-style grouped GEMM, experts object with stride arrays -------

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
