// gk-online-bench: online reload at the sizes users serve.
//
// Builds the example engine (examples/engine) for a model shape with random
// weights made on the device, captures its 35 decode graphs, and measures, in
// one run and against baselines of the same run:
//
//   recapture_all_ms           capture all decode graphs again
//   d2d_copy_ms                one device copy of the bytes a commit copies
//                              (in 1 GiB chunks)
//   pinned_h2d_ms              the same bytes from pinned host memory
//   reload_gpu_source_ms       a streaming reload from device tensors handed
//                              over by a "trainer" that keeps the engine's
//                              layout (whole parameters, adopted: no load
//                              copy; verify included)
//   reload_gpu_source_copy_ms  the same from the checkpoint's tensors, copied
//                              (fused parameters need their parts copied in)
//   reload_pinned_source_ms    the same from pinned host memory: the pause of
//                              a model whose staging copy does not fit
//   reload_safetensors_ms      the same from a safetensors directory in the
//                              page cache (--safetensors-dir; written first)
//   load_pwal_no_graphkeep_ms  the same load and PWAL into a second model,
//                              with no graph protection
//   stage_ms, pause_ms         stage() on another thread (the mean of the
//                              stages repeated over --stage-window-ms and
//                              until --min-stage-steps decode steps were
//                              served meanwhile), then commit() (the pause)
//   pause_no_content_check_ms  the pause with gk::testing::EngineHooks::skip_adopted_content_check
//                              off (no hashing of the adopted tensors)
//   content_hash_ms            that hashing: at adoption in the stage, and in
//                              the pause
//   stage_finite_check_ms      the non-finite weight check in the stage
//   reload_no_finite_check_ms  reload_gpu_source_ms with the check off
//   decode_tok_s_idle          greedy decode throughput through the graphs,
//                              the next tokens chosen on the device
//                              (LlmEngine::decode), one batch, every
//                              sequence at position kv_len - 1
//   decode_tok_s_during_stage  the same while stage() runs
//   peak_above_model_gib       allocator peak above the served model during
//                              the streaming reload
//   largest_layer_gib          the largest layer's checkpoint bytes
//   host_us_per_slot           the host CPU time of the reload call per slot,
//                              up to its return (the device may still copy);
//                              its waits for the device included unless
//                              --blocking-sync (row key "sync"; Note [Host
//                              time and spinning waits] in bench_sync.h)
//
//   gk-online-bench --model llama8b --format dense --json out.json
//   gk-online-bench --model tiny --device cpu        (a smoke run anywhere)
//   gk-online-bench ... --scale-json FILE   (the reload's cost against the model's
//                                         bytes and tensors, Note [Scale rows]; --commit REV)
//   gk-online-bench ... --trace t.json   (a Kineto trace of one more streaming reload, trainer's
//                                         tensors adopted; bench/trace_summary.py)
//   gk-online-bench ... --trace-copied t.json   (the same of a reload with the checkpoint's
//                                         tensors copied: the per-expert path of a MoE)
//
// Models: bench/bench_models.h (llama8b, qwen3moe30b, tiny; llama8b-e32
// and dsv3-count: the same bytes, or DeepSeek-V3's tensor count, in many
// more tensors). One JSON object per run, appended as a
// line to --json.
#include "bench_args.h"
#include "bench_sync.h"
#include "bench_models.h"
#include "bench_trace.h"
#include "engine/checkpoint_writer.h"
#include "engine/llm_engine.h"

#include <graphkeep/reload/testing.h>

#include <graphkeep/core/stopwatch.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#ifdef GRAPHKEEP_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

using gkbench::checkpoint_shapes;
using gkbench::model_config;
using gkbench::random_tensor;
using gkbench::RandomDeviceSource;
using gkbench::Shape;

// A trainer's published weights: all made before the timed region.
std::vector<gk::NamedTensor> trainer_weights(const std::vector<Shape>& shapes, c10::Device device) {
  std::vector<gk::NamedTensor> out;
  for (const Shape& s : shapes) out.push_back({s.name, random_tensor(s, device), 0});
  return out;
}

