// gk-rl-demo: the main demo. An RL loop drives a small serving engine
// (examples/engine/llm_engine.h: a Llama / Qwen3 / Qwen3-MoE decoder read from
// a Hugging Face model directory, 35 captured decode graphs). Each step a
// "trainer" publishes a new checkpoint directory; the engine reloads it through
// gk::ReloadEngine while its CUDA graphs (host graphs on a CPU) stay captured,
// generates by replaying them, and checks the tokens against a fresh engine
// built from the same directory.
//
//   gk-rl-demo                         the built-in tiny model (written to gk-demo-model/ on first run),
//                                      CPU replay backend, or CUDA graphs if a GPU is present
//   gk-rl-demo --model DIR --quant fp8 a Hugging Face directory (config.json + safetensors), FP8 made in PWAL
//   gk-rl-demo --online                stage each checkpoint on another thread while this one keeps
//                                      decoding on the old weights; pause only for the commit
//   gk-rl-demo --delta                 the trainer publishes a weight patch per step (only the elements its
//                                      step changed, with content hashes); the engine applies it exactly,
//                                      pausing for a scatter of the changed elements (with --online: staged
//                                      while serving)
//   gk-rl-demo --unprotect model.layers.0.self_attn.qkv_.fp8_.scale_ --quant fp8
//                                      disable one slot's copy-back: the manifest catches the drift, and
//                                      replaying anyway shows what an engine without graphkeep serves
#include "engine/checkpoint_writer.h"
#include "engine/compare.h"
#include "engine/llm_engine.h"

#include <graphkeep/core/stopwatch.h>
#include <graphkeep/delta/make_patch.h>
#include <graphkeep/delta/patch_file.h>
#include <graphkeep/reload/errors.h>
#include <graphkeep/reload/served_weights.h>
#include <graphkeep/sources/hf_checkpoint.h>
#include <graphkeep/reload/testing.h>
#include <graphkeep/runtime/device.h>

#include <ATen/ATen.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace {

struct Args {
  int steps = 5;
  std::string model;                   // a Hugging Face directory; empty: the built-in model
  std::string work = "gk-demo-model";  // where the built-in model and the trainer's checkpoints go
  std::string quant = "dense";
  std::string device = "auto";
  std::string mode = "streaming";
  std::string unprotect;
  std::int64_t batch = 8;
  std::int64_t prompt = 4;
  std::int64_t tokens = 8;
  std::uint64_t seed = 1234;
  bool list_slots = false;
  bool online = false;
  bool delta = false;
  double density = 0.02;  // --delta: the share of elements a trainer step changes
  std::string adapter;    // a PEFT LoRA adapter directory served from the start
  bool lora = false;      // each step publishes a random adapter update instead of weights
};

void usage() {
  std::puts(
      "usage: gk-rl-demo [options]\n"
      "An RL loop over a graph-captured serving engine: each step a trainer publishes a checkpoint,\n"
      "the engine reloads it with graphkeep (no recapture), generates by replaying its decode graphs,\n"
      "and compares the tokens with a fresh engine built from the same checkpoint.\n"
      "\n"
      "  --model DIR          a Hugging Face model directory (llama, qwen3, qwen3_moe; config.json and\n"
      "                       model.safetensors or shards + index); default: a built-in tiny Qwen3-shaped\n"
      "                       model, written under --work on first run\n"
      "  --work DIR           where the built-in model and the trainer's checkpoints go (default gk-demo-model)\n"
      "  --quant Q            dense (the checkpoint's dtype), fp8 (W8A8 made in PWAL) or w4a16 (int4 groups\n"
      "                       through the Marlin-style kernel, packed in PWAL); default dense\n"
      "  --steps N            RL steps (default 5)\n"
      "  --batch B            sequences generated per step, 1..256 (default 8)\n"
      "  --tokens T           tokens generated per sequence (default 8)\n"
      "  --device D           auto (default: cuda if present), cpu or cuda\n"
      "  --mode M             streaming (default) or transactional reloads\n"
      "  --online             stage each checkpoint on another thread while serving goes on (decode\n"
      "                       replays on the old weights); the pause is the commit alone\n"
      "  --delta              the trainer publishes a weight patch per step (the elements it changed, with\n"
      "                       content hashes); the engine applies it through graphkeep exactly, and the\n"
      "                       pause scales with what changed\n"
      "  --density F          --delta: the share of elements each trainer step changes (default 0.02)\n"
      "  --adapter DIR        serve a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors)\n"
      "                       inside the decode graphs (docs/lora.md)\n"
      "  --lora               the trainer publishes a random LoRA adapter (rank 8, every projection) each\n"
      "                       step, swapped in one commit (--online: staged while serving); the base\n"
      "                       weights stay\n"
      "  --unprotect SLOT     disable copy-back of one slot to show what goes wrong without graphkeep\n"
      "  --list-slots         print the engine's slot plan and exit\n"
      "  --seed S             trainer seed (default 1234)\n"
      "  --help               this text");
}

