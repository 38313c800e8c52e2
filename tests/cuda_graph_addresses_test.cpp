// gk::cuda::scan_graph on graphs captured by libtorch: ATen elementwise,
// cuBLAS fp32 and bf16 GEMMs, a D2D copy (memcpy node), zero_, a memset node
// and our own kernel with pointers inside a by-value struct; child graphs;
// conditional nodes. Needs a GPU (the binary reports "skipped" without one).
#include "gk_test.h"

#include <graphkeep/capture/cuda_graph_addresses.h>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

GK_TEST_REQUIRES_GPU()

// tests/cuda_graph_addresses_kernels.cu
cudaError_t gk_test_launch_scale(int first, const float* in, float* out, int n, float alpha,
                                 std::uint64_t tag, const float* bias, cudaStream_t stream);
cudaError_t gk_test_launch_tensor_info(bool named, float* out, const float* in, int n, std::uint64_t stale,
                                       int dims, cudaStream_t stream);

namespace {

using gk::cuda::GraphAddress;
using gk::cuda::GraphScan;
using Kind = GraphAddress::NodeKind;

constexpr std::uint64_t kTag = 0x1234;  // a small integer: the default filter drops it
constexpr int kScaleN = 1000;
constexpr float kAlpha = 2.0f;

std::uint64_t addr(const at::Tensor& t) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(t.data_ptr()));
}
bool inside(std::uint64_t word, std::uint64_t base, std::uint64_t bytes) {
  return word >= base && word < base + bytes;
}
bool inside(std::uint64_t word, const at::Tensor& t) { return inside(word, addr(t), t.nbytes()); }

std::string dump(const GraphScan& s) {
  std::ostringstream os;
  os << s.nodes << " nodes, " << s.kernel_nodes << " kernel nodes, " << s.words.size()
     << " words, " << s.unsupported.size() << " unsupported\n";
  for (const auto& u : s.unsupported) os << "  unsupported: " << u << "\n";
  for (const auto& w : s.words) {
    os << "  node " << w.node << " " << gk::cuda::to_string(w.kind) << " "
       << w.node_name.substr(0, 90) << " param " << w.param_index << " +" << w.byte_offset
       << " 0x" << std::hex << w.address << std::dec << "\n";
  }
  return os.str();
}

// (param_index, byte_offset, address) triples, printed for comparison.
using Triples = std::set<std::tuple<std::uint32_t, std::uint32_t, std::uint64_t>>;
std::string text(const Triples& t) {
  std::ostringstream os;
  for (const auto& [param, offset, address] : t)
    os << "(param " << param << " +" << offset << " 0x" << std::hex << address << std::dec << ") ";
  return os.str();
}

// The words satisfying `pred`.
template <class Pred>
std::vector<GraphAddress> select(const GraphScan& s, Pred pred) {
  std::vector<GraphAddress> out;
  std::copy_if(s.words.begin(), s.words.end(), std::back_inserter(out), pred);
  return out;
}

// Every tensor the captured sequence touches, allocated before capture.
struct Workload {
  at::TensorOptions f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  at::TensorOptions bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  // at::add_out
  at::Tensor a = at::randn({4096}, f32), b = at::randn({4096}, f32), sum = at::empty({4096}, f32);
  // cuBLAS fp32 and bf16: y = x @ w
  at::Tensor x32 = at::randn({64, 256}, f32), w32 = at::randn({256, 128}, f32),
             y32 = at::empty({64, 128}, f32);
  at::Tensor x16 = at::randn({128, 512}, bf16), w16 = at::randn({512, 256}, bf16),
             y16 = at::empty({128, 256}, bf16);
  // D2D copy_ (memcpy node)
  at::Tensor src = at::randn({8192}, f32), dst = at::empty({8192}, f32);
  // zero_ (a fill kernel) and a raw cudaMemsetAsync (memset node)
  at::Tensor z = at::randn({2048}, f32), m = at::randn({2048}, f32);
  // our kernel: reads sin[3..], writes sout, adds sbias
  at::Tensor sin = at::randn({kScaleN + 3}, f32), sout = at::empty({kScaleN}, f32),
             sbias = at::randn({kScaleN}, f32);
  // Never touched. Its middle third is the "unused" range: no pointer of the
  // graph (not even a one-past-the-end pointer of a neighbour) can reach it.
  at::Tensor holder = at::zeros({3 * 262144}, f32);

