// bench_manifest_extract: the cost of gk::cuda::scan_graph, the address
// extraction under the capture manifest, on synthetic captured graphs of
// 100, 1,000 and 10,000 operations.
//
//   bench_manifest_extract [--benchmark_out=FILE]  (default FILE:
//                          bench_manifest_extract.json, JSON format)
//
// Families:
//   elementwise  N x at::add_out over a ring of 64 small tensors: N kernel
//                nodes, each an ATen elementwise kernel (3 data pointers in a
//                small parameter block, kernelParams path).
//   mixed        N ops cycling add_out, cuBLAS fp32 mm_out, cuBLAS bf16
//                mm_out (large parameter blocks, `extra` path on Hopper) and a
//                D2D copy_ (memcpy node); cuBLAS may add memset nodes.
// Filters:
//   default      gk::cuda::default_plausible (no allocation lookup)
//   intervals    a binary search over the workload's allocations, as the
//                manifest does
// Reported per benchmark: time per scan (the benchmark time), s_per_node
// (time per graph node, all node kinds), items_per_second (nodes per second),
// and the graph's nodes / kernel_nodes / words.
//
// verify/elementwise/N: gk::ReloadEngine::verify() after a reload, i.e. the
// check of a tracked graph's whole manifest against the slot plan, for the
// elementwise graph of N ops whose 64 operands are the parameters of a
// module the engine has prepared (s_per_node: per graph node).
//
// Without a CUDA device it prints a message and exits 0.
#include <graphkeep/capture/cuda_graph_addresses.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/reload/manifest.h>
#include <graphkeep/capture/replay.h>

#include <torch/nn/module.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

enum class Family { elementwise, mixed };
enum class Filter { by_default, intervals };

const char* name_of(Family f) { return f == Family::elementwise ? "elementwise" : "mixed"; }
const char* name_of(Filter f) { return f == Filter::by_default ? "default" : "intervals"; }

std::uint64_t addr(const at::Tensor& t) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(t.data_ptr()));
}

// A captured graph of `ops` operations and the tensors it uses.
struct Synthetic {
  std::vector<at::Tensor> ring;  // elementwise operands
  at::Tensor x32, w32, y32, x16, w16, y16, src, dst;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> allocations;  // sorted [begin, end)

  Synthetic(Family family, int ops) {
    const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
    const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
    for (int i = 0; i < 64; ++i) ring.push_back(at::randn({256}, f32));
    x32 = at::randn({32, 64}, f32), w32 = at::randn({64, 32}, f32), y32 = at::empty({32, 32}, f32);
    x16 = at::randn({64, 128}, bf16), w16 = at::randn({128, 64}, bf16),
    y16 = at::empty({64, 64}, bf16);
    src = at::randn({1024}, f32), dst = at::empty({1024}, f32);

    auto stream = c10::cuda::getStreamFromPool();
    c10::cuda::CUDAStreamGuard guard(stream);
    for (int i = 0; i < 4; ++i) op(family, i);  // warm-up: cuBLAS handles/workspaces
    stream.synchronize();
    graph = std::make_unique<at::cuda::CUDAGraph>(/*keep_graph=*/true);
    graph->capture_begin();
    for (int i = 0; i < ops; ++i) op(family, i);
    graph->capture_end();

    for (const at::Tensor* t : {&x32, &w32, &y32, &x16, &w16, &y16, &src, &dst})
      allocations.emplace_back(addr(*t), addr(*t) + t->nbytes());
    for (const at::Tensor& t : ring) allocations.emplace_back(addr(t), addr(t) + t.nbytes());
    std::sort(allocations.begin(), allocations.end());
  }

  void op(Family family, int i) {
    const int kind = family == Family::elementwise ? 0 : i % 4;
    const auto n = static_cast<int>(ring.size());
    switch (kind) {
      case 0: at::add_out(ring[(i + 2) % n], ring[i % n], ring[(i + 1) % n]); break;
      case 1: at::mm_out(y32, x32, w32); break;
      case 2: at::mm_out(y16, x16, w16); break;
      default: dst.copy_(src); break;
    }
  }

  bool known(std::uint64_t word) const {
    auto it = std::upper_bound(allocations.begin(), allocations.end(),
                               std::make_pair(word, ~std::uint64_t{0}));
    return it != allocations.begin() && word < std::prev(it)->second;
  }
};

// Graphs are captured once per (family, ops) and reused across runs.
std::map<std::pair<Family, int>, std::unique_ptr<Synthetic>>& graphs() {
  static std::map<std::pair<Family, int>, std::unique_ptr<Synthetic>> cache;
  return cache;
}

Synthetic& synthetic(Family family, int ops) {
  auto& slot = graphs()[{family, ops}];
  if (!slot) slot = std::make_unique<Synthetic>(family, ops);
  return *slot;
}

