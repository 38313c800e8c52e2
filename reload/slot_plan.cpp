// Builds the persistent slot plan (see slot_plan.h).
#include <graphkeep/core/check.h>
#include <graphkeep/reload/slot_plan.h>

#include "reload_internal.h"

#include <torch/nn/module.h>

#include <algorithm>

namespace gk {

std::uintptr_t PlannedSlot::storage_begin() const {
  if (!captured.defined() || !captured.has_storage()) return 0;
  return reinterpret_cast<std::uintptr_t>(captured.storage().data());
}

std::string LayerPlan::full_name(std::string_view local) const {
  if (prefix.empty()) return std::string(local);
  std::string s = prefix;
  s += '.';
  s += local;
  return s;
}

std::size_t SlotPlan::num_slots() const noexcept {
  std::size_t n = 0;
  for (const auto& l : layers_) n += l.slots.size();
  return n;
}

std::size_t SlotPlan::num_declared_slots() const noexcept {
  std::size_t n = 0;
  for (const auto& l : layers_)
    for (const auto& s : l.slots) n += s.kind == PlannedSlot::Kind::declared ? 1 : 0;
  return n;
}

std::size_t SlotPlan::captured_bytes() const noexcept {
  std::size_t n = 0;
  for (const auto& l : layers_)
    for (const auto& s : l.slots) n += s.defined() ? s.captured.nbytes() : 0;
  return n;
}

std::vector<std::string> SlotPlan::slot_names() const {
  std::vector<std::string> out;
  for (const auto& l : layers_)
    for (const auto& s : l.slots) out.push_back(s.name);
  return out;
}

const PlannedSlot* SlotPlan::find_slot(std::string_view name) const {
  for (const auto& l : layers_)
    for (const auto& s : l.slots)
      if (s.name == name) return &s;
  return nullptr;
}

namespace {
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

std::vector<std::string> SlotPlan::closest_slot_names(std::string_view name, std::size_t n) const {
  std::vector<std::pair<std::size_t, std::string>> scored;
  for (const auto& l : layers_)
    for (const auto& s : l.slots) scored.emplace_back(edit_distance(name, s.name), s.name);
  std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (std::size_t i = 0; i < scored.size() && i < n; ++i) out.push_back(scored[i].second);
  return out;
}

bool SlotPlan::is_undeclared(std::string_view path) const noexcept {
  return std::find(undeclared_.begin(), undeclared_.end(), path) != undeclared_.end();
}

void SlotPlan::index() {
  ranges_.clear();
  for (std::uint32_t li = 0; li < layers_.size(); ++li)
    for (std::uint32_t si = 0; si < layers_[li].slots.size(); ++si) {
      const PlannedSlot& s = layers_[li].slots[si];
      if (s.defined() && s.storage_nbytes > 0) ranges_.push_back({s.storage_begin(), s.storage_end(), li, si});
    }
  std::sort(ranges_.begin(), ranges_.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (std::size_t i = 0; i < ranges_.size(); ++i)
    ranges_[i].reach = std::max(ranges_[i].end, i > 0 ? ranges_[i - 1].reach : 0);
  // Slots viewing one storage have equal storage bases: adjacent after the
  // sort, so each group is one range of the index.
  for (auto& l : layers_)
    for (auto& s : l.slots) s.storage_group_begin = s.storage_group_end = 0;
  for (std::size_t i = 0; i < ranges_.size();) {
    std::size_t j = i;
    while (j < ranges_.size() && ranges_[j].begin == ranges_[i].begin) ++j;
    for (std::size_t a = i; a < j; ++a) {
      PlannedSlot& s = layers_[ranges_[a].layer].slots[ranges_[a].slot];
      s.storage_group_begin = static_cast<std::uint32_t>(i);
      s.storage_group_end = static_cast<std::uint32_t>(j);
    }
    i = j;
  }
}

std::optional<SlotPlan::Owner> SlotPlan::find_owner(std::uintptr_t address) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), address,
                             [](std::uintptr_t a, const Range& r) { return a < r.begin; });
  // Ranges may overlap (several slots viewing one storage); scan back while
  // a range at or before `it` still reaches past the address. An address in
  // no slot (a trainer's tensor asked about at adoption) stops at once
  // instead of walking every range below it.
  while (it != ranges_.begin()) {
    --it;
    if (it->reach <= address) break;
    if (address < it->end) return Owner{&layers_[it->layer], &layers_[it->layer].slots[it->slot]};
  }
  return std::nullopt;
}

