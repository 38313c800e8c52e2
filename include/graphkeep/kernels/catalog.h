// graphkeep/kernels/catalog.h: the kernel and layer types of kernels/ (failure
// sites 1, 2, 3, 4, 10 and 11 of the seed RFC), as compile-time lists. The
// quantization types are in graphkeep/quant/catalog.h; graphkeep/catalog.h
// joins both.
//
// A new type is one row of a list below (`TypeList<MyKernel>,`), and a new
// header one #include: the type joins gk::Registry, so gk-slots lists it and
// the registry's checks (names unique, every type registered) cover it. Each
// list ends in TypeList<>, so that every row, the last one too, ends in a
// comma.
#pragma once

#include <graphkeep/kernels/mla_attention.h>
#include <graphkeep/kernels/moe_cutlass.h>
#include <graphkeep/kernels/moe_experts.h>
#include <graphkeep/kernels/moe_shuffle.h>
#include <graphkeep/kernels/moe_w4a8.h>
#include <graphkeep/kernels/moe_wna16.h>
#include <graphkeep/kernels/padded_moe.h>
#include <graphkeep/registry/type_registry.h>

namespace gk::kernels {

// The MoE sites.
using MoeTypes = concat_t<TypeList<ShuffledMoe>,         // site 2: shuffled expert weights
                          TypeList<MoeExperts>,          // the experts objects' base
                          TypeList<CutlassExperts>,      // site 4: grouped-GEMM stride arrays
                          TypeList<CutlassMoe>,          //
                          TypeList<CutlassW4A8Experts>,  // site 10: W4A8 a/c/s stride arrays
                          TypeList<W4A8Moe>,             //
                          TypeList<SwigluExperts>,       // Qwen3-MoE experts: site 4's stride arrays
                          TypeList<Rdna3Wna16Kernel>,    // site 11: kernel-owned scratch
                          TypeList<Rdna3Wna16Moe>,       //
                          TypeList<>>;

using Types = concat_t<TypeList<MlaAttention>,  // site 1: MLA absorbed weights
                       TypeList<PaddedMoe>,     // site 3: padded MoE weights
                       MoeTypes,
                       TypeList<>>;

}  // namespace gk::kernels
