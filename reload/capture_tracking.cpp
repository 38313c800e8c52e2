// Tracking captured graphs: each graph's capture manifest recorded and
// judged at track(), verified after every reload, and its verdict kept as
// long as it is tracked.
#include "engine_impl.h"
#include "reload_internal.h"

#include <graphkeep/capture/replay.h>
#include <graphkeep/core/check.h>
#include <graphkeep/reload/collector.h>

#include <algorithm>

namespace gk {

// Note [Fail closed at capture]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A graph is trusted only when the manifest can vouch for every address it
// reads. track() therefore refuses replay (state drift, gk::DriftError) when
//   - the capture recorded no address at all: on the CPU backend a forward
//     written with plain ATen ops runs eagerly and records nothing, so replay
//     would return whatever the output buffer last held;
//   - the graph reads none of the model's slots although the model has some:
//     it cannot be serving this model's weights;
//   - an address lies in no slot, pool, static buffer, library workspace or
//     allowed range: an undeclared tensor (named, with its role) or a raw
//     allocation (with the opaque members near it that could hold it).
// The graph stays tracked, so later reloads verify it too; prepare() after a
// recapture starts over. A library's own persistent workspace is allowed by
// name with allow_address_range().
//
// Note [Confirming raw addresses]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A CUDA kernel node's parameter bytes may hold stale host bytes that look
// like a device address (Note [Stale bytes in kernel parameters] in
// capture/cuda/cuda_replay.cpp). Given the forward, track() tells them apart
// from real reads by capturing once more when the first manifest has raw
// unknown addresses: a real operand is read again by the same kernel, from
// the same parameter byte, at the same address (its tensor was allocated
// before the capture and does not move); stale bytes depend on what host
// code ran at that stack depth and do not repeat. Only the repeated ones are
// refused; the rest stay in the manifest as AddressClass::unstable, and the
// second capture is the graph that is kept. Fail closed: a stale word that
// happens to repeat is refused, as before.
//
// Stale words can repeat, though: a 4-byte integer beside 4 bytes of
// padding that hold the upper half of some pointer looks like an address
// near every pointer that shares that upper half, and comes back in every
// capture (docs/gpu-runs.md, the run of 2026-12-03 15:40 UTC, "half-pointer
// stale words"). Such words point into memory that no live allocation
// covers (a free caching-allocator block): no tensor is there, so no kernel
// can be reading one. Raw words into free memory are therefore unstable too
// (ReplayBackend::in_live_allocation; before and without the recapture). The
// one read this lets through is a graph that reads memory freed before
// track(): a tensor that died right after the capture, an engine bug that
// recapturing would not fix either, since it would read whatever reuses the
// block; graphkeep's promise is about reloads, and a reload cannot cause it.
//
// Note [Capture verdicts last]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// track() refuses a graph the manifest cannot vouch for (Note [Fail closed
// at capture]). Verification after a reload re-checks the addresses a
// manifest recorded, and a manifest that recorded nothing, or only static
// I/O, passes that check trivially: if the refusal lived only in the
// engine's state, the next successful reload() or commit() would set the
// state back to ready and the refused graph would replay the old weights'
// output. So the verdict is kept with the tracked graph: while a refused
// graph is tracked, a reload() throws gk::DriftError after writing (as a
// failed verification does) and leaves replay refused, a stage() is refused
// by the engine's state, and a commit() as stale (track() changed the
// graphs). It ends with the graph: untrack() it (or recapture and
// prepare() again, which drops every graph); the next reload that succeeds
// then allows replay again.
namespace {

// The refusal of a graph that reads addresses nothing owns: each address
// (up to 10), its kernel parameter and byte, and what may hold it (an
// undeclared tensor, by path and role; else the opaque members nearby).
std::string describe_unknown_addresses(const ReplayBackend& graph, const CaptureManifest& m, const SlotPlan& plan,
                                       torch::nn::Module& model) {
  std::string problem = concat("graph '", graph.name(), "' reads ", m.count(AddressClass::unknown),
                   " address(es) that no slot, pool, static buffer or allowed range owns; after a reload these "
                   "would be stale or freed:");
  const std::vector<std::string> opaque = opaque_members(model);
  std::size_t shown = 0;
  for (const ManifestEntry& e : m.entries()) {
    if (e.cls != AddressClass::unknown) continue;
    if (++shown > 10) {
      problem += concat("\n  ... ", m.count(AddressClass::unknown) - 10, " more");
      break;
    }
    problem += concat("\n  node ", e.use.node, " (", e.use.node_name, ") address 0x", std::hex, e.use.address,
                      std::dec);
    if (e.use.param >= 0) problem += concat(" (kernel parameter ", e.use.param, ", byte ", e.use.byte_offset, ")");
    problem += ": ";
    if (e.reachable != SIZE_MAX) {
      const ReachableTensor& r = m.reachable()[e.reachable];
      problem += concat("in the undeclared tensor ", r.path, " (role ", to_string(r.role.role),
                        r.role.reason.empty() ? "" : concat(": ", r.role.reason),
                        "), which is reachable but no slot");
      problem += r.role.reason == kUndeclaredMemberReason
                     ? ": its class declares it, but gk::testing::EngineHooks::undeclared_members left it out of the plan"
                     : ": declare it with a graph-visible role (gk::workspace, gk::scale, gk::metadata, ...), or "
                       "call prepare() again if it was added after prepare()";
      continue;
    }
    problem += "in no tensor the collector reaches (a raw allocation, e.g. a caching-allocator block or a "
               "library handle's memory)";
    if (const std::string where = graph.describe_address(e.use.address); !where.empty())
      problem += concat(" [", where, "]");
    // The opaque members of the layers this node also reads could hold it.
    std::vector<std::string> near;
    for (const ManifestEntry& o : m.entries()) {
      if (o.use.node != e.use.node || o.cls != AddressClass::slot) continue;
      const std::string& prefix = plan.layers()[o.layer].prefix;
      for (const std::string& op : opaque)
        if ((prefix.empty() || op.rfind(prefix + ".", 0) == 0) &&
            std::find(near.begin(), near.end(), op) == near.end())
          near.push_back(op);
    }
    const std::vector<std::string>& list = near.empty() ? opaque : near;
    if (list.empty()) {
      problem += "; the model has no opaque member that could hold it";
    } else {
      problem += concat("; opaque members", near.empty() ? " of the model" : " of the layers this node reads",
                        " that could hold it:");
      for (std::size_t i = 0; i < list.size() && i < 8; ++i) problem += concat(i ? ", " : " ", list[i]);
    }
    problem += ". If it is a library's own persistent workspace, allow it with "
               "ReloadEngine::allow_address_range(name, ptr, bytes, reason) before track()";
  }
  return problem;
}

}  // namespace

std::vector<std::string> ReloadEngine::Impl::drop_destroyed() {
  std::vector<std::string> names;
  for (const Tracked& g : graphs)
    if (g.alive.expired()) names.push_back(g.manifest.graph_name());
  std::erase_if(graphs, [](const Tracked& g) { return g.alive.expired(); });
  return names;
}

std::string ReloadEngine::Impl::capture_refusals() const {
  std::string all;
  for (const Tracked& g : graphs)
    if (!g.refused.empty() && !g.alive.expired()) all += (all.empty() ? "" : "\n") + g.refused;
  return all;
}

VerifyResult ReloadEngine::Impl::verify_all() const {
  VerifyResult all;
  CaptureManifest::SlotVerdicts verdicts(plan);  // one per slot for every graph: Note [Verify once per slot]
  for (const Tracked& g : graphs) {
    if (g.alive.expired()) continue;  // destroyed: nothing can replay it
    VerifyResult r = g.manifest.verify(plan, verdicts);
    all.checked += r.checked;
    all.issues.insert(all.issues.end(), r.issues.begin(), r.issues.end());
  }
  return all;
}

void ReloadEngine::Impl::untrack(const ReplayBackend& graph) {
  // A destroyed graph's address may be reused by `graph`: compare only live ones.
  drop_destroyed();
  std::erase_if(graphs, [&](const Tracked& t) { return t.graph == &graph; });
  graphs_generation += 1;
}

void ReloadEngine::track(ReplayBackend& graph) { track(graph, {}); }

void ReloadEngine::track(ReplayBackend& graph, const std::function<void()>& forward) {
  Impl::Busy busy(*impl_, "track()");
  GK_CHECK(StateError, impl_->state != EngineState::unprepared,
           "track() before prepare(): the manifest classifies addresses against the slot plan");
  impl_->untrack(graph);
  auto record = [&] {
    return CaptureManifest::record(graph, impl_->plan, impl_->io, reachable_tensors(impl_->model, impl_->plan),
                                   impl_->allowed);
  };
  CaptureManifest first = record();
  first.mark_unstable_if_free(graph);  // Note [Confirming raw addresses]
  if (forward && first.count_raw_unknown() > 0) {
    graph.recapture(forward);
    CaptureManifest second = record();
    second.mark_unstable_if_free(graph);
    second.mark_unstable(first);
    first = std::move(second);
  }
  impl_->graphs.push_back({&graph, graph.lifetime(), std::move(first), {}});
  const CaptureManifest& m = impl_->graphs.back().manifest;
  std::string problem;
  if (m.entries().empty()) {
    problem = concat("graph '", graph.name(), "' recorded no launch and no address",
                     graph.device().is_cpu()
                         ? ": on the CPU replay backend a forward must launch through gk::hostrt (plain ATen ops run "
                           "eagerly and are not recorded, so replay would not recompute anything)"
                         : ": nothing was captured on the capture stream");
  } else if (m.count(AddressClass::slot) == 0 && impl_->plan.num_slots() > 0) {
    problem = concat("graph '", graph.name(), "' reads none of the model's ", impl_->plan.num_slots(),
                     " slots: it cannot be computing with this model's weights (was the forward captured on another "
                     "model, or through copies of its tensors?)");
  } else if (m.count(AddressClass::unknown) > 0) {
    problem = describe_unknown_addresses(graph, m, impl_->plan, impl_->model);
  }
  if (problem.empty()) return;
  if (impl_->hooks.report_unknown_addresses) return;
  impl_->graphs.back().refused = concat("graph '", graph.name(), "' was refused at capture and is still tracked (",
                                        "untrack() it, or recapture and prepare() again): ", problem);
  impl_->state = EngineState::drift;
  impl_->reason = problem;
  GK_THROW(DriftError, "replay refused at capture: ", problem);
}

void ReloadEngine::allow_address_range(std::string name, const void* begin, std::size_t bytes, std::string reason) {
  GK_CHECK(StateError, begin != nullptr && bytes > 0, "allow_address_range('", name,
           "'): the range is empty or null");
  GK_CHECK(StateError, !reason.empty(), "allow_address_range('", name,
           "') needs a reason (who owns the memory, and why it never moves across reloads)");
  const auto b = reinterpret_cast<std::uintptr_t>(begin);
  impl_->allowed.push_back({concat(name, " (allowed: ", reason, ")"), b, b + bytes});
}

std::vector<std::string> ReloadEngine::slot_names() const { return impl_->plan.slot_names(); }

void ReloadEngine::untrack(const ReplayBackend& graph) {
  Impl::Busy busy(*impl_, "untrack()");
  impl_->untrack(graph);
}

void ReloadEngine::add_static_io(std::string name, const at::Tensor& buffer) {
  GK_CHECK(StateError, buffer.defined() && buffer.has_storage(), "static buffer '", name, "' is undefined");
  const auto b = reinterpret_cast<std::uintptr_t>(buffer.storage().data());
  impl_->io.push_back({std::move(name), b, b + buffer.storage().nbytes()});
}

VerifyResult ReloadEngine::verify() const { return impl_->verify_all(); }

const CaptureManifest* ReloadEngine::manifest(const ReplayBackend& graph) const {
  for (const auto& t : impl_->graphs)
    if (!t.alive.expired() && t.graph == &graph) return &t.manifest;
  return nullptr;
}

}  // namespace gk
