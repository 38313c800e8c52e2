// The example engine (examples/engine) serving while the next weights stage:
// the online reload's stress test on the real engine's decode graphs, on the CPU
// replay backend (suite cpu) and on CUDA graphs (suite gpu, 1,000 rounds).
#include "gk_test.h"

#include "engine/checkpoint_writer.h"
#include "engine/llm_engine.h"

#include <graphkeep/reload/reload_engine.h>

#include <torch/nn/module.h>

#include <atomic>
#include <condition_variable>
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
void serve_while_staging(const c10::Device device, const int kRounds) {
  at::NoGradGuard no_grad;
  const demo::HfConfig c = demo::builtin_tiny_config();
  auto on_device = [&](std::vector<gk::NamedTensor> w) {
    for (auto& t : w) t.value = t.value.to(device);
    return w;
  };
  const std::vector<gk::NamedTensor> weights[2] = {on_device(demo::random_weights(c, 1)),
                                                   on_device(demo::random_weights(c, 2))};
  demo::LlmEngineOptions opts;
  opts.reload.adopt_source_tensors = true;
  gk::InMemorySource first(weights[0]);
  demo::LlmEngine eng(c, device, demo::WeightFormat::dense, first, opts);
  REQUIRE(eng.num_graphs() == 35);
  const at::Tensor tokens = at::arange(8, at::kLong).mul(7).remainder(c.vocab_size);
  const at::Tensor pos = at::full({8}, 3, at::kLong);
  at::Tensor expected[2];
  expected[0] = eng.decode(tokens, pos);
  {
    gk::InMemorySource b(weights[1]);
    eng.reload(b);
    expected[1] = eng.decode(tokens, pos);
    gk::InMemorySource a(weights[0]);
    eng.reload(a);
  }
  REQUIRE_FALSE(at::equal(expected[0], expected[1]));
  REQUIRE(at::equal(eng.decode(tokens, pos), expected[0]));
  {
    // A trainer that keeps the engine's layout hands over whole parameters
    // (fused q/k/v and gate/up) by parameter name: the parameters of a second
    // engine loaded with B. Adopted, they give B's logits bit for bit.
    demo::LlmEngineOptions eager;
    eager.batch_sizes = {};
    gk::InMemorySource b(weights[1]);
    demo::LlmEngine trainer(c, device, demo::WeightFormat::dense, b, eager);
    std::vector<gk::NamedTensor> whole;
    for (const gk::LayerPlan& lp : trainer.reload_engine().plan().layers())
      for (const gk::CheckpointParam& cp : lp.params) {
        const auto params = lp.module->named_parameters(/*recurse=*/false);
        const at::Tensor* p = params.find(cp.param);
        const at::Tensor t = p != nullptr ? *p : lp.module->named_buffers(/*recurse=*/false)[cp.param];
        whole.push_back({lp.full_name(cp.param), t.detach().clone(), 0});
      }
    gk::InMemorySource src(whole);
    const gk::ReloadReport r = eng.reload(src);
    CHECK(r.tensors_adopted == whole.size());
    CHECK(at::equal(eng.decode(tokens, pos), expected[1]));
    gk::InMemorySource a(weights[0]);
    eng.reload(a);
    REQUIRE(at::equal(eng.decode(tokens, pos), expected[0]));
  }
  const std::uint64_t version0 = eng.reload_engine().weight_version();

  std::mutex mu;
  std::condition_variable cv;
  std::optional<gk::StagedReload> slot;  // staged, waiting for the serving thread
  bool handled = true;  // the serving thread has committed or aborted the last one (stage() may run again)
  int slot_weights = 0;
  std::atomic<int> current{0};  // which weights are committed (written by the serving thread)
  std::atomic<bool> staging{false}, done{false};
  std::atomic<int> stages_begun{0};
  std::string stager_error;
  std::thread stager([&] {
    try {
      for (int round = 0; round < kRounds; ++round) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return handled; });
        }
        const int target = 1 - current.load();
        gk::InMemorySource src(weights[target]);
        staging = true;
        stages_begun += 1;
        gk::StagedReload s = eng.stage(src);
        staging = false;
        std::lock_guard<std::mutex> lock(mu);
        slot.emplace(std::move(s));
        slot_weights = target;
        handled = false;
      }
    } catch (const std::exception& e) {
      stager_error = e.what();
    }
    done = true;
  });
  std::mt19937 rng(17);
  int steps = 0, during_stage = 0, wrong = 0, commits = 0, aborts = 0;
  double max_pause_ms = 0;
  while (true) {
    // Overlapped: stage() was running when the step began, or began during it.
    const int begun = stages_begun.load();
    const bool staging_at_start = staging.load();
    const at::Tensor out = eng.decode(tokens, pos);
    ++steps;
    during_stage += staging_at_start || stages_begun.load() != begun ? 1 : 0;
    if (!at::equal(out, expected[current.load()])) ++wrong;
    std::optional<gk::StagedReload> s;
    int target = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (slot) {
        s = std::move(slot);
        slot.reset();
        target = slot_weights;
      }
    }
    if (s) {
      if (rng() % 3 != 0) {
        const gk::ReloadReport r = eng.commit(std::move(*s));
        max_pause_ms = std::max(max_pause_ms, r.times.commit_ms);
        CHECK(r.drift == 0);
        current = target;
        ++commits;
      } else {
        s->abort();
        ++aborts;
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
  MESSAGE(steps << " decode steps (" << during_stage << " while stage() ran), " << commits << " commits, " << aborts
                << " aborts; longest commit pause " << max_pause_ms << " ms");
  CHECK_MESSAGE(stager_error.empty(), stager_error);
  CHECK(wrong == 0);
  CHECK(commits + aborts == kRounds);
  CHECK(commits > kRounds / 2);
  CHECK(aborts > kRounds / 5);
  CHECK(during_stage > 0);
  CHECK(eng.reload_engine().weight_version() == version0 + static_cast<std::uint64_t>(commits));
  CHECK(eng.reload_engine().state() == gk::EngineState::ready);
  CHECK(at::equal(eng.decode(tokens, pos), expected[current.load()]));
}

}  // namespace

TEST_SUITE("cpu") {
TEST_CASE("the example engine decodes while another thread stages; every step is A or B, bitwise (CPU replay)") {
  serve_while_staging(c10::Device(c10::kCPU), 300);
}
}

TEST_SUITE("gpu") {
TEST_CASE("gpu: the example engine decodes on CUDA graphs while another thread stages 1,000 times; every step is A or B") {
  serve_while_staging(c10::Device(c10::kCUDA, 0), 1000);
}
}
