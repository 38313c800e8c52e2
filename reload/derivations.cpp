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
#include <cstring>
#include <span>
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

}  // namespace

std::int64_t values_per_block(const PlannedDerivation& d, const PlannedDerivation::Output& o) {
  return o.layout == BlockLayout::same_as_source ? d.block_rows * d.block_cols : o.per_block;
}

const PlannedLayout* layout_of(const LayerPlan& lp, std::size_t slot) {
  for (const PlannedLayout& l : lp.layouts)
    if (l.output == slot) return &l;
  return nullptr;
}

const PlannedDerivation* derivation_of(const LayerPlan& lp, std::size_t slot) {
  for (const PlannedDerivation& d : lp.derivations)
    for (const PlannedDerivation::Output& o : d.outputs)
      if (o.slot == slot) return &d;
  return nullptr;
}

namespace {

// Learns which source element each output element of layout `l` holds
// (Note [Layout derivations] in graphkeep/model/block_derivation.h): fn on
// three tensors of indices, i + 1, -(i + 1) and 2i + n + 3. An output
// element holding source element i shows all three; a constant shows one
// value thrice; anything else was computed.
void learn_layout(const LayerPlan& lp, PlannedLayout& l, const at::Tensor& source, const at::Tensor& output,
                  const std::string& what) {
  const PlannedSlot& slot = lp.slots[l.output];
  const std::int64_t n = source.numel();
  const at::Tensor i = at::arange(n, source.options().dtype(at::kLong)).view(source.sizes());
  std::vector<at::Tensor> probe;
  for (const at::Tensor& p : {i + 1, -(i + 1), i * 2 + (n + 3)}) {
    const at::Tensor o = l.fn(p);
    GK_CHECK(DeclarationError, o.defined() && o.scalar_type() == at::kLong && o.numel() == output.numel(), what,
             " maps an int64 tensor shaped as its source ", source.sizes(), " to ",
             o.defined() ? concat(o.scalar_type(), " ", o.sizes()) : std::string("an undefined tensor"), ", but its output ",
             member_of(slot), " (", slot.name, ") holds ", output.numel(), " elements: a layout function moves elements "
             "of any dtype and keeps it");
    probe.push_back(o.reshape({-1}));
  }
  const at::Tensor& a = probe[0];
  const at::Tensor moved = (a >= 1) & (a <= n) & (probe[1] == -a) & (probe[2] == (a - 1) * 2 + (n + 3));
  const at::Tensor constant = (a == probe[1]) & (a == probe[2]);
  const at::Tensor bad = at::nonzero(~(moved | constant)).reshape({-1});
  if (bad.numel() > 0) {
    const std::int64_t e = bad[0].item<std::int64_t>();
    GK_THROW(DeclarationError, member_of(slot), " (", slot.name, ") is bound to ", what, ", but the function computes "
             "values instead of moving elements of '", lp.slots[l.source].local, "': output element ", e, " is ",
             a[e].item<std::int64_t>(), ", ", probe[1][e].item<std::int64_t>(), " and ", probe[2][e].item<std::int64_t>(),
             " for source elements numbered i + 1, -(i + 1) and 2i + ", n + 3, ". Declare it by_blocks() if blocks of "
             "the parameter compute it, or drop .by_layout() (a weight patch then re-runs the layer's PWAL)");
  }
  const at::Tensor where = at::nonzero(moved).reshape({-1});
  const auto [sorted, order] =
      at::sort(a.index_select(0, where) - 1, /*stable=*/std::optional<bool>(true), /*dim=*/0, /*descending=*/false);
  // int32 where the numbers fit: 8 bytes per moved output element, not 16.
  const bool narrow = n < (std::int64_t{1} << 31) && output.numel() < (std::int64_t{1} << 31);
  l.sorted_source = narrow ? sorted.to(at::kInt) : sorted;
  l.position = narrow ? where.index_select(0, order).to(at::kInt) : where.index_select(0, order);
}

}  // namespace

namespace {

// Binds one layer's declared derivations to its planned slots, checking
// each declaration against the plan (bind_block_derivations).
class DerivationBinder {
 public:
  DerivationBinder(LayerPlan& lp, const std::vector<std::string>& left_out) : lp_(lp), left_out_(left_out) {}

