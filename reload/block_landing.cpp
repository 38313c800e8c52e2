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
//      the touched blocks are the unique block numbers, and the entries are
//      sorted by block (one synchronization: the count, and where each chunk
//      of blocks starts among the entries);
//   3. chunk by chunk (kLandChunk source elements), the touched blocks are
//      gathered from the captured source, which still holds the served
//      values (the commit writes later, and a commit after another write is
//      refused as stale), and the chunk's entries applied to the copy;
//   4. the derivation's function computes those blocks of every output.
// Each output becomes one write into its captured storage, with its undo
// gathered now, in whichever form needs less memory:
//   - sparse: the touched elements, in ascending order (sector images need
//     it): an index, a value and an undo value each;
//   - whole: a copy of the output with the touched blocks replaced, and a
//     copy of what it held. A patch of scattered elements touches every
//     row of a weight quantized per row (1 % of the elements is ~40 per row
//     of 4,096): written sparse, an FP8 output's index alone would take 8
//     bytes per 1-byte element, ten times the output with its values and
//     undo; whole, it takes twice the output.
// When the entries are as many as the blocks, every block is recomputed
// instead (Note [Recomputing every block]). The parameter's own writes and
// these commit together, so no replay sees
// a new weight with an old scale; a failed commit writes every undo back.
// The full reload's check (check_block_derivations) is what makes the
// function trustworthy: it equals PWAL over every block, computed apart.
//
// Note [Recomputing every block]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A patch of scattered elements touches nearly every block of a weight
// quantized per row or per group: 1 % of a row of 4,096 is ~40 elements.
// Finding the touched blocks then costs more than it saves: a sort, a
// synchronization for their count, a gather of the blocks and a scatter of
// the results, per derivation (the example engine's 8B FP8 model has 128).
// So when a derivation's source receives at least as many entries as it has
// blocks (the host knows both: the entries' sizes; for entries at random
// positions, at least 63 % of the blocks are touched), every block is
// recomputed instead, as PWAL computes them: the source is copied once
// with the entries applied, and the function runs over it whole block-rows
// at a time, with no index tensor and no synchronization; the outputs are
// written whole. The untouched blocks come out as served: the function is
// block-local and deterministic, and equals PWAL over every block (the
// check above), which is what built or last recomputed them. Its cost
// bounds the dense case: one pass of the function over the source, PWAL's
// own work for the derivation.
#include "block_landing.h"

#include "derivations.h"

#include <graphkeep/core/check.h>
#include <graphkeep/delta/detail/element_bits.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>

