// bench_reload: graphkeep's reload against its alternatives and its floor, in
// one run, on the example engine (examples/engine) at several model sizes.
//
//   1. reload with graphkeep            gk::ReloadEngine::reload (streaming)
//      vs reload then recapture          load_weights (PWAL rebinds) + capturing
//                                        every batch size's graph again
//   2. copy-back throughput              naive per-slot copy_ vs ATen's
//                                        _foreach_copy_ vs gk::copy_slots (one
//                                        launch per 1,536 tasks) vs a prepared
//                                        gk::SlotCopyPlan vs one plain copy of
//                                        the same bytes (the ceiling)
//   3. overhead within a reload          the whole reload vs the floor: loading
//                                        the new weights' bytes once; and vs
//                                        load + PWAL without graphkeep
//   4. peak device memory (CUDA)         during a streaming reload, above the model
//
//   bench_reload [--device cpu|cuda] [--json out.json] [--reps N]
//
// Every number is a median of N repetitions; GPU times use CUDA events around
// synchronized regions. The JSON carries the machine, date and raw numbers;
// bench/report.py turns it into docs/performance.md tables and a plot.
#include "engine/graph_runner.h"
#include "engine/tiny_lm.h"

#include <graphkeep/core/check.h>
#include <graphkeep/runtime/device.h>
#include <graphkeep/reload/copy_slots.h>
#include <graphkeep/reload/reload_engine.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#ifdef GRAPHKEEP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Wall time of f in ms, device synchronized before and after.
template <class F>
double time_ms(c10::Device d, F&& f) {
  gk::runtime::synchronize(d);
  const auto t0 = Clock::now();
  f();
  gk::runtime::synchronize(d);
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Device time of f in ms with CUDA events (GPU), else wall time.
template <class F>
double device_ms(c10::Device d, F&& f) {
#ifdef GRAPHKEEP_WITH_CUDA
  if (d.is_cuda()) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    gk::runtime::synchronize(d);
    start.record();
    f();
    stop.record();
    stop.synchronize();
    return static_cast<double>(start.elapsed_time(stop));
  }
#endif
  return time_ms(d, f);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::size_t bytes_of(const std::vector<gk::NamedTensor>& ts) {
  std::size_t n = 0;
  for (const auto& t : ts) n += t.value.nbytes();
  return n;
}

struct Size {
  int64_t layers, dim, experts, inter;
};

nlohmann::json bench_size(const Size& s, c10::Device dev, int reps, const std::vector<int64_t>& batch_sizes) {
  demo::TinyLMConfig cfg;
  cfg.layers = s.layers;
  cfg.dim = s.dim;
  cfg.experts = s.experts;
  cfg.inter = s.inter;
  cfg.latent = s.dim / 2;
  cfg.vocab = 256;
  auto model = std::make_shared<demo::TinyLM>(cfg, dev);
  {
    gk::InMemorySource src(model->checkpoint(7, 0));
    gk::load_weights(*model, src);
  }
  gk::ReloadEngine engine(*model);
  engine.prepare();
  demo::GraphRunner runner(*model, engine, batch_sizes);
  runner.capture();

  // The checkpoints are materialized up front (on the host, as a trainer's
  // update would arrive), so no timing includes generating them.
  std::vector<std::vector<gk::NamedTensor>> ckpt;
  for (int r = 0; r <= reps; ++r) ckpt.push_back(model->checkpoint(7, r + 1));
  const std::size_t ckpt_bytes = bytes_of(ckpt.front());

  // 1 + 3: reload with graphkeep
  std::vector<double> reload, floor_ms, recapture;
  std::size_t peak_extra = 0, copied = 0;
  std::vector<gk::PhaseTimes> phases;  // host-side time per phase (GPU work lands where the host waits)
  for (int r = 0; r < reps; ++r) {
#ifdef GRAPHKEEP_WITH_CUDA
    std::size_t base = 0;
    if (dev.is_cuda()) {
      gk::runtime::synchronize(dev);
      c10::cuda::CUDACachingAllocator::resetPeakStats(dev.index());
      base = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index())
                 .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
    }
#endif
    gk::InMemorySource src(ckpt[r]);
    gk::ReloadReport rep;
    reload.push_back(time_ms(dev, [&] { rep = engine.reload(src); }));
    copied = rep.bytes_copied;
    phases.push_back(rep.times);
#ifdef GRAPHKEEP_WITH_CUDA
    if (dev.is_cuda()) {
      const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index());
      const auto peak = st.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
      peak_extra = std::max<std::size_t>(peak_extra, static_cast<std::size_t>(peak - base));
    }
#endif
  }
  // Floor: the new weights' bytes loaded once into device tensors of the same shapes.
  {
    std::vector<at::Tensor> dst;
    for (const auto& t : ckpt.front()) dst.push_back(at::empty_like(t.value, at::TensorOptions().device(dev)));
    for (int r = 0; r < reps; ++r)
      floor_ms.push_back(time_ms(dev, [&] {
        for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(ckpt[r][i].value);
      }));
  }
  // Baseline without graphkeep: the same bytes copied into the model's
  // parameters in place, then every layer's PWAL (what an engine pays for a
  // reload with nothing to protect; its graphs are then stale).
  std::vector<double> load_pwal;
  {
    auto plain = std::make_shared<demo::TinyLM>(cfg, dev);
    gk::InMemorySource src0(ckpt[0]);
    gk::load_weights(*plain, src0);
    std::vector<at::Tensor> params;
    const auto named = plain->named_parameters(/*recurse=*/true);
    for (const auto& t : ckpt.front()) {
      const at::Tensor* p = named.find(t.name);
      GK_CHECK(gk::InternalError, p != nullptr, "bench_reload: checkpoint tensor ", t.name, " is no parameter");
      params.push_back(*p);
    }
    std::vector<gk::ReloadableLayer*> layers;
    for (const auto& m : plain->modules(/*include_self=*/true))
      if (auto* l = dynamic_cast<gk::ReloadableLayer*>(m.get())) layers.push_back(l);
    for (int r = 0; r < reps; ++r)
      load_pwal.push_back(time_ms(dev, [&] {
        for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(ckpt[r][i].value);
        for (auto* l : layers) l->process_weights_after_loading();
      }));
  }
  // Alternative: reload without copy-back (PWAL rebinds), then recapture every graph.
  {
    auto other = std::make_shared<demo::TinyLM>(cfg, dev);
    gk::InMemorySource src0(ckpt[0]);
    gk::load_weights(*other, src0);
    for (int r = 0; r < reps; ++r) {
      recapture.push_back(time_ms(dev, [&] {
        gk::InMemorySource src(ckpt[r]);
        gk::load_weights(*other, src);
        gk::ReloadEngine fresh_engine(*other);  // only to give the runner its tracking target
        fresh_engine.prepare();
        demo::GraphRunner rr(*other, fresh_engine, batch_sizes);
        rr.capture();
      }));
    }
  }
  // Model size: every planned slot's captured bytes.
  const std::size_t model_bytes = engine.plan().captured_bytes();
  // Largest layer's checkpoint bytes (the streaming bound is about one layer).
  std::size_t layer_bytes = 0;
  for (const auto& l : engine.plan().layers()) {
    std::size_t b = 0;
    for (const auto& s : l.slots) b += s.defined() ? s.captured.nbytes() : 0;
    layer_bytes = std::max(layer_bytes, b);
  }

  nlohmann::json j;
  j["layers"] = s.layers;
  j["dim"] = s.dim;
  j["experts"] = s.experts;
  j["slots"] = engine.plan().num_slots();
  j["model_bytes"] = model_bytes;
  j["checkpoint_bytes"] = ckpt_bytes;
  j["bytes_copied"] = copied;
  j["largest_layer_bytes"] = layer_bytes;
  j["reload_ms"] = median(reload);
  j["floor_ms"] = median(floor_ms);
  j["reload_recapture_ms"] = median(recapture);
  j["load_pwal_ms"] = median(load_pwal);
  j["overhead_vs_load_pwal"] = median(reload) / std::max(1e-9, median(load_pwal));
  j["overhead_vs_floor"] = median(reload) / std::max(1e-9, median(floor_ms));
  j["speedup_vs_recapture"] = median(recapture) / std::max(1e-9, median(reload));
  j["graphs"] = batch_sizes.size();
  auto phase = [&](double gk::PhaseTimes::*m) {
    std::vector<double> v;
    for (const auto& p : phases) v.push_back(p.*m);
    return median(v);
  };
  j["phases_ms"] = {{"detach", phase(&gk::PhaseTimes::detach_ms)}, {"load", phase(&gk::PhaseTimes::load_ms)},
                    {"pwal", phase(&gk::PhaseTimes::pwal_ms)},     {"check", phase(&gk::PhaseTimes::check_ms)},
                    {"copy", phase(&gk::PhaseTimes::copy_ms)},     {"verify", phase(&gk::PhaseTimes::verify_ms)}};
  if (dev.is_cuda()) j["peak_extra_bytes"] = peak_extra;
  std::printf("layers %3lld dim %4lld: slots %5zu, model %8.2f MiB | reload %8.2f ms, floor %8.2f ms (x%.2f), "
              "reload+recapture %8.2f ms (graphkeep x%.1f faster)%s\n",
              static_cast<long long>(s.layers), static_cast<long long>(s.dim), engine.plan().num_slots(),
              model_bytes / 1048576.0, median(reload), median(floor_ms), j["overhead_vs_floor"].get<double>(),
              median(recapture), j["speedup_vs_recapture"].get<double>(),
              dev.is_cuda() ? (", peak +" + std::to_string(peak_extra / 1048576.0) + " MiB").c_str() : "");
  std::printf("    load + PWAL without graphkeep %8.2f ms (reload x%.2f); phases (host ms): %s\n", median(load_pwal),
              j["overhead_vs_load_pwal"].get<double>(), j["phases_ms"].dump().c_str());
  std::fflush(stdout);
  return j;
}

