// Slot resolution per reload: the persistent slot plan (resolve each stored
// path, O(depth)) against a full recursive walk of the same object tree
// (gk::collect_slots: the generated visitors plus alias grouping), at 10,
// 1,000 and 100,000 slots. Reports ns per slot for both and their ratio.
//
//   bench_plan_resolution --benchmark_out=plan.json --benchmark_out_format=json
#include <graphkeep/registry.h>

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

namespace bench {

// A kernel-like leaf: four tensors with roles and configuration.
struct Leaf {
  gk::Scale scale;
  gk::Metadata strides;
  gk::DerivedWeight weight;
  gk::Workspace<gk::Init::zero> locks;
  int64_t id = 0;
};
GRAPHKEEP_AGGREGATE(Leaf, scale, strides, weight, locks, id);

// A quantization method holding a kernel behind a smart pointer.
class Method {
 public:
  explicit Method(int64_t id) : kernel_(std::make_unique<Leaf>()) {
    auto t = at::zeros({1});
    *kernel_ = Leaf{t.clone(), t.clone(), t.clone(), t.clone(), id};
  }

 private:
  std::unique_ptr<Leaf> kernel_;
  GRAPHKEEP_DESCRIBE(Method, kernel_)
};

// A layer stack: n methods in a vector (depth: vector -> ptr -> member).
class Model {
 public:
  explicit Model(int64_t slots) {
    for (int64_t i = 0; i < std::max<int64_t>(1, slots / 4); ++i) layers_.emplace_back(i);
  }

 private:
  std::vector<Method> layers_;
  GRAPHKEEP_DESCRIBE(Model, layers_)
};

void BM_PlanResolve(benchmark::State& state) {
  Model m(state.range(0));
  const auto slots = gk::collect_slots(gk::ObjectRef::of(m));  // the plan, built once
  for (auto _ : state) {
    std::size_t n = 0;
    for (const gk::Slot& s : slots) n += s.paths.front().resolve_tensor(&m) != nullptr ? 1 : 0;
    benchmark::DoNotOptimize(n);
  }
  state.counters["slots"] = static_cast<double>(slots.size());
  state.counters["ns_per_slot"] = benchmark::Counter(static_cast<double>(slots.size()),
                                                     benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}

void BM_FullWalk(benchmark::State& state) {
  Model m(state.range(0));
  std::size_t n = 0;
  for (auto _ : state) {
    auto slots = gk::collect_slots(gk::ObjectRef::of(m));
    n = slots.size();
    benchmark::DoNotOptimize(slots.data());
  }
  state.counters["slots"] = static_cast<double>(n);
  state.counters["ns_per_slot"] = benchmark::Counter(static_cast<double>(n),
                                                     benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}

BENCHMARK(BM_PlanResolve)->Arg(10)->Arg(1000)->Arg(100000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_FullWalk)->Arg(10)->Arg(1000)->Arg(100000)->Unit(benchmark::kMicrosecond);

}  // namespace bench

BENCHMARK_MAIN();
