// graphkeep/kernels/catalog_scales.h: registered types of the scales failure sites
// (3: padded MoE parameters, 7: FP8/FP4 MLA weights and scales, 8: B12x MoE
// input scales and swizzled scale factors, 9: NVFP4 MoE alphas and global scales).
#pragma once

#include <graphkeep/kernels/padded_moe.h>
#include <graphkeep/quant/fp8_mla_attention.h>
#include <graphkeep/quant/moe_scales_b12x.h>
#include <graphkeep/quant/nvfp4_cutlass_moe.h>
#include <graphkeep/registry/registry.h>

namespace gk::kernels {
using ScalesTypes = TypeList<PaddedMoe, quant::QuantizedMlaAttention, quant::B12xNvfp4Moe, quant::Nvfp4CutlassMoe>;
}  // namespace gk::kernels