namespace detail {

std::string unknown_slot_message(const SlotPlan& plan, std::string_view option, std::string_view name) {
  std::string near;
  for (const std::string& c : plan.closest_slot_names(name)) near += concat(near.empty() ? "" : ", ", "'", c, "'");
  return concat("gk::testing::EngineHooks::", option, " names '", name, "', which is no slot of the model",
                near.empty() ? "" : concat("; closest: ", near),
                " (slot names: module path, then parameter or member path, as ReloadEngine::slot_names() lists them)");
}

// Note [Storage views without dispatch]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A streaming reload makes a storage view of every slot of every layer (what
// PWAL built, what was loaded): at::empty then set_ is two dispatcher calls
// and an allocator call each, a few microseconds of host time on a CUDA
// device, paid per slot where the host sets the pace (docs/performance.md).
// The view is built directly: a TensorImpl over the same storage, with the
// dispatch keys at::empty gives a tensor of t's options (the backend's; the
// constructor adds the autograd keys, or none in inference mode) and t's
// geometry. t is a valid tensor, so the geometry fits its storage. Unlike
// a patch's views (Note [Views without dispatch] in
// graphkeep/delta/detail/element_bits.h), a storage view takes any
// geometry and has a version counter of its own: it is a new handle on
// the storage, not a view of t.
at::Tensor storage_view(const at::Tensor& t) {
  if (!t.defined()) return {};
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(t.storage()),
                                                   c10::DispatchKeySet(t.options().computeDispatchKey()), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return at::Tensor(std::move(impl));
}

at::Tensor placeholder_like(const at::Tensor& t) {
  c10::Storage none(c10::Storage::use_byte_size_t(), 0, c10::DataPtr(nullptr, t.device()), /*allocator=*/nullptr,
                    /*resizable=*/false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(none),
                                                   c10::DispatchKeySet(t.options().computeDispatchKey()), t.dtype());
  impl->set_sizes_contiguous({0});
  return at::Tensor(std::move(impl));
}

void record_layout(PlannedSlot& s, const at::Tensor& t) {
  s.captured = storage_view(t);
  if (!t.defined()) return;
  s.sizes = t.sizes().vec();
  s.strides = t.strides().vec();
  s.storage_offset = t.storage_offset();
  s.dtype = t.scalar_type();
  s.device = t.device();
  s.storage_nbytes = t.storage().nbytes();
}

namespace {

// Note [A module's parameters, read in place]
// Module::named_parameters(false) builds a new OrderedDict (key strings, a
// hash index) at every call, a cost per lookup even for a module of four
// parameters (docs/performance.md, "Figures behind the code"), and
// a reload looks a parameter slot up several times (drift check, detach,
// materialize, layout check, re-point). The dict itself is a protected member
// of torch::nn::Module; a pointer to that member formed through a derived
// class (allowed by [class.protected]) reads it without a copy. Buffers are a
// private member, so module_buffer keeps the copying accessor.
struct ParameterDict : torch::nn::Module {
  static const torch::OrderedDict<std::string, at::Tensor>& of(const torch::nn::Module& m) {
    return m.*(&ParameterDict::parameters_);
  }
};

}  // namespace

at::Tensor module_parameter(torch::nn::Module& m, const std::string& name) {
  // named_parameters() leaves out undefined entries: so does this.
  const at::Tensor* t = ParameterDict::of(m).find(name);
  return t != nullptr && t->defined() ? *t : at::Tensor();
}

at::Tensor module_buffer(torch::nn::Module& m, const std::string& name) {
  const auto dict = m.named_buffers(/*recurse=*/false);
  const at::Tensor* t = dict.find(name);
  return t != nullptr ? *t : at::Tensor();
}

at::Tensor module_tensor(torch::nn::Module& m, const PlannedSlot& s) {
  if (s.kind == PlannedSlot::Kind::parameter) return module_parameter(m, s.local);
  if (s.kind == PlannedSlot::Kind::buffer) return module_buffer(m, s.local);
  return {};
}

std::vector<std::string> layout_differences(const PlannedSlot& s, const at::Tensor& t) {
  std::vector<std::string> d;
  if (s.defined() != t.defined()) {
    d.push_back(s.defined() ? "is no longer defined" : "is defined now but was not at capture");
    return d;
  }
  if (!t.defined()) return d;
  if (!t.sizes().equals(s.sizes)) d.push_back(concat("shape ", at::IntArrayRef(s.sizes), " -> ", t.sizes()));
  if (t.scalar_type() != s.dtype) d.push_back(concat("dtype ", s.dtype, " -> ", t.scalar_type()));
  if (!t.strides().equals(s.strides)) d.push_back(concat("strides ", at::IntArrayRef(s.strides), " -> ", t.strides()));
  if (t.storage_offset() != s.storage_offset)
    d.push_back(concat("storage offset ", s.storage_offset, " -> ", t.storage_offset(),
                       " (a view moved within its storage: copying it back would overwrite other slots)"));
  if (t.device() != s.device) d.push_back(concat("device ", s.device, " -> ", t.device()));
  if (t.storage().nbytes() != s.storage_nbytes)
    d.push_back(concat("storage size ", s.storage_nbytes, " -> ", t.storage().nbytes(), " bytes"));
  return d;
}

}  // namespace detail

