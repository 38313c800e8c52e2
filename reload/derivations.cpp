// Holding declared derivations to their word (Note [Declared derivations] in
// graphkeep/registry/role.h): every full reload, and every patch that re-runs
// a layer's PWAL, compares what PWAL built with what the declaration
// predicts before anything reaches captured storage.
#include "derivations.h"

#include "engine_impl.h"
#include "reload_internal.h"

#include <graphkeep/core/check.h>
#include <graphkeep/delta/detail/element_bits.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <string_view>

namespace gk::detail {
namespace {

// The tensor's elements as integers of their size (bitwise comparison: NaN
// payloads and -0.0 compare as the bits they are); wider ones as values.
at::Tensor as_bits(const at::Tensor& t) {
  const std::size_t n = t.element_size();
  return n == 1 || n == 2 || n == 4 || n == 8 ? t.view(bits_dtype(n)) : t;
}

// "ab_strides1" of "experts_.strides_.ab_strides1", for "<Owner>::<member>".
std::string member_name(const std::string& local) {
  const std::size_t dot = local.find_last_of('.');
  return dot == std::string::npos ? local : local.substr(dot + 1);
}

std::string member_of(const PlannedSlot& s) { return concat(s.owner, "::", member_name(s.local)); }

const char* to_string(BlockLayout l) {
  switch (l) {
    case BlockLayout::same_as_source: return "same_as_source";
    case BlockLayout::one_per_block: return "one_per_block";
    case BlockLayout::one_per_block_transposed: return "one_per_block_transposed";
  }
  return "?";
}

// The number of elements a derivation output holds.
std::int64_t output_numel(const PlannedDerivation& d, BlockLayout l, std::int64_t n, std::int64_t k) {
  return l == BlockLayout::same_as_source ? n * k : (n / d.block_rows) * (k / d.block_cols);
}

}  // namespace

const PlannedDerivation* derivation_of(const LayerPlan& lp, std::size_t slot) {
  for (const PlannedDerivation& d : lp.derivations)
    for (const PlannedDerivation::Output& o : d.outputs)
      if (o.slot == slot) return &d;
  return nullptr;
}

void bind_block_derivations(LayerPlan& lp, const std::vector<std::string>& left_out) {
  lp.derivations.clear();
  if (lp.layer == nullptr) return;
  Derivations declared;
  lp.layer->declare_derivations(declared);
  auto slot_of = [&](const at::Tensor& t) -> std::ptrdiff_t {
    if (!t.defined()) return -1;
    for (std::size_t i = 0; i < lp.slots.size(); ++i)
      if (lp.slots[i].defined() && same_region(lp.slots[i].captured, t)) return static_cast<std::ptrdiff_t>(i);
    return -1;
  };
  bool dropped = false;
  for (const BlockDerivation& b : declared.list()) {
    const std::string what = concat("block derivation '", b.name, "' of layer '", lp.prefix, "'");
    PlannedDerivation d;
    d.name = b.name;
    d.block_rows = b.block_rows;
    d.block_cols = b.block_cols;
    d.fn = b.fn;
    GK_CHECK(DeclarationError, static_cast<bool>(b.fn), what, " has no function");
    const std::ptrdiff_t src = slot_of(b.source);
    const bool checkpoint = src >= 0 && lp.slots[static_cast<std::size_t>(src)].kind != PlannedSlot::Kind::declared &&
                            std::any_of(lp.params.begin(), lp.params.end(), [&](const CheckpointParam& cp) {
                              return cp.param == lp.slots[static_cast<std::size_t>(src)].local;
                            });
    GK_CHECK(DeclarationError, checkpoint, what, " reads a source that is not a checkpoint parameter of the layer (",
             b.source.defined() ? concat(b.source.scalar_type(), " ", b.source.sizes()) : std::string("undefined"),
             "): a block derivation computes a derived member from one parameter that checkpoint_params() lists; "
             "pass that parameter's field");
    d.source = static_cast<std::size_t>(src);
    const at::Tensor& s = b.source;
    GK_CHECK(DeclarationError, s.dim() == 2 && s.is_contiguous() && b.block_rows > 0 && b.block_cols > 0 &&
             s.size(0) % b.block_rows == 0 && s.size(1) % b.block_cols == 0,
             what, ": its source '", lp.slots[d.source].local, "' is ", s.sizes(), (s.is_contiguous() ? "" : " (not contiguous)"),
             ", which blocks of ", b.block_rows, "x", b.block_cols, " do not tile (a 2-D contiguous parameter whose "
             "sizes the block's divide)");
    bool complete = true;
    for (const BlockOutput& o : b.outputs) {
      const std::ptrdiff_t i = slot_of(o.tensor);
      if (i < 0 && !left_out.empty()) {
        complete = false;  // a testing hook left the member out of the plan
        continue;
      }
      GK_CHECK(DeclarationError, i >= 0, what, " names an output (",
               o.tensor.defined() ? concat(o.tensor.scalar_type(), " ", o.tensor.sizes()) : std::string("undefined"),
               ") that is no member of the layer: pass the field of a member declared by_blocks()");
      const PlannedSlot& slot = lp.slots[static_cast<std::size_t>(i)];
      GK_CHECK(DeclarationError, slot.kind == PlannedSlot::Kind::declared && slot.role.derive == Derive::blocks,
               slot.kind == PlannedSlot::Kind::declared ? member_of(slot) : concat("'", slot.local, "'"),
               " is an output of ", what, ", but ",
               slot.kind == PlannedSlot::Kind::declared
                   ? concat("its descriptor declares it ", to_string(slot.role.role),
                            slot.role.derive == Derive::undeclared ? "" : concat(".", to_string(slot.role.derive), "()"),
                            ": declare it gk::", to_string(slot.role.role), ".by_blocks()")
                   : std::string("it is a parameter or buffer of the module: a derivation computes derived members"));
      const std::int64_t want = output_numel(d, o.layout, s.size(0), s.size(1));
      GK_CHECK(DeclarationError, o.tensor.is_contiguous() && o.tensor.numel() == want, member_of(slot), " (", slot.name,
               ") is ", o.tensor.sizes(), o.tensor.is_contiguous() ? "" : " (not contiguous)", ", but as output ",
               to_string(o.layout), " of ", what, " over blocks of ", b.block_rows, "x", b.block_cols, " of ",
               s.sizes(), " it must hold ", want, " elements, contiguous");
      d.outputs.push_back({static_cast<std::size_t>(i), o.layout});
    }
    if (!complete) {
      dropped = true;
      continue;
    }
    lp.derivations.push_back(std::move(d));
  }
  for (std::size_t i = 0; i < lp.slots.size(); ++i) {
    PlannedSlot& slot = lp.slots[i];
    if (slot.role.derive != Derive::blocks || !slot.defined() || derivation_of(lp, i) != nullptr) continue;
    if (dropped) {
      slot.role.derive = Derive::undeclared;  // its derivation was left out with a member: the layer re-runs
      continue;
    }
    GK_THROW(DeclarationError, member_of(slot), " (", slot.name, ") is declared ", to_string(slot.role.role),
             ".by_blocks(), but layer '", lp.prefix, "' binds no block derivation to it: bind it in the layer's "
             "declare_derivations() (graphkeep/model/block_derivation.h), or drop .by_blocks() (a weight patch then "
             "re-runs the layer's PWAL)");
  }
}

void check_block_outputs(const LayerPlan& lp, const PlannedDerivation& d, const std::vector<at::Tensor>& outs,
                         std::int64_t count, std::string_view after) {
  GK_CHECK(DeclarationError, outs.size() == d.outputs.size(), "block derivation '", d.name, "' of layer '", lp.prefix,
           "' returned ", outs.size(), " tensors for its ", d.outputs.size(), " outputs; ", after);
  for (std::size_t j = 0; j < outs.size(); ++j) {
    const PlannedSlot& slot = lp.slots[d.outputs[j].slot];
    const std::int64_t per = d.outputs[j].layout == BlockLayout::same_as_source ? d.block_rows * d.block_cols : 1;
    GK_CHECK(DeclarationError, outs[j].numel() == count * per && outs[j].scalar_type() == slot.dtype,
             "block derivation '", d.name, "' of layer '", lp.prefix, "' returned ", outs[j].scalar_type(), " ",
             outs[j].sizes(), " for ", count, " blocks of output ", member_of(slot), ", which is ", slot.dtype,
             " with ", per, " element(s) per block; ", after);
  }
}

at::Tensor block_elements(const at::Tensor& ids, std::int64_t bh, std::int64_t bw, std::int64_t k) {
  const std::int64_t nbc = k / bw, count = ids.numel();
  const auto longs = ids.options().dtype(at::kLong);
  const at::Tensor rows = (ids.div(nbc, "floor") * bh).view({count, 1, 1}) + at::arange(bh, longs).view({1, bh, 1});
  const at::Tensor cols = (ids.remainder(nbc) * bw).view({count, 1, 1}) + at::arange(bw, longs).view({1, 1, bw});
  return (rows * k + cols).reshape({-1});
}

at::Tensor block_output_index(BlockLayout layout, const at::Tensor& ids, const at::Tensor& elements, std::int64_t nbr,
                              std::int64_t nbc) {
  switch (layout) {
    case BlockLayout::same_as_source: return elements;
    case BlockLayout::one_per_block: return ids;
    case BlockLayout::one_per_block_transposed: return ids.remainder(nbc) * nbr + ids.div(nbc, "floor");
  }
  return ids;
}

// Note [Checking block derivations in chunks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The check runs at prepare() and after every full reload's PWAL, on every
// block of every declared source: for an 8B FP8 model, the whole model
// quantized once more. Built in one piece, the prediction would widen a
// projection to float32 beside PWAL's output (the peak Note [FP8
// quantization in chunks] in the example engine avoids). So the blocks are
// taken kCheckChunk source elements at a time, first the even blocks, then
// the odd ones (each chunk sees other neighbours than PWAL saw, which is
// what catches a function reading beyond its block), each chunk compared
// with the elements PWAL built for it, and the verdicts folded on the
// device: one synchronization per layer. Only a mismatch walks the chunks
// again, to name the first differing element.
constexpr std::int64_t kCheckChunk = std::int64_t{1} << 22;

void check_block_derivations(const LayerPlan& lp, const std::vector<at::Tensor>& current, std::string_view after,
                             const std::vector<char>* mismatched) {
  if (lp.derivations.empty()) return;
  auto skipped = [&](const PlannedDerivation& d) {  // a layout mismatch is reported by the pipeline
    if (mismatched == nullptr) return false;
    if ((*mismatched)[d.source]) return true;
    for (const PlannedDerivation::Output& o : d.outputs)
      if ((*mismatched)[o.slot]) return true;
    return false;
  };
  auto now = [&](std::size_t i) -> const at::Tensor& {
    return i < current.size() && current[i].defined() ? current[i] : lp.slots[i].captured;
  };
  // Calls f(output, index into the output, predicted bits, built bits) for
  // every chunk of d's blocks.
  auto for_each_chunk = [&](const PlannedDerivation& d, const auto& f) {
    const at::Tensor src = now(d.source);
    const std::int64_t n = src.size(0), k = src.size(1), bh = d.block_rows, bw = d.block_cols;
    const std::int64_t nbr = n / bh, nbc = k / bw, nb = nbr * nbc;
    const std::int64_t per_call = std::max<std::int64_t>(1, kCheckChunk / (bh * bw));
    const at::Tensor flat_src = detail::flat_bits(src.contiguous());
    std::vector<at::Tensor> built;  // what PWAL built, flat, as bits: once, not per chunk
    for (const PlannedDerivation::Output& o : d.outputs) built.push_back(as_bits(now(o.slot).contiguous().reshape({-1})));
    for (std::int64_t parity = 0; parity < std::min<std::int64_t>(2, nb); ++parity)
      for (std::int64_t start = parity; start < nb; start += 2 * per_call) {
        const at::Tensor ids = at::arange(start, std::min(nb, start + 2 * per_call), 2, src.options().dtype(at::kLong));
        const at::Tensor elements = block_elements(ids, bh, bw, k);
        const at::Tensor blocks = flat_src.index_select(0, elements).view(src.scalar_type()).view({ids.numel(), bh, bw});
        const std::vector<at::Tensor> outs = d.fn(blocks);
        check_block_outputs(lp, d, outs, ids.numel(), after);
        for (std::size_t j = 0; j < outs.size(); ++j) {
          const at::Tensor index = block_output_index(d.outputs[j].layout, ids, elements, nbr, nbc);
          f(j, index, as_bits(outs[j].contiguous()).reshape({-1}), built[j].index_select(0, index));
        }
      }
  };
  struct Verdict {
    const PlannedDerivation* d;
    std::size_t output;
  };
  std::vector<Verdict> verdicts;
  std::vector<at::Tensor> differs;
  for (const PlannedDerivation& d : lp.derivations) {
    if (skipped(d)) continue;
    const std::size_t first = differs.size();
    for (std::size_t j = 0; j < d.outputs.size(); ++j) {
      verdicts.push_back({&d, j});
      differs.push_back(at::zeros({1}, now(d.source).options().dtype(at::kBool)));
    }
    for_each_chunk(d, [&](std::size_t j, const at::Tensor&, const at::Tensor& predicted, const at::Tensor& built) {
      differs[first + j].logical_or_(at::ne(predicted, built).any().reshape({1}));
    });
  }
  if (differs.empty()) return;
  const at::Tensor any = at::cat(differs).cpu();  // one synchronization for the layer
  const bool* flag = any.data_ptr<bool>();
  for (std::size_t v = 0; v < verdicts.size(); ++v) {
    if (!flag[v]) continue;
    const PlannedDerivation& d = *verdicts[v].d;
    const std::size_t out = verdicts[v].output;
    const PlannedSlot& slot = lp.slots[d.outputs[out].slot];
    // The first differing element, chunk by chunk (a failure: time is no concern).
    std::int64_t first = -1;
    double was = 0, want = 0;
    for_each_chunk(d, [&](std::size_t j, const at::Tensor& index, const at::Tensor& predicted, const at::Tensor& built) {
      if (j != out) return;
      const at::Tensor pos = at::nonzero(at::ne(predicted, built)).reshape({-1});
      if (pos.numel() == 0) return;
      const std::int64_t p = pos[0].item<std::int64_t>(), element = index[p].item<std::int64_t>();
      if (first >= 0 && element >= first) return;
      first = element;
      was = built.narrow(0, p, 1).view(slot.dtype).to(at::kDouble).item<double>();
      want = predicted.narrow(0, p, 1).view(slot.dtype).to(at::kDouble).item<double>();
    });
    GK_THROW(DeclarationError, member_of(slot), " is declared ", to_string(slot.role.role),
             ".by_blocks() and bound to block derivation '", d.name, "' (blocks of ", d.block_rows, "x", d.block_cols,
             " of '", lp.slots[d.source].local, "', ", to_string(d.outputs[out].layout), "), but PWAL of layer '",
             lp.prefix, "' built ", slot.name, " otherwise: element ", first, " is ", was, " where the derivation gives ",
             want, ". The function is not what PWAL computes, or a block depends on more than its own elements: fix "
             "the derivation, or drop .by_blocks() (a weight patch then re-runs this layer's PWAL); ", after);
  }
}

bool patch_leaves_unchanged(const PlannedSlot& s) { return s.role.derive == Derive::from_shapes; }

void check_declared_derivations(const LayerPlan& lp, const std::vector<at::Tensor>& current,
                                const std::vector<char>& mismatched) {
  check_block_derivations(lp, current, "nothing was copied into captured storage for this layer", &mismatched);
  std::vector<std::size_t> which;
  std::vector<at::Tensor> differs;
  for (std::size_t i = 0; i < lp.slots.size(); ++i) {
    const PlannedSlot& s = lp.slots[i];
    if (!patch_leaves_unchanged(s) || !s.defined() || mismatched[i] || !current[i].defined() ||
        current[i].numel() == 0 || same_storage_and_offset(current[i], s.captured))
      continue;
    which.push_back(i);
    differs.push_back(at::ne(as_bits(current[i]), as_bits(s.captured)).any().reshape({1}));
  }
  if (which.empty()) return;
  const at::Tensor any = at::cat(differs).cpu();  // one synchronization for the layer
  const bool* d = any.data_ptr<bool>();
  for (std::size_t j = 0; j < which.size(); ++j) {
    if (!d[j]) continue;
    const PlannedSlot& s = lp.slots[which[j]];
    const at::Tensor now = current[which[j]].reshape({-1}), was = s.captured.reshape({-1});
    const std::int64_t at = at::nonzero(at::ne(as_bits(now), as_bits(was))).reshape({-1})[0].item<std::int64_t>();
    GK_THROW(DeclarationError, s.owner, "::", member_name(s.local), " is declared ", to_string(s.role.role),
             ".from_shapes() (a function of shapes and configuration alone), but PWAL of layer '", lp.prefix,
             "' built ", s.name, " with other values from these weights: element ", at, " was ",
             was[at].item().toDouble(), " and is now ", now[at].item().toDouble(),
             ". It depends on the checkpoint's values: drop .from_shapes() from its declaration (a weight patch "
             "then re-runs this layer's PWAL). Nothing was copied into captured storage for this layer");
  }
}

}  // namespace gk::detail
