// examples/engine/compare.h
//
// Comparisons of outputs (logits, any floating tensors) that fail on NaN and
// Inf. The usual idiom drops them: `std::max(worst, (a - b).abs().max())` is
// `worst` when the difference is NaN (std::max(0.0, NaN) == 0.0), so an
// engine serving all-NaN logits "matches" its reference; at::allclose and
// at::equal call +Inf equal to +Inf. Here any value that is not finite, in
// either tensor, makes the comparison fail, and the reported difference is
// NaN or Inf rather than a small number. Header-only (ATen alone): the
// example programs, the tests and the fuzz targets share it.
//
//   demo::MaxDiff d;
//   d.add(got, want);                     // any number of pairs
//   d.within(1e-4)                        // all finite, max |got - want| <= 1e-4 * max(1, max |want|)
//   d.equal()                             // all finite and every difference 0
//   demo::bitwise_equal(got, want)        // same shape, dtype and bits, every value finite
//   demo::all_close(got, want, 1e-3, 1e-3)  // at::allclose, every value finite
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace demo {

// The number of elements of `t` that are NaN or +-Inf (0 for integer tensors).
inline std::int64_t count_nonfinite(const at::Tensor& t) {
  if (!at::isFloatingType(t.scalar_type()) || t.numel() == 0) return 0;
  return t.numel() - at::isfinite(t).sum().item<std::int64_t>();
}

// The larger of a and b, NaN if either is NaN (std::max keeps its first
// argument when the second is NaN).
inline double max_keep_nan(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return std::max(a, b);
}

// The largest difference over any number of (got, want) pairs.
class MaxDiff {
 public:
  // got and want: the same shape (a mismatch counts as a non-finite pair).
  void add(const at::Tensor& got, const at::Tensor& want) {
    if (got.sizes() != want.sizes()) {
      max_abs_ = std::numeric_limits<double>::quiet_NaN();
      ++nonfinite_;
      return;
    }
    nonfinite_ += count_nonfinite(got) + count_nonfinite(want);
    if (got.numel() == 0) return;
    max_abs_ = max_keep_nan(max_abs_, (got - want).abs().max().item<double>());
    max_ref_ = max_keep_nan(max_ref_, want.abs().max().item<double>());
  }
  void add(const MaxDiff& other) {
    max_abs_ = max_keep_nan(max_abs_, other.max_abs_);
    max_ref_ = max_keep_nan(max_ref_, other.max_ref_);
    nonfinite_ += other.nonfinite_;
  }

  // max |got - want|: NaN or Inf when some value was not finite.
  double max_abs() const { return max_abs_; }
  // max |want|.
  double max_ref() const { return max_ref_; }
  // max_abs() / max(1, max_ref()), NaN when either is not finite.
  double rel() const {
    if (!std::isfinite(max_abs_) || !std::isfinite(max_ref_)) return std::numeric_limits<double>::quiet_NaN();
    return max_abs_ / std::max(1.0, max_ref_);
  }
  // Elements of got or want that were NaN or Inf.
  std::int64_t nonfinite() const { return nonfinite_; }
  bool finite() const { return nonfinite_ == 0 && std::isfinite(max_abs_) && std::isfinite(max_ref_); }
  bool within(double tol) const { return finite() && rel() <= tol; }
  bool equal() const { return finite() && max_abs_ == 0; }

 private:
  double max_abs_ = 0, max_ref_ = 0;
  std::int64_t nonfinite_ = 0;
};

// Same shape, dtype and bits, and every value finite.
inline bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type() || a.device() != b.device()) return false;
  return count_nonfinite(a) == 0 && count_nonfinite(b) == 0 && at::equal(a, b);
}

// at::allclose(a, b, rtol, atol) with the same shape and every value finite.
inline bool all_close(const at::Tensor& a, const at::Tensor& b, double rtol, double atol) {
  if (a.sizes() != b.sizes()) return false;
  return count_nonfinite(a) == 0 && count_nonfinite(b) == 0 && at::allclose(a, b, rtol, atol);
}

}  // namespace demo
