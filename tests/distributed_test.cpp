// Tensor-parallel reload over c10d (gk::BroadcastSource, gk::DistributedReload).
//
// CPU build (test_distributed, label unit): Gloo. In-process tests use a
// world of one rank; the TP tests run several processes of this binary
// (--gk-child=dist_rank, with rank, world size, layout and a FileStore path
// in the environment), each of which checks its own rank and prints
// "OK <step>" / "FAIL <step>: ..." lines the parent checks.
//
// GPU build (test_distributed_gpu*, label gpu; GK_DIST_NCCL defined): the
// same code over ProcessGroupNCCL, buckets and votes on the GPU. The toy
// model's kernels are host code, so the model and its host graph stay on the
// CPU: what runs on the GPU is the communication path (see docs/distributed.md).
#include "gk_test.h"

#include <optional>

#include <graphkeep/distributed/distributed.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/capture/replay.h>

#include "temp_dir.h"
#include "toy_model.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#ifdef GK_DIST_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#else
// The PyPI wheel of libtorch ships this header but not the Gloo headers it
// includes; tests/CMakeLists.txt provides stand-ins (see the note there).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

// ---------------------------------------------------------------------------
// Process groups

struct Group {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  c10::intrusive_ptr<c10d::Backend> backend;
  c10::Device device{c10::kCPU};
};

Group make_group(const std::string& store_path, int rank, int world) {
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, world);
  Group g;
  g.pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
#ifdef GK_DIST_NCCL
  const int dev = rank % c10::cuda::device_count();
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(dev));
  g.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(dev));
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = std::chrono::seconds(60);
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, opts);
  g.backend = nccl;
  g.pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, g.backend);
  g.pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
#else
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);
  g.backend = gloo;
  g.pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, g.backend);
  g.pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
#endif
  return g;
}

using gk::testing::TempDir;

// ---------------------------------------------------------------------------
// The TP toy model: toy::ToyModel split over tp ranks. l1 is column-parallel
// (its output features, and norm.gamma with them, are split), l2 is
// row-parallel (its input features are split): each rank computes a partial
// output, and the sum over ranks (an all-reduce) is the model's output.
constexpr int64_t kD = 8, kH = 16, kTp = 2;

class TpToyModel : public torch::nn::Module {
 public:
  TpToyModel(int64_t d, int64_t h, int64_t tp) {
    l1 = register_module("l1", std::make_shared<toy::ToyLinear>(d, h / tp));
    norm = register_module("norm", std::make_shared<toy::PlainScale>(h / tp));
    l2 = register_module("l2", std::make_shared<toy::ToyLinear>(h / tp, d));
  }
  // The rank's part: captured in the graph. The all-reduce is not (see docs).
  at::Tensor forward_local(const at::Tensor& x) { return l2->forward(norm->forward(l1->forward(x))); }
  std::shared_ptr<toy::ToyLinear> l1, l2;
  std::shared_ptr<toy::PlainScale> norm;
};

std::vector<gk::NamedTensor> full_checkpoint(int step) { return toy::ToyModel(kD, kH).checkpoint(step); }

gk::WeightManifest full_manifest() {
  return gk::WeightManifest({{"l1.weight", {kH, kD}, at::kFloat},
                             {"norm.gamma", {kH}, at::kFloat},
                             {"l2.weight", {kD, kH}, at::kFloat}});
}

gk::ShardRules tp_rules() {
  gk::ShardRules r;
  r.column("l1.*").column("norm.gamma").row("l2.weight");
  return r;
}

// The rank's shards, cut by hand (not through BroadcastSource).
std::vector<gk::NamedTensor> manual_shards(int step, int64_t tp_rank, int64_t tp) {
  std::vector<gk::NamedTensor> out;
  for (const gk::NamedTensor& t : full_checkpoint(step)) {
    at::Tensor v = t.value;
    if (t.name == "l2.weight") v = v.chunk(tp, 1)[tp_rank];
    else v = v.chunk(tp, 0)[tp_rank];
    out.push_back({t.name, v.contiguous(), 0});
  }
  return out;
}

at::Tensor test_input() { return at::linspace(-1.0, 1.0, 3 * kD).reshape({3, kD}); }

// A fresh sharded model loaded with step's weights: its partial output (eager).
at::Tensor fresh_partial(int step, int64_t tp_rank, const at::Tensor& input) {
  auto m = std::make_shared<TpToyModel>(kD, kH, kTp);
  gk::InMemorySource src(manual_shards(step, tp_rank, kTp));
  gk::load_weights(*m, src);
  return m->forward_local(input);
}

