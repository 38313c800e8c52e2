// Real CUDA graphs from C++: capture and replay with at::cuda::CUDAGraph
// (keep_graph=true), the CUDA replay backend, and the capture manifest over
// cuBLAS and ATen kernels. Label gpu: skipped without a CUDA device.
#include "gk_test.h"

#include <graphkeep/reload/collector.h>
#include <graphkeep/reload/copy_slots.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/reload/manifest.h>
#include <graphkeep/capture/cuda_graph_addresses.h>
#include <graphkeep/capture/replay.h>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "concat_layer.h"

#include <alloca.h>

GK_TEST_REQUIRES_GPU()

namespace {

// A plain libtorch module: a cuBLAS GEMM and ATen elementwise kernels.
struct Mlp : torch::nn::Module {
  at::Tensor w, b;
  Mlp() {
    auto o = at::TensorOptions().device(at::kCUDA);
    w = register_parameter("w", at::zeros({32, 64}, o), false);
    b = register_parameter("b", at::zeros({32}, o), false);
  }
  at::Tensor forward(const at::Tensor& x) { return at::relu(at::addmm(b, x, w.t())) * 2.0; }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    return {{"w", at::sin(at::arange(32 * 64, at::kFloat).reshape({32, 64}) * 0.01 + step)},
            {"b", at::cos(at::arange(32, at::kFloat) + step)}};
  }
};

// Fills `bytes` of the unused stack below the caller with `word`, the way
// earlier eager work leaves device pointers there (Note [Stale bytes in kernel
// parameters] in capture/cuda/cuda_replay.cpp).
[[gnu::noinline]] void dirty_stack(std::uint64_t word, std::size_t bytes) {
  auto* p = static_cast<std::uint64_t*>(alloca(bytes));
  for (std::size_t i = 0; i < bytes / sizeof word; ++i) p[i] = word;
  asm volatile("" : : "r"(p) : "memory");
}

// A broadcast float division, the kernel the H200 runs flagged: ATen's
// elementwise kernel takes a lambda holding an empty functor and padding.
at::Tensor broadcast_div(const at::Tensor& x, const at::Tensor& s) { return x / s; }

std::size_t words_equal(const std::vector<gk::CapturedAddress>& a, std::uintptr_t v, std::string* where) {
  std::size_t n = 0;
  for (const auto& c : a)
    if (c.address == v) {
      ++n;
      *where += gk::detail::concat(" node ", c.node, " param ", c.param, " byte ", c.byte_offset, ";");
    }
  return n;
}


}  // namespace

TEST_CASE("a stale pointer in a kernel parameter's padding: seen by a raw scan, not through the CUDA backend") {
  auto o = at::TensorOptions().device(at::kCUDA);
  at::Tensor x = at::randn({72, 64}, o), s = at::rand({72, 1}, o) + 1.0;
  at::Tensor victim = at::zeros({2}, o);  // an 8-byte block outside every graph pool
  const auto v = reinterpret_cast<std::uintptr_t>(victim.data_ptr());
  (void)broadcast_div(x, s);  // warm-up outside capture
  c10::cuda::device_synchronize();
  constexpr std::size_t kDirty = std::size_t{256} << 10;

  // Negative: captured without the scrub, the node's parameter bytes carry v.
  std::size_t raw_hits = 0;
  std::string raw_where;
  {
    at::cuda::CUDAGraph g(/*keep_graph=*/true);
    at::Tensor out;
    {
      c10::cuda::CUDAStreamGuard guard(at::cuda::getStreamFromPool());
      dirty_stack(v, kDirty);
      g.capture_begin();
      out = broadcast_div(x, s);
      g.capture_end();
    }
    const gk::cuda::GraphScan scan = gk::cuda::scan_graph(g.raw_cuda_graph());
    for (const auto& w : scan.words)
      if (w.address == v) {
        ++raw_hits;
        raw_where += gk::detail::concat(" ", w.node_name.substr(0, 60), " param ", w.param_index, " byte ",
                                        w.byte_offset, ";");
      }
    MESSAGE("raw scan: " << raw_hits << " word(s) equal to the stale pointer:" << raw_where);
  }
  CHECK_MESSAGE(raw_hits > 0, "the dirtied stack did not reach the kernel's parameter padding: the premise of "
                              "Note [Stale bytes in kernel parameters] does not hold on this build");

  // Positive: the backend scrubs the stack before the forward runs.
  for (int i = 0; i < 3; ++i) {
    auto graph = gk::make_cuda_replay("div");
    at::Tensor out;
    dirty_stack(v, kDirty);
    graph->capture([&] { out = broadcast_div(x, s); });
    std::string where;
    CHECK_MESSAGE(words_equal(graph->addresses(), v, &where) == 0, "stale pointer read as an address:" << where);
    graph->replay();
    c10::cuda::device_synchronize();
    CHECK(at::equal(out.cpu(), (x / s).cpu()));
  }
}

