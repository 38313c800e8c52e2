// libFuzzer target: the reload input stream. The input bytes choose a weight
// stream for the toy model (tests/support/toy_model.h): which checkpoint
// tensors come, in which order, with which names, shards, shapes and dtypes,
// duplicated or missing, and the reload mode. Whatever comes, a reload must
// either succeed or fail with a graphkeep error (or the injected PWAL
// failure), and afterwards:
//   - no captured address is uncovered (lint_drift empty, verify() passes);
//   - the engine is ready (replay equals the last committed weights, bit for
//     bit) or, after a failed streaming reload, refuses replay.
// Anything else — a crash, a sanitizer report, another exception — is a bug.
#include <graphkeep/reload/collector.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/reload/manifest.h>
#include <graphkeep/capture/replay.h>

#include "toy_model.h"
#include "engine/compare.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>

namespace {

struct Bytes {
  const uint8_t* p;
  size_t n;
  uint8_t next() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
};

struct State {
  std::shared_ptr<toy::ToyModel> model = std::make_shared<toy::ToyModel>(8, 16, /*shards=*/2);
  std::unique_ptr<gk::ReloadEngine> engine;
  gk::HostReplay graph{"fuzz"};
  at::Tensor input = at::linspace(-1.0, 1.0, 2 * 8).reshape({2, 8}), output, expected;
  int committed_step = 0;

  State() {
    gk::InMemorySource src(model->checkpoint(0, 2));
    gk::load_weights(*model, src);
    engine = std::make_unique<gk::ReloadEngine>(*model);
    engine->prepare();
    engine->add_static_io("input", input);
    graph.capture([&] { output = model->forward(input); });
    engine->track(graph);
    graph.replay();
    expected = output.clone();
  }

  at::Tensor fresh(int step) {
    auto m = std::make_shared<toy::ToyModel>(8, 16, 2);
    gk::InMemorySource src(m->checkpoint(step, 2));
    gk::load_weights(*m, src);
    return m->forward(input);
  }
};

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "reload_stream_fuzz: invariant broken: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static State* s = new State();  // one model across inputs: it must stay usable
  Bytes in{data, size};
  const int step = 1 + in.next() % 7;
  gk::ReloadOptions opts;
  opts.mode = (in.next() & 1) ? gk::ReloadMode::transactional : gk::ReloadMode::streaming;
  const bool fail_pwal = (in.next() % 16) == 0;
  s->model->l2->faults.throw_in_pwal = fail_pwal;

  // Build the stream from the complete checkpoint by edits.
  const std::vector<gk::NamedTensor> good = s->model->checkpoint(step, 2);
  std::vector<gk::NamedTensor> stream;
  const size_t ops = in.next() % 12;
  if (ops == 0) stream = good;
  for (size_t i = 0; i < ops; ++i) {
    const uint8_t op = in.next();
    const gk::NamedTensor& pick = good[in.next() % good.size()];
    gk::NamedTensor t{pick.name, pick.value, pick.shard};
    switch (op % 8) {
      case 0: case 1: case 2: break;                                  // as is (maybe repeated)
      case 3: t.name += static_cast<char>('a' + in.next() % 26); break;  // unknown name
      // shard out of range. (An in-range relabel, shard 0's values sent as
      // shard 1, is wrong data the engine cannot see: it would make this
      // harness's oracle, a fresh model, wrong rather than find a bug.)
      case 4: t.shard = (in.next() & 1) ? -1 : 2 + in.next() % 2; break;
      // wrong shape: no checkpoint tensor of the toy model is 9 wide (a
      // [8, 8] edit would be a well-formed l1 shard of zeros: wrong data the
      // engine cannot see, which made this harness's oracle fail in CI)
      case 5: t.value = at::zeros({1 + in.next() % 9, 9}); break;
      case 6: t.value = t.value.to(at::kDouble); break;               // wrong dtype
      case 7: t.value = at::Tensor(); break;                          // undefined
    }
    stream.push_back(std::move(t));
  }
  if (in.next() & 1) std::reverse(stream.begin(), stream.end());

  // GK_FUZZ_VERBOSE=1: print each input's stream and outcome (to replay a crash).
  static const bool verbose = std::getenv("GK_FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(stderr, "step %d, %s%s:", step, opts.mode == gk::ReloadMode::streaming ? "streaming" : "transactional",
                 fail_pwal ? ", PWAL throws" : "");
    for (const auto& t : stream)
      std::fprintf(stderr, " %s[%lld]%s", t.name.c_str(), static_cast<long long>(t.shard),
                   t.value.defined() ? "" : "(undefined)");
    std::fprintf(stderr, "\n");
  }
  bool ok = false;
  try {
    gk::InMemorySource src(stream, "fuzz stream");
    s->engine->reload(src, opts);
    ok = true;
  } catch (const gk::Error& e) {
    if (verbose) std::fprintf(stderr, "  -> %s\n", e.what());
  } catch (const std::runtime_error& e) {
    if (!fail_pwal) bug(e.what());
  }
  if (verbose) std::fprintf(stderr, "  state %d\n", static_cast<int>(s->engine->state()));
  s->model->l2->faults.throw_in_pwal = false;

  if (!gk::lint_drift(s->engine->plan()).empty()) bug("a slot no longer points at its captured storage");
  if (!s->engine->verify().ok()) bug("manifest verification failed");
  if (ok) {
    s->committed_step = step;
    s->expected = s->fresh(step);
  }
  if (s->engine->state() == gk::EngineState::ready) {
    s->graph.replay();
    if (!demo::bitwise_equal(s->output, s->expected)) {
      if (verbose) std::cerr << "replay:\n" << s->output << "\nexpected:\n" << s->expected << "\n";
      bug("replay differs from the last committed weights");
    }
  } else if (s->engine->state() == gk::EngineState::inconsistent) {
    if (opts.mode == gk::ReloadMode::transactional) bug("a transactional reload left the model inconsistent");
    // recover, as an RL loop would, so the next input starts from a known state
    gk::InMemorySource src(s->model->checkpoint(s->committed_step, 2));
    s->engine->reload(src);
    s->graph.replay();
    if (!demo::bitwise_equal(s->output, s->expected)) bug("recovery reload did not restore the weights");
  } else {
    bug("unexpected engine state");
  }
  return 0;
}
