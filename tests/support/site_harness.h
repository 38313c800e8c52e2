// tests/support/site_harness.h
//
// The shared harness of the failure-site tests (the 13 known sites).
// A site is a one-layer model of the pattern:
//
//   struct MySiteModel : torch::nn::Module {
//     explicit MySiteModel(c10::Device device);               // weights uninitialized
//     std::vector<gk::NamedTensor> checkpoint(int step) const; // deterministic, CPU tensors
//     at::Tensor example_input(c10::Device device) const;      // the static input
//     at::Tensor forward(const at::Tensor& x);                 // hostrt on CPU, CUDA kernels on CUDA
//   };
//
// and the checks, the same on the CPU replay backend and on real CUDA graphs:
//
//   sites::positive<MySiteModel>(device);            // capture, reload twice, replay == fresh model;
//                                                    // the same two steps as weight patches
//   sites::negative_unprotected<MySiteModel>(device, "layer.kernel_.workspace_");
//   sites::negative_undeclared<MySiteModel>(device, "layer.kernel_.workspace_");
//
// negative_unprotected disables copy-back of one slot: the manifest must find
// the drift, and the replay (reading the captured storage, which keeps the
// old values) must differ from a fresh model. negative_undeclared treats one
// declared member as undeclared (gk::testing::EngineHooks::undeclared_members: the plan
// leaves it out, as if its class had declared it not graph-visible): the
// manifest must flag it unknown at capture and expired or moved after the
// reload.
#pragma once

#include "gk_test.h"
#include "rig.h"

#include "engine/compare.h"

#include <graphkeep/delta/make_patch.h>
#include <graphkeep/reload/collector.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/reload/manifest.h>
#include <graphkeep/capture/replay.h>

#include <memory>
#include <string>

namespace sites {

inline c10::Device cpu() { return c10::Device(c10::kCPU); }
inline c10::Device gpu() { return c10::Device(c10::kCUDA, 0); }

// Synchronizes `device` (a no-op on CPU), so host reads see finished work.
void sync(c10::Device device);

// x.narrow(dim, start, len) as a contiguous tensor, computed in a way a
// capture records: a hostrt launch into the capture pool on CPU, an ATen copy
// (captured by the CUDA graph) on CUDA. An eager copy during a host capture
// would leave the graph reading a freed temporary, which the manifest flags.
at::Tensor slice(const at::Tensor& x, int64_t dim, int64_t start, int64_t len);

// A site's model on `dev`, captured and tracked (gk::testing::Rig). A graph
// reading a member treated as undeclared is refused at track() (Note [Fail
// closed at capture]); the graph stays tracked and the message is kept in
// track_error for the test.
template <class Model>
struct Rig : gk::testing::Rig<Model> {
  explicit Rig(c10::Device dev, gk::ReloadOptions opts = {}, gk::testing::EngineHooks hooks = {})
      : Rig(std::make_shared<Model>(dev), dev, std::move(opts), std::move(hooks)) {}

  gk::ReloadReport reload(int step) { return gk::testing::Rig<Model>::reload(this->model->checkpoint(step)); }

 private:
  Rig(std::shared_ptr<Model> m, c10::Device dev, gk::ReloadOptions opts, gk::testing::EngineHooks hooks)
      : gk::testing::Rig<Model>(m, m->example_input(dev), [](Model& x) { return x.checkpoint(0); },
                                gk::testing::RigSetup().named("site").with(std::move(opts)).hooked(std::move(hooks))
                                    .on(dev).warmed_up().keeping_track_error()) {}
};

// The output of a freshly built model with step's weights, run eagerly.
template <class Model>
at::Tensor fresh_output(c10::Device dev, int step, const at::Tensor& input) {
  auto m = std::make_shared<Model>(dev);
  gk::InMemorySource src(m->checkpoint(step));
  gk::load_weights(*m, src);
  at::Tensor y = m->forward(input);
  sync(dev);
  return y.to(at::kCPU).clone();
}

inline bool same(const at::Tensor& a, const at::Tensor& b, bool bitwise) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (bitwise) return demo::bitwise_equal(a, b);
  return demo::all_close(a.to(at::kFloat), b.to(at::kFloat), 1e-3, 1e-3);
}

