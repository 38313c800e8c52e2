// graphkeep/delta/non_finite.h
//
// The non-finite values (NaN, +Inf, -Inf) a patch writes: per entry, how
// many, and the first of them with its element. The reload engine refuses a
// patch that writes one at stage time (ReloadOptions::allow_non_finite lets
// it through); with this, a tool refuses or reports it before it ships.
//
//   const gk::Patch p = gk::read_patch("step-42.gkpatch.safetensors");
//   const std::vector<gk::NonFiniteValues> nf = gk::non_finite_values(p);   // one per entry
//   for (std::size_t k = 0; k < nf.size(); ++k)
//     if (nf[k].count > 0)
//       std::cerr << p.entries[k].name << ": " << nf[k].count << " non-finite, the first "
//                 << nf[k].first_value << " at element " << nf[k].first_element << '\n';
//
// Only floating-point dtypes have non-finite values (integers and bool have
// none; float8_e4m3fn has NaN but no infinity). The values are read where
// they are: one pass per entry (at::isfinite; float8 values converted to
// float first), a few numbers per entry left on the device, then one copy to
// the host per device. No validation of its own: give it a patch that
// validate_patch accepts (read_patch and make_patch return such patches).
#pragma once

#include <graphkeep/delta/patch.h>

#include <cstdint>
#include <vector>

namespace gk {

// The non-finite values of one patch entry.
struct NonFiniteValues {
  // How many of the entry's values are NaN or infinite.
  std::int64_t count = 0;
  // The first of them (the lowest element: sparse indices ascend): its flat
  // row-major index in the checkpoint tensor (for a sparse entry the index
  // it is written to, not its position among the values), or -1 when count
  // is 0.
  std::int64_t first_element = -1;
  // Its value as a double: NaN, +inf or -inf (0 when count is 0).
  double first_value = 0;
};

// One per entry of `patch`, in the order of its entries. gk::WeightError
// naming the patch and the tensor when a sparse entry's indices and values
// differ in length or device.
std::vector<NonFiniteValues> non_finite_values(const Patch& patch);

}  // namespace gk