void parse(int argc, char** argv, Args& a) {
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
    else if (k == "--model") a.model = value();
    else if (k == "--work") a.work = value();
    else if (k == "--quant") a.quant = value();
    else if (k == "--batch") a.batch = std::stoll(value());
    else if (k == "--tokens") a.tokens = std::stoll(value());
    else if (k == "--device") a.device = value();
    else if (k == "--mode") a.mode = value();
    else if (k == "--unprotect") a.unprotect = value();
    else if (k == "--seed") a.seed = std::stoull(value());
    else if (k == "--list-slots") a.list_slots = true;
    else if (k == "--online") a.online = true;
    else if (k == "--delta") a.delta = true;
    else if (k == "--density") a.density = std::stod(value());
    else if (k == "--adapter") a.adapter = value();
    else if (k == "--lora") a.lora = true;
    else throw std::invalid_argument("unknown option " + k + " (try --help)");
  }
  if (a.mode != "streaming" && a.mode != "transactional")
    throw std::invalid_argument("--mode must be streaming or transactional");
  if (a.batch < 1 || a.batch > 256) throw std::invalid_argument("--batch must be in 1..256");
  if (!(a.density >= 0 && a.density <= 1)) throw std::invalid_argument("--density must be in [0, 1]");
  if (a.lora && a.delta) throw std::invalid_argument("--lora and --delta: one kind of update at a time");
}

// --delta: every tensor of a checkpoint directory, in memory (the trainer's copy).
std::vector<gk::NamedTensor> read_weights(const std::string& dir) {
  gk::HfCheckpointSource src(dir);
  std::vector<gk::NamedTensor> out;
  while (auto t = src.next()) out.push_back({t->name, t->value.clone(), 0});
  return out;
}

// --delta: one trainer step that moves a share `density` of the elements
// (w + 0.05 * rms(w) * noise on a random mask), as an optimizer step at a
// small learning rate leaves most bf16 elements bit for bit as they were.
std::vector<gk::NamedTensor> sparse_update(const std::vector<gk::NamedTensor>& w, std::uint64_t seed, int step,
                                           double density) {
  std::vector<gk::NamedTensor> out;
  at::Generator g = at::detail::createCPUGenerator(seed * 1000003 + static_cast<std::uint64_t>(step));
  for (const gk::NamedTensor& t : w) {
    const at::Tensor f = t.value.to(at::kFloat);
    const double rms = std::sqrt(f.pow(2).mean().item<double>());
    const at::Tensor mask = at::rand(f.sizes(), g) < density;
    const at::Tensor moved = f + 0.05 * rms * at::randn(f.sizes(), g) * mask;
    out.push_back({t.name, moved.to(t.value.scalar_type()), 0});
  }
  return out;
}

// Greedy generation: prefill each sequence's prompt eagerly, then decode
// `tokens` steps for all sequences at once (graph replays, or eager when
// `graphs` is false). Returns the generated tokens [B, tokens] and the logits
// of every decode step [tokens, B, vocab].
std::pair<at::Tensor, at::Tensor> generate(demo::LlmEngine& eng, const at::Tensor& prompts, std::int64_t tokens,
                                           bool graphs, bool checked) {
  const std::int64_t B = prompts.size(0), P = prompts.size(1);
  at::Tensor next = at::empty({B}, at::kLong);
  for (std::int64_t b = 0; b < B; ++b) next[b] = eng.prefill(b, prompts[b], checked)[P - 1].argmax();
  std::vector<at::Tensor> toks, logits;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const at::Tensor pos = at::full({B}, P + t, at::kLong);
    const at::Tensor l = graphs ? eng.decode_logits(next, pos, checked) : eng.decode_eager(next, pos);
    toks.push_back(next);
    logits.push_back(l);
    next = l.argmax(-1);
  }
  return {at::stack(toks, 1), at::stack(logits, 0)};
}

