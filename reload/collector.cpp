// The runtime collector (see collector.h).
#include <graphkeep/core/check.h>
#include <graphkeep/reload/collector.h>

#include "reload_internal.h"

#include <torch/nn/module.h>

#include <unordered_set>

namespace gk {

std::size_t CollectorReport::uncovered() const noexcept { return count(CollectedTensor::Coverage::uncovered); }
std::size_t CollectorReport::count(CollectedTensor::Coverage c) const noexcept {
  std::size_t n = 0;
  for (const auto& t : tensors) n += t.coverage == c ? 1 : 0;
  return n;
}

namespace {

// Visits every tensor reachable from the model, calling `on_tensor(path,
// role, tensor, resolve)` and `on_flag(message)`; for a member the walk
// cannot look into (opaque, an unregistered dynamic type), also
// `on_blind(member)`, the flag's text without its "opaque: " head. A member
// the plan left out by gk::testing::EngineHooks::undeclared_members is reported with the
// role not_graph_visible (Note [Members treated as undeclared] in
// slot_plan.cpp).
struct ModelWalk {
  using OnTensor = std::function<void(const std::string&, const RoleSpec&, const at::Tensor&,
                                      std::function<at::Tensor()>)>;
  OnTensor on_tensor;
  std::function<void(std::string)> on_flag;
  std::function<void(const std::string&)> on_blind;
  const SlotPlan* plan = nullptr;  // for SlotPlan::undeclared()

  void blind(std::string_view head, const std::string& member) {
    if (on_blind) on_blind(member);
    if (on_flag) on_flag(concat(head, member));
  }

  struct MemberWalker final : Walker {
    ModelWalk& w;
    std::string prefix;
    ObjectRef root;
    MemberWalker(ModelWalk& mw, std::string p, ObjectRef r) : w(mw), prefix(std::move(p)), root(r) {}
    std::string full(const SlotPath& p) const { return prefix.empty() ? p.str() : prefix + "." + p.str(); }
    void tensor(const SlotPath& p, const RoleSpec& role, std::string_view, at::Tensor& t) override {
      SlotPath copy = p;
      ObjectRef r = root;
      const std::string path = full(p);
      const bool undeclared = w.plan != nullptr && w.plan->is_undeclared(path);
      const RoleSpec as_reported =
          undeclared ? RoleSpec{Role::not_graph_visible, Init::unspecified, kUndeclaredMemberReason} : role;
      w.on_tensor(path, as_reported, t, [copy, r]() -> at::Tensor {
        at::Tensor* f = copy.resolve_tensor(r.ptr);
        return f != nullptr ? *f : at::Tensor();
      });
    }
    void opaque(const SlotPath& p, std::string_view owner, std::string_view reason) override {
      w.blind("opaque: ", concat(full(p), " (", owner, ") is not looked into: ", reason));
    }
    bool unregistered_dynamic(const SlotPath& p, std::string_view owner, const std::type_info& t) override {
      w.blind("unregistered dynamic type: ", concat(full(p), " (", owner, ") holds a ", demangle(t.name()),
                                                    "; its tensors are invisible to the registry"));
      return true;
    }
  };

