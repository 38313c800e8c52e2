// graphkeep/reload/collector.h
//
// The runtime recursive collector: the safety net behind the registry. It
// walks the whole model (modules, parameters, buffers, and registered members
// through the generated visitors, containers and polymorphic members) and
// reports every tensor it reaches with its path, role and storage. Measured
// against a slot plan, it flags what the plan does not cover:
//   - tensors reachable but not in the plan (registered on a module at run
//     time, a container that grew after prepare());
//   - tensors declared not graph-visible (listed with their reason, so a
//     reviewer can check the claim), and the declared members a plan left
//     out for gk::testing::EngineHooks::undeclared_members (reported the same way);
//   - opaque members and unregistered dynamic types, which it cannot see into.
// It doubles as a lint: run lint_drift() after load and after reload, and
// assert that it finds nothing.
//
//   gk::CollectorReport r = gk::collect_tensors(model, &engine.plan());
//   for (auto& f : r.flags) std::cerr << f << "\n";
//   assert(gk::lint_drift(engine.plan()).empty());
#pragma once

#include <graphkeep/reload/manifest.h>
#include <graphkeep/reload/slot_plan.h>

#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace gk {

struct CollectedTensor {
  enum class Coverage : std::uint8_t { slot, not_graph_visible, uncovered };
  std::string path;
  RoleSpec role;
  Coverage coverage = Coverage::uncovered;
  std::uintptr_t storage_begin = 0;
  std::size_t storage_nbytes = 0;
};

struct CollectorReport {
  std::vector<CollectedTensor> tensors;
  std::vector<std::string> flags;  // one line per finding
  std::size_t uncovered() const noexcept;
  std::size_t count(CollectedTensor::Coverage c) const noexcept;
};

// Walks `model`; with a plan, classifies each tensor against it (the members
// in plan->undeclared() as not graph-visible).
CollectorReport collect_tensors(torch::nn::Module& model, const SlotPlan* plan = nullptr);

// The same walk, as re-resolvable records for the capture manifest (the
// members in plan.undeclared() with the role not_graph_visible).
std::vector<ReachableTensor> reachable_tensors(torch::nn::Module& model, const SlotPlan& plan);

// The members the collector cannot look into: opaque members and
// unregistered dynamic types, as "path (owner): reason". Raw memory a graph
// reads may be held by one of them.
std::vector<std::string> opaque_members(torch::nn::Module& model);

// Every planned slot whose field (any alias path, or the module's parameter)
// no longer points at its captured storage: one message each. Empty = no drift.
std::vector<std::string> lint_drift(const SlotPlan& plan);

}  // namespace gk
