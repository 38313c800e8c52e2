// The example engine (examples/engine) serving while the next weights stage:
// the online reload's stress test on the real engine's decode graphs, on the CPU
// replay backend (suite cpu) and on CUDA graphs (suite gpu, 1,000 rounds).
// And what a request must never see: KV-cache rows at or past its length
// (an earlier request's, or ones written under earlier, NaN weights).
#include "gk_test.h"
#include "temp_dir.h"

#include "engine/checkpoint_writer.h"
#include "engine/compare.h"
#include "engine/llm_engine.h"
#include "engine/lora_projection.h"

#include <graphkeep/delta/make_patch.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/reload/reload_engine.h>

#include <torch/nn/module.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

namespace {

// The serving thread decodes without pause; a staging thread stages the other
// weights (adopting the "trainer's" tensors) `rounds` times; between two
// decode steps the serving thread commits or aborts what was staged. Every
// step's logits must equal, bit for bit, those of the weights committed at
// that moment: never the other model's, never a mix.
// The serving side of the online stress tests: a stager thread stages
// `rounds` updates, each toward the state the serving thread does not serve
// (`stage(target, round)`), while this thread decodes through the graphs,
// checks every step against expected[current] bitwise, and commits two
// staged updates in three (aborting the third).
struct Served {
  int steps = 0, during_stage = 0, wrong = 0, commits = 0, aborts = 0, current = 0;
  double max_pause_ms = 0;
  std::string stager_error;
};
Served serve_and_swap(demo::LlmEngine& eng, const at::Tensor& tokens, const at::Tensor& pos,
                      const at::Tensor (&expected)[2], int rounds,
                      const std::function<gk::StagedReload(int target, int round)>& stage,
                      const std::function<void(const gk::ReloadReport&)>& on_commit = {}) {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<gk::StagedReload> slot;  // staged, waiting for the serving thread
  bool handled = true;  // the serving thread has committed or aborted the last one (stage() may run again)
  int slot_target = 0;
  std::atomic<int> current{0};  // which state is committed (written by the serving thread)
  std::atomic<bool> staging{false}, done{false};
  std::atomic<int> stages_begun{0};
  Served out;
  std::thread stager([&] {
    try {
      for (int round = 0; round < rounds; ++round) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return handled; });
        }
        const int target = 1 - current.load();
        staging = true;
        stages_begun += 1;
        gk::StagedReload s = stage(target, round);
        staging = false;
        std::lock_guard<std::mutex> lock(mu);
        slot.emplace(std::move(s));
        slot_target = target;
        handled = false;
      }
    } catch (const std::exception& e) {
      out.stager_error = e.what();
    }
    done = true;
  });
  std::mt19937 rng(17);
  while (true) {
    // Overlapped: stage() was running when the step began, or began during it.
    const int begun = stages_begun.load();
    const bool staging_at_start = staging.load();
    const at::Tensor logits = eng.decode_logits(tokens, pos);
    ++out.steps;
    out.during_stage += staging_at_start || stages_begun.load() != begun ? 1 : 0;
    if (!demo::bitwise_equal(logits, expected[current.load()])) ++out.wrong;
    std::optional<gk::StagedReload> s;
    int target = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (slot) {
        s = std::move(slot);
        slot.reset();
        target = slot_target;
      }
    }
    if (s) {
      if (rng() % 3 != 0) {
        const gk::ReloadReport r = eng.commit(std::move(*s));
        out.max_pause_ms = std::max(out.max_pause_ms, r.times.commit_ms);
        CHECK(r.drift == 0);
        if (on_commit) on_commit(r);
        current = target;
        ++out.commits;
      } else {
        s->abort();
        ++out.aborts;
      }
      s.reset();
      {
        // Only now may the next stage() begin: one call on the engine at a time.
        std::lock_guard<std::mutex> lock(mu);
        handled = true;
      }
      cv.notify_all();
    } else if (done.load()) {
      break;
    }
  }
  stager.join();
  out.current = current.load();
  return out;
}

// The tiny model's random weights `seed`, on `device`.
std::vector<gk::NamedTensor> weights_on(const c10::Device device, const demo::HfConfig& c, int seed) {
  std::vector<gk::NamedTensor> w = demo::random_weights(c, seed);
  for (auto& t : w) t.value = t.value.to(device);
  return w;
}

// A trainer that keeps the engine's layout hands over whole parameters (fused
// q/k/v and gate/up) by parameter name: `trainer`'s own, cloned.
std::vector<gk::NamedTensor> whole_parameters(demo::LlmEngine& trainer) {
  std::vector<gk::NamedTensor> whole;
  for (const gk::LayerPlan& lp : trainer.reload_engine().plan().layers())
    for (const gk::CheckpointParam& cp : lp.params) {
      const auto params = lp.module->named_parameters(/*recurse=*/false);
      const at::Tensor* p = params.find(cp.param);
      const at::Tensor t = p != nullptr ? *p : lp.module->named_buffers(/*recurse=*/false)[cp.param];
      whole.push_back({lp.full_name(cp.param), t.detach().clone(), 0});
    }
  return whole;
}

