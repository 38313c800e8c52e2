// Site 10: the W4A8 grouped-GEMM MoE, its experts object and its layer
// (moe_w4a8.h).
#include <graphkeep/kernels/moe_w4a8.h>

#include "moe_grouped.h"
#include "moe_layer_support.h"

#include <string>
#include <vector>

namespace gk::kernels {
using namespace detail;

namespace {
// [E, R, G] -> [E, G, R]. clone, not contiguous(): with a single group the
// transpose is trivial and contiguous() would return a view of the
// checkpoint parameter.
at::Tensor transpose_scales(const at::Tensor& s) { return s.transpose(1, 2).clone(at::MemoryFormat::Contiguous); }
}  // namespace

// --- the experts object: a/c/s stride arrays, grouped W4A8 pipeline ------------------

CutlassW4A8Experts::CutlassW4A8Experts(int64_t num_experts, int64_t hidden, int64_t inter, int64_t topk,
                                       int64_t group, c10::Device device)
    : MoeExperts(num_experts, hidden, inter, topk), group_(group) {
  GK_CHECK(DeclarationError, group > 0 && hidden % 8 == 0 && inter % 8 == 0 && hidden % group == 0 && inter % group == 0,
           "CutlassW4A8Experts: hidden (", hidden, ") and inter (", inter,
           ") must be multiples of 8 and of the group size (", group, ")");
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  a_strides1_ = at::full({num_experts}, hidden, opts);
  a_strides2_ = at::full({num_experts}, inter, opts);
  c_strides1_ = at::full({num_experts}, 2 * inter, opts);
  c_strides2_ = at::full({num_experts}, hidden, opts);
  s_strides1_ = at::full({num_experts}, 2 * inter, opts);
  s_strides2_ = at::full({num_experts}, hidden, opts);
}

at::Tensor CutlassW4A8Experts::apply(const MoeCall& call) const {
  const int64_t E = num_experts_, K = hidden_, N = inter_, topk = topk_, G = group_;
  const at::Tensor& x = call.x;
  GK_CHECK(WeightError,
           x.dim() == 2 && x.size(1) == K && call.logits.dim() == 2 && call.logits.size(0) == x.size(0) &&
               call.logits.size(1) == E && call.w13.sizes() == at::IntArrayRef({E, 2 * N, K / 8}) &&
               call.w2.sizes() == at::IntArrayRef({E, K, N / 8}) &&
               call.w13_scales.sizes() == at::IntArrayRef({E, K / G, 2 * N}) &&
               call.w2_scales.sizes() == at::IntArrayRef({E, N / G, K}),
           "CutlassW4A8Experts: unexpected shapes x ", x.sizes(), ", logits ", call.logits.sizes(), ", w13 ",
           call.w13.sizes(), ", w2 ", call.w2.sizes(), ", w13_scales ", call.w13_scales.sizes(), ", w2_scales ",
           call.w2_scales.sizes());
  for (const at::Tensor* s : {&a_strides1_, &a_strides2_, &c_strides1_, &c_strides2_, &s_strides1_, &s_strides2_})
    grouped::check_strides(*s, E, "a/c/s_strides");
  const grouped::Routing rt = grouped::route(call.logits, E, topk);
  const grouped::QuantRows a1 = grouped::quantize_rows(x, rt, topk);
  const at::Tensor c1 = grouped::w4a8_grouped_gemm("moe_w4a8_gemm1", a1, call.w13, call.w13_scales, rt, a_strides1_,
                                                   c_strides1_, s_strides1_, E, 2 * N, K, G);
  const grouped::QuantRows a2 = grouped::quantize_act(c1, N);
  const at::Tensor c2 = grouped::w4a8_grouped_gemm("moe_w4a8_gemm2", a2, call.w2, call.w2_scales, rt, a_strides2_,
                                                   c_strides2_, s_strides2_, E, K, N, G);
  return grouped::finalize(c2, rt, x.size(0), K, topk);
}

// --- the layer ---------------------------------------------------------------------

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
  w13_scales_t_ = transpose_scales(w13_scales_);  // [E, K/G, 2N]
  w2_scales_t_ = transpose_scales(w2_scales_);    // [E, N/G, K]
  experts_ = std::make_unique<CutlassW4A8Experts>(num_experts_, hidden_, inter_, topk_, group_, w13_qweight_.device());
}

void W4A8Moe::declare_derivations(Derivations& d) const {
  // A word from four bytes of a row: the qweight [E, R, C/2] seen as rows
  // [E * R, C/2], in blocks of 1 x 4, one int32 per block.
  auto words = [&](const char* name, const at::Tensor& q, const at::Tensor& packed) {
    d.blocks(name, q.view({q.size(0) * q.size(1), q.size(2)}), {1, 4}, {{packed, BlockLayout::one_per_block}},
             [](const at::Tensor& blocks) {  // [B, 1, 4] uint8
               return std::vector<at::Tensor>{pack_int4(blocks.view({1, blocks.size(0), 4}))};
             });
  };
  words("int4 pairs into interleaved words (w13)", w13_qweight_, w13_packed_);
  words("int4 pairs into interleaved words (w2)", w2_qweight_, w2_packed_);
  d.layout("w13 group scales transposed per expert", w13_scales_, w13_scales_t_, transpose_scales);
  d.layout("w2 group scales transposed per expert", w2_scales_, w2_scales_t_, transpose_scales);
}

at::Tensor W4A8Moe::forward(const at::Tensor& x, const at::Tensor& logits) {
  return apply_experts("W4A8Moe", experts_.get(), hidden_, num_experts_,
                       {x, logits, w13_packed_, w2_packed_, w13_scales_t_, w2_scales_t_});
}

}  // namespace gk::kernels

GRAPHKEEP_REGISTER_TYPE(gk::kernels::CutlassW4A8Experts);
