// graphkeep/kernels/catalog_moe.h: registered types of the moe failure sites.
#pragma once

#include <graphkeep/registry/registry.h>

namespace gk::kernels {
using MoeTypes = TypeList<>;
}  // namespace gk::kernels
