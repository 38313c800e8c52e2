// graphkeep/kernels/catalog.h: the kernel and layer types of kernels/ (failure
// sites 1, 2, 3, 4, 10 and 11 of the seed RFC), as one compile-time list.
// The quantization types are in graphkeep/quant/catalog.h; graphkeep/catalog.h
// joins both.
#pragma once

#include <graphkeep/kernels/catalog_moe.h>
#include <graphkeep/kernels/mla_attention.h>
#include <graphkeep/kernels/padded_moe.h>
#include <graphkeep/registry/type_registry.h>

namespace gk::kernels {
using Types = concat_t<TypeList<MlaAttention, PaddedMoe>, MoeTypes>;
}  // namespace gk::kernels
