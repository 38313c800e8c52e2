// graphkeep/kernels/catalog.h: the kernel types graphkeep ships.
#pragma once

#include <graphkeep/registry/registry.h>

namespace gk::kernels {
using Types = TypeList<>;
}  // namespace gk::kernels