// Capture, reload twice, replay: equal to a fresh model each time, with every
// captured address unchanged and no drift.
template <class Model>
// rerun: the layers a patch must re-run PWAL for, where the site's
// declarations decide it (Note [Declared derivations]); -1: not checked.
void positive(c10::Device dev, bool bitwise = true, int rerun = -1) {
  Rig<Model> rig(dev);
  std::vector<std::uintptr_t> addresses;
  for (const auto& l : rig.engine->plan().layers())
    for (const auto& s : l.slots) addresses.push_back(s.storage_begin());
  const gk::CaptureManifest* m = rig.engine->manifest(rig.graph);
  REQUIRE(m != nullptr);
  INFO("undeclared at capture: " << (m->undeclared().empty() ? "" : m->undeclared().front()));
  CHECK(m->count(gk::AddressClass::unknown) == 0);
  CHECK(m->count(gk::AddressClass::slot) > 0);
  CHECK(rig.track_error.empty());
  const at::Tensor y0 = rig.replay();
  CHECK(same(y0, fresh_output<Model>(dev, 0, rig.input), bitwise));
  for (int step = 1; step <= 2; ++step) {
    CAPTURE(step);
    const gk::ReloadReport r = rig.reload(step);
    CHECK(r.drift == 0);
    CHECK(r.addresses_verified > 0);
    CHECK(gk::lint_drift(rig.engine->plan()).empty());
    std::vector<std::uintptr_t> now;
    for (const auto& l : rig.engine->plan().layers())
      for (const auto& s : l.slots) now.push_back(s.storage_begin());
    CHECK(now == addresses);
    const at::Tensor y = rig.replay();
    CHECK(same(y, fresh_output<Model>(dev, step, rig.input), bitwise));
    CHECK_FALSE(same(y, y0, true));  // the weights really changed the output
  }
  // The same steps as weight patches (by reload, then by stage and commit),
  // with the checkpoint-format bases kept on the device for the sites whose
  // PWAL transforms what it loads: what is served equals a fresh model's.
  gk::ReloadOptions keep;
  keep.patch_base = gk::PatchBase::device;
  Rig<Model> prig(dev, keep);
  prig.reload(0);  // records the served content and keeps the bases
  for (int step = 1; step <= 2; ++step) {
    CAPTURE(step);
    const gk::Patch p = gk::make_patch(prig.model->checkpoint(step - 1), prig.model->checkpoint(step),
                                       {.base_version = "step" + std::to_string(step - 1),
                                        .target_version = "step" + std::to_string(step)});
    const gk::ReloadReport r = step == 1 ? prig.engine->reload(p) : prig.engine->commit(prig.engine->stage(p));
    CHECK(r.patch.applied);
    CHECK(r.patch.layers_scattered + r.patch.layers_rerun > 0);
    if (rerun >= 0) CHECK(r.patch.layers_rerun == static_cast<std::size_t>(rerun));
    CHECK(r.drift == 0);
    CHECK(prig.engine->replay_allowed());
    CHECK(same(prig.replay(), fresh_output<Model>(dev, step, prig.input), bitwise));
  }
}

// A reload of `rig` (built with copy-back of `slot` disabled): the manifest
// finds the drift, names the slot and refuses replay. Returns the output of a
// replay forced anyway (what an engine without graphkeep would compute).
template <class Model>
at::Tensor drift_caught(Rig<Model>& rig, const std::string& slot) {
  bool found = false;
  for (const auto& l : rig.engine->plan().layers())
    for (const auto& s : l.slots) found = found || s.name == slot;
  REQUIRE_MESSAGE(found, "no planned slot named " << slot);
  try {
    rig.reload(1);
    FAIL("expected a DriftError for " << slot);
  } catch (const gk::DriftError& e) {
    CHECK(std::string(e.what()).find(slot) != std::string::npos);
    CHECK(std::string(e.what()).find("moved") != std::string::npos);
  }
  CHECK_THROWS_AS(rig.engine->check_replay_allowed(), gk::DriftError);
  CHECK_FALSE(gk::lint_drift(rig.engine->plan()).empty());
  return rig.replay_unchecked();
}

template <class Model>
Rig<Model> rig_without_copy_back(c10::Device dev, const std::string& slot) {
  return Rig<Model>(dev, {}, gk::testing::unprotect({slot}));
}

// Copy-back of `slot` disabled: the manifest finds the drift and refuses
// replay; replaying anyway reads the stale captured values.
template <class Model>
void negative_unprotected(c10::Device dev, const std::string& slot, bool bitwise = true) {
  Rig<Model> rig = rig_without_copy_back<Model>(dev, slot);
  const at::Tensor stale = drift_caught(rig, slot);
  CHECK_FALSE(same(stale, fresh_output<Model>(dev, 1, rig.input), bitwise));
}

// Copy-back of `slot` disabled, for a tensor whose *values* every PWAL
// recomputes identically (stride arrays, scratch): the manifest still finds
// the drift and the engine refuses replay. Replaying anyway reads the old
// storage, which the slot plan keeps alive with the same values, so the
// output equals a fresh model's: only the address moved. (What breaks vLLM is
// the *freed* storage: see the undeclared tests and the GPU child scenarios.)
template <class Model>
void unprotected_drift_detected(c10::Device dev, const std::string& slot) {
  Rig<Model> rig = rig_without_copy_back<Model>(dev, slot);
  const at::Tensor replayed = drift_caught(rig, slot);
  CHECK(same(replayed, fresh_output<Model>(dev, 1, rig.input), true));
}

