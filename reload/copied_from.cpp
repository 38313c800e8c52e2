#include "copied_from.h"

#include <algorithm>

namespace gk::detail {

void CopiedFrom::add(const void* to, const void* from, std::size_t n) {
  if (n == 0) return;
  const Copy c{reinterpret_cast<std::uintptr_t>(to), reinterpret_cast<std::uintptr_t>(from), n, false};
  // Loads usually arrive in the parameter's order: no sort is needed.
  if (!copies_.empty() && copies_.back().to > c.to) in_order_ = false;
  copies_.push_back(c);
  sorted_ = false;
}

void CopiedFrom::sort() const {
  if (sorted_) return;
  if (!in_order_)
    std::stable_sort(copies_.begin(), copies_.end(), [](const Copy& a, const Copy& b) { return a.to < b.to; });
  // Sorted by start, a copy overlaps another iff an earlier one ends past
  // its start or the next one starts before its end.
  std::uintptr_t end = 0;
  for (std::size_t i = 0; i < copies_.size(); ++i) {
    Copy& c = copies_[i];
    c.overlapped = end > c.to || (i + 1 < copies_.size() && copies_[i + 1].to < c.to + c.n);
    end = std::max(end, c.to + c.n);
  }
  sorted_ = in_order_ = true;
}

const void* CopiedFrom::source_of(const void* p, std::size_t n) const {
  if (copies_.empty() || n == 0) return nullptr;
  sort();
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  // The last copy starting at or before p.
  const auto it = std::upper_bound(copies_.begin(), copies_.end(), at,
                                   [](std::uintptr_t x, const Copy& c) { return x < c.to; });
  if (it == copies_.begin()) return nullptr;
  const Copy& c = *(it - 1);
  // Not inside this copy, or written twice (which write came last is not
  // known here).
  if (at - c.to + n > c.n || c.overlapped) return nullptr;
  return reinterpret_cast<const void*>(c.from + (at - c.to));
}

}  // namespace gk::detail