void serve_while_staging(const c10::Device device, const int kRounds) {
  at::NoGradGuard no_grad;
  const demo::HfConfig c = demo::builtin_tiny_config();
  const std::vector<gk::NamedTensor> weights[2] = {weights_on(device, c, 1), weights_on(device, c, 2)};
  demo::LlmEngineOptions opts;
  opts.reload.adopt_source_tensors = true;
  gk::InMemorySource first(weights[0]);
  demo::LlmEngine eng(c, device, demo::WeightFormat::dense, first, opts);
  REQUIRE(eng.num_graphs() == 35);
  const at::Tensor tokens = at::arange(8, at::kLong).mul(7).remainder(c.vocab_size);
  const at::Tensor pos = at::full({8}, 3, at::kLong);
  at::Tensor expected[2];
  expected[0] = eng.decode_logits(tokens, pos);
  {
    gk::InMemorySource b(weights[1]);
    eng.reload(b);
    expected[1] = eng.decode_logits(tokens, pos);
    gk::InMemorySource a(weights[0]);
    eng.reload(a);
  }
  REQUIRE_FALSE(demo::bitwise_equal(expected[0], expected[1]));
  REQUIRE(demo::bitwise_equal(eng.decode_logits(tokens, pos), expected[0]));
  {
    // A trainer that keeps the engine's layout hands over whole parameters
    // (fused q/k/v and gate/up) by parameter name: the parameters of a second
    // engine loaded with B. Adopted, they give B's logits bit for bit.
    demo::LlmEngineOptions eager;
    eager.batch_sizes = {};
    gk::InMemorySource b(weights[1]);
    demo::LlmEngine trainer(c, device, demo::WeightFormat::dense, b, eager);
    const std::vector<gk::NamedTensor> whole = whole_parameters(trainer);
    gk::InMemorySource src(whole);
    const gk::ReloadReport r = eng.reload(src);
    CHECK(r.tensors_adopted == whole.size());
    CHECK(demo::bitwise_equal(eng.decode_logits(tokens, pos), expected[1]));
    gk::InMemorySource a(weights[0]);
    eng.reload(a);
    REQUIRE(demo::bitwise_equal(eng.decode_logits(tokens, pos), expected[0]));
  }
  const std::uint64_t version0 = eng.reload_engine().weight_version();
  // Every other round stages a weight patch instead of the other weights:
  // the checkpoint tensors that changed, checked against the served hashes.
  const gk::Patch patches[2] = {gk::make_patch(weights[1], weights[0], {.base_version = "B", .target_version = "A"}),
                                gk::make_patch(weights[0], weights[1], {.base_version = "A", .target_version = "B"})};
  std::atomic<int> patch_rounds{0};
  const Served sv = serve_and_swap(eng, tokens, pos, expected, kRounds, [&](int target, int round) {
    // Every other round stages a weight patch instead of the other weights.
    const bool patch = round % 2 == 1;
    gk::InMemorySource src(weights[target]);
    gk::StagedReload s = patch ? eng.stage(patches[target]) : eng.stage(src);
    patch_rounds += patch ? 1 : 0;
    return s;
  });
  const int steps = sv.steps, during_stage = sv.during_stage, wrong = sv.wrong, commits = sv.commits,
            aborts = sv.aborts;
  const double max_pause_ms = sv.max_pause_ms;
  const std::string& stager_error = sv.stager_error;
  const int current = sv.current;
  MESSAGE(steps << " decode steps (" << during_stage << " while stage() ran), " << commits << " commits, " << aborts
                << " aborts, " << patch_rounds.load() << " of the stages weight patches; longest commit pause "
                << max_pause_ms << " ms");
  CHECK(patch_rounds.load() == kRounds / 2);
  CHECK(eng.reload_engine().served()->label() == (current == 0 ? "A" : "B"));
  CHECK_MESSAGE(stager_error.empty(), stager_error);
  CHECK(wrong == 0);
  CHECK(commits + aborts == kRounds);
  CHECK(commits > kRounds / 2);
  CHECK(aborts > kRounds / 5);
  CHECK(during_stage > 0);
  CHECK(eng.reload_engine().weight_version() == version0 + static_cast<std::uint64_t>(commits));
  CHECK(eng.reload_engine().state() == gk::EngineState::ready);
  CHECK(demo::bitwise_equal(eng.decode_logits(tokens, pos), expected[current]));
}


