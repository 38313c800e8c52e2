// bench_delta: weight patches through the reload engine at the sizes users
// serve, against full reloads of the same target in the same run.
//
// Builds the example engine (examples/engine) for a model shape, with its
// decode graphs captured, and for each density:
//   1. loads the base weights B in full (every tensor made on the device
//      from a seed: nothing of the model's size is kept outside the engine);
//   2. makes the patch B -> T in groups of 2 GiB (gk::make_patch on the device;
//      make_patch_ms), T made from B as the density says;
//   3. stages it and commits it (stage_ms, pause_ms = the commit until the device is idle, hash_ms =
//      the stage's hashing), then decodes one batch through the graphs;
//   3b. reloads B, and stages and commits the patch once more
//      (stage_again_ms, pause_again_ms, update_again_ms,
//      host_us_per_tensor_again): the allocator's cache warm, as in a loop
//      that patches every step;
//   4. reloads B, and applies the patch again with verify_served
//      (pause_verify_ms: what re-hashing the served tensors adds to the
//      pause); its decode must equal step 3's; then again with
//      PatchWrites::sectors (stage_sectors_ms, pause_sectors_ms,
//      update_sectors_ms: the shorter pause, the longer stage; step 3 wrote
//      elements, the default: Note [Sector images]), the same decode;
//   5. stages T in full and commits it (full_stage_ms, full_pause_ms), decodes
//      the same batch: `exact` is every decode's logits bitwise equal and
//      the served content versions equal (--streaming-full: T by a streaming
//      reload instead, whose whole time is then full_pause_ms; for a model
//      whose staged copy does not fit beside it);
//   6. reloads T in full (full_reload_ms), and stages T in full with
//      gk::testing::EngineHooks::skip_served_hashes (full_stage_nohash_ms: what hashing
//      adds to a stage; full_stage_hash_ms is the hashing's own time);
// The full stages and reloads read tensors made on the device as they go;
// the time making them is subtracted (a trainer's device tensors, handed
// over).
// Once per run: one device copy of the model's bytes (d2d_copy_ms, the
// baseline of the scatter's aim).
//
// Densities: "adamw:LR" is a real AdamW step: every tensor (fp32 master
// weights at realistic scale: std 1/sqrt(fan_in), norms near 1) takes --warmup
// AdamW steps with random gradients (betas 0.9/0.999, eps 1e-8, weight decay
// 0.01 except norms), B is its bf16 rounding before the last step and T
// after it; the density is what changed bit for bit. A number is the share
// of elements changed at random positions of random-init weights.
//
//   bench_delta --model llama8b --format dense --densities adamw:1e-6,adamw:3e-6,0.01,0.1 --json out.json
//   bench_delta --model tiny --device cpu --densities 0.01          (a smoke run anywhere)
//   bench_delta ... --trace t.json   (a Kineto trace of the last density's stage and commit; bench/trace_summary.py)
//   bench_delta --model qwen3moe30b --layers 24 ...   (half the MoE's depth, every layer's tensors: fits 80 GB)
//
// One JSON object per density, appended as a line to --json (and printed):
// model, model_layers, format, density, patch_bytes, model_bytes, make_patch_ms, stage_ms,
// pause_ms, update_ms (stage + pause), full_update_ms (the full update from
// the same tensors: stage + pause, or a streaming reload), full_pause_ms,
// full_reload_ms, hash_ms, layers_rerun, blocks_recomputed (rows of FP8
// weights requantized without PWAL), host_us_per_tensor (the staging
// thread's CPU time per patched tensor), exact, and more keys.
#include "bench_args.h"
#include "bench_sync.h"
#include "bench_models.h"
#include "bench_trace.h"
#include "engine/checkpoint_writer.h"
#include "engine/llm_engine.h"

#include <graphkeep/reload/testing.h>

#include <graphkeep/core/stopwatch.h>
#include <graphkeep/delta/make_patch.h>
#include <graphkeep/reload/served_weights.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <nlohmann/json.hpp>
#ifdef GRAPHKEEP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

// CPU time of the calling thread, in ms.
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}