  void bind(const LayoutDerivation& l) {
    const std::string what = concat("layout derivation '", l.name, "' of layer '", lp_.prefix, "'");
    GK_CHECK(DeclarationError, static_cast<bool>(l.fn), what, " has no function");
    PlannedLayout p;
    p.name = l.name;
    p.fn = l.fn;
    p.source = checkpoint_source(l.source, what);
    GK_CHECK(DeclarationError, l.source.is_contiguous(), what, ": its source '", lp_.slots[p.source].local,
             "' is not contiguous");
    const std::ptrdiff_t i = declared_output(l.output, what, Derive::layout);
    if (i < 0) {
      dropped_ = true;
      return;
    }
    p.output = static_cast<std::size_t>(i);
    const PlannedSlot& slot = lp_.slots[p.output];
    GK_CHECK(DeclarationError, l.output.is_contiguous() && l.output.scalar_type() == l.source.scalar_type(),
             member_of(slot), " (", slot.name, ") is ", l.output.scalar_type(),
             l.output.is_contiguous() ? "" : " (not contiguous)", ", but as the output of ", what, " it holds elements "
             "of '", lp_.slots[p.source].local, "', which is ", l.source.scalar_type(), ": a layout moves elements and "
             "keeps their dtype (a cast is computed: declare it by_blocks(), or drop .by_layout())");
    learn_layout(lp_, p, l.source, l.output, what);
    lp_.layouts.push_back(std::move(p));
  }

  void bind(const BlockDerivation& b) {
    const std::string what = concat("block derivation '", b.name, "' of layer '", lp_.prefix, "'");
    PlannedDerivation d;
    d.name = b.name;
    d.block_rows = b.block_rows;
    d.block_cols = b.block_cols;
    d.fn = b.fn;
    GK_CHECK(DeclarationError, static_cast<bool>(b.fn), what, " has no function");
    d.source = checkpoint_source(b.source, what);
    const at::Tensor& s = b.source;
    d.rows = s.dim() == 2 ? s.size(0) : 0;
    d.cols = s.dim() == 2 ? s.size(1) : 0;
    GK_CHECK(DeclarationError, s.dim() == 2 && s.is_contiguous() && b.block_rows > 0 && b.block_cols > 0 &&
             s.size(0) % b.block_rows == 0 && s.size(1) % b.block_cols == 0,
             what, ": its source '", lp_.slots[d.source].local, "' is ", s.sizes(), (s.is_contiguous() ? "" : " (not contiguous)"),
             ", which blocks of ", b.block_rows, "x", b.block_cols, " do not tile (a 2-D contiguous parameter whose "
             "sizes the block's divide)");
    bool complete = true;
    for (const BlockOutput& o : b.outputs) complete = bind_output(d, b, o, what) && complete;
    if (!complete) {
      dropped_ = true;
      return;
    }
    lp_.derivations.push_back(std::move(d));
  }

  // Every member declared by_blocks() or by_layout() must have been bound.
  void check_every_member_bound() {
    for (std::size_t i = 0; i < lp_.slots.size(); ++i) {
      PlannedSlot& slot = lp_.slots[i];
      const Derive derive = slot.role.derive;
      if ((derive != Derive::blocks && derive != Derive::layout) || !slot.defined() ||
          derivation_of(lp_, i) != nullptr || layout_of(lp_, i) != nullptr)
        continue;
      if (dropped_) {
        slot.role.derive = Derive::undeclared;  // its derivation was left out with a member: the layer re-runs
        continue;
      }
      GK_THROW(DeclarationError, member_of(slot), " (", slot.name, ") is declared ", to_string(slot.role.role), ".by_",
               to_string(derive), "(), but layer '", lp_.prefix, "' binds no ",
               derive == Derive::blocks ? "block" : "layout", " derivation to it: bind it in the layer's "
               "declare_derivations() (graphkeep/model/block_derivation.h), or drop .by_", to_string(derive),
               "() (a weight patch then re-runs the layer's PWAL)");
    }
  }