TEST_CASE("the CUDA backend tells addresses in live allocations from those in free blocks") {
  auto g = gk::make_cuda_replay("probe");
  auto o = at::TensorOptions().device(at::kCUDA);
  at::Tensor a = at::empty({1 << 20}, o), b = at::empty({1 << 20}, o);
  const auto pa = reinterpret_cast<std::uintptr_t>(a.data_ptr()) + 4096;
  const auto pb = reinterpret_cast<std::uintptr_t>(b.data_ptr()) + 4096;
  b = at::Tensor();  // its block stays cached by the allocator, free
  const std::vector<bool> live = g->in_live_allocation({pa, pb, std::uintptr_t{16}});
  REQUIRE(live.size() == 3);
  CHECK(live[0]);
  CHECK_FALSE(live[1]);
  CHECK(live[2]);  // not allocator memory: unknown, so treated as live
}

TEST_CASE("at::cuda::CUDAGraph(keep_graph=true) captures from C++ and replays with the captured pointers") {
  auto o = at::TensorOptions().device(at::kCUDA);
  at::Tensor x = at::ones({1024}, o), y = at::zeros({1024}, o);
  at::cuda::CUDAGraph g(/*keep_graph=*/true);
  c10::cuda::device_synchronize();
  {
    c10::cuda::CUDAStreamGuard guard(at::cuda::getStreamFromPool());
    g.capture_begin();
    at::mul_out(y, x, x);
    y.add_(1.0);
    g.capture_end();
  }
  CHECK(g.raw_cuda_graph() != nullptr);
  g.instantiate();
  CHECK(at::equal(y.cpu(), at::zeros({1024})));  // capture does not execute
  x.fill_(3.0);
  g.replay();
  c10::cuda::device_synchronize();
  CHECK(at::equal(y.cpu(), at::full({1024}, 10.0)));
  x.fill_(-2.0);  // new values at the same address
  g.replay();
  c10::cuda::device_synchronize();
  CHECK(at::equal(y.cpu(), at::full({1024}, 5.0)));
}

TEST_CASE("the manifest classifies cuBLAS and ATen kernel pointers as parameters, inputs or the graph pool") {
  auto m = std::make_shared<Mlp>();
  gk::InMemorySource src(m->checkpoint(0));
  gk::load_weights(*m, src);
  gk::ReloadEngine engine(*m);
  engine.prepare();
  at::Tensor x = at::randn({16, 64}, at::TensorOptions().device(at::kCUDA));
  engine.add_static_io("x", x);
  (void)m->forward(x);  // warm-up: cuBLAS handle and workspace
  auto graph = gk::make_cuda_replay("mlp");
  at::Tensor out;
  graph->capture([&] { out = m->forward(x); });
  engine.track(*graph);
  const gk::CaptureManifest* man = engine.manifest(*graph);
  REQUIRE(man != nullptr);
  INFO("undeclared: " << (man->undeclared().empty() ? std::string() : man->undeclared().front()));
  CHECK(man->count(gk::AddressClass::unknown) == 0);
  CHECK(man->count(gk::AddressClass::slot) >= 2);       // w (cuBLAS) and b
  CHECK(man->count(gk::AddressClass::static_io) >= 1);  // x
  CHECK(man->count(gk::AddressClass::pool) >= 1);       // intermediates and out
  bool w_seen = false;
  for (const auto& e : man->entries()) w_seen = w_seen || e.owner == "w";
  CHECK(w_seen);

  // Reload on the GPU: replay equals a fresh model, no drift.
  for (int step = 1; step <= 2; ++step) {
    gk::InMemorySource s(m->checkpoint(step));
    const gk::ReloadReport r = engine.reload(s);
    CHECK(r.drift == 0);
    graph->replay();
    auto fresh = std::make_shared<Mlp>();
    gk::InMemorySource f(fresh->checkpoint(step));
    gk::load_weights(*fresh, f);
    const at::Tensor want = fresh->forward(x);
    c10::cuda::device_synchronize();
    CHECK(at::allclose(out.cpu(), want.cpu(), 1e-5, 1e-5));
  }
}

TEST_CASE("batched default loads: a CUDA layer's concatenated tensors and dim-0 shards in one launch, bit for bit "
          "their concatenation, the layer's own loader in order") {
  using gktest::ConcatLayer;
  auto m = std::make_shared<torch::nn::Module>();
  auto layer = m->register_module("layer", std::make_shared<ConcatLayer>(at::kCUDA));
  auto source = [](int step) {
    std::vector<gk::NamedTensor> ts = ConcatLayer::checkpoint(step);
    for (gk::NamedTensor& t : ts) t = {"layer." + t.name, t.value.to(at::kCUDA), t.shard};
    return ts;
  };
  auto check_step = [&](int step) {
    const std::vector<at::Tensor> want = ConcatLayer::expected(step), got = layer->params();
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      CHECK(at::equal(got[i].cpu(), want[i]));
    }
  };
  gk::InMemorySource first(source(0));
  // Batched: w's 37 tensors, s's 6 shards, c0 and c2. Not: t's dim-1
  // shards (default_load) and c1 (the layer's loader).
  CHECK(gk::load_weights(*m, first).tensors_batched == 37 + 6 + 2);
  check_step(0);
  // A reload through a ReloadEngine batches the same loads.
  gk::ReloadEngine engine(*m);
  engine.prepare();
  gk::InMemorySource next(source(1));
  CHECK(engine.reload(next).tensors_batched == 37 + 6 + 2);
  check_step(1);
}