// The unsharded model's output (eager).
at::Tensor full_output(int step, const at::Tensor& input) {
  auto m = std::make_shared<toy::ToyModel>(kD, kH);
  gk::InMemorySource src(full_checkpoint(step));
  gk::load_weights(*m, src);
  return m->forward(input);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------------------
// Several ranks: this binary re-executed with --gk-child=dist_rank, all at
// once, with rank, world, layout and the store in the environment.
struct RankResult {
  int rank = 0;
  bool exited = false;
  int exit_code = -1;
  bool killed = false;
  std::string output;
};

std::vector<RankResult> run_world(const std::string& layout, int world, int timeout_s = 90) {
  TempDir dir;
  std::array<char, 4096> exe{};
  const ssize_t n = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  REQUIRE(n > 0);
  const std::string self(exe.data(), static_cast<std::size_t>(n));
  std::vector<pid_t> pids(world, -1);
  std::vector<RankResult> results(world);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env_store;
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "GK_DIST_", 8) != 0) env_store.emplace_back(*e);
    env_store.push_back("GK_DIST_RANK=" + std::to_string(r));
    env_store.push_back("GK_DIST_WORLD=" + std::to_string(world));
    env_store.push_back("GK_DIST_LAYOUT=" + layout);
    env_store.push_back("GK_DIST_STORE=" + dir.path + "/store");
    std::vector<char*> envp;
    for (auto& s : env_store) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string arg0 = self, arg1 = "--gk-child=dist_rank";
    std::array<char*, 3> argv{arg0.data(), arg1.data(), nullptr};
    const std::string log = dir.path + "/rank" + std::to_string(r) + ".log";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = posix_spawn(&pids[r], self.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    REQUIRE_MESSAGE(rc == 0, "posix_spawn failed for rank " << r);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int left = world;
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] < 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        results[r].exited = WIFEXITED(status);
        results[r].exit_code = results[r].exited ? WEXITSTATUS(status) : -1;
        pids[r] = -1;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r)
        if (pids[r] > 0) {
          kill(pids[r], SIGKILL);  // only the ranks this test spawned
          waitpid(pids[r], nullptr, 0);
          results[r].killed = true;
          pids[r] = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r) {
    results[r].rank = r;
    results[r].output = read_file(dir.path + "/rank" + std::to_string(r) + ".log");
  }
  return results;
}