// The same for LoRA adapters: a trainer thread stages adapter
// swaps (LlmEngine::stage_adapter: every projection's A and B in one patch)
// while the serving thread decodes through the graphs and commits or aborts
// them; every step must be adapter 1's or adapter 2's logits, bitwise, never
// a mix of two adapters.
void serve_while_swapping_adapters(const c10::Device device, const int kRounds) {
  at::NoGradGuard no_grad;
  const demo::HfConfig c = demo::builtin_tiny_config();
  demo::LoraConfig lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.targets = {"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"};
  const demo::LoraShapes shapes{c.num_hidden_layers, c.hidden_size, c.num_attention_heads * c.head_dim,
                                c.num_key_value_heads * c.head_dim, c.intermediate_size, false};
  const gk::testing::TempDir root("gk_online_adapters_");
  const std::string dirs[2] = {root.path + "/a1", root.path + "/a2"};
  for (int i = 0; i < 2; ++i)
    demo::write_lora_adapter(dirs[i], lora, demo::random_lora_tensors(shapes, lora, static_cast<std::uint64_t>(11 + i)));
  demo::LlmEngineOptions opts;
  opts.adapter = dirs[0];
  std::vector<gk::NamedTensor> w = demo::random_weights(c, 1);
  for (auto& t : w) t.value = t.value.to(device);
  gk::InMemorySource first(w);
  demo::LlmEngine eng(c, device, demo::WeightFormat::dense, first, opts);
  // Dense weights: each projection's A is the last rows of its base
  // weight's parameter, so that one GEMM reads both (Note [LoRA in the
  // decode graphs]); there is no A parameter of its own.
  {
    const auto params = eng.model().named_parameters();
    std::map<std::string, at::Tensor> served;
    for (const gk::NamedTensor& t : eng.model().adapter_tensors()) served.emplace(t.name, t.value);
    const std::pair<const char*, const char*> joined[] = {{"self_attn.qkv_proj", "self_attn.v_proj"},
                                                          {"self_attn.o_proj", "self_attn.o_proj"},
                                                          {"mlp.gate_up_proj", "mlp.up_proj"},
                                                          {"mlp.down_proj", "mlp.down_proj"}};
    for (const auto& [param, last] : joined) {
      const std::string w_name = std::string("model.layers.0.") + param;
      CAPTURE(w_name);
      const at::Tensor* wt = params.find(w_name);
      REQUIRE(wt != nullptr);
      CHECK(params.find(w_name + "_lora_A") == nullptr);
      const at::Tensor& a = served.at(std::string("model.layers.0.") + last + ".lora_A.weight");
      CHECK(a.storage().is_alias_of(wt->storage()));
      CHECK(a.storage_offset() + a.numel() == wt->storage_offset() + wt->numel());  // its last rows
    }
  }
  const at::Tensor tokens = at::arange(8, at::kLong).mul(7).remainder(c.vocab_size);
  const at::Tensor pos = at::full({8}, 3, at::kLong);
  at::Tensor expected[2];
  expected[0] = eng.decode_logits(tokens, pos);
  if (device.is_cuda()) {
    // The joined GEMM computes what a shrink GEMM of its own computes, up to
    // the order of the sums; a lost A (the LoRA term gone) is far outside.
    using Kernels = demo::LoraProjection::Kernels;
    gk::InMemorySource again(w);
    const at::Tensor other = [&] {
      const demo::LoraProjection::ScopedKernels scoped(Kernels::fused_expand);  // read when built and captured
      demo::LlmEngine unjoined(c, device, demo::WeightFormat::dense, again, opts);
      return unjoined.decode_logits(tokens, pos);
    }();
    CHECK(demo::LoraProjection::kernels() == Kernels::joined);  // restored
    demo::LlmEngineOptions none = opts;
    none.adapter.clear();
    gk::InMemorySource base(w);
    const at::Tensor plain = demo::LlmEngine(c, device, demo::WeightFormat::dense, base, none).decode_logits(tokens, pos);
    demo::MaxDiff d, lora_term;
    d.add(expected[0], other);
    lora_term.add(plain, other);
    CAPTURE(d.rel());
    CAPTURE(lora_term.rel());
    CHECK(d.within(1e-4));
    CHECK_FALSE(lora_term.within(1e-2));  // the adapter moves the logits: the check above can fail
  }
  eng.reload_adapter(dirs[1]);
  expected[1] = eng.decode_logits(tokens, pos);
  eng.reload_adapter(dirs[0]);
  REQUIRE_FALSE(demo::bitwise_equal(expected[0], expected[1]));
  REQUIRE(demo::bitwise_equal(eng.decode_logits(tokens, pos), expected[0]));

  const Served sv = serve_and_swap(
      eng, tokens, pos, expected, kRounds, [&](int target, int) { return eng.stage_adapter(dirs[target]); },
      [](const gk::ReloadReport& r) { CHECK(r.patch.layers_rerun == 0); });
  const int steps = sv.steps, wrong = sv.wrong, commits = sv.commits, aborts = sv.aborts;
  const double max_pause_ms = sv.max_pause_ms;
  const std::string& stager_error = sv.stager_error;
  const int current = sv.current;
  MESSAGE(steps << " decode steps, " << commits << " adapter swaps committed, " << aborts
                << " aborted; longest commit pause " << max_pause_ms << " ms");
  CHECK_MESSAGE(stager_error.empty(), stager_error);
  CHECK(wrong == 0);
  CHECK(commits + aborts == kRounds);
  CHECK(commits > kRounds / 2);
  CHECK(aborts > kRounds / 5);
  CHECK(demo::bitwise_equal(eng.decode_logits(tokens, pos), expected[current]));
}

