// graphkeep/quant/catalog.h: the quantization types of quant/, as
// compile-time lists (graphkeep/catalog.h joins them with the kernels').
//   MarlinTypes  site 5   Marlin W4A16 act-order: lock workspace + g_idx_sort_indices
//                site 6   Marlin FP8 / FP4 / MoE siblings, each with its own lock workspace
//                site 12  Machete act-order: the act_perm closure as a registered functor
//                site 13  compressed-tensors W8A8 int8: scales cloned in PWAL
//   ScalesTypes  site 7   FP8/FP4 MLA weights and scales
//                site 8   B12x MoE input scales and swizzled scale factors
//                site 9   NVFP4 MoE alphas and global scales
#pragma once

#include <graphkeep/quant/act_order.h>
#include <graphkeep/quant/fp8_mla_attention.h>
#include <graphkeep/quant/marlin.h>
#include <graphkeep/quant/moe_scales_b12x.h>
#include <graphkeep/quant/nvfp4_cutlass_moe.h>
#include <graphkeep/quant/w8a8.h>
#include <graphkeep/registry/type_registry.h>

namespace gk::quant {
using MarlinTypes = TypeList<MarlinW4A16Kernel, MarlinW4A16Linear, MarlinFp8Kernel, MarlinFp8Linear, MarlinFp4Kernel,
                             MarlinFp4Linear, MarlinMoeKernel, MarlinMoeLayer, ActPerm, MacheteLinearMethod,
                             MacheteW4A16Linear, CompressedTensorsW8A8Int8, W8A8Int8Linear>;
using ScalesTypes = TypeList<QuantizedMlaAttention, B12xNvfp4Moe, Nvfp4CutlassMoe>;
using Types = concat_t<MarlinTypes, ScalesTypes>;
}  // namespace gk::quant
