// graphkeep/quant/catalog.h: the quantization types graphkeep ships.
#pragma once

#include <graphkeep/registry/registry.h>

namespace gk::quant {
using Types = TypeList<>;
}  // namespace gk::quant