// A trainer that keeps the engine's layout (fused q/k/v, gate/up, stacked
// experts) hands over whole parameters, by parameter name (weight_source.h).
std::vector<gk::NamedTensor> trainer_params(const gk::SlotPlan& plan, c10::Device device) {
  std::vector<gk::NamedTensor> out;
  for (const gk::LayerPlan& lp : plan.layers())
    for (const gk::CheckpointParam& cp : lp.params) {
      const Shape s{lp.full_name(cp.param), cp.shape(), cp.dtype()};
      out.push_back({s.name, random_tensor(s, device), 0});
    }
  return out;
}

// The checkpoint's tensors in pinned host memory: one pinned buffer (the
// caching host allocator would round each tensor up to a power of two),
// carved into 256-byte-aligned tensors.
std::vector<gk::NamedTensor> pinned_weights(const std::vector<Shape>& shapes, c10::Device device) {
  auto aligned = [](const Shape& s) { return (s.nbytes() + 255) / 256 * 256; };
  std::int64_t total = 0;
  for (const Shape& s : shapes) total += aligned(s);
  at::Tensor buffer = at::empty({total}, at::TensorOptions().dtype(at::kByte).pinned_memory(device.is_cuda()));
  std::vector<gk::NamedTensor> out;
  std::int64_t off = 0;
  for (const Shape& s : shapes) {
    at::Tensor t = buffer.narrow(0, off, s.nbytes()).view(s.dtype).view(s.shape);
    t.copy_(random_tensor(s, device));
    out.push_back({s.name, t, 0});
    off += aligned(s);
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

std::int64_t allocated_bytes(c10::Device d) {
#ifdef GRAPHKEEP_WITH_CUDA
  if (d.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(d.index()).allocated_bytes[0].current;
#endif
  (void)d;
  return 0;
}
std::int64_t peak_bytes(c10::Device d) {
#ifdef GRAPHKEEP_WITH_CUDA
  if (d.is_cuda()) return c10::cuda::CUDACachingAllocator::getDeviceStats(d.index()).allocated_bytes[0].peak;
#endif
  (void)d;
  return 0;
}
// Returns cached free blocks to the driver, so a phase's leftovers do not
// fragment the next one (a 57 GiB model built and freed, say).
void release_cache(c10::Device d) {
#ifdef GRAPHKEEP_WITH_CUDA
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  (void)d;
}
void reset_peak(c10::Device d) {
#ifdef GRAPHKEEP_WITH_CUDA
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
#endif
  (void)d;
}

// Copies `bytes` in chunks of at most 1 GiB from `src` (device or pinned
// host) to a device buffer; returns the time in ms.
double chunked_copy_ms(std::int64_t bytes, bool from_pinned_host, c10::Device device) {
  const std::int64_t chunk = std::min<std::int64_t>(bytes, std::int64_t{1} << 30);
  at::Tensor dst = at::empty({chunk}, at::TensorOptions().dtype(at::kByte).device(device));
  at::Tensor src = from_pinned_host
                       ? at::empty({chunk}, at::TensorOptions().dtype(at::kByte).pinned_memory(device.is_cuda()))
                       : at::empty({chunk}, at::TensorOptions().dtype(at::kByte).device(device));
  src.fill_(1);
  dst.copy_(src);  // warm-up
  gk::runtime::synchronize(device);
  const gk::Stopwatch w;
  for (std::int64_t done = 0; done < bytes; done += chunk) {
    const std::int64_t n = std::min(chunk, bytes - done);
    dst.narrow(0, 0, n).copy_(src.narrow(0, 0, n), /*non_blocking=*/true);
  }
  gk::runtime::synchronize(device);
  return w.elapsed_ms();
}

// Decode throughput: greedy steps through the graphs, the next tokens chosen
// on the device (LlmEngine::decode: only the ids come back), every
// sequence at position `pos`. `steps` steps, or until `until` is set (then
// `served`, when given, counts the steps as they are done).
double decode_tok_s(demo::LlmEngine& eng, std::int64_t batch, std::int64_t pos, int steps,
                    const std::atomic<bool>* until = nullptr, std::atomic<std::int64_t>* served = nullptr) {
  const at::Tensor tokens = at::arange(batch, at::kLong).remainder(eng.config().vocab_size);
  const at::Tensor positions = at::full({batch}, pos, at::kLong);
  (void)eng.decode(tokens, positions);
  const gk::Stopwatch w;
  std::int64_t n = 0;
  if (until != nullptr) {
    while (!until->load()) {
      (void)eng.decode(tokens, positions);
      ++n;
      if (served) served->store(n);
    }
  } else {
    for (; n < steps; ++n) (void)eng.decode(tokens, positions);
  }
  return n > 0 ? static_cast<double>(n * batch) / (w.elapsed_ms() / 1e3) : 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  gkbench::CommonArgs common(/*default_batch=*/64);
  std::string &model = common.model, &format_name = common.format, &json = common.json,
              &device_name = common.device;
  std::int64_t& batch = common.batch;
  bool streaming_only = false;  // no second model and no staged copy: for models that fill the GPU
  bool no_plain = false;        // no second model (the plain load + PWAL baseline)
  bool adopt_stage = true;      // stage() adopts the trainer's tensors (else copies them)
  bool high_priority = true;    // LlmEngineOptions::high_priority_serving
  double stage_share = 1.0;     // LlmEngineOptions::stage_device_share
  std::string safetensors_dir;  // where to write the checkpoint for reload_safetensors_ms
  double stage_window_ms = 2000;  // how long stage() is repeated while decoding (at least)
  std::int64_t min_stage_steps = 200;  // ... and until this many decode steps were served meanwhile
  std::int64_t max_len = 64;           // the KV cache length; decode runs at position max_len - 1
  int reps = 3;                   // streaming reloads measured (median)
  std::int64_t layers = 0;        // > 0: the model's layer count (the slot count of a big model, small tensors)
  std::string trace;              // a Kineto trace of one more streaming reload (adopted)
  std::string trace_copied;       // the same, the checkpoint's tensors copied
  std::string scale_json;         // the scale rows (Note [Scale rows]) appended here
  for (gkbench::ArgWalker a(argc, argv); a.next();) {
    if (a.common(common)) continue;
    const std::string k = a.flag();
    auto val = [&] { return a.value(); };
    if (k == "--streaming-only") streaming_only = true;
    else if (k == "--no-plain") no_plain = true;
    else if (k == "--copy-stage") adopt_stage = false;
    else if (k == "--same-priority") high_priority = false;
    else if (k == "--stage-share") stage_share = std::stod(val());
    else if (k == "--safetensors-dir") safetensors_dir = val();
    else if (k == "--stage-window-ms") stage_window_ms = std::stod(val());
    else if (k == "--min-stage-steps") min_stage_steps = std::stoll(val());
    else if (k == "--kv-len") max_len = std::stoll(val());
    else if (k == "--reps") reps = std::max(1, std::stoi(val()));
    else if (k == "--layers") layers = std::stoll(val());
    else if (k == "--trace") trace = val();
    else if (k == "--trace-copied") trace_copied = val();
    else if (k == "--scale-json") scale_json = val();
    else {
      std::fprintf(stderr, "usage: gk-online-bench [--model llama8b|qwen3moe30b|llama8b-e32|dsv3-count|tiny] [--format dense|fp8|w4a16] "
                           "[--device auto|cpu|cuda] [--batch B] [--streaming-only] [--no-plain] [--copy-stage] [--same-priority] [--stage-share S] [--safetensors-dir DIR] [--stage-window-ms MS] [--min-stage-steps N] [--kv-len L] [--reps N] [--layers N] [--json FILE] [--scale-json FILE] [--trace FILE] [--trace-copied FILE] [--blocking-sync] [--commit REV]\n");
      return 2;
    }
  }
  const std::string sync = gkbench::apply_sync(common.blocking_sync);  // Note [Host time and spinning waits]
  try {
    at::NoGradGuard no_grad;
    const bool cuda = device_name == "cuda" || (device_name == "auto" && gk::runtime::cuda_device_available());
    const c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
    demo::HfConfig cfg = model_config(model);
    if (layers > 0) cfg.num_hidden_layers = layers;
    const demo::WeightFormat format = demo::parse_weight_format(format_name);
    const std::vector<Shape> shapes = checkpoint_shapes(cfg, device);
    release_cache(device);
    std::map<std::string, double> layer_bytes;
    double weights_bytes = 0;
    for (const Shape& s : shapes) {
      const double b = static_cast<double>(s.nbytes());
      weights_bytes += b;
      const auto p = s.name.find(".layers.");
      const std::string layer = p == std::string::npos ? s.name
                                                       : s.name.substr(0, s.name.find('.', p + 8));
      layer_bytes[layer] += b;
    }
    double largest_layer = 0;
    for (const auto& [_, b] : layer_bytes) largest_layer = std::max(largest_layer, b);
    constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
    std::printf("gk-online-bench: %s (%s), %s, %.2f GiB of weights, largest layer %.2f GiB, device %s\n",
                model.c_str(), cfg.model_type.c_str(), format_name.c_str(), weights_bytes / GiB, largest_layer / GiB,
                device.str().c_str());
    std::fflush(stdout);

    demo::LlmEngineOptions opts;
    opts.max_len = max_len;
    opts.sampling_graphs = false;  // greedy decode only: no sampling graphs' memory beside a staged model
    opts.reload.adopt_source_tensors = adopt_stage;  // what stage() does with the trainer's tensors
    opts.high_priority_serving = high_priority;
    opts.stage_device_share = stage_share;
    const gk::Stopwatch build_watch;
    RandomDeviceSource first(shapes, device);
    demo::LlmEngine eng(cfg, device, format, first, opts);
    const gk::SlotPlan& plan = eng.reload_engine().plan();
    const std::int64_t captured = static_cast<std::int64_t>(plan.captured_bytes());
    std::printf("  built and captured %zu graphs in %.0f ms (capture %.0f ms); %zu slots, %.2f GiB captured\n",
                eng.num_graphs(), build_watch.elapsed_ms(), eng.capture_ms(), plan.num_slots(),
                static_cast<double>(captured) / GiB);
    std::fflush(stdout);

    const std::int64_t decode_pos = max_len - 1;
    const double idle = decode_tok_s(eng, batch, decode_pos, 200);
    const double d2d = chunked_copy_ms(captured, false, device);
    const double h2d = device.is_cuda() ? chunked_copy_ms(captured, true, device) : 0.0;

    // Streaming reloads, each `reps` times (the median is reported): the
    // source's tensors are made once and handed over again each time.
    struct Measured {
      double ms = 0, host_us = 0, peak_above = 0;
      gk::PhaseTimes phases;
      std::size_t adopted = 0;
    };
    std::size_t drift = 0, verified = 0;
    auto measure = [&](const char* what, int n, const std::function<gk::ReloadReport()>& reload) {
      Measured m;
      std::vector<double> wall, host;
      for (int rep = 0; rep < n; ++rep) {
        gk::runtime::synchronize(device);
        const std::int64_t base = allocated_bytes(device);
        reset_peak(device);
        const double cpu0 = thread_cpu_ms();
        const gk::Stopwatch t;
        const gk::ReloadReport r = reload();
        // The reload's own host work: up to its return, before waiting for
        // the device (a spinning wait would count as CPU time).
        host.push_back((thread_cpu_ms() - cpu0) * 1e3 / static_cast<double>(plan.num_slots()));
        gk::runtime::synchronize(device);
        wall.push_back(t.elapsed_ms());
        // `base` includes the source's tensors; what the reload adds above them:
        m.peak_above = std::max(m.peak_above, static_cast<double>(peak_bytes(device) - base) / GiB);
        drift += r.drift;
        verified = r.addresses_verified;
        m.adopted = r.tensors_adopted;
        if (rep == n / 2) m.phases = r.times;
      }
      m.ms = median(wall);
      m.host_us = median(host);
      std::printf("  %-34s %9.2f ms  (host %.2f us/slot, %zu tensors adopted, peak +%.2f GiB)\n", what, m.ms,
                  m.host_us, m.adopted, m.peak_above);
      std::fflush(stdout);
      return m;
    };
    gk::ReloadOptions adopt = eng.reload_engine().options().defaults, copy = adopt;
    adopt.adopt_source_tensors = true;
    copy.adopt_source_tensors = false;
    Measured gpu, gpu_copy, pinned, st;
    {
      const std::vector<gk::NamedTensor> w = trainer_params(plan, device);
      gpu = measure("reload, trainer's tensors adopted", reps, [&] {
        gk::InMemorySource src(w);
        return eng.reload(src, adopt);
      });
    }
    release_cache(device);
    {
      const std::vector<gk::NamedTensor> w = trainer_weights(shapes, device);
      gpu_copy = measure("reload, checkpoint tensors copied", reps, [&] {
        gk::InMemorySource src(w);
        return eng.reload(src, copy);
      });
      if (!trace_copied.empty()) {  // after the measured ones, as --trace
        gk::InMemorySource src(w);
        const gkbench::KinetoTrace tracing(trace_copied);
        eng.reload(src, copy);
      }
    }
    release_cache(device);
    if (device.is_cuda()) {
      const std::vector<gk::NamedTensor> w = pinned_weights(shapes, device);
      pinned = measure("reload from pinned host memory", std::min(reps, 2), [&] {
        gk::InMemorySource src(w, "pinned host weights");
        return eng.reload(src, copy);
      });
      if (!safetensors_dir.empty()) {
        demo::write_hf_checkpoint(safetensors_dir, cfg, w, std::size_t{4} << 30);
        st = measure("reload from safetensors (page cache)", std::min(reps, 2),
                     [&] { return eng.reload(safetensors_dir, copy); });
      }
    }
    // The non-finite weight check's share of that reload: the same with it off.
    Measured unchecked;
    {
      gk::ReloadOptions o = adopt;
      o.allow_non_finite = true;
      const std::vector<gk::NamedTensor> w = trainer_params(plan, device);
      unchecked = measure("reload, adopted, non-finite check off", reps, [&] {
        gk::InMemorySource src(w);
        return eng.reload(src, o);
      });
    }
    if (!trace.empty()) {  // after the measured ones: kernels loaded, caches warm
      const std::vector<gk::NamedTensor> w = trainer_params(plan, device);
      gk::InMemorySource src(w);
      const gkbench::KinetoTrace tracing(trace);
      eng.reload(src, adopt);
    }
    release_cache(device);
    const double reload_ms = gpu.ms, host_us = gpu.host_us, peak_above = gpu.peak_above;
    const gk::PhaseTimes phases = gpu.phases;
    release_cache(device);
    // The same load and PWAL into a second model, without graphkeep.
    double plain_ms = -1;
    if (!streaming_only && !no_plain) {
      std::vector<gk::NamedTensor> w = trainer_weights(shapes, device);
      demo::CausalLM second(cfg, device, format);
      gk::InMemorySource src(std::move(w));
      gk::runtime::synchronize(device);
      const gk::Stopwatch t;
      gk::load_weights(second, src);
      gk::runtime::synchronize(device);
      plain_ms = t.elapsed_ms();
    }
    release_cache(device);
    // Online: stage on another thread while this one decodes, then commit.
    double stage_ms = -1, pause_ms = -1, during = -1, pause_unhashed_ms = -1, stage_finite_ms = -1,
           content_hash_ms = -1;
    std::string stage_note;
    std::atomic<std::int64_t> served{0};
    int stage_count = 0;
    if (!streaming_only) {
      // The trainer's weights, staged again and again (each stage but the
      // last aborted) for at least `stage_window_ms` and until at least
      // `min_stage_steps` decode steps were served meanwhile, so that the
      // decode throughput during staging is measured over many decode steps
      // even when one stage is shorter than a decode step.
      const std::vector<gk::NamedTensor> w = trainer_params(plan, device);
      gk::runtime::synchronize(device);
      std::atomic<bool> done{false};
      gk::StagedReload staged;
      std::exception_ptr error;
      int stages = 0;
      double stage_total = 0;
      std::thread stager([&] {
        const gk::Stopwatch window;
        try {
          do {
            if (staged) staged.abort();
            gk::InMemorySource src(w);  // handles to the same tensors: nothing is copied
            const gk::Stopwatch t;
            staged = eng.stage(src);
            stage_total += t.elapsed_ms();
            ++stages;
          } while (window.elapsed_ms() < stage_window_ms || served.load() < min_stage_steps);
        } catch (...) {
          error = std::current_exception();
        }
        done = true;
      });
      during = decode_tok_s(eng, batch, decode_pos, 0, &done, &served);
      stager.join();
      try {
        if (error) std::rethrow_exception(error);
        stage_ms = stage_total / std::max(stages, 1);
        stage_count = stages;
        const gk::Stopwatch t;
        const gk::ReloadReport r = eng.commit(std::move(staged));
        pause_ms = t.elapsed_ms();
        drift += r.drift;
        stage_finite_ms = r.times.finite_ms;
        content_hash_ms = r.times.hash_ms;  // the stage's hashes at adoption and the commit's in the pause
        // The same stage and commit with the adopted-content check off: the
        // pause without the commit's hashing (Note [Adopted tensors are hashed]).
        gk::testing::EngineHooks h;
        h.skip_adopted_content_check = true;
        const gk::testing::ScopedHooks no_check(&eng.reload_engine(), std::move(h));
        gk::InMemorySource src(w);
        gk::StagedReload unhashed = eng.reload_engine().stage(src);
        const gk::Stopwatch t2;
        drift += eng.commit(std::move(unhashed)).drift;
        pause_unhashed_ms = t2.elapsed_ms();
      } catch (const c10::OutOfMemoryError& e) {
        // The row keeps what was measured; stage_ms and pause_ms stay null.
        const std::string what = e.what();
        stage_note = "staging did not fit on the device: " + what.substr(0, what.find('\n'));
        during = -1;
        std::printf("  %s\n", stage_note.c_str());
      }
    }
    const double recapture_ms = eng.recapture();

    // One row, its keys in this order, numbers rounded to the digits a reader
    // uses. `maybe` marks what a run may not measure (negative: null).
    const auto num = gkbench::rounded;
    const auto maybe = gkbench::rounded_or_null;
    const nlohmann::ordered_json row = {
        {"model", model},
        {"format", format_name},
        {"weights_gib", num(weights_bytes / GiB, 3)},
        {"graphs", eng.num_graphs()},
        {"recapture_all_ms", num(recapture_ms, 2)},
        {"d2d_copy_ms", num(d2d, 3)},
        {"pinned_h2d_ms", num(h2d, 3)},
        {"reload_gpu_source_ms", num(reload_ms, 3)},
        {"reload_gpu_source_copy_ms", num(gpu_copy.ms, 3)},
        {"reload_pinned_source_ms", maybe(device.is_cuda() ? pinned.ms : -1, 3)},
        {"reload_safetensors_ms", maybe(safetensors_dir.empty() ? -1 : st.ms, 3)},
        {"tensors_adopted", gpu.adopted},
        {"host_us_per_slot_copy", num(gpu_copy.host_us, 2)},
        {"stage_adopts", adopt_stage},
        {"load_pwal_no_graphkeep_ms", maybe(plain_ms, 3)},
        {"stage_ms", maybe(stage_ms, 3)},
        {"pause_ms", maybe(pause_ms, 3)},
        {"pause_no_content_check_ms", maybe(pause_unhashed_ms, 3)},
        {"content_hash_ms", maybe(content_hash_ms, 3)},
        {"stage_finite_check_ms", maybe(stage_finite_ms, 3)},
        {"reload_no_finite_check_ms", num(unchecked.ms, 3)},
        {"decode_tok_s_idle", num(idle, 1)},
        {"decode_tok_s_during_stage", maybe(during, 1)},
        {"decode_steps_during_stage", served.load()},
        {"decode_logits", "decode, greedy, tokens chosen on the device"},
        {"decode_position", decode_pos},
        {"fast_cuda", opts.fast_cuda},
        {"stages", stage_count},
        {"peak_above_model_gib", num(peak_above, 3)},
        {"largest_layer_gib", num(largest_layer / GiB, 3)},
        {"host_us_per_slot", num(host_us, 2)},
        {"slots", plan.num_slots()},
        {"captured_gib", num(static_cast<double>(captured) / GiB, 3)},
        {"reload_phases_ms",
         {{"detach", num(phases.detach_ms, 3)},
          {"load", num(phases.load_ms, 3)},
          {"pwal", num(phases.pwal_ms, 3)},
          {"check", num(phases.check_ms, 3)},
          {"finite", num(phases.finite_ms, 3)},
          {"hash", num(phases.hash_ms, 3)},
          {"copy", num(phases.copy_ms, 3)},
          {"verify", num(phases.verify_ms, 3)}}},
        {"reps", reps},
        {"addresses_verified", verified},
        {"drift", drift},
        {"batch", batch},
        {"streaming_only", streaming_only},
        {"stage_note", stage_note},
        {"high_priority_serving", opts.high_priority_serving},
        {"stage_device_share", num(opts.stage_device_share, 2)},
        {"device", device.str()},
        {"sync", sync},
    };
    const std::string line = row.dump();
    std::printf("%s\n", line.c_str());
    if (!json.empty()) std::ofstream(json, std::ios::app) << line << "\n";

    // Note [Scale rows]
    // ~~~~~~~~~~~~~~~~~
    // The reload's cost against the model's bytes and tensor count, one row
    // per mode, its keys in a fixed order (the rows of
    // docs/data/reload_scale_h100.json): `streaming` (the trainer's tensors
    // adopted; serving waits for the whole reload, so pause_ms is
    // reload_ms), and, when staging ran, `staged` twice: with the adopted-
    // content check on (reload_ms is stage + pause) and off (the pause
    // alone; the stage was not timed apart). host_us_per_slot is the
    // streaming reload's (null for the staged rows: not measured), and
    // check_adopted_content is null for it (a staged commit's option).
    // `tensors` counts the checkpoint's tensors, `slots` the plan's.
    // `source` says what the reload read: `adopted` (the trainer's whole
    // parameters, adopted), or, for one more streaming row, `copied` (the
    // checkpoint's tensors, loaded into fresh parameters: per expert at a
    // MoE).
    const std::string card =
#ifdef GRAPHKEEP_WITH_CUDA
        device.is_cuda() ? std::string(at::cuda::getDeviceProperties(device.index())->name) :
#endif
                         std::string("cpu");
    auto scale_row = [&](const char* mode, double reload, double pause, double host, const nlohmann::ordered_json& checked,
                         const char* source = "adopted") {
      return nlohmann::ordered_json{
          {"model", model},
          {"format", format_name},
          {"model_bytes", static_cast<std::int64_t>(weights_bytes)},
          {"tensors", shapes.size()},
          {"slots", plan.num_slots()},
          {"mode", mode},
          {"reload_ms", maybe(reload, 3)},
          {"pause_ms", maybe(pause, 3)},
          {"d2d_copy_ms", num(d2d, 3)},
          {"host_us_per_slot", maybe(host, 2)},
          {"check_adopted_content", nlohmann::ordered_json(checked)},
          {"commit", common.commit},
          {"date", gkbench::utc_date()},
          {"gpu", card},
          {"layers", cfg.num_hidden_layers},
          {"reps", reps},
          {"sync", sync},
          {"source", source},
      };
    };
    if (!scale_json.empty()) {
      std::ofstream out(scale_json, std::ios::app);
      out << scale_row("streaming", reload_ms, reload_ms, host_us, nullptr).dump() << "\n";
      out << scale_row("streaming", gpu_copy.ms, gpu_copy.ms, gpu_copy.host_us, nullptr, "copied").dump() << "\n";
      if (stage_ms >= 0 && pause_ms >= 0) {
        out << scale_row("staged", stage_ms + pause_ms, pause_ms, -1, true).dump() << "\n";
        out << scale_row("staged", -1, pause_unhashed_ms, -1, false).dump() << "\n";
      }
    }
    return drift == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gk-online-bench: %s\n", e.what());
    return 1;
  }
}