  std::uint64_t scale_in() const { return addr(sin) + 3 * sizeof(float); }
  std::uint64_t unused_begin() const { return addr(holder) + holder.nbytes() / 3; }
  std::uint64_t unused_bytes() const { return holder.nbytes() / 3; }

  void run(cudaStream_t stream) {
    at::add_out(sum, a, b);
    at::mm_out(y32, x32, w32);
    at::mm_out(y16, x16, w16);
    dst.copy_(src);
    z.zero_();
    REQUIRE(cudaMemsetAsync(m.data_ptr(), 0, m.nbytes(), stream) == cudaSuccess);
    REQUIRE(gk_test_launch_scale(0, reinterpret_cast<const float*>(scale_in()),
                                 sout.data_ptr<float>(), kScaleN, kAlpha, kTag,
                                 sbias.data_ptr<float>(), stream) == cudaSuccess);
  }
};

// Captures Workload::run into a kept template graph on a side stream.
struct Captured {
  Workload w;
  at::cuda::CUDAGraph graph{/*keep_graph=*/true};

  Captured() {
    auto stream = c10::cuda::getStreamFromPool();
    c10::cuda::CUDAStreamGuard guard(stream);
    w.run(stream.stream());  // warm-up: cuBLAS handles and workspaces exist before capture
    stream.synchronize();
    graph.capture_begin();
    w.run(stream.stream());
    graph.capture_end();
  }
  cudaGraph_t raw() { return graph.raw_cuda_graph(); }
};

}  // namespace

TEST_CASE("scan_graph finds the addresses of every captured op") {
  Captured c;
  const Workload& w = c.w;
  const GraphScan s = gk::cuda::scan_graph(c.raw());
  const std::string listing = dump(s);
  INFO(listing);

  CHECK(s.unsupported.empty());
  CHECK(s.nodes >= 7);
  CHECK(s.kernel_nodes >= 5);
  for (const auto& word : s.words) {
    CHECK(word.node < s.nodes);
    CHECK(gk::cuda::default_plausible(word.address));
  }

  SUBCASE("ATen elementwise add: out and both inputs in one kernel node") {
    const auto out = select(s, [&](const GraphAddress& x) {
      return x.kind == Kind::kernel && x.address == addr(w.sum);
    });
    REQUIRE(!out.empty());
    const std::size_t node = out.front().node;
    CHECK(out.front().node_name.find("elementwise") != std::string::npos);
    for (const at::Tensor* t : {&w.a, &w.b}) {
      CHECK(!select(s, [&](const GraphAddress& x) {
               return x.node == node && x.kind == Kind::kernel && x.address == addr(*t);
             }).empty());
    }
  }

  SUBCASE("cuBLAS GEMMs (fp32 and bf16): inputs, weights and outputs in kernel nodes") {
    const std::vector<std::pair<const char*, const at::Tensor*>> tensors = {
        {"x32", &w.x32}, {"w32", &w.w32}, {"y32", &w.y32},
        {"x16", &w.x16}, {"w16", &w.w16}, {"y16", &w.y16}};
    for (const auto& [name, t] : tensors) {
      INFO("tensor " << name);
      CHECK(!select(s, [&](const GraphAddress& x) {
               return x.kind == Kind::kernel && inside(x.address, *t);
             }).empty());
    }
  }

  SUBCASE("D2D copy_: one memcpy node, source param 0, destination param 1") {
    const auto from = select(s, [&](const GraphAddress& x) {
      return x.kind == Kind::memcpy && x.param_index == gk::cuda::kMemcpySrcParam &&
             x.address == addr(w.src);
    });
    REQUIRE(from.size() == 1);
    CHECK(from.front().node_name == "memcpy");
    CHECK(from.front().byte_offset == 0);
    CHECK(select(s, [&](const GraphAddress& x) {
            return x.node == from.front().node && x.kind == Kind::memcpy &&
                   x.param_index == gk::cuda::kMemcpyDstParam && x.address == addr(w.dst);
          }).size() == 1);
  }

  SUBCASE("zero_ and cudaMemsetAsync") {
    CHECK(!select(s, [&](const GraphAddress& x) {
             return (x.kind == Kind::kernel || x.kind == Kind::memset) && x.address == addr(w.z);
           }).empty());
    const auto set = select(s, [&](const GraphAddress& x) {
      return x.kind == Kind::memset && x.address == addr(w.m);
    });
    REQUIRE(set.size() == 1);
    CHECK(set.front().node_name == "memset");
    CHECK(set.front().param_index == gk::cuda::kMemsetDstParam);
  }

  SUBCASE("our kernel: pointers inside a struct parameter at non-zero offsets") {
    const auto mine = select(s, [](const GraphAddress& x) {
      return x.node_name.find("gk_test_scale_kernel") != std::string::npos;
    });
    REQUIRE(mine.size() == 3);  // args.in, args.out, bias; not `first`, n|alpha or the tag
    Triples got;
    for (const auto& x : mine) {
      CHECK(x.kind == Kind::kernel);
      CHECK(x.node == mine.front().node);
      got.emplace(x.param_index, x.byte_offset, x.address);
    }
    const Triples want = {
        {1, 8, w.scale_in()}, {1, 24, addr(w.sout)}, {2, 0, addr(w.sbias)}};
    CHECK(text(got) == text(want));
  }

  SUBCASE("an allocation the graph does not use does not appear") {
    CHECK(select(s, [&](const GraphAddress& x) {
            return inside(x.address, w.unused_begin(), w.unused_bytes());
          }).empty());
  }
}

