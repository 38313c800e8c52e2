// graphkeep/kernels/catalog_moe.h: registered types of the moe failure sites
// (2: shuffled expert weights, 4: CUTLASS grouped-GEMM stride arrays, 10:
// W4A8 grouped-GEMM a/c/s stride arrays, 11: kernel-owned scratch).
#pragma once

#include <graphkeep/kernels/moe_cutlass.h>
#include <graphkeep/kernels/moe_experts.h>
#include <graphkeep/kernels/moe_shuffle.h>
#include <graphkeep/kernels/moe_w4a8.h>
#include <graphkeep/kernels/moe_wna16.h>
#include <graphkeep/registry/type_registry.h>

namespace gk::kernels {
using MoeTypes = TypeList<ShuffledMoe, MoeExperts, CutlassExperts, CutlassMoe, CutlassW4A8Experts, W4A8Moe,
                          Rdna3Wna16Kernel, Rdna3Wna16Moe>;
}  // namespace gk::kernels
