// The writes a patch makes into block-derived members.
//
// Note [Patches through block derivations]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A layer whose derived members are declared by_blocks() (Note [Declared
// derivations] in graphkeep/registry/role.h) takes a patch without PWAL:
//   1. the entries landing in a derivation's source (a passthrough
//      parameter, written by the scatter) are put in the source's flat
//      coordinates: an entry's flat index i in a destination at storage
//      offset o is element o - source offset + i;
//   2. each element (r, c) lies in block (r / block_rows, c / block_cols);
//      the touched blocks are the unique block numbers (one synchronization:
//      their count);
//   3. the touched blocks are gathered from the captured source, which
//      still holds the served values (the commit writes later, and a commit
//      after another write is refused as stale), and the entries applied to
//      the gathered copy;
//   4. the derivation's function computes those blocks of every output, and
//      each becomes a write into the output's captured storage, in ascending
//      element order (sector images need it), with its undo gathered now.
// The parameter's own writes and these commit together, so no replay sees
// a new weight with an old scale; a failed commit writes every undo back.
// The full reload's check (check_block_derivations) is what makes the
// function trustworthy: it equals PWAL over every block, computed apart.
#include "block_landing.h"

#include "derivations.h"

#include <graphkeep/core/check.h>
#include <graphkeep/delta/detail/element_bits.h>

#include <ATen/ATen.h>

namespace gk {
namespace {


// Adds a write of `values` (bits, one per index) at `index` of `dst`, and its undo.
void add_write(StagedPatch& sp, const at::Tensor& dst, at::Tensor index, at::Tensor values) {
  const at::Tensor bits = detail::flat_bits(dst);
  const auto [sorted, order] = at::sort(index);
  values = values.index_select(0, order);
  sp.undo.push_back({bits, sorted, bits.index_select(0, sorted)});
  sp.writes.push_back({bits, sorted, values});
}

}  // namespace

std::size_t land_derived_blocks(const LayerPlan& lp, const std::vector<PatchLanding>& ls, StagedPatch& sp) {
  std::size_t recomputed = 0;
  for (const PlannedDerivation& d : lp.derivations) {
    const at::Tensor& src = lp.slots[d.source].captured;
    const std::int64_t n = src.size(0), k = src.size(1), bh = d.block_rows, bw = d.block_cols;
    const std::int64_t nbr = n / bh, nbc = k / bw;
    const auto longs = src.options().dtype(at::kLong);
    // 1. The entries in the source's flat coordinates.
    std::vector<at::Tensor> flat, values;
    for (const PatchLanding& l : ls) {
      if (!l.dst.has_storage() || storage_key(l.dst) != storage_key(src)) continue;
      const std::int64_t off = l.dst.storage_offset() - src.storage_offset();
      if (off < 0 || off + l.dst.numel() > src.numel()) continue;
      GK_INTERNAL_ASSERT(l.dst.is_contiguous(), "a landing in a block derivation's source is not contiguous");
      flat.push_back(l.indices.defined() ? l.indices.to(at::kLong) + off : at::arange(off, off + l.dst.numel(), longs));
      values.push_back(l.values);
    }
    if (flat.empty()) continue;
    const at::Tensor f = at::cat(flat), v = at::cat(values);
    // 2. The touched blocks.
    const at::Tensor r = f.div(k, "floor"), c = f - r * k;
    const at::Tensor b = r.div(bh, "floor") * nbc + c.div(bw, "floor");
    const at::Tensor u = std::get<0>(at::_unique(b, /*sorted=*/true));
    const std::int64_t count = u.numel();
    // 3. Their elements, gathered from the source, with the entries applied.
    const at::Tensor elements = detail::block_elements(u, bh, bw, k);
    at::Tensor blocks = detail::flat_bits(src).index_select(0, elements);
    const at::Tensor at_block = at::searchsorted(u, b) * (bh * bw) + r.remainder(bh) * bw + c.remainder(bw);
    blocks.index_put_({at_block}, v);
    // 4. The outputs' blocks.
    const std::vector<at::Tensor> outs = d.fn(blocks.view(src.scalar_type()).view({count, bh, bw}));
    detail::check_block_outputs(lp, d, outs, count, "the patch was not staged");
    for (std::size_t j = 0; j < outs.size(); ++j)
      add_write(sp, lp.slots[d.outputs[j].slot].captured,
                detail::block_output_index(d.outputs[j].layout, u, elements, nbr, nbc),
                detail::flat_bits(outs[j].contiguous()));
    recomputed += static_cast<std::size_t>(count);
  }
  return recomputed;
}

}  // namespace gk