namespace {

class ConfigCollector final : public Walker {
 public:
  std::vector<PlannedConfig> configs;
  void tensor(const SlotPath&, const RoleSpec&, std::string_view, at::Tensor&) override {}
  void config(const SlotPath& path, std::string_view, ConfigRef value) override {
    if (value.ops != nullptr) configs.push_back(PlannedConfig{path.str(), path, value.ops, value.ops->copy(value.ptr)});
  }
};

// Note [Members treated as undeclared]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// gk::testing::EngineHooks::undeclared_members makes the plan forget declared members,
// for the negative tests that show what an undeclared tensor does: the graphs
// read addresses no slot owns (unknown at capture), and a reload frees or
// moves them. The names are checked against the complete plan before any is
// dropped, so a misspelt name fails with the closest real names instead of
// silently dropping nothing. The plan keeps every path of a dropped slot;
// the collector reports the tensors there as not graph-visible, so the
// manifest and track() name the member as they would name a tensor its class
// declared not graph-visible.
void leave_out_undeclared(SlotPlan& plan, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    const PlannedSlot* s = plan.find_slot(name);
    GK_CHECK(StateError, s != nullptr, detail::unknown_slot_message(plan, "undeclared_members", name));
    GK_CHECK(StateError, s->kind == PlannedSlot::Kind::declared, "gk::testing::EngineHooks::undeclared_members names '", name,
             "', a ", s->kind == PlannedSlot::Kind::parameter ? "parameter" : "buffer",
             " of its module: only a declared member can be treated as undeclared (parameters and buffers are "
             "always in the plan)");
  }
  for (LayerPlan& lp : plan.layers()) {
    auto dropped = [&](const PlannedSlot& s) {
      if (std::find(names.begin(), names.end(), s.name) == names.end()) return false;
      for (const SlotPath& p : s.paths) plan.undeclared().push_back(lp.full_name(p.str()));
      return true;
    };
    lp.slots.erase(std::remove_if(lp.slots.begin(), lp.slots.end(), dropped), lp.slots.end());
  }
}

PlannedSlot module_slot(const LayerPlan& lp, PlannedSlot::Kind kind, const std::string& name,
                        const at::Tensor& t) {
  PlannedSlot s;
  s.kind = kind;
  s.name = lp.full_name(name);
  s.local = name;
  s.role = gk::parameter;
  s.originals = {t};
  detail::record_layout(s, t);
  return s;
}

}  // namespace