// The hooks of a rig whose `member` (a full slot name) is treated as
// undeclared: left out of the plan, as if its class had declared it not
// graph-visible.
inline gk::testing::EngineHooks with_undeclared(const std::string& member) {
  return gk::testing::undeclare({member});
}
// The same, and no capture-manifest verification after reloads (what an
// engine without graphkeep does: the children that replay freed memory).
inline gk::testing::EngineHooks with_undeclared_unverified(const std::string& member) {
  gk::testing::EngineHooks h = with_undeclared(member);
  h.skip_manifest_verification = true;
  return h;
}

// `member` treated as undeclared (gk::testing::EngineHooks::undeclared_members):
// unknown at capture, expired or moved after the reload. Replay is refused;
// the test never replays freed memory in this process.
template <class Model>
void negative_undeclared(c10::Device dev, const std::string& member) {
  Rig<Model> rig(dev, {}, with_undeclared(member));
  CHECK(rig.engine->plan().find_slot(member) == nullptr);  // left out of the plan
  const gk::CaptureManifest* m = rig.engine->manifest(rig.graph);
  REQUIRE(m != nullptr);
  CHECK(m->count(gk::AddressClass::unknown) > 0);
  bool named = false;
  for (const auto& u : m->undeclared()) named = named || u.find(member) != std::string::npos;
  CHECK_MESSAGE(named, "the manifest should name " << member);
  // Refused at capture already, naming the member.
  CHECK(rig.track_error.find(member) != std::string::npos);
  CHECK_THROWS_AS(rig.engine->check_replay_allowed(), gk::DriftError);
  CHECK_THROWS_AS(rig.reload(1), gk::DriftError);
  const gk::VerifyResult v = rig.engine->verify();
  CHECK(v.count(gk::VerifyIssue::Kind::expired) + v.count(gk::VerifyIssue::Kind::moved) > 0);
  CHECK_THROWS_AS(rig.engine->check_replay_allowed(), gk::DriftError);
}

// For GPU child scenarios: reload with `member` (a full slot name) treated as
// undeclared, so the reload frees or moves it, then replay anyway (as an
// engine without graphkeep would) and print what happened:
//   "REPLAY maxdiff=<x> nan=<n>" or a CUDA error. Returns 0.
template <class Model>
int replay_after_hidden_reload_child(const std::string& member) {
  try {
    Rig<Model> rig(gpu(), {}, with_undeclared_unverified(member));
    rig.reload(1);
    // churn the allocator so freed blocks are reused by other data
    std::vector<at::Tensor> churn;
    for (int i = 0; i < 64; ++i) churn.push_back(at::full({1 << 12}, 1e9f, at::TensorOptions().device(gpu())));
    const at::Tensor y = rig.replay_unchecked();
    const at::Tensor want = fresh_output<Model>(gpu(), 1, rig.input);
    const double maxdiff = (y.to(at::kDouble) - want.to(at::kDouble)).abs().nan_to_num(1e30).max().item<double>();
    std::printf("REPLAY maxdiff=%g nan=%lld\n", maxdiff, static_cast<long long>(at::isnan(y).sum().item<int64_t>()));
  } catch (const std::exception& e) {
    std::printf("CUDA_ERROR %s\n", e.what());
  }
  return 0;
}

// Parent side: the child's replay went wrong in one of the ways a missed
// slot shows (wrong result, NaNs from a lock timeout, an illegal access).
// The lines of a child's output that say what its replay did (printed with
// every GPU run, so the log records how each site fails without graphkeep).
inline std::string child_summary(const gk::testing::ChildResult& r) {
  std::string out;
  std::size_t begin = 0;
  while (begin < r.output.size()) {
    std::size_t end = r.output.find('\n', begin);
    if (end == std::string::npos) end = r.output.size();
    const std::string line = r.output.substr(begin, end - begin);
    for (const char* key : {"REPLAY", "CUDA_ERROR", "REUSED", "VICTIM", "TIMEOUT", "timed out"})
      if (line.find(key) != std::string::npos) {
        out += (out.empty() ? "" : " | ") + line.substr(0, 200);
        break;
      }
    begin = end + 1;
  }
  if (r.signaled) out += " | killed by a signal";
  if (r.exit_code != 0) out += " | exit code " + std::to_string(r.exit_code);
  return out;
}

inline void check_child_shows_failure(const gk::testing::ChildResult& r) {
  MESSAGE("child: " << child_summary(r));
  INFO("child output: " << r.output);
  const bool wrong = r.output.find("REPLAY maxdiff=0 nan=0") == std::string::npos &&
                     r.output.find("REPLAY ") != std::string::npos;
  const bool error = r.output.find("CUDA_ERROR") != std::string::npos || r.signaled || r.exit_code != 0;
  CHECK((wrong || error));
}

}  // namespace sites
