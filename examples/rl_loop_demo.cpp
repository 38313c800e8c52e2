// gk-rl-demo: the main demo. An RL loop drives a small inference engine built
// on graphkeep: each step a "trainer update" perturbs the weights, the engine
// reloads them through gk::ReloadEngine while its CUDA graphs (or host graphs
// on CPU) stay captured, then generates tokens by replaying the graphs, and
// checks tokens and logits against a fresh engine built with the same weights.
//
//   gk-rl-demo                       CPU replay backend, or CUDA graphs if a GPU is present
//   gk-rl-demo --unprotect layers.0.attn.W_UV_
//                                    disable one slot's copy-back: the manifest catches the drift, and
//                                    replaying anyway shows what an engine without graphkeep serves
//   gk-rl-demo --help
#include "engine/graph_runner.h"
#include "engine/tiny_lm.h"

#include <graphkeep/runtime/device.h>
#include <graphkeep/reload/collector.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/reload/manifest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Args {
  int steps = 5;
  int64_t layers = 2;
  std::vector<int64_t> batch_sizes{1, 2, 4, 8, 16, 32};
  int64_t batch = 8;
  int64_t tokens = 8;
  std::string device = "auto";
  std::string mode = "streaming";
  std::string unprotect;
  uint64_t seed = 1234;
  bool list_slots = false;
};

void usage() {
  std::puts(
      "usage: gk-rl-demo [options]\n"
      "An RL loop over a small graph-captured inference engine: each step perturbs the weights\n"
      "(a trainer update), reloads them with graphkeep, generates by replaying the captured\n"
      "graphs, and compares tokens and logits with a fresh engine built with the same weights.\n"
      "\n"
      "  --steps N            RL steps (default 5)\n"
      "  --layers L           transformer blocks (default 2)\n"
      "  --batch-sizes LIST   batch sizes to capture, comma-separated (default 1,2,4,8,16,32)\n"
      "  --batch B            generation batch, one of the captured sizes (default 8)\n"
      "  --tokens T           tokens generated per step (default 8)\n"
      "  --device D           auto (default: cuda if present), cpu or cuda\n"
      "  --mode M             streaming (default) or transactional\n"
      "  --unprotect SLOT     disable copy-back of one slot (e.g. layers.0.attn.W_UV_) to show\n"
      "                       what goes wrong without graphkeep\n"
      "  --list-slots         print the engine's slot plan and exit\n"
      "  --seed S             weight seed (default 1234)\n"
      "  --help               this text");
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument("missing value for " + k);
      return argv[++i];
    };
    if (k == "--help" || k == "-h") {
      usage();
      std::exit(0);
    } else if (k == "--steps") a.steps = std::stoi(value());
    else if (k == "--layers") a.layers = std::stoll(value());
    else if (k == "--batch-sizes") a.batch_sizes = parse_list(value());
    else if (k == "--batch") a.batch = std::stoll(value());
    else if (k == "--tokens") a.tokens = std::stoll(value());
    else if (k == "--device") a.device = value();
    else if (k == "--mode") a.mode = value();
    else if (k == "--unprotect") a.unprotect = value();
    else if (k == "--seed") a.seed = std::stoull(value());
    else if (k == "--list-slots") a.list_slots = true;
    else throw std::invalid_argument("unknown option " + k + " (try --help)");
  }
  if (a.mode != "streaming" && a.mode != "transactional") throw std::invalid_argument("--mode must be streaming or transactional");
  bool found = false;
  for (int64_t b : a.batch_sizes) found = found || b == a.batch;
  if (!found) throw std::invalid_argument("--batch must be one of --batch-sizes");
  return true;
}

struct Compare {
  int64_t tokens_differ = 0, tokens_total = 0;
  double max_logit_diff = 0;
  bool equal() const { return tokens_differ == 0 && max_logit_diff == 0; }
};

Compare compare(const std::pair<at::Tensor, at::Tensor>& got, const std::pair<at::Tensor, at::Tensor>& want) {
  Compare c;
  c.tokens_total = want.first.numel();
  c.tokens_differ = got.first.ne(want.first).sum().item<int64_t>();
  c.max_logit_diff = (got.second - want.second).abs().nan_to_num(1e30).max().item<double>();
  return c;
}

