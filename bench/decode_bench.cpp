// gk-decode-bench: the example engine's decode step against the device's
// speed and against a plain PyTorch decoder of the same shapes measured in
// the same run (bench/plain_decoder.py, its row read from --plain-json).
//
// Builds the example engine (examples/engine) for a model shape with random
// weights made on the device, captures its 35 decode graphs (and sampling
// graphs; --graphs batch: only the measured batch's, for a model whose 35
// graphs do not fit beside it), then measures at one batch size, every sequence at position
// kv_len - 1 (each step attends over kv_len positions):
//
//   decode_step_ms         the whole step as a server calls it:
//                          LlmEngine::decode, greedy (host work,
//                          input copies, replay, the int32 ids back)
//   gpu_step_ms            the decode graph's replay alone, back to back
//   sampling_step_ms       decode with temperature 0.8, top-k 50,
//                          top-p 0.95 (the sampling graph replayed too)
//   logits_step_ms         decode_logits(): the float32 logits copied to the host
//   read_bw_gbs            the device's read bandwidth, measured here: the
//                          best of 5 at::sum over a 4 GiB bf16 buffer
//   bytes_read_per_step    what one step must read: every projection weight
//                          in the run's format, the norms, lm_head, the
//                          batch's embedding rows, for a MoE the router and
//                          the experts expected to be chosen by the batch
//                          under uniform routing, E (1 - (1 - k/E)^B) of E,
//                          and the KV cache's kv_len positions per sequence
//   read_roofline_ms       bytes_read_per_step / read_bw_gbs
//   breakdown_ms           GPU time per part of the step (embedding, norms,
//                          gemms, attention, mlp_activation, moe, lm_head,
//                          sampling) in one eager pass queued behind a
//                          sleep kernel (demo::PartTimer), so the parts run
//                          back to back as in the graph
//   plain_torch_step_ms    the plain decoder's graph replay, from --plain-json
//
//   gk-decode-bench --model llama8b --batch 64 --kv-len 64 --plain-json plain.json --json decode_h200.json
//   gk-decode-bench --model tiny --device cpu --batch 4        (a smoke run anywhere)
//
// One JSON object per run, appended as a line to --json.
#include "bench_args.h"
#include "bench_models.h"
#include "bench_parts.h"
#include "engine/llm_engine.h"
#include "engine/part_timer.h"
#include "engine/sampler.h"

#include <graphkeep/core/stopwatch.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {


// The best read bandwidth of 5 at::sum over a 4 GiB bf16 buffer, GB/s (CUDA).
double read_bandwidth_gbs(c10::Device device) {
  if (!device.is_cuda()) return -1;
  const std::int64_t n = std::int64_t{2} << 30;  // bf16 elements: 4 GiB
  const at::Tensor buf = at::ones({n}, at::TensorOptions().dtype(at::kBFloat16).device(device));
  (void)buf.sum(at::kFloat);
  double best = 0;
  for (int i = 0; i < 5; ++i) {
    gk::runtime::synchronize(device);
    const gk::Stopwatch w;
    const at::Tensor s = buf.sum(at::kFloat);
    gk::runtime::synchronize(device);
    best = std::max(best, static_cast<double>(buf.nbytes()) / (w.elapsed_ms() * 1e6));
  }
  return best;
}

// What one decode step of `batch` sequences at kv_len positions must read
// (the header's bytes_read_per_step).
double bytes_read_per_step(const demo::HfConfig& c, demo::WeightFormat format, std::int64_t batch,
                           std::int64_t kv_len) {
  const double e = static_cast<double>(c10::elementSize(c.dtype));
  const double proj = format == demo::WeightFormat::fp8 ? 1.0 : format == demo::WeightFormat::w4a16 ? 0.5 : e;
  const double H = static_cast<double>(c.hidden_size), D = static_cast<double>(c.head_dim);
  const double heads = static_cast<double>(c.num_attention_heads), kv = static_cast<double>(c.num_key_value_heads);
  double layer = (H * (heads + 2 * kv) * D + heads * D * H) * proj + 2 * H * e + (c.has_qk_norm() ? 2 * D * e : 0);
  if (c.is_moe()) {
    const double E = static_cast<double>(c.num_experts), k = static_cast<double>(c.num_experts_per_tok);
    const double chosen = E * (1 - std::pow(1 - k / E, static_cast<double>(batch)));
    layer += E * H * e + chosen * 3 * H * static_cast<double>(c.moe_intermediate_size) * e;
  } else {
    layer += 3 * H * static_cast<double>(c.intermediate_size) * proj;
  }
  const double kv_read = 2 * static_cast<double>(batch * kv_len) * kv * D * e;
  const double vocab = static_cast<double>(c.vocab_size);
  return static_cast<double>(c.num_hidden_layers) * (layer + kv_read) + vocab * H * e +
         static_cast<double>(batch) * H * e + H * e;
}

