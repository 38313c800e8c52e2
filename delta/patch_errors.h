// delta/patch_errors.h: how the delta layer names a patch in its errors.
// Internal to the layer.
#pragma once

#include <graphkeep/delta/patch.h>

#include <string_view>

namespace gk::detail {

// The patch's label ("patch file '...'", "in-memory patch ..."), or "patch".
inline std::string_view patch_label(const Patch& patch) {
  return patch.label.empty() ? std::string_view("patch") : std::string_view(patch.label);
}

}  // namespace gk::detail