at::Tensor start_tokens(int64_t batch, int64_t vocab) { return at::arange(batch, at::kLong).mul(7).remainder(vocab); }

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    parse(argc, argv, args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gk-rl-demo: %s\n", e.what());
    return 2;
  }
  const bool cuda = args.device == "cuda" || (args.device == "auto" && gk::runtime::cuda_device_available());
  c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  at::manual_seed(0);
  at::NoGradGuard no_grad;
  demo::TinyLMConfig cfg;
  cfg.layers = args.layers;

  std::printf("graphkeep RL-loop demo: %lld layers, device %s (%s), batch sizes",
              static_cast<long long>(cfg.layers), device.str().c_str(),
              device.is_cuda() ? "CUDA graphs" : "CPU replay backend");
  for (int64_t b : args.batch_sizes) std::printf(" %lld", static_cast<long long>(b));
  std::printf(", mode %s\n", args.mode.c_str());

  try {
    // --- the engine: load, prepare, capture --------------------------------
    auto model = std::make_shared<demo::TinyLM>(cfg, device);
    {
      gk::InMemorySource src(model->checkpoint(args.seed, 0), "initial weights");
      gk::load_weights(*model, src);
    }
    gk::ReloadOptions opts;
    opts.mode = args.mode == "transactional" ? gk::ReloadMode::transactional : gk::ReloadMode::streaming;
    if (!args.unprotect.empty()) opts.unprotected_slots = {args.unprotect};
    gk::ReloadEngine engine(*model, opts);
    engine.prepare();  // a --unprotect name that is no slot fails here, naming the closest ones
    if (args.list_slots) {
      for (const auto& l : engine.plan().layers())
        for (const auto& s : l.slots)
          std::printf("%-48s %-16s %s\n", s.name.c_str(), std::string(gk::to_string(s.role.role)).c_str(),
                      std::string(gk::to_string(s.role.effective_init())).c_str());
      return 0;
    }
    demo::GraphRunner runner(*model, engine, args.batch_sizes);
    runner.capture();
    std::printf("prepared: %zu slots (%zu declared by registered kernels), %.2f MiB captured; %zu graphs captured in %.1f ms\n",
                engine.plan().num_slots(), engine.plan().num_declared_slots(),
                static_cast<double>(engine.plan().captured_bytes()) / (1 << 20), runner.batch_sizes().size(),
                runner.capture_ms());

    const at::Tensor start = start_tokens(args.batch, cfg.vocab);
    double reload_ms = 0, worst_diff = 0;
    std::size_t bytes = 0, drift = 0;
    bool all_equal = true;
    for (int step = 1; step <= args.steps; ++step) {
      // trainer update, reload, generate
      gk::InMemorySource src(model->checkpoint(args.seed, step), "trainer update");
      gk::ReloadReport r;
      try {
        r = engine.reload(src);
      } catch (const gk::DriftError& e) {
        std::printf("step %d/%d: the capture manifest caught drift; replay is refused:\n%s\n", step, args.steps, e.what());
        // Show what an engine without graphkeep would serve.
        auto got = runner.generate(start, args.tokens, /*checked=*/false);
        auto fresh = std::make_shared<demo::TinyLM>(cfg, device);
        gk::InMemorySource fsrc(fresh->checkpoint(args.seed, step));
        gk::load_weights(*fresh, fsrc);
        const Compare c = compare(got, demo::generate_eager(*fresh, start, args.tokens));
        std::printf("replaying anyway (what an engine without graphkeep does): %lld of %lld tokens differ from a "
                    "fresh engine, max |logit diff| %.4g\n",
                    static_cast<long long>(c.tokens_differ), static_cast<long long>(c.tokens_total), c.max_logit_diff);
        std::printf("SUMMARY: unprotected slot %s -> drift caught by the manifest; replayed without the check, "
                    "%lld of %lld tokens differ from a fresh engine\n",
                    args.unprotect.c_str(), static_cast<long long>(c.tokens_differ),
                    static_cast<long long>(c.tokens_total));
        return 3;
      }
      auto got = runner.generate(start, args.tokens);
      auto fresh = std::make_shared<demo::TinyLM>(cfg, device);
      gk::InMemorySource fsrc(fresh->checkpoint(args.seed, step));
      gk::load_weights(*fresh, fsrc);
      const Compare c = compare(got, demo::generate_eager(*fresh, start, args.tokens));
      reload_ms += r.times.total_ms;
      bytes += r.bytes_copied;
      drift += r.drift;
      worst_diff = std::max(worst_diff, c.max_logit_diff);
      all_equal = all_equal && c.equal();
      std::printf("step %d/%d  reload %7.2f ms  slots %zu  copied %.2f MiB  drift %zu  verified %zu addrs  "
                  "tokens %s fresh engine (max |dlogit| %.3g)\n",
                  step, args.steps, r.times.total_ms, r.slots_tracked, static_cast<double>(r.bytes_copied) / (1 << 20),
                  r.drift, r.addresses_verified, c.equal() ? "==" : "!=", c.max_logit_diff);
      std::fflush(stdout);
    }
    std::printf("SUMMARY: %d reloads, %zu slots tracked, %.2f MiB copied, drift %zu, mean reload %.2f ms, "
                "replay after reload %s a fresh engine (max |dlogit| %.3g)\n",
                args.steps, engine.plan().num_slots(), static_cast<double>(bytes) / (1 << 20), drift,
                args.steps > 0 ? reload_ms / args.steps : 0.0, all_equal ? "equals" : "DIFFERS FROM", worst_diff);
    return all_equal && drift == 0 ? 0 : 1;
  } catch (const gk::Error& e) {
    std::fprintf(stderr, "gk-rl-demo: %s\n", e.what());
    return 1;
  }
}
