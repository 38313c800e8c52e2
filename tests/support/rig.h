// tests/support/rig.h
//
// The rig every reload test starts from: a model loaded with its first
// weights, its gk::ReloadEngine prepared, `input` declared as the graphs'
// static input, the forward captured on a replay backend and tracked.
//
//   gk::testing::Rig<toy::ToyModel> rig(std::make_shared<toy::ToyModel>(8, 16),
//                                       at::linspace(-1.0, 1.0, 24).reshape({3, 8}),
//                                       [](toy::ToyModel& m) { return m.checkpoint(0); });
//   rig.reload(rig.model->checkpoint(1));
//   at::Tensor y = rig.replay();   // throws when the engine refuses replay
//
// A test's own rig derives from it and adds what it reloads with, e.g.
// `reload(int step)`. The graph is a gk::HostReplay on the CPU and a CUDA
// graph on a CUDA device (gk::make_replay); it outlives the engine. `Graph`
// is the type the rig shows it as: gk::HostReplay for a rig that only runs
// on the CPU. No doctest here: the fuzz targets use it too.
#pragma once

#include <graphkeep/capture/replay.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/reload/testing.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/sources/weight_source.h>

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gk::testing {

// How a Rig captures, beyond the model, its input and its first weights:
//   gk::testing::RigSetup().named("toy").with(opts).hooked(hooks).keeping_track_error()
struct RigSetup {
  gk::ReloadOptions options;        // the engine's defaults (EngineOptions::defaults)
  EngineHooks hooks;                // installed before prepare() (graphkeep/reload/testing.h)
  std::string name = "rig";         // the graph's (in messages)
  c10::Device device = c10::kCPU;   // where the graph is captured
  std::string weights_label;        // the first weights' source label; empty: InMemorySource's own
  bool warm_up = false;             // one eager forward before the capture (library handles, lazy allocations)
  bool keep_track_error = false;    // track()'s gk::DriftError goes to track_error (the graph stays tracked)

  RigSetup& named(std::string n) { name = std::move(n); return *this; }
  RigSetup& with(gk::ReloadOptions o) { options = std::move(o); return *this; }
  RigSetup& hooked(EngineHooks h) { hooks = std::move(h); return *this; }
  RigSetup& on(c10::Device d) { device = d; return *this; }
  RigSetup& labelled(std::string l) { weights_label = std::move(l); return *this; }
  RigSetup& warmed_up() { warm_up = true; return *this; }
  RigSetup& keeping_track_error() { keep_track_error = true; return *this; }
};

template <class Model, class Graph = gk::ReplayBackend>
struct Rig {
  using Weights = std::function<std::vector<gk::NamedTensor>(Model&)>;
  using Forward = std::function<at::Tensor(Model&, const at::Tensor&)>;

  Rig(std::shared_ptr<Model> m, at::Tensor in, const Weights& weights, RigSetup setup = {}, Forward forward = {})
      : model(std::move(m)),
        input(std::move(in)),
        device(setup.device),
        backend(gk::make_replay(setup.device, setup.name)),
        graph(dynamic_cast<Graph&>(*backend)) {
    if (!forward) forward = [](Model& mod, const at::Tensor& x) { return mod.forward(x); };
    const std::vector<gk::NamedTensor> first = weights(*model);
    const auto src = setup.weights_label.empty() ? std::make_unique<gk::InMemorySource>(first)
                                                 : std::make_unique<gk::InMemorySource>(first, setup.weights_label);
    gk::load_weights(*model, *src);
    engine = std::make_unique<gk::ReloadEngine>(*model, gk::EngineOptions{setup.options, {}});
    set_hooks(*engine, std::move(setup.hooks));
    engine->prepare();
    engine->add_static_io("input", input);
    if (setup.warm_up) {
      (void)forward(*model, input);
      sync();
    }
    graph.capture([&] { output = forward(*model, input); });
    try {
      engine->track(graph);
    } catch (const gk::DriftError& e) {
      if (!setup.keep_track_error) throw;
      track_error = e.what();
    }
  }

  // Replays if the engine allows it (else throws its error); the output, on the CPU.
  at::Tensor replay() {
    engine->check_replay_allowed();
    return replay_unchecked();
  }
  // Replays without asking the engine: what an engine without graphkeep does.
  at::Tensor replay_unchecked() {
    graph.replay();
    sync();
    return output.to(at::kCPU).clone();
  }
  gk::ReloadReport reload(const std::vector<gk::NamedTensor>& weights) {
    gk::InMemorySource src(weights);
    return engine->reload(src);
  }
  gk::ReloadReport reload(const std::vector<gk::NamedTensor>& weights, const gk::ReloadOptions& options) {
    gk::InMemorySource src(weights);
    return engine->reload(src, options);
  }
  // Waits for the graph's device (nothing to wait for on the CPU).
  void sync() const { gk::runtime::synchronize(device); }

  std::shared_ptr<Model> model;
  at::Tensor input, output;
  c10::Device device;
  std::unique_ptr<gk::ReplayBackend> backend;  // declared before the engine: destroyed after it
  Graph& graph;
  std::unique_ptr<gk::ReloadEngine> engine;
  std::string track_error;  // with RigSetup::keep_track_error: what track() refused, or ""
};

}  // namespace gk::testing
