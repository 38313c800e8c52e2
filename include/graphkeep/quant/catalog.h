// graphkeep/quant/catalog.h: the quantization types of quant/, as
// compile-time lists (graphkeep/catalog.h joins them with the kernels').
//
// A new type is one row of a list below (`TypeList<MyMethod>,`), and a new
// header one #include; each list ends in TypeList<>, so that every row ends
// in a comma (see graphkeep/kernels/catalog.h).
#pragma once

#include <graphkeep/quant/act_order.h>
#include <graphkeep/quant/fp8_mla_attention.h>
#include <graphkeep/quant/marlin.h>
#include <graphkeep/quant/moe_scales_b12x.h>
#include <graphkeep/quant/nvfp4_cutlass_moe.h>
#include <graphkeep/quant/w8a8.h>
#include <graphkeep/registry/type_registry.h>

namespace gk::quant {

// Lock workspaces, permutations and scheme scales.
using MarlinTypes = concat_t<TypeList<MarlinW4A16Kernel>,          // site 5: lock workspace + g_idx_sort_indices
                             TypeList<MarlinW4A16Linear>,          //
                             TypeList<MarlinFp8Kernel>,            // site 6: the siblings, each with its own locks
                             TypeList<MarlinFp8Linear>,            //
                             TypeList<MarlinFp4Kernel>,            //
                             TypeList<MarlinFp4Linear>,            //
                             TypeList<MarlinMoeKernel>,            //
                             TypeList<MarlinMoeLayer>,             //
                             TypeList<ActPerm>,                    // site 12: the act_perm closure as a functor
                             TypeList<MacheteLinearMethod>,        //
                             TypeList<MacheteW4A16Linear>,         //
                             TypeList<CompressedTensorsW8A8Int8>,  // site 13: W8A8 scales cloned in PWAL
                             TypeList<W8A8Int8Linear>,             //
                             TypeList<>>;

// Derived scales.
using ScalesTypes = concat_t<TypeList<QuantizedMlaAttention>,  // site 7: FP8/FP4 MLA weights and scales
                             TypeList<B12xNvfp4Moe>,           // site 8: MoE input scales, swizzled scale factors
                             TypeList<Nvfp4CutlassMoe>,        // site 9: NVFP4 MoE alphas and global scales
                             TypeList<>>;

using Types = concat_t<MarlinTypes, ScalesTypes>;

}  // namespace gk::quant