// Checks one world's results: every rank exited 0 and reported every step.
void check_world(const std::vector<RankResult>& results, const std::vector<std::string>& steps) {
  for (const RankResult& r : results) {
    CAPTURE(r.rank);
    INFO("output of rank " << r.rank << ":\n" << r.output);
    CHECK_FALSE(r.killed);
    CHECK(r.exited);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("FAIL") == std::string::npos);
    for (const std::string& s : steps) {
      CAPTURE(s);
      CHECK(r.output.find("OK " + s + "\n") != std::string::npos);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// One rank of a multi-process world (run by run_world).
namespace {

struct RankCtx {
  int rank = 0, world = 1;
  std::string layout;
  int trainer = 0;
  int tp_rank = -1;
  int failures = 0;
  Group group;

  // The global rank of tp rank t.
  int rank_of_tp(int t) const { return layout == "dedicated" ? t + 1 : t; }
  std::string tag(int t) const {
    const int r = rank_of_tp(t);
    return "rank " + std::to_string(r) + " (" + (r == trainer ? "trainer + " : "") + "tp " + std::to_string(t) +
           "/" + std::to_string(kTp) + ")";
  }
  void ok(const std::string& step) { std::printf("[rank %d] OK %s\n", rank, step.c_str()); std::fflush(stdout); }
  void fail(const std::string& step, const std::string& why) {
    ++failures;
    std::printf("[rank %d] FAIL %s: %s\n", rank, step.c_str(), why.c_str());
    std::fflush(stdout);
  }
  void expect(bool cond, const std::string& step, const std::string& why) {
    if (!cond) fail(step, why);
  }
};

int child_main() {
  RankCtx c;
  c.rank = std::atoi(std::getenv("GK_DIST_RANK"));
  c.world = std::atoi(std::getenv("GK_DIST_WORLD"));
  c.layout = std::getenv("GK_DIST_LAYOUT");
  const std::string store = std::getenv("GK_DIST_STORE");
  // dedicated: rank 0 only trains (sends); ranks 1.. are tp 0..
  // colocated: rank 0 trains and is tp 0; rank 1 is tp 1
  c.tp_rank = c.layout == "dedicated" ? c.rank - 1 : c.rank;
  c.group = make_group(store, c.rank, c.world);
  const bool trainer = c.rank == c.trainer;
  const bool model_here = c.tp_rank >= 0;
  std::printf("[rank %d] layout %s, world %d, tp rank %d, device %s\n", c.rank, c.layout.c_str(), c.world, c.tp_rank,
              c.group.device.str().c_str());

  gk::BroadcastConfig cfg;
  cfg.trainer_rank = c.trainer;
  cfg.tp_rank = c.tp_rank;
  cfg.tp_size = static_cast<int>(kTp);
  cfg.device = c.group.device;
  gk::Collective coll(c.group.pg);

  // The trainer's full weights of a step (other ranks: none).
  std::unique_ptr<gk::InMemorySource> full;
  auto source_with = [&](int step, const gk::BroadcastConfig& conf, gk::WeightManifest manifest, gk::ShardFn rules,
                         std::vector<gk::NamedTensor> weights) {
    full.reset();
    if (trainer) {
      if (weights.empty()) weights = full_checkpoint(step);
      full = std::make_unique<gk::InMemorySource>(std::move(weights), "trainer step " + std::to_string(step));
    }
    return std::make_unique<gk::BroadcastSource>(coll, std::move(manifest), std::move(rules), conf, full.get());
  };
  auto source_for = [&](int step) { return source_with(step, cfg, full_manifest(), tp_rules(), {}); };

  // The first load, over the broadcast too (not transactional: it is the first).
  std::shared_ptr<TpToyModel> model;
  std::unique_ptr<gk::ReloadEngine> engine;
  gk::HostReplay graph{"tp-local"};
  const at::Tensor input = test_input();
  at::Tensor partial;
  {
    auto src = source_for(0);
    if (model_here) {
      model = std::make_shared<TpToyModel>(kD, kH, kTp);
      gk::load_weights(*model, *src);
      engine = std::make_unique<gk::ReloadEngine>(*model);
      engine->prepare();
      engine->add_static_io("input", input);
      graph.capture([&] { partial = model->forward_local(input); });
      engine->track(graph);
    } else {
      src->drain();
    }
  }
  gk::DistributedReload dist(coll, engine.get());

  // The model's output: the captured local part, replayed, then the all-reduce
  // of the partial outputs (outside the graph; the trainer-only rank adds 0).
  auto replay_partial = [&]() -> at::Tensor {
    dist.check_replay_allowed();
    graph.replay();
    return partial.clone();
  };
  auto all_reduce = [&](const at::Tensor& p) {
    std::vector<at::Tensor> t{(p.defined() ? p : at::zeros({3, kD})).to(c.group.device)};
    c.group.pg->allreduce(t)->wait();
    return t[0].to(at::kCPU);
  };
  // Checks this rank's replay against a fresh sharded model (bitwise) and the
  // reduced output against the unsharded model (the sum is not bitwise: the
  // per-rank scales of the row-parallel layer differ from the full one's).
  auto check_step = [&](const std::string& name, int step) {
    at::Tensor p;
    if (model_here) {
      p = replay_partial();
      c.expect(at::equal(p, fresh_partial(step, c.tp_rank, input)), name,
               "replay differs from a fresh sharded model of step " + std::to_string(step));
    }
    const at::Tensor y = all_reduce(p);
    c.expect(at::allclose(y, full_output(step, input), 1e-5, 1e-5), name,
             "the reduced output differs from the unsharded model of step " + std::to_string(step));
  };
  auto reload = [&](const std::string& name, std::unique_ptr<gk::BroadcastSource> src) -> gk::DistributedReport {
    try {
      return dist.reload(*src);
    } catch (const std::exception& e) {
      c.fail(name, std::string("unexpected exception: ") + e.what());
      return {};
    }
  };
  // A reload every rank must refuse; returns the message.
  auto refused = [&](const std::string& name, std::function<gk::DistributedReport()> f, int failing_rank,
                     const std::string& needle) {
    try {
      f();
      c.fail(name, "the reload succeeded");
    } catch (const gk::ReloadAbortedError& e) {
      const std::string m = e.what();
      std::printf("[rank %d] %s: %s\n", c.rank, name.c_str(), m.c_str());
      c.expect(m.find(needle) != std::string::npos, name, "message lacks '" + needle + "': " + m);
      c.expect(e.failures().size() == 1 && e.failures()[0].rank == failing_rank, name,
               "failures() does not list rank " + std::to_string(failing_rank) + " alone");
      c.expect(m.find("rank " + std::to_string(failing_rank) + " (") != std::string::npos, name,
               "message does not name rank " + std::to_string(failing_rank));
    } catch (const std::exception& e) {
      c.fail(name, std::string("wrong exception: ") + e.what());
    }
    if (model_here) {
      c.expect(engine->state() == gk::EngineState::ready, name, "engine not ready after the abort");
      c.expect(dist.replay_allowed(), name, "replay refused after the abort");
    }
  };

  check_step("initial", 0);
  c.ok("initial");

  // (a) a broadcast reload: one bucket (default 64 MiB budget).
  {
    gk::DistributedReport r = reload("a", source_for(1));
    if (model_here) c.expect(r.reload.has_value() && r.reload->tensors_loaded == 3, "a", "report: " + r.summary());
    c.expect(r.broadcast.buckets == 1, "a", "expected 1 bucket: " + r.summary());
    check_step("a", 1);
    c.ok("a");
  }
  // (b) two consecutive reloads with tiny buckets: tensors split across buckets.
  {
    gk::BroadcastConfig small = cfg;
    small.bucket_bytes = 100;
    gk::DistributedReport r = reload("b", source_with(2, small, full_manifest(), tp_rules(), {}));
    c.expect(r.broadcast.buckets >= 10 && r.broadcast.max_bucket_bytes <= 100, "b", "buckets: " + r.summary());
    check_step("b", 2);
    reload("b", source_with(3, small, full_manifest(), tp_rules(), {}));
    check_step("b", 3);
    c.ok("b");
  }
  const int tp1 = c.rank_of_tp(1);
  // (c) failures on one rank abort the reload on every rank; old weights stay.
  // A fault injected on rank tp1 only (graphkeep/reload/testing.h), for one scope.
  auto fault_on_tp1 = [&](gk::testing::FaultPoint stage, std::string layer) {
    return gk::testing::ScopedHooks(c.tp_rank == 1 ? engine.get() : nullptr, gk::testing::fault_at(stage, layer));
  };
  {
    const auto hooks = fault_on_tp1(gk::testing::FaultPoint::pwal, "l2");
    gk::DistributedReload faulty(coll, engine.get(), {});
    refused("c-pwal", [&] { return faulty.reload(*source_for(4)); }, tp1, "injected pwal failure on l2");
    check_step("c-pwal", 3);
    c.ok("c-pwal");
  }
  {
    // before reading anything: the failing rank drains the whole broadcast
    const auto hooks = fault_on_tp1(gk::testing::FaultPoint::detach, "l1");
    gk::DistributedReload faulty(coll, engine.get(), {});
    refused("c-detach", [&] { return faulty.reload(*source_for(4)); }, tp1, "injected detach failure on l1");
    check_step("c-detach", 3);
    c.ok("c-detach");
  }
  {
    // after every layer's checks, in the last stage before the vote
    const auto hooks = fault_on_tp1(gk::testing::FaultPoint::before_copies, "l1");
    gk::DistributedReload faulty(coll, engine.get(), {});
    refused("c-commit", [&] { return faulty.reload(*source_for(4)); }, tp1, "injected before_copies failure on l1");
    check_step("c-commit", 3);
    c.ok("c-commit");
  }
  {
    // a bad tensor for rank tp1's shard: its rules replicate l2.weight, so
    // it receives [8, 16] where its model expects [8, 8]
    gk::ShardRules wrong;
    wrong.column("l1.*").column("norm.gamma");
    gk::ShardFn rules = c.tp_rank == 1 ? gk::ShardFn(wrong) : gk::ShardFn(tp_rules());
    refused("c-shard", [&] { return dist.reload(*source_with(4, cfg, full_manifest(), rules, {})); }, tp1,
            "weight 'l2.weight' has shape [8, 16] but the model expects [8, 8]");
    check_step("c-shard", 3);
    c.ok("c-shard");
  }
  {
    // the trainer's source lacks a tensor: the trainer aborts the broadcast
    auto weights = full_checkpoint(4);
    weights.erase(weights.begin() + 1);  // norm.gamma
    refused("c-trainer", [&] { return dist.reload(*source_with(4, cfg, full_manifest(), tp_rules(), weights)); },
            c.trainer, "ended without 1 manifest tensor(s): 'norm.gamma'");
    check_step("c-trainer", 3);
    c.ok("c-trainer");
  }
  // (d) a manifest that differs on one rank: a clear error on every rank.
  {
    std::vector<gk::WeightEntry> e = full_manifest().entries();
    for (auto& x : e)
      if (x.name == "l2.weight") x.shape = {kD, 12};
    gk::WeightManifest mine = c.tp_rank == 1 ? gk::WeightManifest(e) : full_manifest();
    refused("d", [&] { return dist.reload(*source_with(4, cfg, mine, tp_rules(), {})); }, tp1,
            "'l2.weight' has shape [8, 16] on the trainer but [8, 12] here");
    check_step("d", 3);
    c.ok("d");
  }
  // (e) a failure after a unanimous yes (in the copy into captured storage):
  // the failing rank undoes its commit, the others keep the new weights;
  // every rank learns it and replay is refused until a reload succeeds.
  {
    std::optional<gk::testing::ScopedHooks> hooks(fault_on_tp1(gk::testing::FaultPoint::copy, "l2"));
    gk::DistributedReload faulty(coll, engine.get(), {});
    try {
      faulty.reload(*source_for(5));
      c.fail("e", "the reload succeeded");
    } catch (const gk::StateError& e) {
      const std::string m = e.what();
      std::printf("[rank %d] e: %s\n", c.rank, m.c_str());
      c.expect(m.find("diverged") != std::string::npos && m.find("rank " + std::to_string(tp1) + " (") != std::string::npos,
               "e", "message: " + m);
    } catch (const std::exception& e) {
      c.fail("e", std::string("wrong exception: ") + e.what());
    }
    c.expect(!faulty.replay_allowed(), "e", "replay allowed after a divergence");
    if (model_here) {
      graph.replay();
      const at::Tensor p = partial.clone();
      c.expect(at::equal(p, fresh_partial(c.tp_rank == 1 ? 3 : 5, c.tp_rank, input)), "e",
               "unexpected weights after the divergence");
    }
    hooks.reset();  // the fault was for `faulty`'s reload only
    reload("e", source_for(6));  // the shared DistributedReload: no divergence recorded there
    check_step("e", 6);
    c.ok("e");
  }
  // After all of that the group is still in step: a last good reload.
  {
    reload("final", source_for(7));
    check_step("final", 7);
    c.ok("final");
  }
  c.group.pg->barrier()->wait();
  std::printf("[rank %d] done, %d failure(s)\n", c.rank, c.failures);
  std::fflush(stdout);
  return c.failures == 0 ? 0 : 1;
}

}  // namespace

GK_TEST_CHILD(dist_rank) {
  try {
    return child_main();
  } catch (const std::exception& e) {
    std::printf("FAIL uncaught: %s\n", e.what());
    std::fflush(stdout);
    return 3;
  }
}

namespace {
const std::vector<std::string> kAllSteps = {"initial", "a",         "b", "c-pwal", "c-detach", "c-commit",
                                            "c-shard", "c-trainer", "d", "e",      "final"};
}  // namespace

#ifndef GK_DIST_NCCL
// ===========================================================================
// CPU (Gloo)

TEST_CASE("glob patterns and shard rules") {
  CHECK(gk::glob_match("l1.*", "l1.weight"));
  CHECK(gk::glob_match("*.o_proj.weight", "layers.3.attn.o_proj.weight"));
  CHECK(gk::glob_match("layers.*.mlp.*.weight", "layers.10.mlp.up.weight"));
  CHECK_FALSE(gk::glob_match("layers.*.mlp.*.weight", "layers.10.attn.up.weight"));
  CHECK_FALSE(gk::glob_match("l1.*", "l11"));
  CHECK(gk::glob_match("*", ""));
  CHECK(gk::glob_match("a*b*c", "aXbYbZc"));
  gk::ShardRules r;
  r.column("*.qkv.weight").row("*.o_proj.weight").add("lm_head.weight", {gk::Split::column, "head.weight"});
  CHECK(r("layers.0.qkv.weight").split == gk::Split::column);
  CHECK(r("layers.0.o_proj.weight").split == gk::Split::row);
  CHECK(r("layers.0.norm.weight").split == gk::Split::replicated);  // no match: replicated
  CHECK(r("lm_head.weight").rename == "head.weight");
}

TEST_CASE("a manifest is canonical, round-trips and names its differences") {
  const gk::WeightManifest m = full_manifest();
  CHECK(m.entries()[0].name == "l1.weight");  // sorted by name
  CHECK(m.entries()[1].name == "l2.weight");
  CHECK(m.index_of("norm.gamma") == 2);
  CHECK(m.index_of("nope") == -1);
  CHECK(m.total_bytes() == (16 * 8 + 16 + 8 * 16) * 4);
  CHECK(m.serialize() == "l1.weight\tFloat\t[16, 8]\nl2.weight\tFloat\t[8, 16]\nnorm.gamma\tFloat\t[16]\n");
  CHECK(gk::WeightManifest::parse(m.serialize()) == m);
  CHECK(gk::WeightManifest::of(full_checkpoint(3)) == m);
  CHECK(gk::WeightManifest::of(full_checkpoint(3)).hash() == m.hash());
  const gk::WeightManifest scalar({{"s", {}, at::kDouble}, {"e", {0, 4}, at::kBFloat16}});
  CHECK(gk::WeightManifest::parse(scalar.serialize()) == scalar);

  std::vector<gk::WeightEntry> e = m.entries();
  e[1].shape = {8, 12};
  e[2].dtype = at::kHalf;
  e.push_back({"extra", {1}, at::kFloat});
  e.erase(e.begin());
  const std::string d = gk::WeightManifest::diff(m, gk::WeightManifest(e));
  CHECK(d == "'extra' is here but not on the trainer; 'l1.weight' is on the trainer but not here; 'l2.weight' has "
             "shape [8, 16] on the trainer but [8, 12] here; 'norm.gamma' has dtype Float on the trainer but Half here");
  CHECK(gk::WeightManifest::diff(m, m).empty());
  GK_CHECK_THROWS_WITH_SUBSTR(gk::WeightManifest({{"a", {1}, at::kFloat}, {"a", {2}, at::kFloat}}), gk::WeightError,
                              "manifest lists 'a' twice");
  GK_CHECK_THROWS_WITH_SUBSTR(gk::WeightManifest::parse("a\tNoSuchType\t[1]\n"), gk::WeightError, "unknown dtype");
}

TEST_CASE("one rank over Gloo: buckets of every size carry every dtype bit for bit, under the expected names") {
  TempDir dir;
  Group g = make_group(dir.path + "/store", 0, 1);
  std::vector<gk::NamedTensor> full = {
      {"a.float", at::randn({5, 3}), 0},
      {"b.long", at::arange(8, at::kLong).reshape({2, 2, 2}), 0},
      {"c.bool", at::arange(7).remainder(2).to(at::kBool), 0},
      {"d.scalar", at::scalar_tensor(3.25, at::kDouble), 0},
      {"e.empty", at::empty({0, 4}), 0},
      {"f.half", at::randn({3, 5}).to(at::kHalf), 0},
      {"g.long_vector", at::randn({100}), 0},
      {"h.wide", at::randn({2, 30}), 0},  // a row of 120 B: larger than the budget
  };
  const gk::WeightManifest manifest = gk::WeightManifest::of(full);
  gk::ShardRules rules;
  rules.add("f.half", {gk::Split::replicated, "renamed.half"});
  for (const bool via_backend : {false, true}) {
    CAPTURE(via_backend);
    for (const std::size_t budget : {std::size_t{40}, std::size_t{64} << 20}) {
      CAPTURE(budget);
      gk::BroadcastConfig cfg;
      cfg.bucket_bytes = budget;
      std::vector<gk::NamedTensor> copy = full;
      std::reverse(copy.begin(), copy.end());  // any order
      gk::InMemorySource src(copy);
      gk::BroadcastSource b(via_backend ? gk::Collective(g.backend) : gk::Collective(g.pg), manifest, rules, cfg, &src);
      CHECK(b.role() == "trainer + tp 0/1");
      std::map<std::string, at::Tensor> got;
      while (auto t = b.next()) {
        CHECK(t->shard == 0);
        CHECK(got.count(t->name) == 0);
        got[t->name] = t->value;
      }
      CHECK(b.finished());
      REQUIRE(got.size() == full.size());
      for (const auto& t : full) {
        const std::string name = t.name == "f.half" ? "renamed.half" : t.name;
        CAPTURE(name);
        REQUIRE(got.count(name) == 1);
        CHECK((got[name].scalar_type() == t.value.scalar_type()));
        CHECK(got[name].sizes() == t.value.sizes());
        CHECK(at::equal(got[name], t.value));
      }
      const gk::BroadcastStats& s = b.stats();
      CHECK(s.tensors_sent == full.size());
      CHECK(s.tensors_yielded == full.size());
      if (budget == 40) {
        CHECK(s.buckets > 10);
        CHECK(s.max_bucket_bytes == 120);  // the wide row, alone
      } else {
        CHECK(s.buckets == 1);
      }
    }
  }
}

TEST_CASE("one rank over Gloo: a bad trainer source aborts the broadcast with the tensor's name") {
  TempDir dir;
  Group g = make_group(dir.path + "/store", 0, 1);
  const std::vector<gk::NamedTensor> good = full_checkpoint(1);
  const gk::WeightManifest manifest = full_manifest();
  auto run = [&](std::vector<gk::NamedTensor> weights) {
    gk::InMemorySource src(std::move(weights), "test weights");
    gk::BroadcastSource b(g.pg, manifest, gk::ShardRules(), {}, &src);
    b.drain();
  };
  {
    auto w = good;
    w[0].value = at::zeros({16, 9});
    GK_CHECK_THROWS_WITH_SUBSTR(run(w), gk::WeightError,
                                "yields 'l1.weight' with shape [16, 9] but the manifest says [16, 8]");
  }
  {
    auto w = good;
    w[2].value = w[2].value.to(at::kDouble);
    GK_CHECK_THROWS_WITH_SUBSTR(run(w), gk::WeightError, "yields 'l2.weight' with dtype Double but the manifest says Float");
  }
  {
    auto w = good;
    w.push_back(w[0]);
    GK_CHECK_THROWS_WITH_SUBSTR(run(w), gk::WeightError, "yields 'l1.weight' twice");
  }
  {
    auto w = good;
    w.push_back({"l9.weight", at::zeros({1}), 0});
    GK_CHECK_THROWS_WITH_SUBSTR(run(w), gk::WeightError, "yields 'l9.weight', which is not in the manifest");
  }
  {
    auto w = good;
    w[0].shard = 1;
    GK_CHECK_THROWS_WITH_SUBSTR(run(w), gk::WeightError, "the trainer sends whole tensors");
  }
  {
    auto w = good;
    w.pop_back();
    GK_CHECK_THROWS_WITH_SUBSTR(run(w), gk::WeightError, "ended without 1 manifest tensor(s): 'l2.weight'");
  }
  // A rule that cannot apply is refused in the handshake.
  {
    gk::InMemorySource src(good);
    gk::ShardRules r;
    r.row("norm.gamma");
    gk::BroadcastSource b(g.pg, manifest, r, {}, &src);
    GK_CHECK_THROWS_WITH_SUBSTR(b.next(), gk::WeightError,
                                "'norm.gamma' [16] cannot be split row-parallel (dim 1) into 1 equal parts");
  }
  // The group still works after every abort.
  gk::InMemorySource src(good);
  gk::BroadcastSource b(g.pg, manifest, gk::ShardRules(), {}, &src);
  std::size_t n = 0;
  while (b.next()) ++n;
  CHECK(n == 3);
}

TEST_CASE("one rank over Gloo: the distributed reload commits, or rolls back and names the rank") {
  TempDir dir;
  Group g = make_group(dir.path + "/store", 0, 1);
  auto model = std::make_shared<toy::ToyModel>(kD, kH);
  {
    gk::InMemorySource src(full_checkpoint(0));
    gk::load_weights(*model, src);
  }
  gk::ReloadEngine engine(*model);
  engine.prepare();
  const at::Tensor input = test_input();
  engine.add_static_io("input", input);
  at::Tensor out;
  gk::HostReplay graph{"toy"};
  graph.capture([&] { out = model->forward(input); });
  engine.track(graph);
  auto source = [&](int step, std::vector<gk::NamedTensor>& keep) {
    keep = full_checkpoint(step);
    return std::make_unique<gk::InMemorySource>(keep);
  };
  std::vector<gk::NamedTensor> w;
  gk::DistributedReload dist(g.pg, &engine);
  {
    auto full = source(1, w);
    gk::BroadcastSource b(g.pg, full_manifest(), gk::ShardRules(), {}, full.get());
    const gk::DistributedReport r = dist.reload(b);
    REQUIRE(r.reload.has_value());
    CHECK(r.reload->mode == gk::ReloadMode::transactional);  // forced
    CHECK(r.reload->tensors_loaded == 3);
    CHECK(r.broadcast.buckets == 1);
    CHECK(r.summary().find("1 bucket(s)") != std::string::npos);
    graph.replay();
    CHECK(at::equal(out, full_output(1, input)));
  }
  {
    gk::testing::EngineHooks h;
    h.fault = [](gk::testing::FaultPoint s, const std::string& l) {
      if (s == gk::testing::FaultPoint::pwal && l == "l2") throw std::runtime_error("injected");
    };
    const gk::testing::ScopedHooks hooks(&engine, std::move(h));
    gk::DistributedReload faulty(g.pg, &engine, {});
    auto full = source(2, w);
    gk::BroadcastSource b(g.pg, full_manifest(), gk::ShardRules(), {}, full.get());
    try {
      faulty.reload(b);
      FAIL("expected an abort");
    } catch (const gk::ReloadAbortedError& e) {
      CHECK(e.message() ==
            "distributed reload aborted on every rank, each keeps its old weights: rank 0 (trainer + tp "
            "0/1): std::runtime_error: injected");
      REQUIRE(e.failures().size() == 1);
      CHECK(e.failures()[0].rank == 0);
    }
    CHECK(b.finished());
    CHECK(engine.state() == gk::EngineState::ready);
    graph.replay();
    CHECK(at::equal(out, full_output(1, input)));
  }
  {
    // a user before_commit runs before the vote; throwing from it aborts
    gk::DistributedOptions o;
    o.reload = engine.options().defaults;
    int calls = 0;
    o.reload->before_commit = [&] { ++calls; };
    gk::DistributedReload d2(gk::Collective(g.backend), &engine, o);
    gk::InMemorySource plain(full_checkpoint(3));  // any source works for the vote
    d2.reload(plain);
    CHECK(calls == 1);
    graph.replay();
    CHECK(at::equal(out, full_output(3, input)));
  }
}

TEST_CASE("the engine's before_commit hook: once, after every check, before the first commit; throwing rolls back") {
  auto model = std::make_shared<toy::ToyModel>(kD, kH);
  {
    gk::InMemorySource src(full_checkpoint(0));
    gk::load_weights(*model, src);
  }
  gk::ReloadOptions opts;
  opts.mode = gk::ReloadMode::transactional;
  std::vector<std::string> log;
  gk::ReloadEngine engine(*model, {opts});
  gk::testing::EngineHooks hooks;
  hooks.fault = [&](gk::testing::FaultPoint s, const std::string& l) {
    log.push_back(std::string(gk::testing::to_string(s)) + ":" + l);
  };
  gk::testing::set_hooks(engine, hooks);
  engine.prepare();
  const at::Tensor input = test_input();
  engine.add_static_io("input", input);
  at::Tensor out;
  gk::HostReplay graph{"toy"};
  graph.capture([&] { out = model->forward(input); });
  engine.track(graph);

  gk::ReloadOptions o = opts;
  o.before_commit = [&] { log.push_back("before_commit"); };
  gk::InMemorySource s1(full_checkpoint(1));
  engine.reload(s1, o);
  const auto at = std::find(log.begin(), log.end(), "before_commit");
  REQUIRE(at != log.end());
  CHECK(std::count(log.begin(), log.end(), "before_commit") == 1);
  CHECK(*(at - 1) == "before_copies:l2");  // after the last layer's before_copies fault point
  CHECK(*(at + 1) == "copy:l1");      // before the first copy
  for (auto it = log.begin(); it != at; ++it) CHECK(it->rfind("copy:", 0) != 0);

  o.before_commit = [] { throw gk::WeightError("vote: no"); };
  gk::InMemorySource s2(full_checkpoint(2));
  GK_CHECK_THROWS_WITH_SUBSTR(engine.reload(s2, o), gk::WeightError, "vote: no");
  CHECK(engine.state() == gk::EngineState::ready);
  graph.replay();
  CHECK(at::equal(out, full_output(1, input)));

  // A streaming reload has no moment before its first commit: refused,
  // naming the option, before anything is read; without it, it runs.
  o.mode = gk::ReloadMode::streaming;
  gk::InMemorySource s3(full_checkpoint(3));
  GK_CHECK_THROWS_WITH_SUBSTR(engine.reload(s3, o), gk::StateError,
                              "ReloadOptions::before_commit is set, but ReloadOptions::mode is ReloadMode::streaming");
  CHECK(engine.state() == gk::EngineState::ready);
  graph.replay();
  CHECK(at::equal(out, full_output(1, input)));
  o.before_commit = nullptr;
  engine.reload(s3, o);
  graph.replay();
  CHECK(at::equal(out, full_output(3, input)));
}

TEST_CASE("TP=2 over Gloo, a dedicated trainer rank (world 3): reloads, aborts on every rank, manifest check") {
  check_world(run_world("dedicated", 3), kAllSteps);
}

TEST_CASE("TP=2 over Gloo, the trainer is tp rank 0 (world 2)") {
  check_world(run_world("colocated", 2), kAllSteps);
}

#else
// ===========================================================================
// GPU (NCCL). Every test here needs CUDA; see GK_TEST_REQUIRES_GPU.
GK_TEST_REQUIRES_GPU()

TEST_CASE("gpu one rank over NCCL: buckets on the device carry the weights bit for bit") {
  TempDir dir;
  Group g = make_group(dir.path + "/store", 0, 1);
  const std::vector<gk::NamedTensor> full = full_checkpoint(1);
  gk::BroadcastConfig cfg;
  cfg.device = g.device;
  cfg.bucket_bytes = 100;
  gk::InMemorySource src(full);
  gk::BroadcastSource b(g.pg, full_manifest(), gk::ShardRules(), cfg, &src);
  std::size_t n = 0;
  while (auto t = b.next()) {
    ++n;
    CHECK(t->value.device() == g.device);
    for (const auto& f : full)
      if (f.name == t->name) CHECK(at::equal(t->value.cpu(), f.value));
  }
  CHECK(n == full.size());
  CHECK(b.stats().buckets > 3);
}

TEST_CASE("gpu2 TP=2 over NCCL, the trainer is tp rank 0 (needs 2 GPUs)") {
  if (c10::cuda::device_count() < 2) {
    std::printf("skipped: TP=2 over NCCL needs 2 GPUs, this machine has %d\n",
                static_cast<int>(c10::cuda::device_count()));
    std::fflush(stdout);
    std::_Exit(77);  // ctest: skipped (SKIP_RETURN_CODE)
  }
  check_world(run_world("colocated", 2), kAllSteps);
  if (c10::cuda::device_count() >= 3) check_world(run_world("dedicated", 3), kAllSteps);
}
#endif