// Every row of every layer's KV cache set to NaN, +Inf or -Inf (keys and
// values in a different pattern): what rows written under NaN weights hold.
// A streaming reload from a resident source hashes what it loads with the
// non-finite scan's read (Note [Scanning a resident source first]): the
// served hashes must be those of the bytes loaded, whether the tensors were
// adopted (the scan's hashes reused) or copied (the source's tensors freed
// as they are consumed, their memory free for the copies of later layers:
// a hash found by address alone would then be another tensor's). A NaN in
// the last tensor is refused before any layer is copied.
void streaming_hashes_are_the_loaded_bytes(const c10::Device device) {
  at::NoGradGuard no_grad;
  const demo::HfConfig c = demo::builtin_tiny_config();
  const std::vector<gk::NamedTensor> weights[2] = {weights_on(device, c, 3), weights_on(device, c, 4)};
  gk::InMemorySource first(weights[0]);
  demo::LlmEngine eng(c, device, demo::WeightFormat::dense, first);
  const at::Tensor tokens = at::arange(8, at::kLong).mul(5).remainder(c.vocab_size);
  const at::Tensor pos = at::full({8}, 2, at::kLong);
  // Hashes the source's scan took: on a GPU every tensor the scan could
  // read as one range (only a source on the model's GPU is scanned first).
  const auto from_scan = [&](std::size_t n) { return device.is_cuda() ? n : std::size_t{0}; };
  for (bool adopt : {true, false}) {
    for (int which : {1, 0}) {
      CAPTURE(adopt);
      CAPTURE(which);
      std::vector<gk::NamedTensor> own;  // the source's tensors alone hold their memory
      for (const gk::NamedTensor& t : weights[which]) own.push_back({t.name, t.value.clone(), t.shard});
      gk::InMemorySource src(std::move(own));
      gk::ReloadOptions o = eng.reload_engine().options().defaults;
      o.mode = gk::ReloadMode::streaming;
      o.adopt_source_tensors = adopt;
      const gk::ReloadReport r = eng.reload(src, o);
      CHECK((r.tensors_adopted > 0) == adopt);
      // Adopted or copied byte for byte, every tensor's hash is the scan's
      // (Note [Hashes of verbatim copies] in reload/copied_from.h).
      CHECK(r.hashes_from_scan == from_scan(weights[which].size()));
      const auto served = eng.reload_engine().served();
      REQUIRE(served != nullptr);
      for (const gk::NamedTensor& t : weights[which]) {
        CAPTURE(t.name);
        CHECK(served->hash(t.name) == gk::content_hash(t.value));
      }
    }
  }
  {
    // One tensor not contiguous (the same values, column-major): the scan
    // cannot read it as one range and the load copies it element by
    // element, so it alone is hashed again after the load, and still right.
    std::vector<gk::NamedTensor> own;
    for (const gk::NamedTensor& t : weights[1]) own.push_back({t.name, t.value.clone(), t.shard});
    const auto it = std::find_if(own.begin(), own.end(), [](const gk::NamedTensor& t) { return t.value.dim() == 2; });
    REQUIRE(it != own.end());
    it->value = it->value.t().contiguous().t();
    REQUIRE(!it->value.is_contiguous());
    gk::InMemorySource src(std::move(own));
    gk::ReloadOptions o = eng.reload_engine().options().defaults;
    o.mode = gk::ReloadMode::streaming;
    o.adopt_source_tensors = false;
    const gk::ReloadReport r = eng.reload(src, o);
    CHECK(r.hashes_from_scan == from_scan(weights[1].size() - 1));
    for (const gk::NamedTensor& t : weights[1]) {
      CAPTURE(t.name);
      CHECK(eng.reload_engine().served()->hash(t.name) == gk::content_hash(t.value));
    }
  }
  // Whole parameters by their names (several checkpoint tensors each): the
  // scan reads them as their checkpoint tensors' ranges.
  demo::LlmEngineOptions eager;
  eager.batch_sizes = {};
  gk::InMemorySource b(weights[1]);
  demo::LlmEngine trainer(c, device, demo::WeightFormat::dense, b, eager);
  const auto whole_params = [&] { return whole_parameters(trainer); };
  {
    gk::InMemorySource src(whole_params());
    gk::ReloadOptions o = eng.reload_engine().options().defaults;
    o.mode = gk::ReloadMode::streaming;
    o.adopt_source_tensors = true;
    const gk::ReloadReport r = eng.reload(src, o);
    CHECK(r.tensors_adopted > 0);
    CHECK(r.hashes_from_scan == from_scan(weights[1].size()));  // by checkpoint tensor, whole parameters' too
    for (const gk::NamedTensor& t : weights[1]) {
      CAPTURE(t.name);
      CHECK(eng.reload_engine().served()->hash(t.name) == gk::content_hash(t.value));
    }
  }
  const at::Tensor logits = eng.decode_logits(tokens, pos);
  const std::uint64_t version = eng.reload_engine().served()->content_version();
  {
    // A NaN in a later checkpoint tensor of a whole parameter: named by the
    // parameter, at its element index in the parameter.
    std::vector<gk::NamedTensor> whole = whole_params();
    auto fused = std::find_if(whole.begin(), whole.end(), [](const gk::NamedTensor& t) {
      return t.name.find("qkv") != std::string::npos;
    });
    REQUIRE(fused != whole.end());
    const std::int64_t at_elem = fused->value.numel() - 3;  // in its last checkpoint tensor (v)
    fused->value.view({-1})[at_elem] = INFINITY;
    const std::string name = fused->name;
    gk::InMemorySource src(std::move(whole));
    gk::ReloadOptions o = eng.reload_engine().options().defaults;
    o.mode = gk::ReloadMode::streaming;
    o.adopt_source_tensors = true;
    const std::string msg = gk::testing::message_of<gk::WeightError>([&] { eng.reload(src, o); });
    CAPTURE(msg);
    CHECK(msg.find("weight '" + name + "'") != std::string::npos);
    CHECK(msg.find(gk::detail::concat("at element ", at_elem, " of ")) != std::string::npos);
    CHECK(eng.reload_engine().served()->content_version() == version);
  }
  std::vector<gk::NamedTensor> bad;
  for (const gk::NamedTensor& t : weights[1]) bad.push_back({t.name, t.value.clone(), t.shard});
  bad.back().value.view({-1})[bad.back().value.numel() - 1] = std::nan("");
  const std::string last = bad.back().name;
  gk::InMemorySource nan_src(std::move(bad));
  gk::ReloadOptions o = eng.reload_engine().options().defaults;
  o.mode = gk::ReloadMode::streaming;
  o.adopt_source_tensors = true;
  const std::string msg = gk::testing::message_of<gk::WeightError>([&] { eng.reload(nan_src, o); });
  CHECK(msg.find("weight '" + last + "'") != std::string::npos);
  CHECK(msg.find("refused before any layer was copied") != std::string::npos);
  CHECK(eng.reload_engine().served()->content_version() == version);
  CHECK(demo::bitwise_equal(eng.decode_logits(tokens, pos), logits));
}

// The MoE experts' stride arrays are declared from_shapes: every full reload
// compares what PWAL built with the captured storage, on the host (Note
// [Comparing on the host] in reload/late_bytes.h). A captured element that
// no longer holds what PWAL builds (written here by hand) is named with
// both values and the reload refused; once it holds them again, a reload
// serves the weights bitwise.
void from_shapes_strides_are_compared(const c10::Device device) {
  at::NoGradGuard no_grad;
  demo::HfConfig c;
  for (const demo::HfConfig& x : demo::builtin_tiny_configs())
    if (x.model_type == "qwen3_moe") c = x;
  REQUIRE(c.model_type == "qwen3_moe");
  const std::vector<gk::NamedTensor> w3 = weights_on(device, c, 3), w4 = weights_on(device, c, 4);
  gk::InMemorySource first(w3);
  demo::LlmEngine eng(c, device, demo::WeightFormat::dense, first);
  const at::Tensor tokens = at::arange(8, at::kLong).mul(5).remainder(c.vocab_size);
  const at::Tensor pos = at::full({8}, 2, at::kLong);
  const at::Tensor logits3 = eng.decode_logits(tokens, pos);
  gk::ReloadOptions o = eng.reload_engine().options().defaults;
  o.mode = gk::ReloadMode::streaming;
  o.adopt_source_tensors = true;
  const auto reload = [&](const std::vector<gk::NamedTensor>& w) {
    std::vector<gk::NamedTensor> own;
    for (const gk::NamedTensor& t : w) own.push_back({t.name, t.value.clone(), t.shard});
    gk::InMemorySource src(std::move(own));
    return eng.reload(src, o);
  };
  CHECK_NOTHROW(reload(w4));
  CHECK_FALSE(demo::bitwise_equal(eng.decode_logits(tokens, pos), logits3));
  const gk::PlannedSlot* strides = nullptr;
  for (const gk::LayerPlan& l : eng.reload_engine().plan().layers())
    for (const gk::PlannedSlot& s : l.slots)
      if (strides == nullptr && s.name.find("strides_.ab_strides2") != std::string::npos) strides = &s;
  REQUIRE(strides != nullptr);
  CAPTURE(strides->name);
  REQUIRE(strides->captured.device() == device);
  const at::Tensor kept = strides->captured.clone();
  strides->captured[1].fill_(12345);
  std::ostringstream want;
  want << " built " << strides->name << " with other values from these weights: element 1 was " << 12345.0
       << " and is now " << static_cast<double>(c.moe_intermediate_size) << ". It depends on the checkpoint's values";
  const std::string msg = gk::testing::message_of<gk::DeclarationError>([&] { reload(w3); });
  CAPTURE(msg);
  CHECK(msg.find(want.str()) != std::string::npos);
  CHECK(msg.find("ab_strides2 is declared metadata.from_shapes()") != std::string::npos);
  strides->captured.copy_(kept);
  CHECK_NOTHROW(reload(w3));
  CHECK(demo::bitwise_equal(eng.decode_logits(tokens, pos), logits3));
}