// Tokens and logits against a fresh engine's: equal only when every token
// and every logit bit agree and no logit is NaN or Inf (demo::MaxDiff).
struct Compare {
  std::int64_t differ = 0, total = 0;
  demo::MaxDiff logits;
  bool equal() const { return differ == 0 && logits.equal(); }
};

Compare compare(const std::pair<at::Tensor, at::Tensor>& got, const std::pair<at::Tensor, at::Tensor>& want) {
  Compare c{got.first.ne(want.first).sum().item<std::int64_t>(), want.first.numel(), {}};
  c.logits.add(got.second, want.second);
  return c;
}

// --online: stages `dir` on a thread of its own while this thread goes on
// decoding one fixed batch on the old weights, and checks every output served
// meanwhile against the one computed before staging began (bitwise: replay is
// deterministic), so a mix of old and new weights would show.
struct OnlineStep {
  gk::StagedReload staged;  // move-only: the step owns it until the commit
  double stage_ms = 0, served_per_s = 0, idle_per_s = 0;
  std::int64_t served = 0, mixed = 0;
};

OnlineStep stage_while_serving(demo::LlmEngine& eng, const std::string& dir, std::int64_t batch,
                               std::int64_t position, const gk::Patch* patch = nullptr) {
  const at::Tensor tokens = at::arange(batch, at::kLong).remainder(eng.config().vocab_size);
  const at::Tensor pos = at::full({batch}, position, at::kLong);
  const at::Tensor before = eng.decode_logits(tokens, pos);
  OnlineStep o;
  {
    const gk::Stopwatch idle;
    for (int i = 0; i < 16; ++i) (void)eng.decode_logits(tokens, pos);
    o.idle_per_s = 16 / std::max(idle.elapsed_ms(), 1e-6) * 1e3;
  }
  std::atomic<bool> done{false};
  std::exception_ptr error;
  std::thread stager([&] {
    const gk::Stopwatch w;
    try {
      o.staged = patch != nullptr ? eng.stage(*patch) : eng.stage(dir);
    } catch (...) {
      error = std::current_exception();
    }
    o.stage_ms = w.elapsed_ms();
    done = true;
  });
  const gk::Stopwatch serving;
  while (!done.load()) {
    const at::Tensor l = eng.decode_logits(tokens, pos);
    ++o.served;
    if (!demo::bitwise_equal(l, before)) ++o.mixed;
  }
  const double ms = serving.elapsed_ms();
  stager.join();
  if (error) std::rethrow_exception(error);
  o.served_per_s = o.served > 0 ? static_cast<double>(o.served) / std::max(ms, 1e-6) * 1e3 : 0;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    parse(argc, argv, args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gk-rl-demo: %s\n", e.what());
    return 2;
  }
  namespace fs = std::filesystem;
  const bool cuda = args.device == "cuda" || (args.device == "auto" && gk::runtime::cuda_device_available());
  const c10::Device device = cuda ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  at::NoGradGuard no_grad;
  try {
    const demo::WeightFormat format = demo::parse_weight_format(args.quant);
    // --- the first checkpoint ---------------------------------------------
    std::string base = args.model;
    if (base.empty()) {
      base = (fs::path(args.work) / "step0").string();
      if (!fs::exists(fs::path(base) / "config.json")) {
        const demo::HfConfig c = demo::builtin_tiny_config();
        demo::write_hf_checkpoint(base, c, demo::random_weights(c, args.seed));
        std::printf("wrote the built-in model to %s\n", base.c_str());
      }
    }
    // --- --lora: the adapter served from the start ---------------------------
    demo::LoraConfig lora;
    lora.rank = 8;
    lora.alpha = 16;
    const auto lora_dir = [&](int step) { return (fs::path(args.work) / "lora" / ("step" + std::to_string(step))).string(); };
    const auto write_random_adapter = [&](int step) {
      const demo::HfConfig c = demo::read_hf_config(base);
      lora.targets = c.is_moe() ? std::vector<std::string>{"k_proj", "o_proj", "q_proj", "v_proj"}
                                : std::vector<std::string>{"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj",
                                                           "up_proj", "v_proj"};
      const demo::LoraShapes shapes{c.num_hidden_layers, c.hidden_size, c.num_attention_heads * c.head_dim,
                                    c.num_key_value_heads * c.head_dim, c.intermediate_size, c.is_moe()};
      demo::write_lora_adapter(lora_dir(step), lora,
                               demo::random_lora_tensors(shapes, lora, args.seed + static_cast<std::uint64_t>(step),
                                                         c.dtype));
      return lora_dir(step);
    };
    std::string adapter = args.adapter;
    if (args.lora && adapter.empty()) adapter = write_random_adapter(0);
    // --- the engine: load, prepare, capture --------------------------------
    demo::LlmEngineOptions opts;
    opts.adapter = adapter;
    opts.max_len = args.prompt + args.tokens;
    opts.reload.mode = args.mode == "transactional" ? gk::ReloadMode::transactional : gk::ReloadMode::streaming;
    // The reference: a fresh engine per checkpoint, eager only (no graphs).
    demo::LlmEngineOptions reference_opts;
    reference_opts.batch_sizes = {};
    reference_opts.max_len = opts.max_len;
    reference_opts.max_seqs = args.batch;
    reference_opts.adapter = adapter;
    demo::LlmEngine eng(base, device, format, opts);
    // The demonstration hook (graphkeep/reload/testing.h): one slot left out
    // of copy-back. A name that is no slot fails here, naming the closest.
    if (!args.unprotect.empty()) gk::testing::set_hooks(eng.reload_engine(), gk::testing::unprotect({args.unprotect}));
    const demo::HfConfig& cfg = eng.config();
    if (args.list_slots) {
      for (const auto& l : eng.reload_engine().plan().layers())
        for (const auto& s : l.slots)
          std::printf("%-56s %-16s %s\n", s.name.c_str(), std::string(gk::to_string(s.role.role)).c_str(),
                      std::string(gk::to_string(s.role.effective_init())).c_str());
      return 0;
    }
    const gk::SlotPlan& plan = eng.reload_engine().plan();
    std::printf("graphkeep RL-loop demo: %s, %lld layers, %.1fM parameters, %s, %s, device %s (%s)\n",
                cfg.model_type.c_str(), static_cast<long long>(cfg.num_hidden_layers),
                static_cast<double>(cfg.num_parameters()) / 1e6, c10::toString(cfg.dtype),
                std::string(demo::to_string(format)).c_str(), device.str().c_str(),
                device.is_cuda() ? "CUDA graphs" : "CPU replay backend");
    std::printf("prepared: %zu slots (%zu declared), %.2f MiB captured; %zu decode graphs (batch 1..256) captured "
                "in %.1f ms\n",
                plan.num_slots(), plan.num_declared_slots(), static_cast<double>(plan.captured_bytes()) / (1 << 20),
                eng.num_graphs(), eng.capture_ms());

    const at::Tensor prompts = at::arange(args.batch * args.prompt, at::kLong).mul(7).remainder(cfg.vocab_size)
                                   .view({args.batch, args.prompt});
    double reload_ms = 0, pause_ms = 0;
    demo::MaxDiff worst;  // over every step
    std::size_t drift = 0;
    bool all_equal = true;
    std::string prev = base;
    std::vector<gk::NamedTensor> trainer;  // --delta: the trainer's weights
    if (args.delta) trainer = read_weights(base);
    std::size_t patch_bytes = 0, model_bytes = 0;
    for (const gk::NamedTensor& t : trainer) model_bytes += t.value.nbytes();
    for (int step = 1; step <= args.steps; ++step) {
      if (args.lora) {
        // --- the trainer publishes the next adapter; one commit swaps it ------
        const std::string adir = write_random_adapter(step);
        gk::ReloadReport r = args.online ? eng.commit(eng.stage_adapter(adir)) : eng.reload_adapter(adir);
        const auto got = generate(eng, prompts, args.tokens, /*graphs=*/true, /*checked=*/true);
        reference_opts.adapter = adir;
        demo::LlmEngine fresh(base, device, format, reference_opts);
        const Compare c = compare(got, generate(fresh, prompts, args.tokens, false, true));
        reload_ms += r.times.total_ms;
        pause_ms += r.times.commit_ms;
        drift += r.drift;
        worst.add(c.logits);
        all_equal = all_equal && c.equal();
        std::printf("step %d/%d  adapter swap: %zu tensors, %zu layers scattered, %zu re-ran PWAL; pause %.3f ms "
                    "(stage %.2f ms)  drift %zu  tokens %s a fresh engine with the new adapter (%lld/%lld equal)\n",
                    step, args.steps, r.patch.tensors, r.patch.layers_scattered, r.patch.layers_rerun,
                    r.times.commit_ms, r.times.stage_ms, r.drift, c.equal() ? "==" : "!=",
                    static_cast<long long>(c.total - c.differ), static_cast<long long>(c.total));
        std::fflush(stdout);
        continue;
      }
      // --- the trainer publishes the next checkpoint ---------------------------
      // (--delta: and the patch from the last one; the checkpoint is the
      // fresh engine's reference)
      const std::string dir = (fs::path(args.work) / ("step" + std::to_string(step))).string();
      std::optional<gk::Patch> patch;
      std::string delta_note;
      if (args.delta) {
        std::vector<gk::NamedTensor> next = sparse_update(trainer, args.seed, step, args.density);
        demo::write_hf_checkpoint(dir, cfg, next);
        gk::MakePatchOptions po;
        po.base_version = "step" + std::to_string(step - 1);
        po.target_version = "step" + std::to_string(step);
        const gk::Stopwatch make;
        const gk::Patch made = gk::make_patch(trainer, next, po);
        const double make_ms = make.elapsed_ms();
        const std::string file = dir + ".gkpatch.safetensors";
        gk::write_patch(file, made);
        patch = gk::read_patch(file);  // what the engine receives
        std::size_t changed = 0, total = 0;
        for (const gk::PatchEntry& e : patch->entries) changed += static_cast<std::size_t>(e.count());
        for (const gk::NamedTensor& t : next) total += static_cast<std::size_t>(t.value.numel());
        const std::size_t bytes = fs::file_size(file);
        patch_bytes += bytes;
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "  patch %s -> %s: %zu tensors, density %.4f (%zu of %zu elements), %zu bytes = %.4f of the "
                      "model's %zu, made in %.1f ms",
                      po.base_version.c_str(), po.target_version.c_str(), patch->entries.size(),
                      total > 0 ? static_cast<double>(changed) / static_cast<double>(total) : 0.0, changed, total,
                      bytes, model_bytes > 0 ? static_cast<double>(bytes) / static_cast<double>(model_bytes) : 0.0,
                      model_bytes, make_ms);
        delta_note = buf;
        trainer = std::move(next);
      } else {
        demo::write_hf_checkpoint(dir, cfg, demo::trainer_update(prev, args.seed, step));
      }
      prev = dir;
      // --- serving pauses for the reload (or, --online, only for the commit) ----
      const gk::Stopwatch pause_watch;
      double online_pause = -1;
      gk::ReloadReport r;
      std::string online_note;
      try {
        if (args.online) {
          OnlineStep o = stage_while_serving(eng, dir, args.batch, args.prompt, patch ? &*patch : nullptr);
          const gk::Stopwatch commit_watch;
          r = eng.commit(std::move(o.staged));
          online_pause = commit_watch.elapsed_ms();
          char buf[256];
          std::snprintf(buf, sizeof buf,
                        "  staged %.1f ms while serving %lld decode steps (%.0f steps/s; idle %.0f), %lld differed "
                        "from the old weights' output; weight version %llu",
                        o.stage_ms, static_cast<long long>(o.served), o.served_per_s, o.idle_per_s,
                        static_cast<long long>(o.mixed), static_cast<unsigned long long>(eng.weight_version()));
          online_note = buf;
          all_equal = all_equal && o.mixed == 0;
        } else if (patch) {
          r = eng.reload(*patch);
        } else {
          r = eng.reload(dir);
        }
      } catch (const gk::DriftError& e) {
        std::printf("step %d/%d: the capture manifest caught drift; replay is refused:\n%s\n", step, args.steps,
                    e.what());
        demo::LlmEngine fresh(dir, device, format, reference_opts);
        const Compare c = compare(generate(eng, prompts, args.tokens, true, /*checked=*/false),
                                  generate(fresh, prompts, args.tokens, false, true));
        std::printf("SUMMARY: unprotected slot %s -> drift caught by the manifest; replayed without the check, "
                    "%lld of %lld tokens differ from a fresh engine (max |dlogit| %.3g)\n",
                    args.unprotect.c_str(), static_cast<long long>(c.differ), static_cast<long long>(c.total),
                    c.logits.max_abs());
        return 3;
      }
      const double pause = online_pause >= 0 ? online_pause : pause_watch.elapsed_ms();
      // --- serve, and compare with a fresh engine of the same checkpoint ---------
      const auto got = generate(eng, prompts, args.tokens, /*graphs=*/true, /*checked=*/true);
      demo::LlmEngine fresh(dir, device, format, reference_opts);
      const Compare c = compare(got, generate(fresh, prompts, args.tokens, false, true));
      reload_ms += r.times.total_ms;
      pause_ms += pause;
      drift += r.drift;
      worst.add(c.logits);
      all_equal = all_equal && c.equal();
      std::printf("step %d/%d  reload %7.2f ms (pause %7.2f ms)  copied %.2f MiB  drift %zu  verified %zu addrs  "
                  "tokens %s reference (%lld/%lld equal, max |dlogit| %.3g)\n",
                  step, args.steps, r.times.total_ms, pause, static_cast<double>(r.bytes_copied) / (1 << 20), r.drift,
                  r.addresses_verified, c.equal() ? "==" : "!=", static_cast<long long>(c.total - c.differ),
                  static_cast<long long>(c.total), c.logits.max_abs());
      if (!online_note.empty()) std::printf("%s\n", online_note.c_str());
      if (patch) {
        std::printf("%s; %zu layers scattered (%zu derived blocks recomputed), %zu re-ran PWAL; serving %s\n",
                    delta_note.c_str(), r.patch.layers_scattered, r.patch.blocks_recomputed, r.patch.layers_rerun,
                    eng.reload_engine().served()->describe().c_str());
        // Each layer's landing at the first step (later: the re-runs only):
        // the scatter with what it wrote in derived members, or why PWAL ran.
        std::size_t reruns = 0;
        for (const auto& l : r.patch.landings) {
          if (l.rerun && (step == 1 || ++reruns <= 3))
            std::printf("  re-ran %s: %s\n", l.layer.c_str(), l.why.c_str());
          else if (step == 1)
            std::printf("  scatter %s: %zu derived blocks recomputed, %zu layout elements written\n", l.layer.c_str(),
                        l.blocks_recomputed, l.layout_elements);
        }
        all_equal = all_equal && eng.reload_engine().served()->label() == "step" + std::to_string(step);
      }
      std::fflush(stdout);
    }
    const double recapture_ms = eng.recapture();  // what an engine without graphkeep pays per reload
    std::printf("SUMMARY: %d %s, %zu slots tracked, drift %zu, mean reload %.2f ms (serving paused %.2f ms) vs "
                "recapture of %zu graphs %.1f ms, replay after reload %s a fresh engine (max |dlogit| %.3g)\n",
                args.steps,
                args.lora    ? (args.online ? "online adapter swaps (staged while serving)" : "adapter swaps")
                : args.delta ? (args.online ? "online patch reloads (staged while serving)" : "patch reloads")
                : args.online ? "online reloads (staged while serving)" : "reloads",
                eng.reload_engine().plan().num_slots(), drift, args.steps > 0 ? reload_ms / args.steps : 0.0,
                args.steps > 0 ? pause_ms / args.steps : 0.0, eng.num_graphs(), recapture_ms,
                all_equal ? "equals" : "DIFFERS FROM", worst.max_abs());
    return all_equal && drift == 0 ? 0 : 1;
  } catch (const gk::Error& e) {
    std::fprintf(stderr, "gk-rl-demo: %s\n", e.what());
    return 1;
  }
}