// The plain decoder's row for this model, batch and KV length, if any.
std::optional<double> plain_step_ms(const std::string& file, const std::string& model, std::int64_t batch,
                                    std::int64_t kv_len) {
  if (file.empty()) return std::nullopt;
  std::ifstream in(file);
  std::optional<double> ms;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const nlohmann::json r = nlohmann::json::parse(line);
    if (r.value("model", "") == model && r.value("batch", 0) == batch && r.value("kv_len", 0) == kv_len &&
        r.contains("plain_torch_step_ms"))
      ms = r["plain_torch_step_ms"].get<double>();  // the last matching row
  }
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  gkbench::CommonArgs common(/*default_batch=*/64);
  std::string &model = common.model, &format_name = common.format, &json = common.json,
              &device_name = common.device;
  std::int64_t& batch = common.batch;
  std::string plain_json;
  std::int64_t kv_len = 64;
  int steps = 100;
  bool fast = true, all_graphs = true;
  for (gkbench::ArgWalker a(argc, argv); a.next();) {
    if (a.common(common)) continue;
    const std::string k = a.flag();
    auto val = [&] { return a.value(); };
    if (k == "--plain-json") plain_json = val();
    else if (k == "--kv-len") kv_len = std::stoll(val());
    else if (k == "--steps") steps = std::max(1, std::stoi(val()));
    else if (k == "--reference") fast = false;
    else if (k == "--graphs") {
      const std::string g = val();
      if (g != "all" && g != "batch") throw std::invalid_argument("--graphs takes all or batch, not " + g);
      all_graphs = g == "all";
    }
    else {
      std::fprintf(stderr, "usage: gk-decode-bench [--model llama8b|qwen3moe30b|tiny] [--format dense|fp8|w4a16] "
                           "[--device auto|cpu|cuda] [--batch B] [--kv-len L] [--steps N] [--reference] "
                           "[--graphs all|batch] [--plain-json FILE] [--json FILE]\n");
      return 2;
    }
  }
  try {
    at::NoGradGuard no_grad;
    const bool cuda = device_name == "cuda" || (device_name == "auto" && gk::runtime::cuda_device_available());
    const c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
    const demo::HfConfig cfg = gkbench::model_config(model);
    const demo::WeightFormat format = demo::parse_weight_format(format_name);
    const std::vector<gkbench::Shape> shapes = gkbench::checkpoint_shapes(cfg, device);
    std::printf("gk-decode-bench: %s (%s), %s, batch %lld, kv_len %lld, %s path, device %s\n", model.c_str(),
                cfg.model_type.c_str(), format_name.c_str(), static_cast<long long>(batch),
                static_cast<long long>(kv_len), fast ? "fast" : "reference", device.str().c_str());
    std::fflush(stdout);

    demo::LlmEngineOptions opts;
    opts.max_len = kv_len;
    opts.fast_cuda = fast;
    if (!all_graphs) opts.batch_sizes = {batch};
    const gk::Stopwatch build_watch;
    gkbench::RandomDeviceSource src(shapes, device);
    demo::LlmEngine eng(cfg, device, format, src, opts);
    std::printf("  built and captured %zu graphs in %.0f ms\n", eng.num_graphs(), build_watch.elapsed_ms());
    std::fflush(stdout);

    const at::Tensor tokens = at::arange(batch, at::kLong).mul(7).remainder(cfg.vocab_size);
    const at::Tensor pos = at::full({batch}, kv_len - 1, at::kLong);
    const demo::SamplingParams sampling{.temperature = 0.8, .top_k = 50, .top_p = 0.95, .seed = 1};
    const double step_ms = gkbench::mean_ms(steps, [&] { (void)eng.decode(tokens, pos); });
    const double sampling_ms = gkbench::mean_ms(steps, [&] { (void)eng.decode(tokens, pos, sampling); });
    const double logits_ms = gkbench::mean_ms(std::max(steps / 10, 3), [&] { (void)eng.decode_logits(tokens, pos); });
    // The graph alone: the inputs of the last step stay; replays queued back
    // to back, one wait at the end.
    (void)eng.decode(tokens, pos);
    for (int i = 0; i < 3; ++i) eng.replay_graph(batch);
    gk::runtime::synchronize(device);
    const gk::Stopwatch replay_watch;
    for (int i = 0; i < steps; ++i) eng.replay_graph(batch);
    gk::runtime::synchronize(device);
    const double gpu_ms = replay_watch.elapsed_ms() / steps;

    // Per part: one eager step behind a sleep kernel, then the samplers.
    std::map<std::string, double> parts;
    if (device.is_cuda()) {
      demo::SamplingRows rows = demo::SamplingRows::make(batch, device);
      rows.set(sampling, batch);
      parts = gkbench::eager_parts(eng, device, tokens, pos, [&](const at::Tensor& logits, const at::Tensor& positions) {
        demo::mark_part(demo::Part::sampling);
        (void)demo::greedy_tokens(logits);
        (void)demo::sample_tokens(logits, positions, rows);
      });
    }
    double parts_sum = 0;
    for (const auto& [_, ms] : parts) parts_sum += ms;

    const double bw = read_bandwidth_gbs(device);
    const double bytes = bytes_read_per_step(cfg, format, batch, kv_len);
    const double roofline_ms = bw > 0 ? bytes / (bw * 1e6) : -1;
    const std::optional<double> plain = plain_step_ms(plain_json, model, batch, kv_len);

    const auto num = gkbench::rounded;
    const auto maybe = gkbench::rounded_or_null;
    nlohmann::ordered_json breakdown = nlohmann::ordered_json::object();
    for (const auto& [part, ms] : parts) breakdown[part] = num(ms, 4);
    const nlohmann::ordered_json row = {
        {"model", model},
        {"format", format_name},
        {"batch", batch},
        {"kv_len", kv_len},
        {"decode_step_ms", num(step_ms, 4)},
        {"gpu_step_ms", num(gpu_ms, 4)},
        {"plain_torch_step_ms", plain ? nlohmann::ordered_json(num(*plain, 4)) : nlohmann::ordered_json(nullptr)},
        {"read_bw_gbs", maybe(bw, 1)},
        {"read_bw_how", "best of 5 at::sum over a 4 GiB bf16 buffer (read-only reduction), wall time after a sync"},
        {"bytes_read_per_step", num(bytes, 0)},
        {"read_roofline_ms", maybe(roofline_ms, 4)},
        {"gpu_vs_roofline", maybe(roofline_ms > 0 ? roofline_ms / gpu_ms : -1, 3)},
        {"step_vs_plain", maybe(plain ? step_ms / *plain : -1, 3)},
        {"tok_s", num(static_cast<double>(batch) / (step_ms / 1e3), 1)},
        {"roofline_tok_s", maybe(roofline_ms > 0 ? static_cast<double>(batch) / (roofline_ms / 1e3) : -1, 1)},
        {"sampling_step_ms", num(sampling_ms, 4)},
        {"logits_step_ms", num(logits_ms, 4)},
        {"breakdown_ms", breakdown},
        {"breakdown_sum_ms", num(parts_sum, 4)},
        {"breakdown_how", "one eager step queued behind a sleep kernel, CUDA events at part boundaries"},
        {"host_ms", num(step_ms - gpu_ms, 4)},
        {"fast_cuda", fast},
        {"sampling_in_graphs", eng.sampling_in_graphs()},
        {"graphs", eng.num_graphs()},
        {"device", device.str()},
    };
    // The aims, where this run measures them (bf16, batch 64).
    if (fast && format == demo::WeightFormat::dense && batch == 64 && roofline_ms > 0) {
      if (model == "llama8b" && plain)
        std::printf("aims: whole step %.2fx the plain decoder (<= 1.1: %s); GPU work at %.0f %% of the read roofline "
                    "(>= 45 %%: %s)\n",
                    step_ms / *plain, step_ms <= 1.1 * *plain ? "met" : "NOT met", 100 * roofline_ms / gpu_ms,
                    roofline_ms >= 0.45 * gpu_ms ? "met" : "NOT met");
      if (model == "qwen3moe30b")
        std::printf("aims: %.0f tok/s, %.0f %% of the read roofline's (>= 50 %%: %s)\n",
                    static_cast<double>(batch) / (step_ms / 1e3), 100 * roofline_ms / step_ms,
                    roofline_ms >= 0.5 * step_ms ? "met" : "NOT met");
    }
    const std::string line = row.dump();
    std::printf("%s\n", line.c_str());
    if (!json.empty()) std::ofstream(json, std::ios::app) << line << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gk-decode-bench: %s\n", e.what());
    return 1;
  }
}
