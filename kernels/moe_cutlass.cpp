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
  GK_CHECK(DeclarationError, topk >= 1 && topk <= num_experts, "CutlassMoe: need 1 <= topk <= experts");
  w13_weight_ = register_parameter("w13_weight", at::zeros({num_experts, 2 * inter, hidden}, on(device)), false);
  w2_weight_ = register_parameter("w2_weight", at::zeros({num_experts, hidden, inter}, on(device)), false);
}

std::vector<CheckpointParam> CutlassMoe::checkpoint_params() const {
  return {{"w13_weight", {{"w13_weight", {num_experts_, 2 * inter_, hidden_}, at::kFloat}}},
          {"w2_weight", {{"w2_weight", {num_experts_, hidden_, inter_}, at::kFloat}}}};
}

void CutlassMoe::process_weights_after_loading() {
  // vLLM rebuilds moe_kernel (and with it the experts object and its strides) on every PWAL.
  experts_ = std::make_unique<CutlassExperts>(num_experts_, hidden_, inter_, topk_, w13_weight_.device());
}

at::Tensor CutlassMoe::forward(const at::Tensor& x, const at::Tensor& logits) {
  check_inputs("CutlassMoe", x, logits, hidden_, num_experts_);
  GK_CHECK(StateError, experts_ != nullptr, "CutlassMoe: forward before process_weights_after_loading");
  return experts_->apply({x, logits, w13_weight_, w2_weight_, {}, {}});
}

}  // namespace gk::kernels