TEST_CASE("scan_graph applies the plausibility filter to every word") {
  Captured c;
  const Workload& w = c.w;

  SUBCASE("accept everything: non-pointer words of our kernel appear too") {
    const GraphScan s = gk::cuda::scan_graph(c.raw(), [](std::uint64_t) { return true; });
    INFO(dump(s));
    const auto mine = select(s, [](const GraphAddress& x) {
      return x.node_name.find("gk_test_scale_kernel") != std::string::npos;
    });
    // args: n|alpha at +0, in +8, tag +16, out +24; bias. `first` (4 bytes) has no word.
    REQUIRE(mine.size() == 5);
    std::int32_t n = kScaleN;
    float alpha = kAlpha;
    std::uint64_t packed = 0;
    std::memcpy(&packed, &n, 4);
    std::memcpy(reinterpret_cast<unsigned char*>(&packed) + 4, &alpha, 4);
    Triples got;
    for (const auto& x : mine) got.emplace(x.param_index, x.byte_offset, x.address);
    const Triples want = {
        {1, 0, packed}, {1, 8, w.scale_in()}, {1, 16, kTag}, {1, 24, addr(w.sout)},
        {2, 0, addr(w.sbias)}};
    CHECK(text(got) == text(want));
  }

  SUBCASE("accept one allocation: only its words, from every node kind that uses it") {
    std::size_t calls = 0;
    const GraphScan s = gk::cuda::scan_graph(c.raw(), [&](std::uint64_t word) {
      ++calls;
      return inside(word, w.sout) || inside(word, w.dst);
    });
    INFO(dump(s));
    CHECK(calls > s.words.size());
    REQUIRE(s.words.size() == 2);
    for (const auto& x : s.words) CHECK((inside(x.address, w.sout) || inside(x.address, w.dst)));
    CHECK(std::count_if(s.words.begin(), s.words.end(),
                        [](const GraphAddress& x) { return x.kind == Kind::memcpy; }) == 1);
  }
}

TEST_CASE("scan_graph recurses into child graphs, numbering their nodes after the parent") {
  Captured c;
  const GraphScan inner = gk::cuda::scan_graph(c.raw());

  cudaGraph_t parent = nullptr;
  REQUIRE(cudaGraphCreate(&parent, 0) == cudaSuccess);
  cudaGraphNode_t child = nullptr;
  REQUIRE(cudaGraphAddChildGraphNode(&child, parent, nullptr, 0, c.raw()) == cudaSuccess);  // clones
  const GraphScan outer = gk::cuda::scan_graph(parent);
  CHECK(cudaGraphDestroy(parent) == cudaSuccess);

  INFO(dump(outer));
  CHECK(outer.nodes == inner.nodes + 1);
  CHECK(outer.kernel_nodes == inner.kernel_nodes);
  CHECK(outer.unsupported.size() == inner.unsupported.size());
  REQUIRE(outer.words.size() == inner.words.size());
  using Key = std::tuple<std::uint64_t, Kind, std::string, std::uint32_t, std::uint32_t>;
  std::multiset<Key> a, b;
  for (const auto& x : inner.words) a.emplace(x.address, x.kind, x.node_name, x.param_index, x.byte_offset);
  for (const auto& x : outer.words) {
    CHECK(x.node >= 1);  // node 0 is the child-graph node itself
    b.emplace(x.address, x.kind, x.node_name, x.param_index, x.byte_offset);
  }
  const bool same_words = a == b;
  CHECK(same_words);
}

