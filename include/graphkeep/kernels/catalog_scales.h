// graphkeep/kernels/catalog_scales.h: registered types of the scales failure sites.
#pragma once

#include <graphkeep/registry/registry.h>

namespace gk::kernels {
using ScalesTypes = TypeList<>;
}  // namespace gk::kernels