// Note [Processing while the scan runs] (reload/weight_stream.cpp): a
// streaming reload of a resident source loads, runs PWAL on and checks up
// to four adopted layers while its non-finite scan still runs, and copies
// nothing before the scan's verdict. On a CPU the scan answers at once; the
// hook makes the reload take it as running for `pending` more layers. The
// fault hook records the order: how many layers ran PWAL before the first
// copy into captured storage (two without the hook: a layer's copy-back is
// enqueued after the next layer's checks, Note [Copy back one layer late]).
void processing_while_the_scan_runs(const c10::Device device) {
  at::NoGradGuard no_grad;
  const demo::HfConfig c = demo::builtin_tiny_config();
  gk::InMemorySource first(weights_on(device, c, 3));
  demo::LlmEngine eng(c, device, demo::WeightFormat::dense, first);
  demo::LlmEngineOptions eager;
  eager.batch_sizes = {};
  gk::InMemorySource b(weights_on(device, c, 4));
  demo::LlmEngine trainer(c, device, demo::WeightFormat::dense, b, eager);
  const at::Tensor tokens = at::arange(8, at::kLong).mul(5).remainder(c.vocab_size);
  const at::Tensor pos = at::full({8}, 2, at::kLong);
  const at::Tensor logits3 = eng.decode_logits(tokens, pos);
  const std::size_t layers = eng.reload_engine().plan().layers().size();
  REQUIRE(layers >= 6);
  std::vector<std::pair<gk::testing::FaultPoint, std::string>> events;
  const auto pwal_before_first_copy = [&] {
    std::size_t n = 0;
    for (const auto& [point, layer] : events) {
      if (point == gk::testing::FaultPoint::copy) return n;
      n += point == gk::testing::FaultPoint::pwal ? 1 : 0;
    }
    return n;
  };
  std::string fail_at;  // a layer whose check fails (a fault injected there)
  const auto reload = [&](std::size_t pending, std::vector<gk::NamedTensor> source) {
    gk::testing::EngineHooks h;
    h.scan_pending_layers = pending;
    h.fault = [&](gk::testing::FaultPoint point, const std::string& layer) {
      events.emplace_back(point, layer);
      if (point == gk::testing::FaultPoint::check && layer == fail_at) throw std::runtime_error("injected at " + layer);
    };
    gk::testing::set_hooks(eng.reload_engine(), h);
    events.clear();
    gk::InMemorySource src(std::move(source));
    gk::ReloadOptions o = eng.reload_engine().options().defaults;
    o.mode = gk::ReloadMode::streaming;
    o.adopt_source_tensors = true;
    const gk::ReloadReport r = eng.reload(src, o);
    gk::testing::set_hooks(eng.reload_engine(), {});
    return r;
  };
  // Without the hook: two layers' PWAL before the first copy.
  CHECK(reload(0, whole_parameters(trainer)).tensors_adopted > 0);
  CHECK(pwal_before_first_copy() == 2);
  const at::Tensor want = eng.decode_logits(tokens, pos);
  CHECK_FALSE(demo::bitwise_equal(want, logits3));
  {
    gk::InMemorySource back(weights_on(device, c, 3));
    eng.reload(back);
    CHECK(demo::bitwise_equal(eng.decode_logits(tokens, pos), logits3));
  }
  // Taken as running: four layers go ahead, the fifth's checks end the wait.
  const gk::ReloadReport r = reload(3, whole_parameters(trainer));
  CHECK(r.tensors_adopted == r.tensors_loaded);
  CHECK(pwal_before_first_copy() == 5);
  CHECK(demo::bitwise_equal(eng.decode_logits(tokens, pos), want));
  for (const gk::NamedTensor& t : whole_parameters(trainer)) {
    CAPTURE(t.name);
    for (const gk::LayerPlan& lp : eng.reload_engine().plan().layers())
      for (const gk::CheckpointParam& cp : lp.params)
        if (lp.full_name(cp.param) == t.name && cp.tensors.size() == 1)
          CHECK(eng.reload_engine().served()->hash(lp.full_name(cp.tensors[0].name)) == gk::content_hash(t.value));
  }
  // A fault at the fourth layer's check, three layers processed ahead: all
  // of them rolled back, nothing copied, the engine ready.
  const std::uint64_t served = eng.reload_engine().served()->content_version();
  fail_at = eng.reload_engine().plan().layers()[3].prefix;
  CHECK_THROWS_WITH_AS(reload(3, whole_parameters(trainer)), ("injected at " + fail_at).c_str(), std::runtime_error);
  fail_at.clear();
  CHECK(pwal_before_first_copy() == 4);
  CHECK(std::none_of(events.begin(), events.end(), [](const auto& e) { return e.first == gk::testing::FaultPoint::copy; }));
  gk::testing::set_hooks(eng.reload_engine(), {});
  CHECK(eng.reload_engine().state() == gk::EngineState::ready);
  CHECK(eng.reload_engine().served()->content_version() == served);
  CHECK(demo::bitwise_equal(eng.decode_logits(tokens, pos), want));
  // A NaN in the last tensor: the layers processed ahead are rolled back,
  // nothing was copied, the weights served are the trainer's still.
  const std::uint64_t version = eng.reload_engine().served()->content_version();
  std::vector<gk::NamedTensor> bad = whole_parameters(trainer);
  bad.back().value.view({-1})[0] = std::nan("");
  const std::string name = bad.back().name;
  const std::string msg = gk::testing::message_of<gk::WeightError>([&] { reload(3, std::move(bad)); });
  CAPTURE(msg);
  CHECK(msg.find("weight '" + name + "'") != std::string::npos);
  CHECK(msg.find("refused before any layer was copied") != std::string::npos);
  CHECK(pwal_before_first_copy() >= 4);
  CHECK(std::none_of(events.begin(), events.end(), [](const auto& e) { return e.first == gk::testing::FaultPoint::copy; }));
  gk::testing::set_hooks(eng.reload_engine(), {});
  CHECK(eng.reload_engine().served()->content_version() == version);
  CHECK(demo::bitwise_equal(eng.decode_logits(tokens, pos), want));
}