 private:
  std::ptrdiff_t slot_of(const at::Tensor& t) const {
    if (!t.defined()) return -1;
    for (std::size_t i = 0; i < lp_.slots.size(); ++i)
      if (lp_.slots[i].defined() && same_region(lp_.slots[i].captured, t)) return static_cast<std::ptrdiff_t>(i);
    return -1;
  }

  // The slot of a derivation's source, which must be a checkpoint parameter:
  // its field, or a contiguous view of all of it (a 3-D expert stack seen as
  // 2-D rows).
  std::size_t checkpoint_source(const at::Tensor& t, const std::string& what) const {
    std::ptrdiff_t src = slot_of(t);
    for (std::size_t i = 0; src < 0 && t.defined() && t.has_storage() && t.is_contiguous() && i < lp_.slots.size(); ++i) {
      const at::Tensor& c = lp_.slots[i].captured;
      if (lp_.slots[i].defined() && c.is_contiguous() && c.storage().unsafeGetStorageImpl() == t.storage().unsafeGetStorageImpl() &&
          c.storage_offset() == t.storage_offset() && c.numel() == t.numel() && c.scalar_type() == t.scalar_type())
        src = static_cast<std::ptrdiff_t>(i);
    }
    const bool checkpoint = src >= 0 && lp_.slots[static_cast<std::size_t>(src)].kind != PlannedSlot::Kind::declared &&
                            std::any_of(lp_.params.begin(), lp_.params.end(), [&](const CheckpointParam& cp) {
                              return cp.param == lp_.slots[static_cast<std::size_t>(src)].local;
                            });
    GK_CHECK(DeclarationError, checkpoint, what, " reads a source that is not a checkpoint parameter of the layer (",
             t.defined() ? concat(t.scalar_type(), " ", t.sizes()) : std::string("undefined"),
             "): a derivation computes a derived member from one parameter that checkpoint_params() lists; "
             "pass that parameter's field");
    return static_cast<std::size_t>(src);
  }

  // The slot of a derivation's output, which must be declared `derive`; -1
  // when a testing hook left the member out of the plan.
  std::ptrdiff_t declared_output(const at::Tensor& t, const std::string& what, Derive derive) const {
    const std::ptrdiff_t i = slot_of(t);
    if (i < 0 && !left_out_.empty()) return -1;
    GK_CHECK(DeclarationError, i >= 0, what, " names an output (",
             t.defined() ? concat(t.scalar_type(), " ", t.sizes()) : std::string("undefined"),
             ") that is no member of the layer: pass the field of a member declared by_", to_string(derive), "()");
    const PlannedSlot& slot = lp_.slots[static_cast<std::size_t>(i)];
    GK_CHECK(DeclarationError, slot.kind == PlannedSlot::Kind::declared && slot.role.derive == derive,
             slot.kind == PlannedSlot::Kind::declared ? member_of(slot) : concat("'", slot.local, "'"),
             " is an output of ", what, ", but ",
             slot.kind == PlannedSlot::Kind::declared
                 ? concat("its descriptor declares it ", to_string(slot.role.role),
                          slot.role.derive == Derive::undeclared ? "" : concat(".", to_string(slot.role.derive), "()"),
                          ": declare it gk::", to_string(slot.role.role), ".by_", to_string(derive), "()")
                 : std::string("it is a parameter or buffer of the module: a derivation computes derived members"));
    return i;
  }

  // One output of a block derivation; false when its member was left out.
  bool bind_output(PlannedDerivation& d, const BlockDerivation& b, const BlockOutput& o, const std::string& what) const {
    const std::ptrdiff_t i = declared_output(o.tensor, what, Derive::blocks);
    if (i < 0) return false;
    const PlannedSlot& slot = lp_.slots[static_cast<std::size_t>(i)];
    GK_CHECK(DeclarationError, o.per_block > 0, member_of(slot), " (", slot.name, ") is an output of ", what,
             " with per_block ", o.per_block, ": a block holds at least one value");
    const PlannedDerivation::Output out{static_cast<std::size_t>(i), o.layout, o.per_block};
    const at::Tensor& s = b.source;
    const std::int64_t want = (s.size(0) / b.block_rows) * (s.size(1) / b.block_cols) * values_per_block(d, out);
    GK_CHECK(DeclarationError, o.tensor.is_contiguous() && o.tensor.numel() == want, member_of(slot), " (", slot.name,
             ") is ", o.tensor.sizes(), o.tensor.is_contiguous() ? "" : " (not contiguous)", ", but as output ",
             to_string(o.layout), o.layout == BlockLayout::same_as_source ? "" : concat(" (", o.per_block, " per block)"),
             " of ", what, " over blocks of ", b.block_rows, "x", b.block_cols, " of ", s.sizes(), " it must hold ",
             want, " elements, contiguous");
    d.outputs.push_back(out);
    return true;
  }

