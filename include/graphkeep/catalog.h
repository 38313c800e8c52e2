// graphkeep/catalog.h
//
// The project's static registry: every kernel and quantization type that
// graphkeep ships, as one compile-time list. `gk-slots` prints its table.
//
//   using R = gk::Registry<gk::ProjectTypes>;
//   constexpr auto table = R::table();
#pragma once

#include <graphkeep/kernels/catalog.h>
#include <graphkeep/quant/catalog.h>
#include <graphkeep/registry/type_registry.h>

namespace gk {
using ProjectTypes = concat_t<kernels::Types, quant::Types>;
}  // namespace gk
