// sources/json_depth.h (private to the sources layer)
//
// A bound on JSON nesting checked before parsing: the safetensors header and
// the Hugging Face index are untrusted input, and a parser that recurses per
// level could exhaust the stack on a hostile file.
#pragma once

#include <cstddef>
#include <string_view>

namespace gk::detail {

// The deepest nesting of arrays and objects in `text`, outside strings; stops
// counting as soon as it passes `limit` (a scan without recursion).
std::size_t json_nesting_depth(std::string_view text, std::size_t limit);

}  // namespace gk::detail