// How T is made from B.
struct Change {
  std::string label;   // "adamw:1e-06" or "0.01"
  double lr = 0;       // > 0: an AdamW step at this learning rate
  double share = 0;    // else: this share of elements at random positions
};
Change parse_change(const std::string& s) {
  Change c{s};
  if (s.rfind("adamw:", 0) == 0) c.lr = std::stod(s.substr(6));
  else c.share = std::stod(s);
  return c;
}

// Every tensor made where it lives, from a seed of its own: B and T of one
// checkpoint tensor, on demand.
class Weights {
 public:
  Weights(std::vector<gk::CheckpointTensor> shapes, c10::Device device, int warmup)
      : shapes_(std::move(shapes)), device_(device), warmup_(warmup) {}
  const std::vector<gk::CheckpointTensor>& shapes() const { return shapes_; }

  // (B, T) of tensor i for `c`; T undefined when !target.
  std::pair<at::Tensor, at::Tensor> make(std::size_t i, const Change& c, bool target) {
    const gk::CheckpointTensor& s = shapes_[i];
    // The device's default generator, seeded per tensor (one thread makes
    // the weights; ATen's ops lock the generator themselves).
    at::Generator g = at::globalContext().defaultGenerator(device_);
    {
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_current_seed(0x9E3779B97F4A7C15ull ^ std::hash<std::string>{}(s.name));
    }
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device_);
    const bool norm = s.name.ends_with("norm.weight");
    at::Tensor w = norm ? 1.0 + 0.05 * at::randn(s.shape, g, f32)
                        : at::randn(s.shape, g, f32) * (1.0 / std::sqrt(static_cast<double>(s.shape.back())));
    if (c.lr <= 0) {
      const at::Tensor base = w.to(s.dtype, /*non_blocking=*/false, /*copy=*/true);
      if (!target) return {base, {}};
      const at::Tensor mask = at::rand(s.shape, g, f32) < c.share;
      // A relative move of 1% (several bf16 ulps): the element's bits change.
      const at::Tensor moved = (w * (1.0 + 0.01 * at::sign(at::randn(s.shape, g, f32)))).to(s.dtype);
      return {base, at::where(mask, moved, base)};
    }
    // AdamW from zero moments; B before the last step, T after it.
    at::Tensor m = at::zeros_like(w), v = at::zeros_like(w);
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = norm ? 0.0 : 0.01;
    at::Tensor base;
    for (int step = 1; step <= warmup_ + 1; ++step) {
      if (step == warmup_ + 1) {
        base = w.to(s.dtype, /*non_blocking=*/false, /*copy=*/true);  // w moves on in place
        if (!target) return {base, {}};
      }
      const at::Tensor grad = at::randn(s.shape, g, f32);
      m.mul_(b1).add_(grad, 1 - b1);
      v.mul_(b2).addcmul_(grad, grad, 1 - b2);
      const double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
      w.mul_(1 - c.lr * wd).sub_((m / c1) / ((v / c2).sqrt() + eps) * c.lr);
    }
    return {base, w.to(s.dtype)};
  }

  // A source yielding B (or T) of every tensor, made as it goes. made_ms:
  // the time spent making them (the device synchronized around each), which
  // the full-reload baselines subtract: they stand for a reload from tensors
  // a trainer already holds on the device.
  class Source final : public gk::WeightSource {
   public:
    Source(Weights& w, Change c, bool target) : w_(w), c_(std::move(c)), target_(target) {}
    std::optional<gk::NamedTensor> next() override {
      if (i_ >= w_.shapes_.size()) return std::nullopt;
      const std::size_t i = i_++;
      gk::runtime::synchronize(w_.device_);
      const gk::Stopwatch watch;
      auto [b, t] = w_.make(i, c_, target_);
      gk::runtime::synchronize(w_.device_);
      made_ms += watch.elapsed_ms();
      return gk::NamedTensor{w_.shapes_[i].name, target_ ? t : b, 0};
    }
    std::string describe() const override { return std::string(target_ ? "T" : "B") + " of " + c_.label; }
    double made_ms = 0;

   private:
    Weights& w_;
    Change c_;
    bool target_;
    std::size_t i_ = 0;
  };

 private:
  std::vector<gk::CheckpointTensor> shapes_;
  c10::Device device_;
  int warmup_;
};