TEST_CASE("scan_graph lists conditional nodes as unsupported") {
  // A runtime call on the current device makes sure its primary context exists.
  REQUIRE(cudaFree(nullptr) == cudaSuccess);
  cudaGraph_t g = nullptr;
  REQUIRE(cudaGraphCreate(&g, 0) == cudaSuccess);
  cudaGraphConditionalHandle handle{};
  REQUIRE(cudaGraphConditionalHandleCreate(&handle, g, 1, cudaGraphCondAssignDefault) == cudaSuccess);
  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeIf;
  params.conditional.size = 1;
  cudaGraphNode_t node = nullptr;
  REQUIRE(cudaGraphAddNode(&node, g, nullptr, nullptr, 0, &params) == cudaSuccess);

  const GraphScan s = gk::cuda::scan_graph(g);
  CHECK(cudaGraphDestroy(g) == cudaSuccess);
  INFO(dump(s));
  CHECK(s.nodes == 1);
  CHECK(s.kernel_nodes == 0);
  CHECK(s.words.empty());
  REQUIRE(s.unsupported.size() == 1);
  CHECK(s.unsupported.front().find("conditional") != std::string::npos);
  CHECK(s.unsupported.front().find("node 0") != std::string::npos);
}

TEST_CASE("scan_graph rejects a null graph and keeps the default filter conservative") {
  GK_CHECK_THROWS_WITH_SUBSTR(gk::cuda::scan_graph(nullptr), gk::StateError, "keep_graph");
  CHECK_FALSE(gk::cuda::default_plausible(0));
  CHECK_FALSE(gk::cuda::default_plausible(0xffffffffULL));
  CHECK_FALSE(gk::cuda::default_plausible(~0ULL));                // -1
  CHECK_FALSE(gk::cuda::default_plausible(0x3ff0000000000000ULL));  // 1.0 as a double
  CHECK(gk::cuda::default_plausible(0x7f12a4000000ULL));
  CHECK(gk::cuda::default_plausible(0x302000001ULL));  // odd: a byte pointer is kept
}

TEST_CASE("scan_graph reads a TensorInfo parameter's data pointer, not its unused sizes and strides") {
  // Note [ATen's TensorInfo]: a stale device address (that of `stale`, a live
  // tensor the kernel never reads) in strides[15] of a TensorInfo-shaped
  // parameter. Under another struct name the same bytes are scanned whole
  // and the address is reported: the scan would name it, and a kept graph
  // would be refused as reading memory no slot owns.
  const auto f32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  at::Tensor in = at::randn({256}, f32), out = at::empty({256}, f32), stale = at::empty({64}, f32);
  const auto scan_of = [&](bool named, int dims) {
    auto stream = c10::cuda::getStreamFromPool();
    c10::cuda::CUDAStreamGuard guard(stream);
    at::cuda::CUDAGraph graph(/*keep_graph=*/true);
    graph.capture_begin();
    REQUIRE(gk_test_launch_tensor_info(named, out.data_ptr<float>(), in.data_ptr<float>(), 256, addr(stale), dims,
                                       stream.stream()) == cudaSuccess);
    graph.capture_end();
    graph.replay();
    stream.synchronize();
    CHECK(at::equal(out, in));
    return gk::cuda::scan_graph(graph.raw_cuda_graph());
  };
  const auto has = [](const GraphScan& s, std::uint64_t a) {
    return std::any_of(s.words.begin(), s.words.end(), [&](const GraphAddress& w) { return w.address == a; });
  };
  const GraphScan named = scan_of(true, 2);
  INFO(dump(named));
  REQUIRE(named.words.size() >= 2);
  CHECK(named.words.front().node_name.find("10TensorInfo") != std::string::npos);
  CHECK(has(named, addr(out)));
  CHECK(has(named, addr(in)));
  CHECK_FALSE(has(named, addr(stale)));

  const GraphScan other = scan_of(false, 2);
  INFO(dump(other));
  CHECK(has(other, addr(out)));
  CHECK(has(other, addr(stale)));  // the negative: the same bytes, scanned whole
  const auto at_168 = select(other, [&](const GraphAddress& w) { return w.address == addr(stale); });
  REQUIRE(at_168.size() == 1);
  CHECK(at_168.front().param_index == 0);
  CHECK(at_168.front().byte_offset == 168);

  // A dims field no TensorInfo can hold: not that layout, scanned whole.
  CHECK(has(scan_of(true, 1000), addr(stale)));
}