  void run(torch::nn::Module& model) {
    std::vector<std::pair<std::string, torch::nn::Module*>> modules{{"", &model}};
    for (const auto& item : model.named_modules("", false)) modules.emplace_back(item.key(), item.value().get());
    for (auto& entry : modules) {
      const std::string& prefix = entry.first;  // (not a structured binding: lambdas capture it)
      torch::nn::Module* m = entry.second;
      auto join = [&](const std::string& n) { return prefix.empty() ? n : prefix + "." + n; };
      for (const auto& p : m->named_parameters(false)) {
        torch::nn::Module* mod = m;
        std::string name = p.key();
        on_tensor(join(name), gk::parameter, p.value(),
                  [mod, name]() -> at::Tensor { return detail::module_parameter(*mod, name); });
      }
      for (const auto& b : m->named_buffers(false)) {
        torch::nn::Module* mod = m;
        std::string name = b.key();
        on_tensor(join(name), gk::parameter, b.value(),
                  [mod, name]() -> at::Tensor { return detail::module_buffer(*mod, name); });
      }
      if (auto* layer = dynamic_cast<ReloadableLayer*>(m)) {
        ObjectRef root = layer->registered_members();
        if (root) {
          MemberWalker mw(*this, prefix, root);
          root.walk(mw);
        }
      }
    }
  }
};

std::unordered_set<const void*> planned_storages(const SlotPlan& plan) {
  std::unordered_set<const void*> s;
  for (const auto& l : plan.layers())
    for (const auto& slot : l.slots)
      if (slot.defined()) s.insert(slot.captured.storage().unsafeGetStorageImpl());
  return s;
}

}  // namespace

CollectorReport collect_tensors(torch::nn::Module& model, const SlotPlan* plan) {
  CollectorReport r;
  std::unordered_set<const void*> planned;
  if (plan != nullptr) planned = planned_storages(*plan);
  std::unordered_set<const void*> seen;
  ModelWalk w;
  w.plan = plan;
  w.on_flag = [&](std::string f) { r.flags.push_back(std::move(f)); };
  w.on_tensor = [&](const std::string& path, const RoleSpec& role, const at::Tensor& t, std::function<at::Tensor()>) {
    CollectedTensor c;
    c.path = path;
    c.role = role;
    if (t.defined() && t.has_storage()) {
      c.storage_begin = reinterpret_cast<std::uintptr_t>(t.storage().data());
      c.storage_nbytes = t.storage().nbytes();
    }
    if (role.role == Role::not_graph_visible) {
      c.coverage = CollectedTensor::Coverage::not_graph_visible;
      r.flags.push_back(concat("not graph-visible: ", path, " (",
                               role.reason == kUndeclaredMemberReason ? "" : "declared: ", role.reason, ")"));
    } else if (plan == nullptr || !t.defined() ||
               planned.count(t.storage().unsafeGetStorageImpl()) != 0) {
      c.coverage = CollectedTensor::Coverage::slot;
    } else {
      c.coverage = CollectedTensor::Coverage::uncovered;
      r.flags.push_back(concat("uncovered: ", path, " (", to_string(role.role),
                            ") is reachable but not in the slot plan; call prepare() again after changing the "
                            "model, before capturing"));
    }
    r.tensors.push_back(std::move(c));
  };
  w.run(model);
  return r;
}

std::vector<ReachableTensor> reachable_tensors(torch::nn::Module& model, const SlotPlan& plan) {
  std::vector<ReachableTensor> out;
  ModelWalk w;
  w.plan = &plan;
  w.on_flag = [](std::string) {};
  w.on_tensor = [&](const std::string& path, const RoleSpec& role, const at::Tensor& t,
                    std::function<at::Tensor()> resolve) {
    if (!t.defined() || !t.has_storage()) return;
    ReachableTensor rt;
    rt.path = path;
    rt.role = role;
    rt.begin = reinterpret_cast<std::uintptr_t>(t.storage().data());
    rt.end = rt.begin + t.storage().nbytes();
    rt.storage = c10::weak_intrusive_ptr<c10::StorageImpl>(t.storage().getWeakStorageImpl());
    rt.resolve = std::move(resolve);
    out.push_back(std::move(rt));
  };
  w.run(model);
  return out;
}

std::vector<std::string> opaque_members(torch::nn::Module& model) {
  std::vector<std::string> out;
  ModelWalk w;
  w.on_tensor = [](const std::string&, const RoleSpec&, const at::Tensor&, std::function<at::Tensor()>) {};
  w.on_blind = [&](const std::string& member) { out.push_back(member); };
  w.run(model);
  return out;
}

std::vector<std::string> lint_drift(const SlotPlan& plan) {
  std::vector<std::string> out;
  for (const LayerPlan& lp : plan.layers()) {
    for (const PlannedSlot& s : lp.slots) {
      if (!s.defined()) continue;
      const void* captured = s.captured.storage().unsafeGetStorageImpl();
      auto differs = [&](const at::Tensor& t) {
        return !t.defined() || !t.has_storage() || t.storage().unsafeGetStorageImpl() != captured;
      };
      if (s.kind != PlannedSlot::Kind::declared) {
        const at::Tensor t = detail::module_tensor(*lp.module, s);
        if (differs(t)) out.push_back(concat(s.name, ": the module's tensor no longer uses the captured storage"));
      }
      for (const SlotPath& p : s.paths) {
        at::Tensor* f = p.resolve_tensor(lp.root.ptr);
        if (f == nullptr)
          out.push_back(concat(lp.full_name(p.str()), ": path no longer resolves"));
        else if (differs(*f))
          out.push_back(concat(lp.full_name(p.str()), ": points at other storage than the captured ", s.name));
      }
    }
  }
  return out;
}

}  // namespace gk
