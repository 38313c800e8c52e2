// graphkeep/kernels/catalog.h: the kernel and layer types graphkeep ships
// (the failure sites of the seed RFC), as one compile-time list.
#pragma once

#include <graphkeep/kernels/catalog_marlin.h>
#include <graphkeep/kernels/catalog_moe.h>
#include <graphkeep/kernels/catalog_scales.h>
#include <graphkeep/kernels/mla_attention.h>
#include <graphkeep/registry/registry.h>

namespace gk::kernels {
using Types = concat_t<TypeList<MlaAttention>, MoeTypes, MarlinTypes, ScalesTypes>;
}  // namespace gk::kernels
