// Soak: 1,000 reloads of the example engine on the CPU replay backend, with
// random weight perturbations. Every captured address stays where it was,
// the replayed tokens and logits equal a fresh engine's (checked every 100
// reloads and at the end), and resident memory does not grow.
#include "gk_test.h"

#include "engine/compare.h"
#include "engine/graph_runner.h"
#include "engine/tiny_lm.h"

#include <graphkeep/reload/collector.h>
#include <graphkeep/reload/reload_engine.h>

#include <fstream>
#include <random>

namespace {

std::size_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * 4096;
}

std::vector<std::uintptr_t> addresses(const gk::SlotPlan& plan) {
  std::vector<std::uintptr_t> out;
  for (const auto& l : plan.layers())
    for (const auto& s : l.slots) out.push_back(s.storage_begin());
  return out;
}

}  // namespace

TEST_CASE("1000 reloads of the example engine: stable addresses, right values, no memory growth") {
  at::NoGradGuard no_grad;
  demo::TinyLMConfig cfg;
  auto model = std::make_shared<demo::TinyLM>(cfg, c10::kCPU);
  gk::InMemorySource first(model->checkpoint(99, 0));
  gk::load_weights(*model, first);
  gk::ReloadEngine engine(*model);
  engine.prepare();
  demo::GraphRunner runner(*model, engine, {1, 4, 8});
  runner.capture();
  const auto captured = addresses(engine.plan());
  const at::Tensor start = at::arange(8, at::kLong).mul(5);

  std::mt19937 rng(2026);
  std::uniform_int_distribution<int> pick(1, 64);
  std::size_t rss_after_warmup = 0;
  int moved = 0, wrong = 0, drift = 0;
  for (int i = 1; i <= 1000; ++i) {
    const int step = pick(rng);
    gk::InMemorySource src(model->checkpoint(99, step));
    const gk::ReloadReport r = engine.reload(src);
    drift += static_cast<int>(r.drift);
    if (addresses(engine.plan()) != captured) ++moved;
    if (i % 100 == 0 || i == 1000) {
      auto fresh = std::make_shared<demo::TinyLM>(cfg, c10::kCPU);
      gk::InMemorySource fsrc(fresh->checkpoint(99, step));
      gk::load_weights(*fresh, fsrc);
      const auto want = demo::generate_eager(*fresh, start, 4);
      const auto got = runner.generate(start, 4);
      if (!demo::bitwise_equal(got.first, want.first) || !demo::bitwise_equal(got.second, want.second)) ++wrong;
      CHECK(gk::lint_drift(engine.plan()).empty());
    }
    if (i == 100) rss_after_warmup = resident_bytes();
  }
  const std::size_t rss_end = resident_bytes();
  MESSAGE("resident memory after 100 reloads: " << rss_after_warmup / 1048576.0 << " MiB, after 1000: "
                                                << rss_end / 1048576.0 << " MiB");
  CHECK(moved == 0);
  CHECK(wrong == 0);
  CHECK(drift == 0);
  CHECK(engine.state() == gk::EngineState::ready);
  // Growth over 900 reloads must stay within allocator noise (16 MiB).
  CHECK(rss_end <= rss_after_warmup + (16u << 20));
}
