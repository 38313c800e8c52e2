// graphkeep/kernels/catalog_marlin.h: registered types of the marlin failure sites.
//   site 5   Marlin W4A16 act-order: lock workspace + g_idx_sort_indices
//   site 6   Marlin FP8 / FP4 / MoE siblings, each with its own lock workspace
//   site 12  Machete act-order: the act_perm closure as a registered functor
//   site 13  compressed-tensors W8A8 int8: scales cloned in PWAL
#pragma once

#include <graphkeep/quant/act_order.h>
#include <graphkeep/quant/marlin.h>
#include <graphkeep/quant/w8a8.h>
#include <graphkeep/registry/registry.h>

namespace gk::kernels {
using MarlinTypes =
    TypeList<quant::MarlinW4A16Kernel, quant::MarlinW4A16Linear, quant::MarlinFp8Kernel, quant::MarlinFp8Linear,
             quant::MarlinFp4Kernel, quant::MarlinFp4Linear, quant::MarlinMoeKernel, quant::MarlinMoeLayer,
             quant::ActPerm, quant::MacheteLinearMethod, quant::MacheteW4A16Linear, quant::CompressedTensorsW8A8Int8,
             quant::W8A8Int8Linear>;
}  // namespace gk::kernels