  LayerPlan& lp_;
  const std::vector<std::string>& left_out_;
  bool dropped_ = false;  // a derivation was left out with a member (a testing hook)
};

}  // namespace

void bind_block_derivations(LayerPlan& lp, const std::vector<std::string>& left_out) {
  lp.derivations.clear();
  lp.layouts.clear();
  if (lp.layer == nullptr) return;
  Derivations declared;
  lp.layer->declare_derivations(declared);
  DerivationBinder binder(lp, left_out);
  for (const LayoutDerivation& l : declared.layouts()) binder.bind(l);
  for (const BlockDerivation& b : declared.list()) binder.bind(b);
  binder.check_every_member_bound();
}

void check_block_outputs(const LayerPlan& lp, const PlannedDerivation& d, const std::vector<at::Tensor>& outs,
                         std::int64_t count, std::string_view after) {
  GK_CHECK(DeclarationError, outs.size() == d.outputs.size(), "block derivation '", d.name, "' of layer '", lp.prefix,
           "' returned ", outs.size(), " tensors for its ", d.outputs.size(), " outputs; ", after);
  for (std::size_t j = 0; j < outs.size(); ++j) {
    const PlannedSlot& slot = lp.slots[d.outputs[j].slot];
    const std::int64_t per = values_per_block(d, d.outputs[j]);
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

at::Tensor block_output_index(const PlannedDerivation::Output& o, const at::Tensor& ids, const at::Tensor& elements,
                              std::int64_t nbr, std::int64_t nbc) {
  const std::int64_t m = o.per_block;
  // [count, m]: value v of block `id` at first(id) * m + v (one_per_block),
  // or at (column * m + v) * nbr + row (transposed).
  const at::Tensor v = at::arange(m, ids.options().dtype(at::kLong)).view({1, m});
  switch (o.layout) {
    case BlockLayout::same_as_source: return elements;
    case BlockLayout::one_per_block: return m == 1 ? ids : ((ids * m).view({-1, 1}) + v).reshape({-1});
    case BlockLayout::one_per_block_transposed:
      if (m == 1) return ids.remainder(nbc) * nbr + ids.div(nbc, "floor");
      return (((ids.remainder(nbc) * m).view({-1, 1}) + v) * nbr + ids.div(nbc, "floor").view({-1, 1})).reshape({-1});
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
  if (lp.derivations.empty() && lp.layouts.empty()) return;
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
    const at::Tensor src = now(d.source).reshape({d.rows, d.cols});
    const std::int64_t n = d.rows, k = d.cols, bh = d.block_rows, bw = d.block_cols;
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
          const at::Tensor index = block_output_index(d.outputs[j], ids, elements, nbr, nbc);
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
  // Layouts: fn of the source, whole (a copy of the output).
  std::vector<const PlannedLayout*> layouts;
  for (const PlannedLayout& l : lp.layouts) {
    if (mismatched != nullptr && ((*mismatched)[l.source] || (*mismatched)[l.output])) continue;
    layouts.push_back(&l);
    differs.push_back(at::ne(as_bits(l.fn(now(l.source)).contiguous().reshape({-1})),
                             as_bits(now(l.output).contiguous().reshape({-1})))
                          .any()
                          .reshape({1}));
  }
  if (differs.empty()) return;
  const at::Tensor any = at::cat(differs).cpu();  // one synchronization for the layer
  const bool* flag = any.data_ptr<bool>();
  for (std::size_t v = 0; v < layouts.size(); ++v) {
    if (!flag[verdicts.size() + v]) continue;
    const PlannedLayout& l = *layouts[v];
    const PlannedSlot& slot = lp.slots[l.output];
    const at::Tensor want = l.fn(now(l.source)).contiguous().reshape({-1}), was = now(l.output).contiguous().reshape({-1});
    const std::int64_t e = at::nonzero(at::ne(as_bits(want), as_bits(was))).reshape({-1})[0].item<std::int64_t>();
    GK_THROW(DeclarationError, member_of(slot), " is declared ", to_string(slot.role.role),
             ".by_layout() and bound to layout derivation '", l.name, "' of '", lp.slots[l.source].local,
             "', but PWAL of layer '", lp.prefix, "' built ", slot.name, " otherwise: element ", e, " is ",
             was[e].item().toDouble(), " where the layout gives ", want[e].item().toDouble(),
             ". The function is not what PWAL does: fix the layout, or drop .by_layout() (a weight patch then re-runs "
             "this layer's PWAL); ", after);
  }
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
             " of '", lp.slots[d.source].local, "', ", to_string(d.outputs[out].layout),
             d.outputs[out].layout == BlockLayout::same_as_source ? "" : concat(", ", d.outputs[out].per_block,
                                                                                 " per block"),
             "), but PWAL of layer '",
             lp.prefix, "' built ", slot.name, " otherwise: element ", first, " is ", was, " where the derivation gives ",
             want, ". The function is not what PWAL computes, or a block depends on more than its own elements: fix "
             "the derivation, or drop .by_blocks() (a weight patch then re-runs this layer's PWAL); ", after);
  }
}

bool patch_leaves_unchanged(const PlannedSlot& s) { return s.role.derive == Derive::from_shapes; }

FromShapesCheck launch_from_shapes_check(const LayerPlan& lp, const std::vector<at::Tensor>& current,
                                         const std::vector<char>& mismatched) {
  FromShapesCheck c;
  std::vector<at::Tensor> read;
  for (std::size_t i = 0; i < lp.slots.size(); ++i) {
    const PlannedSlot& s = lp.slots[i];
    if (!patch_leaves_unchanged(s) || !s.defined() || mismatched[i] || !current[i].defined() ||
        current[i].numel() == 0 || same_storage_and_offset(current[i], s.captured))
      continue;
    c.slots.push_back(i);
    read.push_back(current[i]);
    read.push_back(s.captured);
  }
  if (!read.empty()) c.bytes = LateBytes(read);
  return c;
}

void finish_from_shapes_check(const LayerPlan& lp, FromShapesCheck& check) {
  if (!check.bytes.pending()) return;
  check.bytes.wait();
  for (std::size_t j = 0; j < check.slots.size(); ++j) {
    const std::span<const std::byte> now = check.bytes.bytes(2 * j), was = check.bytes.bytes(2 * j + 1);
    if (now.size() == was.size() && std::memcmp(now.data(), was.data(), now.size()) == 0) continue;
    const PlannedSlot& s = lp.slots[check.slots[j]];
    // (check() found the layout PWAL built equal to the captured one.)
    GK_INTERNAL_ASSERT(now.size() == was.size(), s.name, ": ", now.size(), " bytes now, ", was.size(), " captured");
    const std::size_t esz = c10::elementSize(s.dtype);
    const std::size_t at = static_cast<std::size_t>(
        std::mismatch(now.begin(), now.end(), was.begin()).first - now.begin()) / esz;
    const auto value = [&](std::span<const std::byte> b) {
      const auto n = static_cast<std::int64_t>(b.size() / esz);
      return at::from_blob(const_cast<std::byte*>(b.data()), {n}, at::TensorOptions().dtype(s.dtype))
          [static_cast<std::int64_t>(at)].item().toDouble();
    };
    const double was_v = value(was), now_v = value(now);
    check.bytes.release();
    GK_THROW(DeclarationError, s.owner, "::", member_name(s.local), " is declared ", to_string(s.role.role),
             ".from_shapes() (a function of shapes and configuration alone), but PWAL of layer '", lp.prefix,
             "' built ", s.name, " with other values from these weights: element ", at, " was ", was_v,
             " and is now ", now_v,
             ". It depends on the checkpoint's values: drop .from_shapes() from its declaration (a weight patch "
             "then re-runs this layer's PWAL). Nothing was copied into captured storage for this layer");
  }
  check.bytes.release();
}

}  // namespace gk::detail
