// The writes a patch makes into layout-derived members.
//
// Note [Patches through layout derivations]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A member declared by_layout() holds elements of one checkpoint parameter,
// moved (Note [Layout derivations] in graphkeep/model/block_derivation.h).
// prepare() learned, for every output element that holds a source element,
// the source index, and sorted those: `sorted_source` and `position`, 8
// bytes per output element (int32; 16 past 2^31 elements): a shuffled
// expert weight in bf16 costs four times its bytes, per-group scales,
// strides and permutations are small.
// A patch then lands without PWAL:
//   1. the entries landing in the source are put in its flat coordinates,
//      as for block derivations;
//   2. each changed element's run of output positions is found by two
//      binary searches in `sorted_source` (a broadcast puts one source
//      element in several places, a narrow in none);
//   3. the runs' total length is read back: one synchronization per layer,
//      for all of its layouts;
//   4. the values are written at those positions, with their undo, in the
//      same commit as the parameter.
// Work and memory are O(changed elements x their copies); nothing reads the
// whole output. The full reload's check (fn of the parameter, compared with
// what PWAL built) is what makes the map trustworthy.
#include "layout_landing.h"

#include "block_landing.h"

#include <graphkeep/delta/detail/element_bits.h>

#include <ATen/ATen.h>

namespace gk {

std::size_t land_layout_elements(const LayerPlan& lp, const std::vector<PatchLanding>& ls, StagedPatch& sp) {
  struct Touched {
    const PlannedLayout* layout;
    at::Tensor lo, counts, values;
  };
  std::vector<Touched> touched;
  std::vector<at::Tensor> totals;
  for (const PlannedLayout& l : lp.layouts) {
    // 1. The entries in the source's flat coordinates.
    const auto [flat, values] = entries_in_source(lp.slots[l.source].captured, ls);
    if (!flat.defined() || l.sorted_source.numel() == 0) continue;
    const at::Tensor f = flat.to(l.sorted_source.scalar_type());
    // 2. Each element's run of output positions.
    const at::Tensor lo = at::searchsorted(l.sorted_source, f);
    const at::Tensor counts = at::searchsorted(l.sorted_source, f, /*out_int32=*/false, /*right=*/true) - lo;
    touched.push_back({&l, lo, counts, values});
    totals.push_back(counts.sum().reshape({1}));
  }
  if (touched.empty()) return 0;
  // 3. The runs' lengths: the one synchronization.
  const at::Tensor total = at::cat(totals).cpu();
  std::size_t written = 0;
  for (std::size_t t = 0; t < touched.size(); ++t) {
    const std::int64_t n = total[static_cast<std::int64_t>(t)].item<std::int64_t>();
    if (n == 0) continue;
    const Touched& u = touched[t];
    // 4. Element j of the runs is position[lo[e] + (j - start of e's run)] of entry e.
    const at::Tensor starts = at::cumsum(u.counts, 0) - u.counts;
    const at::Tensor at_run = at::repeat_interleave(u.lo - starts, u.counts, /*dim=*/0, n) +
                              at::arange(n, u.lo.options());
    const at::Tensor positions = u.layout->position.index_select(0, at_run).to(at::kLong);
    const at::Tensor bits = u.values.index_select(0, at::repeat_interleave(
                                                         at::arange(u.counts.numel(), u.lo.options()), u.counts, 0, n));
    add_indexed_write(sp, lp.slots[u.layout->output].captured, positions, bits);
    written += static_cast<std::size_t>(n);
  }
  return written;
}

}  // namespace gk
