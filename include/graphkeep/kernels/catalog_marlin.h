// graphkeep/kernels/catalog_marlin.h: registered types of the marlin failure sites.
#pragma once

#include <graphkeep/registry/registry.h>

namespace gk::kernels {
using MarlinTypes = TypeList<>;
}  // namespace gk::kernels