namespace gk {
namespace {

// Source elements per call of a derivation's function while landing: its
// working memory (FP8 widens a chunk to float32) stays a few chunks.
constexpr std::int64_t kLandChunk = std::int64_t{1} << 22;

// One output of a derivation being landed: whole (a copy of the output as
// bits, the touched blocks written into it) or sparse (index and bits per
// chunk).
struct OutputWrite {
  at::Tensor whole;
  std::vector<at::Tensor> index, bits;
};

// Writes every block of d's outputs from the source with the entries `f`
// (flat indices) set to `values` (Note [Recomputing every block]), and
// returns the number of blocks.
std::size_t recompute_every_block(const LayerPlan& lp, const PlannedDerivation& d, const at::Tensor& src,
                                  const at::Tensor& f, const at::Tensor& values, std::int64_t chunk, StagedPatch& sp) {
  const std::int64_t k = d.cols, bh = d.block_rows, bw = d.block_cols;
  const std::int64_t nbr = d.rows / bh, nbc = k / bw;
  const at::Tensor patched = detail::flat_bits(src).clone();
  patched.index_put_({f}, values);
  std::vector<at::Tensor> whole;
  for (const PlannedDerivation::Output& o : d.outputs)
    whole.push_back(at::empty_like(detail::flat_bits(lp.slots[o.slot].captured)));
  const std::int64_t per_call = std::max<std::int64_t>(1, chunk / (bh * k));  // block-rows
  for (std::int64_t r0 = 0; r0 < nbr; r0 += per_call) {
    const std::int64_t rows = std::min(per_call, nbr - r0), count = rows * nbc;
    // [count, bh, bw], block by block (with one block per block-row, the
    // permutation moves nothing and contiguous() copies nothing).
    const at::Tensor bits = patched.view({nbr, bh, nbc, bw}).narrow(0, r0, rows).permute({0, 2, 1, 3}).contiguous();
    const std::vector<at::Tensor> outs = d.fn(bits.view(src.scalar_type()).view({count, bh, bw}));
    detail::check_block_outputs(lp, d, outs, count, "the patch was not staged");
    for (std::size_t j = 0; j < outs.size(); ++j) {
      const at::Tensor out = detail::flat_bits(outs[j].contiguous());
      const std::int64_t m = d.outputs[j].per_block;
      switch (d.outputs[j].layout) {  // where block_output_index puts them, for a range of whole block-rows
        case BlockLayout::same_as_source:
          whole[j].view({nbr, bh, nbc, bw}).narrow(0, r0, rows).copy_(out.view({rows, nbc, bh, bw}).permute({0, 2, 1, 3}));
          break;
        case BlockLayout::one_per_block: whole[j].narrow(0, r0 * nbc * m, count * m).copy_(out); break;
        case BlockLayout::one_per_block_transposed:
          whole[j].view({nbc * m, nbr}).narrow(1, r0, rows).copy_(out.view({rows, nbc * m}).t());
          break;
      }
    }
  }
  for (std::size_t j = 0; j < d.outputs.size(); ++j) {
    const at::Tensor dst = detail::flat_bits(lp.slots[d.outputs[j].slot].captured);
    sp.undo.push_back({dst, at::Tensor(), dst.clone()});
    sp.writes.push_back({dst, at::Tensor(), std::move(whole[j])});
  }
  return static_cast<std::size_t>(nbr * nbc);
}

}  // namespace

SourceEntries entries_in_source(const at::Tensor& src, const std::vector<PatchLanding>& ls) {
  std::vector<at::Tensor> flat, values;
  for (const PatchLanding& l : ls) {
    if (!l.dst.has_storage() || storage_key(l.dst) != storage_key(src)) continue;
    const std::int64_t off = l.dst.storage_offset() - src.storage_offset();
    if (off < 0 || off + l.dst.numel() > src.numel()) continue;
    GK_INTERNAL_ASSERT(l.dst.is_contiguous(), "a landing in a derivation's source is not contiguous");
    flat.push_back(l.indices.defined() ? l.indices.to(at::kLong) + off
                                       : at::arange(off, off + l.dst.numel(), src.options().dtype(at::kLong)));
    values.push_back(l.values);
  }
  if (flat.empty()) return {};
  return {at::cat(flat), at::cat(values)};
}

void add_indexed_write(StagedPatch& sp, const at::Tensor& dst, const at::Tensor& index, const at::Tensor& values) {
  const at::Tensor bits = detail::flat_bits(dst);
  const auto [sorted, order] = at::sort(index);
  sp.undo.push_back({bits, sorted, at::Tensor()});  // gathered at the end of the stage (gather_items)
  sp.writes.push_back({bits, sorted, values.index_select(0, order)});
}

std::size_t land_derived_blocks(const LayerPlan& lp, const std::vector<PatchLanding>& ls, StagedPatch& sp,
                                std::int64_t chunk_elements) {
  const std::int64_t chunk = chunk_elements > 0 ? chunk_elements : kLandChunk;
  using at::indexing::Slice;
  std::size_t recomputed = 0;
  for (const PlannedDerivation& d : lp.derivations) {
    const at::Tensor src = lp.slots[d.source].captured.view({d.rows, d.cols});
    const std::int64_t n = d.rows, k = d.cols, bh = d.block_rows, bw = d.block_cols;
    const std::int64_t nbr = n / bh, nbc = k / bw;
    const auto longs = src.options().dtype(at::kLong);
    // 1. The entries in the source's flat coordinates.
    const auto [f, values] = entries_in_source(src, ls);
    if (!f.defined()) continue;
    if (f.numel() >= nbr * nbc) {  // Note [Recomputing every block]
      recomputed += recompute_every_block(lp, d, src, f, values, chunk, sp);
      continue;
    }
    // 2. The touched blocks, and the entries sorted by block.
    const at::Tensor r = f.div(k, "floor"), c = f - r * k;
    const at::Tensor b = r.div(bh, "floor") * nbc + c.div(bw, "floor");
    const auto [by_block, order] = at::sort(b, /*stable=*/std::optional<bool>(true), /*dim=*/0, /*descending=*/false);
    const at::Tensor in_block = (r.remainder(bh) * bw + c.remainder(bw)).index_select(0, order);
    const at::Tensor v = values.index_select(0, order);
    // The touched blocks in order, and where each chunk of them starts
    // among the sorted entries: each entry's block ordinal (a running count
    // of block changes), each block's id put at its ordinal, the chunks'
    // first entries found by ordinal; their count and the chunks' starts
    // come to the host together (the one synchronization: at::unique would
    // take another).
    const std::int64_t m = by_block.numel(), per_call = std::max<std::int64_t>(1, chunk / (bh * bw));
    if (m == 0) continue;  // entries that change nothing
    const at::Tensor starts_block = at::ones({m}, longs);
    if (m > 1) starts_block.narrow(0, 1, m - 1).copy_(by_block.narrow(0, 1, m - 1).ne(by_block.narrow(0, 0, m - 1)));
    const at::Tensor ordinal = starts_block.cumsum(0).sub_(1);
    // (Fewer entries than blocks here: at most m blocks, in at most m_chunks chunks.)
    const std::int64_t m_chunks = (m + per_call - 1) / per_call;
    const at::Tensor block_ids = at::empty({m}, longs).index_put_({ordinal}, by_block);  // equal values collide
    const at::Tensor host =
        at::cat({at::searchsorted(ordinal, at::arange(0, m_chunks * per_call, per_call, longs)), ordinal.narrow(0, m - 1, 1) + 1})
            .cpu();
    const std::int64_t* at_host = host.const_data_ptr<std::int64_t>();
    const std::int64_t count = at_host[m_chunks], chunks = (count + per_call - 1) / per_call;
    const at::Tensor u = block_ids.narrow(0, 0, count);
    std::vector<std::int64_t> bounds(at_host, at_host + chunks);
    bounds.push_back(m);
    // Each output whole or sparse, by the memory it takes (Note [Patches
    // through block derivations]).
    std::vector<OutputWrite> w(d.outputs.size());
    for (std::size_t j = 0; j < d.outputs.size(); ++j) {
      const at::Tensor& out = lp.slots[d.outputs[j].slot].captured;
      const std::int64_t e = static_cast<std::int64_t>(out.element_size());
      const std::int64_t touched = count * detail::values_per_block(d, d.outputs[j]);
      // (Some block is untouched here, so whole starts from the old output.)
      if (out.numel() * 2 * e <= touched * (8 + 2 * e)) w[j].whole = detail::flat_bits(out).clone();
    }
    const at::Tensor src_blocks = detail::flat_bits(src).view({nbr, bh, nbc, bw});
    for (std::int64_t ci = 0; ci < chunks; ++ci) {
      const std::int64_t first = ci * per_call, cnt = std::min(per_call, count - first);
      const at::Tensor ids = u.narrow(0, first, cnt);
      const at::Tensor rows = ids.div(nbc, "floor"), cols = ids.remainder(nbc);
      // 3. The chunk's blocks, gathered from the source, with its entries applied.
      at::Tensor blocks = src_blocks.index({rows, Slice(), cols, Slice()}).contiguous();  // [cnt, bh, bw]
      const std::int64_t e0 = bounds[static_cast<std::size_t>(ci)], e1 = bounds[static_cast<std::size_t>(ci) + 1];
      if (e1 > e0) {
        const at::Tensor at_block =
            at::searchsorted(ids, by_block.narrow(0, e0, e1 - e0)) * (bh * bw) + in_block.narrow(0, e0, e1 - e0);
        blocks.view({-1}).index_put_({at_block}, v.narrow(0, e0, e1 - e0));
      }
      // 4. The outputs' blocks.
      const std::vector<at::Tensor> outs = d.fn(blocks.view(src.scalar_type()));
      detail::check_block_outputs(lp, d, outs, cnt, "the patch was not staged");
      for (std::size_t j = 0; j < outs.size(); ++j) {
        const BlockLayout layout = d.outputs[j].layout;
        const at::Tensor bits = detail::flat_bits(outs[j].contiguous());
        if (w[j].whole.defined()) {
          if (layout == BlockLayout::same_as_source)
            w[j].whole.view({nbr, bh, nbc, bw}).index_put_({rows, Slice(), cols, Slice()}, bits.view({cnt, bh, bw}));
          else
            w[j].whole.index_put_({detail::block_output_index(d.outputs[j], ids, {}, nbr, nbc)}, bits);
          continue;
        }
        w[j].index.push_back(detail::block_output_index(
            d.outputs[j], ids,
            layout == BlockLayout::same_as_source ? detail::block_elements(ids, bh, bw, k) : at::Tensor(), nbr, nbc));
        w[j].bits.push_back(bits);
      }
    }
    for (std::size_t j = 0; j < d.outputs.size(); ++j) {
      const at::Tensor dst = detail::flat_bits(lp.slots[d.outputs[j].slot].captured);
      if (w[j].whole.defined()) {
        sp.undo.push_back({dst, at::Tensor(), dst.clone()});
        sp.writes.push_back({dst, at::Tensor(), w[j].whole});
      } else {
        add_indexed_write(sp, lp.slots[d.outputs[j].slot].captured, at::cat(w[j].index), at::cat(w[j].bits));
      }
    }
    recomputed += static_cast<std::size_t>(count);
  }
  return recomputed;
}

}  // namespace gk