double copy_ms(std::int64_t bytes, c10::Device device) {
  const std::int64_t chunk = std::min<std::int64_t>(bytes, std::int64_t{1} << 30);
  const auto o = at::TensorOptions().dtype(at::kByte).device(device);
  at::Tensor src = at::ones({chunk}, o), dst = at::empty({chunk}, o);
  dst.copy_(src);
  gk::runtime::synchronize(device);
  const gk::Stopwatch w;
  for (std::int64_t done = 0; done < bytes; done += chunk) {
    const std::int64_t n = std::min(chunk, bytes - done);
    dst.narrow(0, 0, n).copy_(src.narrow(0, 0, n));
  }
  gk::runtime::synchronize(device);
  return w.elapsed_ms();
}

// Commits `staged` and waits for the device: the pause as the next decode
// step sees it, whatever the commit left queued (a patch's commit waits for
// its scatter, a full commit need not wait for its copies). Sets
// report.times.commit_ms to it.
template <class Commit>
gk::ReloadReport timed_commit(Commit&& commit, c10::Device device) {
  gk::runtime::synchronize(device);
  const gk::Stopwatch w;
  gk::ReloadReport r = commit();
  gk::runtime::synchronize(device);
  r.times.commit_ms = w.elapsed_ms();
  return r;
}

// The CUDA caching allocator's bytes in use on `device`: now, and the peak
// since the last reset_peak() (0 on the CPU).
struct DeviceMemory {
  static void reset_peak(c10::Device device) {
#ifdef GRAPHKEEP_WITH_CUDA
    if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
    (void)device;
  }
  static std::pair<double, double> now_and_peak_gib(c10::Device device) {
#ifdef GRAPHKEEP_WITH_CUDA
    if (device.is_cuda()) {
      const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
      const auto& a = st.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      return {static_cast<double>(a.current) / (1 << 30), static_cast<double>(a.peak) / (1 << 30)};
    }
#endif
    (void)device;
    return {0.0, 0.0};
  }
};

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && at::equal(a.contiguous().view(at::kByte), b.contiguous().view(at::kByte));
}

}  // namespace