void poison_kv_cache(demo::LlmEngine& eng) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const demo::KvCache& c : eng.kv_caches()) {
    const std::int64_t rows = c.k.size(0);
    for (std::int64_t r = 0; r < rows; ++r) {
      c.k[r].fill_(r % 3 == 0 ? nan : r % 3 == 1 ? inf : -inf);
      c.v[r].fill_(r % 2 == 0 ? nan : -inf);
    }
  }
}

// One request of `prompt`'s rows (each its own sequence): prefill each
// sequence's first `p` tokens, then decode the rest, first through the decode
// graphs, then eagerly. Returns every logits tensor in order.
std::vector<at::Tensor> serve_request(demo::LlmEngine& eng, const at::Tensor& prompt, std::int64_t p) {
  std::vector<at::Tensor> out;
  const std::int64_t B = prompt.size(0), T = prompt.size(1);
  for (std::int64_t b = 0; b < B; ++b) out.push_back(eng.prefill(b, prompt[b].narrow(0, 0, p)));
  for (std::int64_t t = p; t < T; ++t) {
    const at::Tensor pos = at::full({B}, t, at::kLong);
    out.push_back(t < (p + T) / 2 ? eng.decode_logits(prompt.select(1, t), pos) : eng.decode_eager(prompt.select(1, t), pos));
  }
  return out;
}

void stale_kv_rows_never_reach_logits(const c10::Device device) {
  // Attention reads the whole static cache of the sequence and weights the
  // rows past the token's position 0; 0 * NaN = NaN, so those rows must be
  // left out, not weighted 0 (Note [Stale KV rows] in examples/engine/layers.cpp).
  // A used engine whose cache holds an earlier, longer request and then NaN
  // and Inf everywhere must serve a new request bitwise as a fresh engine
  // does, eagerly and through the captured decode graphs (the CPU replay
  // backend, or CUDA graphs).
  at::NoGradGuard no_grad;
  for (const demo::HfConfig& c : demo::builtin_tiny_configs()) {
    CAPTURE(c.model_type);
    const std::vector<gk::NamedTensor> weights = demo::random_weights(c, 7);
    demo::LlmEngineOptions opts;
    opts.batch_sizes = {1, 2, 4};
    opts.max_len = 16;
    gk::InMemorySource w1(weights), w2(weights);
    demo::LlmEngine fresh(c, device, demo::WeightFormat::dense, w1, opts);
    demo::LlmEngine used(c, device, demo::WeightFormat::dense, w2, opts);
    REQUIRE(used.num_graphs() == 3);
    const at::Tensor earlier = at::arange(3 * 16, at::kLong).mul(11).remainder(c.vocab_size).view({3, 16});
    (void)serve_request(used, earlier, 10);
    poison_kv_cache(used);
    const at::Tensor prompt = at::arange(3 * 10, at::kLong).mul(5).add(3).remainder(c.vocab_size).view({3, 10});
    const std::vector<at::Tensor> want = serve_request(fresh, prompt, 4);
    const std::vector<at::Tensor> got = serve_request(used, prompt, 4);
    REQUIRE(got.size() == 9);  // 3 prefills, 3 decode steps through graphs, 3 eager
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(demo::bitwise_equal(got[i], want[i]));  // and finite
    }
    // The poison is still there past the request's length (row seq * max_len + position).
    CHECK(at::isnan(used.kv_caches()[0].v[12]).all().item<bool>());
    CHECK(at::isinf(used.kv_caches()[1].k[2 * 16 + 14]).all().item<bool>());
  }
}

// The built-in config written to a fresh directory, the first `from` in its
// config.json text replaced by `to`, read back with demo::read_hf_config.
demo::HfConfig read_edited_config(const std::string& name, const std::string& from, const std::string& to) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("gk_hf_config_test_" + name)).string();
  demo::write_hf_config(demo::builtin_tiny_config(), dir);
  const std::string file = dir + "/config.json";
  std::string text;
  {
    std::ifstream in(file);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  std::ofstream(file) << text;
  return demo::read_hf_config(dir);
}

}  // namespace