void BM_ScanGraph(benchmark::State& state, Family family, Filter filter) {
  Synthetic& g = synthetic(family, static_cast<int>(state.range(0)));
  const cudaGraph_t raw = g.graph->raw_cuda_graph();
  std::function<bool(std::uint64_t)> plausible;
  if (filter == Filter::intervals) {
    plausible = [&g](std::uint64_t w) { return g.known(w); };
  }

  gk::cuda::GraphScan scan = gk::cuda::scan_graph(raw, plausible);  // untimed: shape of the result
  for (auto _ : state) {
    gk::cuda::GraphScan s = gk::cuda::scan_graph(raw, plausible);
    benchmark::DoNotOptimize(s.words.data());
    benchmark::ClobberMemory();
  }
  const auto nodes = static_cast<double>(scan.nodes);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(scan.nodes));
  state.counters["nodes"] = nodes;
  state.counters["kernel_nodes"] = static_cast<double>(scan.kernel_nodes);
  state.counters["words"] = static_cast<double>(scan.words.size());
  state.counters["unsupported"] = static_cast<double>(scan.unsupported.size());
  state.counters["s_per_node"] = benchmark::Counter(
      nodes, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// The manifest check after a reload: a module whose 64 parameters are the
// ring operands, prepared by an engine that tracks a captured graph of N adds.
struct Verified {
  struct Ring : torch::nn::Module {
    std::vector<at::Tensor> w;
    Ring() {
      for (int i = 0; i < 64; ++i)
        w.push_back(register_parameter("w" + std::to_string(i), at::randn({256}, at::TensorOptions().device(at::kCUDA)),
                                       /*requires_grad=*/false));
    }
  };
  std::shared_ptr<Ring> model = std::make_shared<Ring>();
  std::unique_ptr<gk::ReloadEngine> engine;
  std::unique_ptr<gk::ReplayBackend> graph = gk::make_cuda_replay("ring");
  std::size_t nodes = 0;

  explicit Verified(int ops) {
    engine = std::make_unique<gk::ReloadEngine>(*model);
    engine->prepare();
    const auto n = static_cast<int>(model->w.size());
    graph->capture([&] {
      for (int i = 0; i < ops; ++i) at::add_out(model->w[(i + 2) % n], model->w[i % n], model->w[(i + 1) % n]);
    });
    engine->track(*graph);
    nodes = static_cast<std::size_t>(ops);
  }
  ~Verified() { engine->untrack(*graph); }
};

void BM_Verify(benchmark::State& state) {
  Verified v(static_cast<int>(state.range(0)));
  const gk::CaptureManifest* m = v.engine->manifest(*v.graph);
  if (m == nullptr || !v.engine->verify().ok()) {
    state.SkipWithError("the manifest does not verify before any reload");
    return;
  }
  for (auto _ : state) {
    gk::VerifyResult r = v.engine->verify();
    benchmark::DoNotOptimize(r.issues.data());
  }
  state.counters["nodes"] = static_cast<double>(v.nodes);
  state.counters["entries"] = static_cast<double>(m->entries().size());
  state.counters["s_per_node"] = benchmark::Counter(static_cast<double>(v.nodes),
                                                    benchmark::Counter::kIsIterationInvariantRate |
                                                        benchmark::Counter::kInvert);
}

bool cuda_device_present() {
  try {
    return c10::cuda::device_count() > 0;
  } catch (...) {
    return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda_device_present()) {
    std::printf("bench_manifest_extract: no CUDA device; nothing to measure (exit 0)\n");
    return 0;
  }

  // Default to JSON output unless the caller names a file.
  std::vector<char*> args(argv, argv + argc);
  std::string out_arg = "--benchmark_out=bench_manifest_extract.json";
  std::string format_arg = "--benchmark_out_format=json";
  const bool has_out = std::any_of(args.begin() + 1, args.end(), [](const char* a) {
    return std::string(a).rfind("--benchmark_out=", 0) == 0;
  });
  if (!has_out) {
    args.push_back(out_arg.data());
    args.push_back(format_arg.data());
    std::printf("bench_manifest_extract: writing JSON to bench_manifest_extract.json\n");
  }
  int count = static_cast<int>(args.size());
  args.push_back(nullptr);

  for (Family family : {Family::elementwise, Family::mixed}) {
    for (Filter filter : {Filter::by_default, Filter::intervals}) {
      const std::string name =
          std::string("scan_graph/") + name_of(family) + "/" + name_of(filter);
      benchmark::RegisterBenchmark(name.c_str(), BM_ScanGraph, family, filter)
          ->Arg(100)
          ->Arg(1000)
          ->Arg(10000)
          ->Unit(benchmark::kMicrosecond);
    }
  }

  benchmark::RegisterBenchmark("verify/elementwise", BM_Verify)
      ->Arg(100)
      ->Arg(1000)
      ->Arg(10000)
      ->Unit(benchmark::kMicrosecond);

  benchmark::Initialize(&count, args.data());
  if (benchmark::ReportUnrecognizedArguments(count, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  graphs().clear();  // release graphs and tensors before CUDA/Torch tear down
  return 0;
}