TEST_CASE("gk::copy_slots: one launch for contiguous CUDA pairs, copy_ semantics for every other pair") {
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  std::vector<at::Tensor> dst, src;
  // contiguous pairs: small, several 64 KiB chunks with a tail, odd byte counts
  for (int64_t n : {1, 17, 4096, 3 * 16384 + 5}) {
    dst.push_back(at::zeros({n}, cuda));
    src.push_back(at::randn({n}, cuda));
  }
  at::Tensor bytes_dst = at::zeros({200001}, cuda.dtype(at::kByte));
  at::Tensor bytes_src = at::randint(0, 255, {200001}, cuda.dtype(at::kByte));
  // unaligned views (1-byte offset): the kernel's byte path
  dst.push_back(bytes_dst.narrow(0, 1, 100000));
  src.push_back(bytes_src.narrow(0, 3, 100000));
  // a strided view and a dtype cast: copy_ handles them
  at::Tensor strided = at::zeros({64, 32}, cuda);
  dst.push_back(strided.t());
  src.push_back(at::randn({32, 64}, cuda));
  dst.push_back(at::zeros({100}, cuda.dtype(at::kDouble)));
  src.push_back(at::randn({100}, cuda));
  // a CPU pair
  dst.push_back(at::zeros({10}));
  src.push_back(at::randn({10}));
  gk::copy_slots(dst, src);
  for (std::size_t i = 0; i < dst.size(); ++i) {
    CAPTURE(i);
    CHECK(at::equal(dst[i], src[i].to(dst[i].scalar_type())));
  }
  CHECK(bytes_dst[0].item<int>() == 0);  // nothing written outside the view
  CHECK(at::equal(bytes_dst.narrow(0, 100001, 100000), at::zeros({100000}, cuda.dtype(at::kByte))));
  GK_CHECK_THROWS_WITH_SUBSTR(gk::copy_slots(std::vector<at::Tensor>{dst[0]}, std::vector<at::Tensor>{}), gk::StateError,
                              "1 destinations but 0 sources");
}

TEST_CASE("gk::copy_slots: several launches when the tasks overflow one batch; capturable in a CUDA graph") {
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  std::vector<at::Tensor> dst, src;
  // 2,000 small slots, then one slot of 1,600 tasks of 512 KiB (kCopyChunk)
  // that starts in the middle of a batch: three launches, a slot split across
  // two of them.
  for (int i = 0; i < 2000; ++i) {
    dst.push_back(at::zeros({64 + i % 7}, cuda));
    src.push_back(at::randn({64 + i % 7}, cuda));
  }
  dst.push_back(at::zeros({1600 * 131072 + 3}, cuda));
  src.push_back(at::randn({1600 * 131072 + 3}, cuda));
  auto require_copied = [&] {
    for (std::size_t i = 0; i < dst.size(); ++i) {
      CAPTURE(i);
      REQUIRE(at::equal(dst[i], src[i]));
    }
  };
  SUBCASE("eager") {
    gk::copy_slots(dst, src);
    require_copied();
  }
  SUBCASE("captured, then replayed after the sources change") {
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    at::cuda::CUDAGraph graph;
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      graph.capture_begin();
      gk::copy_slots(dst, src);
      graph.capture_end();
    }
    CHECK_FALSE(at::equal(dst.back(), src.back()));  // capture ran nothing
    for (auto& s : src) s.add_(1.0f);
    graph.replay();
    c10::cuda::device_synchronize();
    require_copied();
  }
  SUBCASE("prepared once as a gk::SlotCopyPlan, run twice") {
    const gk::SlotCopyPlan plan(dst, src);
    CHECK(plan.pairs() == dst.size());
    CHECK(plan.launches() == 3);  // 2,000 + 1,601 tasks in batches of 1,536
    for (int step = 0; step < 2; ++step) {
      for (auto& s : src) s.add_(1.0f);
      plan.run();
      c10::cuda::device_synchronize();
      require_copied();
    }
  }
  SUBCASE("a pair the batched kernel cannot copy is named when the plan is built") {
    std::vector<at::Tensor> d{dst[0], at::zeros({8, 4}, cuda).t()}, s{src[0], at::randn({4, 8}, cuda)};
    GK_CHECK_THROWS_WITH_SUBSTR(gk::SlotCopyPlan(d, s), gk::StateError, "pair 1 cannot be batched: a tensor is not contiguous");
    d[1] = at::zeros({32}, cuda.dtype(at::kDouble));
    s[1] = at::randn({32}, cuda);
    GK_CHECK_THROWS_WITH_SUBSTR(gk::SlotCopyPlan(d, s), gk::StateError, "pair 1 cannot be batched: dtypes differ");
  }
}