TEST_CASE("the comparisons of the checks fail on NaN and Inf, in the output or in the reference") {
  // What gk-hf-check, the demo, these tests and the fuzzers compare with
  // (examples/engine/compare.h). The idiom it replaces passes NaN:
  const at::Tensor want = at::linspace(-2, 2, 12).view({3, 4});
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  CHECK(std::max(0.0, (want.clone().fill_(nan) - want).abs().max().item<double>()) == 0.0);
  CHECK(demo::max_keep_nan(0.0, nan) != demo::max_keep_nan(0.0, nan));
  {
    demo::MaxDiff same;
    same.add(want, want.clone());
    CHECK(same.equal());
    CHECK(same.within(0));
    CHECK(same.nonfinite() == 0);
    CHECK(demo::bitwise_equal(want, want.clone()));
    CHECK(demo::all_close(want, want + 1e-6, 1e-3, 1e-3));
    demo::MaxDiff off;
    off.add(want, want + 0.5);
    CHECK_FALSE(off.equal());
    CHECK(off.within(0.5 / 2.5));  // max |diff| 0.5 against max |reference| 2.5
    CHECK_FALSE(off.within(0.19));
    CHECK_FALSE(demo::bitwise_equal(want, want + 0.5));
    CHECK_FALSE(demo::all_close(want, want + 0.5, 1e-3, 1e-3));
    demo::MaxDiff shape;
    shape.add(want, want.view({4, 3}));
    CHECK_FALSE(shape.within(1));
  }
  for (const double bad : {nan, inf, -inf}) {
    CAPTURE(bad);
    for (const bool in_reference : {false, true}) {
      CAPTURE(in_reference);
      for (const bool all : {false, true}) {
        CAPTURE(all);
        at::Tensor poisoned = want.clone();
        if (all)
          poisoned.fill_(bad);
        else
          poisoned[1][2] = bad;
        const at::Tensor& got = in_reference ? want : poisoned;
        const at::Tensor& ref = in_reference ? poisoned : want;
        demo::MaxDiff d;
        d.add(got, ref);
        CHECK(d.nonfinite() == (all ? 12 : 1));
        CHECK_FALSE(d.finite());
        CHECK_FALSE(d.within(1e30));
        CHECK_FALSE(d.equal());
        CHECK_FALSE(std::isfinite(d.rel()));
        // Non-finite on both sides, even the same value, is no match.
        demo::MaxDiff both;
        both.add(poisoned, poisoned.clone());
        CHECK_FALSE(both.within(1e30));
        CHECK_FALSE(both.equal());
        CHECK_FALSE(demo::bitwise_equal(got, ref));
        CHECK_FALSE(demo::bitwise_equal(poisoned, poisoned.clone()));
        CHECK_FALSE(demo::bitwise_equal(poisoned, poisoned));  // at::equal's same-storage shortcut
        CHECK_FALSE(demo::all_close(got, ref, 1e30, 1e30));
        CHECK_FALSE(demo::all_close(poisoned, poisoned.clone(), 1e-3, 1e-3));
        // An earlier finite pair does not hide a later non-finite one, nor the other way round.
        demo::MaxDiff later, finite_only, merged;
        later.add(want, want);
        later.add(got, ref);
        later.add(want, want);
        CHECK_FALSE(later.within(1e30));
        finite_only.add(want, want);
        merged.add(finite_only);
        merged.add(later);
        CHECK_FALSE(merged.within(1e30));
      }
    }
  }
}

TEST_CASE("config.json: rope scalings are read as transformers reads them; what the engine cannot serve is refused by name") {
  const std::string null_rope = "\"rope_scaling\": null";
  CHECK(read_edited_config("default", null_rope, null_rope).rope_scaling == demo::RopeScaling{});
  {
    const demo::HfConfig c =
        read_edited_config("linear", null_rope, R"("rope_scaling": {"rope_type": "linear", "factor": 2.0})");
    CHECK(c.rope_scaling.type == "linear");
    CHECK(c.rope_scaling.factor == 2.0);
  }
  {  // the older key, and both keys (as transformers' config writes them)
    CHECK(read_edited_config("dynamic", null_rope, R"("rope_scaling": {"type": "dynamic", "factor": 4})")
              .rope_scaling.type == "dynamic");
    CHECK(read_edited_config("dynamic2", null_rope,
                             R"("rope_scaling": {"type": "dynamic", "rope_type": "dynamic", "factor": 4})")
              .rope_scaling.factor == 4.0);
  }
  const std::string llama31 = R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, )"
                              R"("high_freq_factor": 4.0, "original_max_position_embeddings": 8192)";
  {
    const demo::HfConfig c = read_edited_config("llama3", null_rope, "\"rope_scaling\": " + llama31 + "}");
    CHECK(c.rope_scaling.type == "llama3");
    CHECK(c.rope_scaling.original_max_position_embeddings == 8192);
    CHECK(c.rope_scaling.high_freq_factor == 4.0);
    // Written back and read again: the same.
    const std::string dir = (std::filesystem::temp_directory_path() / "gk_hf_config_test_roundtrip").string();
    demo::write_hf_config(c, dir);
    CHECK(demo::read_hf_config(dir).rope_scaling == c.rope_scaling);
  }
  // Refusals: each names the field, says the engine cannot serve the model
  // when the field is one it does not implement, and never advises editing
  // the config (serving without it gives other logits: hf.check.llama_rope_llama3.plain_rope).
  struct Bad {
    const char* name;
    std::string from, to, says;
    bool unsupported;  // "the engine cannot serve this model"
  };
  const std::vector<Bad> bad = {
      {"yarn", null_rope, R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})", "rope_scaling.rope_type 'yarn'",
       true},
      {"longrope", null_rope, R"("rope_scaling": {"type": "longrope", "factor": 4.0})",
       "rope_scaling.rope_type 'longrope'", true},
      {"no_type", null_rope, R"("rope_scaling": {"factor": 4.0})", "has no 'rope_type'", true},
      {"types_differ", null_rope, R"("rope_scaling": {"type": "linear", "rope_type": "dynamic", "factor": 2.0})",
       "rope_scaling.rope_type 'dynamic' and rope_scaling.type 'linear' differ", true},
      {"missing", null_rope, R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0})",
       "the field 'rope_scaling.original_max_position_embeddings' is missing", false},
      {"extra", null_rope, "\"rope_scaling\": " + llama31 + ", \"attention_factor\": 0.5}",
       "unsupported field 'rope_scaling.attention_factor' = 0.5", true},
      {"factor", null_rope, R"("rope_scaling": {"rope_type": "linear", "factor": 0})", "rope_scaling.factor is 0", true},
      {"not_object", null_rope, R"("rope_scaling": "llama3")", "the field 'rope_scaling' has the value \"llama3\"",
       true},
      {"partial", null_rope, R"("rope_scaling": null, "partial_rotary_factor": 0.5)",
       "unsupported value 0.5 of the field 'partial_rotary_factor'", true},
      {"bias", "\"attention_bias\": false", "\"attention_bias\": true",
       "unsupported value true of the field 'attention_bias'", true},
      {"model_type", "\"model_type\": \"qwen3\"", "\"model_type\": \"mistral\"", "unsupported model_type 'mistral'",
       true},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.name);
    std::string message;
    try {
      (void)read_edited_config(b.name, b.from, b.to);
    } catch (const gk::WeightError& e) {
      message = e.message();
    }
    CAPTURE(message);
    CHECK(message.find("config.json") != std::string::npos);
    CHECK(message.find(b.says) != std::string::npos);
    CHECK((message.find("the engine cannot serve this model") != std::string::npos) == b.unsupported);
    CHECK(message.find("remove") == std::string::npos);
    CHECK(message.find("set it") == std::string::npos);
  }
}

