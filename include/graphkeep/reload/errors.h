// graphkeep/reload/errors.h
//
// The reload layer's own errors (the rest of the family, and GK_CHECK, are in
// graphkeep/core/check.h):
//   gk::MismatchError  PWAL changed a slot's layout or a captured
//                      configuration value; recapture the graphs
//   gk::DriftError     a captured address is no longer covered by its slot;
//                      the engine refuses replay
#pragma once

#include <graphkeep/core/check.h>

#include <string>
#include <vector>

namespace gk {

// PWAL changed a slot's shape, dtype, strides, device or storage size, or a
// captured configuration value: the graphs must be recaptured. `paths()`
// lists every affected slot.
class MismatchError : public Error {
 public:
  MismatchError(std::string m, std::vector<std::string> paths = {}, SourceLocation w = {})
      : Error(ErrorKind::mismatch, std::move(m), w), paths_(std::move(paths)) {}
  explicit MismatchError(std::string m) : MismatchError(std::move(m), {}) {}
  const std::vector<std::string>& paths() const noexcept { return paths_; }

 private:
  std::vector<std::string> paths_;
};
class DriftError : public Error {
 public:
  explicit DriftError(std::string m, SourceLocation w = {}) : Error(ErrorKind::drift, std::move(m), w) {}
};

}  // namespace gk