int main(int argc, char** argv) {
  gkbench::CommonArgs common(/*default_batch=*/8);
  std::string &model = common.model, &format_name = common.format, &json = common.json,
              &device_name = common.device;
  std::int64_t& batch = common.batch;
  std::string densities = "adamw:1e-6,adamw:3e-6,0.01,0.1";
  std::int64_t max_batch = 0;
  int warmup = 3;
  bool streaming_full = false;  // the full baseline by a streaming reload (no staged copy of the model)
  std::string trace;            // a Kineto trace of the last density's stage and commit
  std::int64_t layers = 0;      // > 0: the model's layer count (a MoE's tensors per layer on an 80 GB card)
  for (gkbench::ArgWalker a(argc, argv); a.next();) {
    if (a.common(common)) continue;
    const std::string k = a.flag();
    auto val = [&] { return a.value(); };
    if (k == "--densities") densities = val();
    else if (k == "--max-batch") max_batch = std::stoll(val());
    else if (k == "--warmup") warmup = std::stoi(val());
    else if (k == "--streaming-full") streaming_full = true;
    else if (k == "--trace") trace = val();
    else if (k == "--layers") layers = std::stoll(val());
    else {
      std::fprintf(stderr, "usage: bench_delta [--model llama8b|qwen3moe30b|llama8b-e32|dsv3-count|moe-narrow|llama1b|tiny] [--format dense|fp8|w4a16] "
                           "[--device auto|cpu|cuda] [--densities adamw:LR,SHARE,...] [--batch B] [--max-batch N] "
                           "[--warmup STEPS] [--streaming-full] [--layers N] [--json FILE] [--trace FILE] [--blocking-sync]\n");
      return 2;
    }
  }
  const std::string sync = gkbench::apply_sync(common.blocking_sync);  // Note [Host time and spinning waits]
  try {
    at::NoGradGuard no_grad;
    const bool cuda = device_name == "cuda" || (device_name == "auto" && gk::runtime::cuda_device_available());
    const c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
    demo::HfConfig cfg = gkbench::model_config(model);
    if (layers > 0) cfg.num_hidden_layers = layers;
    const demo::WeightFormat format = demo::parse_weight_format(format_name);
    std::vector<gk::CheckpointTensor> shapes;
    {
      demo::CausalLM m(cfg, c10::Device(c10::kMeta), demo::WeightFormat::dense);
      shapes = demo::expected_checkpoint(m);
    }
    std::int64_t model_bytes = 0;
    for (const gk::CheckpointTensor& s : shapes) {
      std::int64_t n = static_cast<std::int64_t>(c10::elementSize(s.dtype));
      for (const std::int64_t d : s.shape) n *= d;
      model_bytes += n;
    }
    Weights weights(shapes, device, warmup);
    std::vector<Change> changes;
    {
      std::stringstream ss(densities);
      for (std::string item; std::getline(ss, item, ',');) changes.push_back(parse_change(item));
    }
    std::printf("bench_delta: %s (%s), %s, %.2f GiB of weights, device %s\n", model.c_str(), cfg.model_type.c_str(),
                format_name.c_str(), static_cast<double>(model_bytes) / (1 << 30), device.str().c_str());
    std::fflush(stdout);

    demo::LlmEngineOptions opts;
    opts.max_len = 32;
    if (max_batch > 0) std::erase_if(opts.batch_sizes, [&](std::int64_t b) { return b > max_batch; });
    Weights::Source first(weights, changes.front(), false);
    demo::LlmEngine eng(cfg, device, format, first, opts);
    const double d2d_ms = device.is_cuda() ? copy_ms(model_bytes, device) : 0.0;
    const at::Tensor tokens = at::arange(batch, at::kLong).mul(7).remainder(cfg.vocab_size);
    const at::Tensor pos = at::full({batch}, 3, at::kLong);

    for (const Change& c : changes) {
      // 1. B in full.
      {
        Weights::Source b(weights, c, false);
        eng.reload(b);
      }
      // 2. The patch B -> T.
      gk::Patch patch;
      patch.base_version = "B";
      patch.target_version = "T " + c.label;
      double make_ms = 0;
      std::size_t changed = 0, total = 0;
      // In groups of at most 2 GiB of weights (B and T of the whole model
      // do not fit beside a 30B engine): one make_patch call per group, as a
      // trainer publishing layer by layer would make them.
      constexpr std::int64_t kGroupBytes = std::int64_t{2} << 30;
      for (std::size_t i = 0; i < shapes.size();) {
        std::vector<gk::NamedTensor> bs, ts;
        std::int64_t bytes = 0;
        for (; i < shapes.size() && (bs.empty() || bytes < kGroupBytes); ++i) {
          auto [b, t] = weights.make(i, c, true);
          bytes += static_cast<std::int64_t>(b.nbytes());
          total += static_cast<std::size_t>(b.numel());
          bs.push_back({shapes[i].name, b, 0});
          ts.push_back({shapes[i].name, t, 0});
        }
        gk::runtime::synchronize(device);
        const gk::Stopwatch w;
        gk::Patch group = gk::make_patch(bs, ts, {.base_version = "B", .target_version = patch.target_version});
        gk::runtime::synchronize(device);
        make_ms += w.elapsed_ms();
        for (gk::PatchEntry& e : group.entries) {
          if (e.encoding == gk::PatchEncoding::sparse) {
            changed += static_cast<std::size_t>(e.count());
          } else {
            for (std::size_t k = 0; k < bs.size(); ++k)
              if (bs[k].name == e.name) changed += static_cast<std::size_t>(bs[k].value.ne(ts[k].value).sum().item<std::int64_t>());
          }
          patch.entries.push_back(std::move(e));
        }
      }
      std::sort(patch.entries.begin(), patch.entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
      // 3. The patch, staged and committed.
      // stage_peak_gib: what the stage allocates beyond the model, its
      // graphs and the patch (Note [Re-run layers release their passthrough
      // copies]).
      DeviceMemory::reset_peak(device);
      const double before_stage_gib = DeviceMemory::now_and_peak_gib(device).first;
      std::optional<gkbench::KinetoTrace> tracing;
      if (&c == &changes.back()) tracing.emplace(trace);  // the last: kernels loaded, caches warm
      const double cpu0 = thread_cpu_ms();
      gk::StagedReload sp = eng.stage(patch);
      // The staging thread's CPU time per patched tensor: its own work, and
      // its waits for the device unless --blocking-sync (Note [Host time
      // and spinning waits] in bench_sync.h).
      const double host_us_per_tensor =
          (thread_cpu_ms() - cpu0) * 1e3 / static_cast<double>(std::max<std::size_t>(1, patch.entries.size()));
      const double stage_peak_gib = DeviceMemory::now_and_peak_gib(device).second - before_stage_gib;
      const double staged_gib = static_cast<double>(sp.staged_bytes()) / (1 << 30);
      gk::ReloadReport staged = timed_commit([&] { return eng.commit(std::move(sp)); }, device);
      tracing.reset();
      const at::Tensor by_patch = eng.decode_logits(tokens, pos);
      const std::uint64_t patched_version = eng.reload_engine().served()->content_version();
      // 3b. B again, and the same patch staged and committed once more: the
      // caching allocator now holds blocks of the stage's sizes, as in a
      // loop that patches every step (step 3 is a process's first patch,
      // whose stage maps fresh memory for its buffers).
      double again_stage_ms = 0, again_pause_ms = 0, again_host_us = 0;
      bool exact = true;
      {
        Weights::Source b(weights, c, false);
        eng.reload(b);
        gk::runtime::synchronize(device);
        const double again_cpu0 = thread_cpu_ms();
        gk::StagedReload sa = eng.stage(patch);
        again_host_us = (thread_cpu_ms() - again_cpu0) * 1e3 /
                        static_cast<double>(std::max<std::size_t>(1, patch.entries.size()));
        const gk::ReloadReport ra = timed_commit([&] { return eng.commit(std::move(sa)); }, device);
        again_stage_ms = ra.times.stage_ms, again_pause_ms = ra.times.commit_ms;
        exact = same_bits(eng.decode_logits(tokens, pos), by_patch);
      }
      // 4. B again, and the patch with verify_served (it must serve the same).
      double verify_pause_ms = 0;
      {
        Weights::Source b(weights, c, false);
        eng.reload(b);
        gk::testing::EngineHooks h;
        h.verify_served = true;
        const gk::testing::ScopedHooks verifying(&eng.reload_engine(), std::move(h));
        gk::StagedReload sv = eng.reload_engine().stage(patch);
        verify_pause_ms = timed_commit([&] { return eng.reload_engine().commit(std::move(sv)); }, device).times.commit_ms;
        exact = exact && same_bits(eng.decode_logits(tokens, pos), by_patch);
      }
      // 4b. B again, and the patch written as whole sectors
      // (PatchWrites::sectors; the default writes elements).
      double sectors_pause_ms = 0, sectors_scatter_ms = 0, sectors_stage_ms = 0;
      double sectors_stage_gib = 0;
      std::size_t sectors_written = 0;
      {
        Weights::Source b(weights, c, false);
        eng.reload(b);
        gk::PatchOptions o = eng.reload_engine().options().patch;
        o.patch_writes = gk::PatchWrites::sectors;
        gk::runtime::synchronize(device);
        const gk::Stopwatch ws;
        gk::StagedReload se = eng.reload_engine().stage(patch, o);
        gk::runtime::synchronize(device);
        sectors_stage_ms = ws.elapsed_ms();
        sectors_stage_gib = static_cast<double>(se.staged_bytes()) / (1 << 30);
        const gk::ReloadReport re = timed_commit([&] { return eng.reload_engine().commit(std::move(se)); }, device);
        sectors_pause_ms = re.times.commit_ms;
        sectors_scatter_ms = re.times.copy_ms;
        sectors_written = re.patch.sectors_written;
        exact = exact && same_bits(eng.decode_logits(tokens, pos), by_patch);
      }
      const std::size_t patch_bytes = patch.payload_bytes();
      const std::size_t patch_tensors = patch.entries.size();
      patch = gk::Patch();  // its memory, before the full stage (a 30B MoE's staged copy fills the GPU)
      // 5. T in full, staged and committed (--streaming-full: reloaded).
      gk::ReloadReport full;
      double full_stage_ms = 0;
      {
        Weights::Source t(weights, c, true);
        if (streaming_full) {
          full = eng.reload(t);
          full.times.commit_ms = full.times.total_ms - t.made_ms;  // a reload's pause is all of it
        } else {
          gk::StagedReload sf = eng.stage(t);
          full = timed_commit([&] { return eng.commit(std::move(sf)); }, device);
          full_stage_ms = full.times.stage_ms - t.made_ms;
        }
      }
      const at::Tensor by_full = eng.decode_logits(tokens, pos);
      exact = exact && same_bits(by_patch, by_full) && patched_version == eng.reload_engine().served()->content_version();
      // 6. T reloaded in full; a stage without hashing.
      double full_reload_ms = 0, nohash_stage_ms = 0;
      {
        Weights::Source t(weights, c, true);
        full_reload_ms = eng.reload(t).times.total_ms - t.made_ms;
      }
      if (!streaming_full) {
        Weights::Source t(weights, c, true);
        gk::testing::EngineHooks h;
        h.skip_served_hashes = true;
        const gk::testing::ScopedHooks unhashed(&eng.reload_engine(), std::move(h));
        gk::StagedReload s = eng.reload_engine().stage(t);
        nohash_stage_ms = s.report().times.stage_ms - t.made_ms;
        s.abort();
      }
      nlohmann::json row = {
          {"model", model},
          {"model_layers", cfg.num_hidden_layers},
          {"format", format_name},
          {"change", c.label},
          {"density", total > 0 ? static_cast<double>(changed) / static_cast<double>(total) : 0.0},
          {"patch_bytes", patch_bytes},
          {"model_bytes", model_bytes},
          {"make_patch_ms", make_ms},
          {"stage_ms", staged.times.stage_ms},
          {"stage_peak_gib", stage_peak_gib},
          {"staged_gib", staged_gib},
          {"pause_ms", staged.times.commit_ms},
          {"update_ms", staged.times.stage_ms + staged.times.commit_ms},
          {"full_update_ms", streaming_full ? full.times.commit_ms : full_stage_ms + full.times.commit_ms},
          {"host_us_per_tensor", host_us_per_tensor},
          {"stage_again_ms", again_stage_ms},
          {"pause_again_ms", again_pause_ms},
          {"update_again_ms", again_stage_ms + again_pause_ms},
          {"host_us_per_tensor_again", again_host_us},
          {"patch_tensors", patch_tensors},
          {"pause_scatter_ms", staged.times.copy_ms},
          {"patch_writes", staged.patch.sectors_written > 0 ? "sectors" : "elements"},
          {"sectors_written", sectors_written},
          {"pause_sectors_ms", sectors_pause_ms},
          {"stage_sectors_ms", sectors_stage_ms},
          {"update_sectors_ms", sectors_stage_ms + sectors_pause_ms},
          {"pause_sectors_scatter_ms", sectors_scatter_ms},
          {"staged_sectors_gib", sectors_stage_gib},
          {"full_pause_ms", full.times.commit_ms},
          {"full_pause_kind", streaming_full ? "streaming reload" : "staged commit"},
          {"full_stage_ms", full_stage_ms},
          {"full_reload_ms", full_reload_ms},
          {"hash_ms", staged.times.hash_ms},
          {"stage_check_ms", staged.times.check_ms},
          {"stage_finite_ms", staged.times.finite_ms},
          {"stage_load_ms", staged.times.load_ms},
          {"full_stage_hash_ms", full.times.hash_ms},
          {"full_stage_nohash_ms", nohash_stage_ms},
          {"pause_verify_ms", verify_pause_ms},
          {"d2d_copy_ms", d2d_ms},
          {"layers_scattered", staged.patch.layers_scattered},
          {"layers_rerun", staged.patch.layers_rerun},
          {"blocks_recomputed", staged.patch.blocks_recomputed},
          {"bytes_scattered", staged.patch.bytes_scattered},
          {"exact", exact},
          {"device", device.str()},
          {"sync", sync},
      };
      const std::string line = row.dump();
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      if (!json.empty()) std::ofstream(json, std::ios::app) << line << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_delta: %s\n", e.what());
    return 1;
  }
}