TEST_CASE("a format the model's sizes do not fit is refused naming the tensor and the config field") {
  // W4A16 groups K input channels by 128 (K itself below 128): an
  // intermediate_size of 160 fits no group, and down_proj's K is it.
  at::NoGradGuard no_grad;
  const c10::Device cpu(c10::kCPU);
  demo::HfConfig c = demo::builtin_tiny_config();
  c.intermediate_size = 160;
  const std::vector<gk::NamedTensor> weights = demo::random_weights(c, 3);
  demo::LlmEngineOptions eager;
  eager.batch_sizes = {};
  auto refusal = [&](const demo::HfConfig& cfg, const std::vector<gk::NamedTensor>& w, demo::WeightFormat f) {
    gk::InMemorySource src(w);
    try {
      demo::LlmEngine eng(cfg, cpu, f, src, eager);
    } catch (const gk::WeightError& e) {
      return std::string(e.message());
    }
    return std::string();
  };
  const std::string msg = refusal(c, weights, demo::WeightFormat::w4a16);
  CAPTURE(msg);
  CHECK(msg.find("model.layers.0.mlp.down_proj.weight: the w4a16 format needs the input size K = 160 "
                 "(intermediate_size) to be a multiple of 8 and of its group size 128") == 0);
  CHECK(msg.find("the engine cannot serve this model in w4a16") != std::string::npos);
  // The same model serves in the other formats.
  CHECK(refusal(c, weights, demo::WeightFormat::dense).empty());
  CHECK(refusal(c, weights, demo::WeightFormat::fp8).empty());
  // A hidden size of 100 fits no W4A16 group of q, k, v (fused) nor of gate, up: the first named is qkv's.
  demo::HfConfig h = demo::builtin_tiny_config();
  h.hidden_size = 100;
  const std::string hmsg = refusal(h, demo::random_weights(h, 3), demo::WeightFormat::w4a16);
  CAPTURE(hmsg);
  CHECK(hmsg.find("model.layers.0.self_attn.q_proj.weight + model.layers.0.self_attn.k_proj.weight + "
                  "model.layers.0.self_attn.v_proj.weight: the w4a16 format needs the input size K = 100 "
                  "(hidden_size)") == 0);
  // The quant kernel names what it is built from when told.
  const at::Tensor g_idx = at::zeros({64}, at::kInt);
  std::string kmsg;
  try {
    gk::quant::MarlinW4A16Kernel(at::zeros({4, 16}, at::kInt), g_idx, gk::quant::MarlinSplitK{},
                                 "model.layers.3.mlp.down_proj.weight");
  } catch (const gk::WeightError& e) {
    kmsg = e.message();
  }
  CAPTURE(kmsg);
  CHECK(kmsg.find("MarlinW4A16Kernel for model.layers.3.mlp.down_proj.weight: qweight must be [K/8, N] for g_idx [K] "
                  "int32, got [4, 16] and [64]") == 0);
}

TEST_SUITE("cpu") {
TEST_CASE("KV-cache rows at or past a sequence's length (NaN, Inf, earlier requests') never reach its logits") {
  stale_kv_rows_never_reach_logits(c10::Device(c10::kCPU));
}

TEST_CASE("the example engine decodes while another thread stages; every step is A or B, bitwise (CPU replay)") {
  serve_while_staging(c10::Device(c10::kCPU), 300);
}

TEST_CASE("a streaming reload's served hashes are those of the bytes it loaded, adopted or copied (CPU replay)") {
  streaming_hashes_are_the_loaded_bytes(c10::Device(c10::kCPU));
}
TEST_CASE("a streaming reload processes adopted layers while its scan runs, and copies nothing before its verdict (CPU replay)") {
  processing_while_the_scan_runs(c10::Device(c10::kCPU));
}
TEST_CASE("the MoE's from_shapes strides are compared with what the graphs captured at every reload (CPU replay)") {
  from_shapes_strides_are_compared(c10::Device(c10::kCPU));
}
TEST_CASE("LoRA adapters swapped while decoding: every step is adapter 1's or adapter 2's, never a mix (CPU replay)") {
  serve_while_swapping_adapters(c10::Device(c10::kCPU), 120);
}
}

TEST_SUITE("gpu") {
TEST_CASE("gpu: KV-cache rows at or past a sequence's length never reach its logits (CUDA graphs)") {
  stale_kv_rows_never_reach_logits(c10::Device(c10::kCUDA, 0));
}

TEST_CASE("gpu: the example engine decodes on CUDA graphs while another thread stages 1,000 times; every step is A or B") {
  serve_while_staging(c10::Device(c10::kCUDA, 0), 1000);
}

TEST_CASE("gpu: a streaming reload's served hashes are those of the bytes it loaded, scanned and hashed in one read") {
  streaming_hashes_are_the_loaded_bytes(c10::Device(c10::kCUDA, 0));
}

TEST_CASE("gpu: a streaming reload processes adopted layers while its scan runs on the device, and copies nothing before its verdict") {
  processing_while_the_scan_runs(c10::Device(c10::kCUDA, 0));
}

TEST_CASE("gpu: the MoE's from_shapes strides, copied to the host and compared there, at every reload (CUDA graphs)") {
  from_shapes_strides_are_compared(c10::Device(c10::kCUDA, 0));
}

TEST_CASE("gpu: LoRA adapters swapped 500 times while decoding on CUDA graphs; never a mix of two adapters") {
  serve_while_swapping_adapters(c10::Device(c10::kCUDA, 0), 500);
}
}