SlotPlan build_slot_plan(torch::nn::Module& model, const std::vector<std::string>& undeclared) {
  at::NoGradGuard no_grad;
  SlotPlan plan;
  std::vector<std::pair<std::string, torch::nn::Module*>> modules{{"", &model}};
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    modules.emplace_back(item.key(), item.value().get());

  for (auto& [prefix, module] : modules) {
    auto* layer = dynamic_cast<ReloadableLayer*>(module);
    auto params = module->named_parameters(/*recurse=*/false);
    auto buffers = module->named_buffers(/*recurse=*/false);
    if (layer == nullptr && params.is_empty() && buffers.is_empty()) continue;

    LayerPlan lp;
    lp.prefix = prefix;
    lp.module = module;
    lp.layer = layer;
    if (layer != nullptr) {
      lp.root = layer->registered_members();
      lp.params = layer->checkpoint_params();
    } else {
      for (const auto& p : params)
        lp.params.push_back(CheckpointParam{p.key(), {{p.key(), p.value().sizes().vec(), p.value().scalar_type()}}});
    }
    for (const CheckpointParam& cp : lp.params) {
      GK_CHECK(DeclarationError, params.contains(cp.param) || buffers.contains(cp.param), "layer '",
               prefix, "' lists checkpoint param '", cp.param,
               "', which is neither a parameter nor a buffer of the module: register it in the constructor");
      (void)cp.shape();  // validates the tensor list
      (void)cp.dtype();
    }

    for (const auto& p : params) lp.slots.push_back(module_slot(lp, PlannedSlot::Kind::parameter, p.key(), p.value()));
    for (const auto& b : buffers) lp.slots.push_back(module_slot(lp, PlannedSlot::Kind::buffer, b.key(), b.value()));
    const std::size_t module_slots = lp.slots.size();

    if (lp.root) {
      for (Slot& s : collect_slots(lp.root)) {
        // A declared member that aliases a parameter or buffer joins that slot.
        auto same = std::find_if(lp.slots.begin(), lp.slots.begin() + module_slots, [&](const PlannedSlot& ps) {
          return same_region(ps.originals.front(), *s.tensor);
        });
        if (same != lp.slots.begin() + module_slots) {
          GK_CHECK(DeclarationError,
                   s.role.role == Role::parameter || s.role.effective_init() == Init::copy_new,
                   lp.full_name(s.path()), " is the ", same->kind == PlannedSlot::Kind::parameter ? "parameter '" : "buffer '",
                   same->local, "' of the module but declares init policy ", to_string(s.role.effective_init()),
                   ": a parameter takes the loaded value; declare it gk::parameter");
          for (const SlotPath& p : s.paths) {
            same->paths.push_back(p);
            same->originals.push_back(*p.resolve_tensor(lp.root.ptr));
          }
          continue;
        }
        GK_CHECK(DeclarationError, s.role.role != Role::parameter, lp.full_name(s.path()), " (",
                 s.owner, ") is declared gk::parameter but is not a parameter or buffer of module '", prefix,
                 "': register it on the module, or give it the role of the tensor PWAL derives");
        PlannedSlot ps;
        ps.kind = PlannedSlot::Kind::declared;
        ps.name = lp.full_name(s.path());
        ps.local = s.path();
        ps.role = s.role;
        ps.owner = s.owner;
        for (const SlotPath& p : s.paths) ps.originals.push_back(*p.resolve_tensor(lp.root.ptr));
        ps.paths = std::move(s.paths);
        detail::record_layout(ps, *s.tensor);
        lp.slots.push_back(std::move(ps));
      }
      ConfigCollector cc;
      lp.root.walk(cc);
      lp.configs = std::move(cc.configs);
      for (auto& c : lp.configs) c.name = lp.full_name(c.name);
    }
    plan.layers().push_back(std::move(lp));
  }
  if (!undeclared.empty()) leave_out_undeclared(plan, undeclared);
  plan.index();
  return plan;
}

}  // namespace gk