// 2: copy-back throughput over many slots of mixed sizes.
nlohmann::json bench_copy(c10::Device dev, int reps) {
  nlohmann::json out = nlohmann::json::array();
  for (int64_t slots : {64, 1024, 8192}) {
    std::vector<at::Tensor> dst, src;
    std::size_t bytes = 0;
    for (int64_t i = 0; i < slots; ++i) {
      const int64_t n = 256 << (i % 6);  // 1 KiB .. 32 KiB of float32
      dst.push_back(at::empty({n}, at::TensorOptions().device(dev)));
      src.push_back(at::randn({n}, at::TensorOptions().device(dev)));
      bytes += n * 4;
    }
    at::Tensor flat_dst = at::empty({static_cast<int64_t>(bytes / 4)}, at::TensorOptions().device(dev));
    at::Tensor flat_src = at::randn({static_cast<int64_t>(bytes / 4)}, at::TensorOptions().device(dev));
    const gk::SlotCopyPlan plan(dst, src);  // prepared once, outside the timings
    std::vector<double> naive, foreach, batched, prepared, ceiling;
    for (int r = 0; r < reps + 1; ++r) {
      const double a = device_ms(dev, [&] {
        for (std::size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
      });
      const double f = device_ms(dev, [&] { at::_foreach_copy_(dst, src); });
      const double b = device_ms(dev, [&] { gk::copy_slots(dst, src); });
      const double p = device_ms(dev, [&] { plan.run(); });
      const double c = device_ms(dev, [&] { flat_dst.copy_(flat_src); });
      if (r == 0) continue;  // warm-up
      naive.push_back(a);
      foreach.push_back(f);
      batched.push_back(b);
      prepared.push_back(p);
      ceiling.push_back(c);
    }
    for (std::size_t i = 0; i < dst.size(); ++i)
      GK_CHECK(gk::InternalError, at::equal(dst[i], src[i]), "bench_reload: gk::copy_slots left slot ", i, " unequal");
    nlohmann::json j;
    const double gb = static_cast<double>(bytes) / 1e9;
    j["slots"] = slots;
    j["bytes"] = bytes;
    j["naive_ms"] = median(naive);
    j["foreach_ms"] = median(foreach);
    j["batched_ms"] = median(batched);
    j["prepared_ms"] = median(prepared);
    j["prepared_launches"] = plan.launches();
    j["ceiling_ms"] = median(ceiling);
    j["naive_GBps"] = gb / (median(naive) / 1e3);
    j["foreach_GBps"] = gb / (median(foreach) / 1e3);
    j["batched_GBps"] = gb / (median(batched) / 1e3);
    j["prepared_GBps"] = gb / (median(prepared) / 1e3);
    j["ceiling_GBps"] = gb / (median(ceiling) / 1e3);
    j["naive_vs_ceiling"] = median(ceiling) / median(naive);
    j["foreach_vs_ceiling"] = median(ceiling) / median(foreach);
    j["batched_vs_ceiling"] = median(ceiling) / median(batched);
    j["prepared_vs_ceiling"] = median(ceiling) / median(prepared);
    std::printf("copy-back %5lld slots (%7.2f MiB): per-slot %6.1f GB/s (%.2f of ceiling), _foreach_copy_ %6.1f GB/s "
                "(%.2f), gk::copy_slots %6.1f GB/s (%.2f), gk::SlotCopyPlan::run %6.1f GB/s (%.2f), plain copy %6.1f "
                "GB/s\n",
                static_cast<long long>(slots), bytes / 1048576.0, j["naive_GBps"].get<double>(),
                j["naive_vs_ceiling"].get<double>(), j["foreach_GBps"].get<double>(),
                j["foreach_vs_ceiling"].get<double>(), j["batched_GBps"].get<double>(),
                j["batched_vs_ceiling"].get<double>(), j["prepared_GBps"].get<double>(),
                j["prepared_vs_ceiling"].get<double>(), j["ceiling_GBps"].get<double>());
    out.push_back(j);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "auto", json_path = "bench_reload.json";
  int reps = 5;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--device" && i + 1 < argc) device = argv[++i];
    else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::stoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else {
      std::puts("usage: bench_reload [--device auto|cpu|cuda] [--json out.json] [--reps N] [--quick]");
      return a == "--help" ? 0 : 2;
    }
  }
  const bool cuda = device != "cpu" && gk::runtime::cuda_device_available();
  if (device == "cuda" && !cuda) {
    std::puts("bench_reload: no CUDA device");
    return 0;
  }
  const c10::Device dev = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  at::NoGradGuard no_grad;
  std::printf("bench_reload on %s, %d repetitions (medians)\n", dev.str().c_str(), reps);

  std::vector<Size> sizes = {{2, 64, 4, 32}, {4, 128, 8, 64}, {8, 256, 8, 128}, {16, 256, 16, 128}};
  if (cuda) sizes.push_back({16, 512, 16, 256});
  if (quick) sizes.resize(2);
  const std::vector<int64_t> batch_sizes{1, 2, 4, 8, 16, 32};
  nlohmann::json j;
  j["device"] = dev.str();
  j["reps"] = reps;
  j["batch_sizes"] = batch_sizes;
  j["models"] = nlohmann::json::array();
  for (const Size& s : sizes) j["models"].push_back(bench_size(s, dev, reps, batch_sizes));
  j["copy_back"] = bench_copy(dev, reps);
  std::ofstream(json_path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", json_path.c_str());
  return 0;
}
