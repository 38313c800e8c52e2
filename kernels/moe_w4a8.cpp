// Site 10: the W4A8 grouped-GEMM MoE layer (moe_w4a8.h).
#include <graphkeep/kernels/moe_w4a8.h>
#include <graphkeep/runtime/device.h>

#include "cuda/moe_launch.h"
#include "moe_layer_support.h"

#include <string>
#include <vector>

namespace gk::kernels {
using namespace detail;

// --- site 10: W4A8 grouped GEMM, a/c/s stride arrays -----------------------------------

W4A8Moe::W4A8Moe(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk, int64_t group,
                 c10::Device device)
    : num_experts_(num_experts), hidden_(hidden), inter_(inter), topk_(topk), group_(group) {
  check_routing("W4A8Moe", num_experts, topk);
  GK_CHECK(DeclarationError,
           group > 0 && hidden % 8 == 0 && inter % 8 == 0 && hidden % group == 0 && inter % group == 0,
           "W4A8Moe: hidden (", hidden, ") and inter (", inter, ") must be multiples of 8 and of the group size (",
           group, ")");
  const int64_t E = num_experts, K = hidden, N = inter, G = group;
  w13_qweight_ = checkpoint_param("w13_qweight", {E, 2 * N, K / 2}, at::kByte, device);
  w13_scales_ = checkpoint_param("w13_scales", {E, 2 * N, K / G}, at::kFloat, device);
  w2_qweight_ = checkpoint_param("w2_qweight", {E, K, N / 2}, at::kByte, device);
  w2_scales_ = checkpoint_param("w2_scales", {E, K, N / G}, at::kFloat, device);
}

void W4A8Moe::process_weights_after_loading() {
  // vLLM: cutlass_encode_and_reorder_int4b / cutlass_pack_scale_fp8, then a new experts object.
  w13_packed_ = pack_int4(w13_qweight_);
  w2_packed_ = pack_int4(w2_qweight_);
  // clone, not contiguous(): with a single group the transpose is trivial and
  // contiguous() would return a view of the checkpoint parameter.
  w13_scales_t_ = w13_scales_.transpose(1, 2).clone(at::MemoryFormat::Contiguous);  // [E, K/G, 2N]
  w2_scales_t_ = w2_scales_.transpose(1, 2).clone(at::MemoryFormat::Contiguous);    // [E, N/G, K]
  experts_ = std::make_unique<CutlassW4A8Experts>(num_experts_, hidden_, inter_, topk_, group_, w13_qweight_.device());
}

at::Tensor W4A8Moe::forward(const at::Tensor& x, const at::Tensor& logits) {
  return apply_experts("W4A8Moe", experts_.get(), hidden_, num_experts_,
                       {x, logits, w13_packed_, w2_packed_, w13_scales_t_, w2_scales_t_});
}

}  // namespace gk::kernels
