// The MoE failure sites (2, 4, 10, 11), each as a registered layer, on the
// CPU replay backend (suite cpu) and on real CUDA graphs (suite gpu).
//   site 2   shuffled expert weights (AITER shuffle)       gk::kernels::ShuffledMoe
//   site 4   CUTLASS grouped GEMM stride arrays             gk::kernels::CutlassMoe / CutlassExperts
//   site 10  W4A8 grouped GEMM a/c/s stride arrays          gk::kernels::W4A8Moe / CutlassW4A8Experts
//   site 11  kernel-owned scratch (RDNA3 WNA16)             gk::kernels::Rdna3Wna16Moe / Rdna3Wna16Kernel
// and the Qwen3-MoE experts, site 4's stride arrays under
// softmax routing and a SiLU-gated activation:       gk::kernels::SwigluExperts
#include "site_harness.h"

#include <graphkeep/kernels/catalog.h>
#include <graphkeep/numerics/softmax_topk.h>
#include <graphkeep/reload/collector.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

using gk::kernels::CutlassExperts;
using gk::kernels::CutlassW4A8Experts;
using gk::kernels::SwigluExperts;

constexpr int64_t E = 4, K = 16, N = 16, TOPK = 2, T = 6, G = 8, MAX_TOKENS = 8;

int64_t numel(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}
// Deterministic float weights: amp * sin(i * freq + phase).
at::Tensor wave(const std::vector<int64_t>& shape, double freq, double phase, double amp = 0.5) {
  return (at::sin(at::arange(numel(shape), at::kDouble) * freq + phase) * amp).to(at::kFloat).reshape(shape);
}
// Deterministic integers: (i * mul + add) mod m, as dtype.
at::Tensor ints(const std::vector<int64_t>& shape, int64_t mul, int64_t add, int64_t m, at::ScalarType dtype,
                int64_t offset = 0) {
  return (at::remainder(at::arange(numel(shape), at::kLong) * mul + add, m) - offset).to(dtype).reshape(shape);
}
// Positive per-channel / per-group scales.
at::Tensor scales(const std::vector<int64_t>& shape, double phase) { return wave(shape, 0.41, phase, 0.01) + 0.02f; }

// The static input of every MoE model: [T, K + E], hidden states then router logits.
at::Tensor moe_input(c10::Device d) {
  return at::cos(at::arange(T * (K + E), at::kFloat) * 0.37).reshape({T, K + E}).to(d);
}

// Site 2.
struct ShuffleModel : torch::nn::Module {
  std::shared_ptr<gk::kernels::ShuffledMoe> moe;
  explicit ShuffleModel(c10::Device d) {
    moe = register_module("moe", std::make_shared<gk::kernels::ShuffledMoe>(E, K, N, TOPK, d));
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    std::vector<gk::NamedTensor> out;
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = "moe.experts." + std::to_string(e) + ".";
      out.push_back({p + "w1", wave({N, K}, 0.31, 1.7 * e + 0.9 * step)});
      out.push_back({p + "w3", wave({N, K}, 0.23, 0.5 * e + 1.3 * step + 2.0)});
      out.push_back({p + "w2", wave({K, N}, 0.19, 2.1 * e + 0.7 * step + 1.0)});
    }
    return out;
  }
  at::Tensor example_input(c10::Device d) const { return moe_input(d); }
  at::Tensor forward(const at::Tensor& x) { return moe->forward(sites::slice(x, 1, 0, K), sites::slice(x, 1, K, E)); }
};

// Site 4.
struct CutlassModel : torch::nn::Module {
  std::shared_ptr<gk::kernels::CutlassMoe> moe;
  explicit CutlassModel(c10::Device d) {
    moe = register_module("moe", std::make_shared<gk::kernels::CutlassMoe>(E, K, N, TOPK, d));
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    return {{"moe.w13_weight", wave({E, 2 * N, K}, 0.13, 1.0 * step)},
            {"moe.w2_weight", wave({E, K, N}, 0.17, 1.1 * step + 0.5)}};
  }
  at::Tensor example_input(c10::Device d) const { return moe_input(d); }
  at::Tensor forward(const at::Tensor& x) { return moe->forward(sites::slice(x, 1, 0, K), sites::slice(x, 1, K, E)); }
  const CutlassExperts& experts() const { return dynamic_cast<const CutlassExperts&>(moe->experts()); }
};

// Site 10.
struct W4A8Model : torch::nn::Module {
  std::shared_ptr<gk::kernels::W4A8Moe> moe;
  explicit W4A8Model(c10::Device d) {
    moe = register_module("moe", std::make_shared<gk::kernels::W4A8Moe>(E, K, N, TOPK, G, d));
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    return {{"moe.w13_qweight", ints({E, 2 * N, K / 2}, 37, 11 + 53 * step, 256, at::kByte)},
            {"moe.w13_scales", scales({E, 2 * N, K / G}, 0.3 + step)},
            {"moe.w2_qweight", ints({E, K, N / 2}, 59, 5 + 71 * step, 256, at::kByte)},
            {"moe.w2_scales", scales({E, K, N / G}, 1.9 + step)}};
  }
  at::Tensor example_input(c10::Device d) const { return moe_input(d); }
  at::Tensor forward(const at::Tensor& x) { return moe->forward(sites::slice(x, 1, 0, K), sites::slice(x, 1, K, E)); }
  const CutlassW4A8Experts& experts() const { return dynamic_cast<const CutlassW4A8Experts&>(moe->experts()); }
};

// Site 11.
struct Wna16Model : torch::nn::Module {
  std::shared_ptr<gk::kernels::Rdna3Wna16Moe> moe;
  explicit Wna16Model(c10::Device d) {
    moe = register_module("moe", std::make_shared<gk::kernels::Rdna3Wna16Moe>(E, K, N, TOPK, MAX_TOKENS, d));
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    return {{"moe.w13_qweight", ints({E, 2 * N, K}, 29, 7 + 31 * step, 255, at::kChar, 127)},
            {"moe.w13_scales", scales({E, 2 * N}, 0.7 + step)},
            {"moe.w2_qweight", ints({E, K, N}, 43, 3 + 17 * step, 255, at::kChar, 127)},
            {"moe.w2_scales", scales({E, K}, 2.3 + step)}};
  }
  at::Tensor example_input(c10::Device d) const { return moe_input(d); }
  at::Tensor forward(const at::Tensor& x) { return moe->forward(sites::slice(x, 1, 0, K), sites::slice(x, 1, K, E)); }
};

// The Qwen3-MoE experts, held as the example engine's SparseMoe holds them:
// PWAL rebuilds the experts object; the weights are the parameters, in WT.
class SwigluLayer : public torch::nn::Module, public gk::DescribedLayer<SwigluLayer> {
 public:
  SwigluLayer(c10::Device d, at::ScalarType wt) {
    w13_ = checkpoint_param("w13", {E, 2 * N, K}, wt, d);
    w2_ = checkpoint_param("w2", {E, K, N}, wt, d);
  }
  void process_weights_after_loading() override {
    experts_ = std::make_unique<SwigluExperts>(E, K, N, TOPK, /*norm_topk_prob=*/true, w13_.device());
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& logits) {
    return experts_->apply({x, logits, w13_, w2_, {}, {}});
  }
  const SwigluExperts& experts() const { return dynamic_cast<const SwigluExperts&>(*experts_); }

 private:
  at::Tensor w13_, w2_;
  std::unique_ptr<gk::kernels::MoeExperts> experts_;
  GRAPHKEEP_DESCRIBE_DERIVED(SwigluLayer, (torch::nn::Module, gk::DescribedLayer<SwigluLayer>), (w13_, gk::parameter),
                             (w2_, gk::parameter), experts_)
};

template <at::ScalarType WT>
struct SwigluModelT : torch::nn::Module {
  std::shared_ptr<SwigluLayer> moe;
  explicit SwigluModelT(c10::Device d) { moe = register_module("moe", std::make_shared<SwigluLayer>(d, WT)); }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    return {{"moe.w13", wave({E, 2 * N, K}, 0.13, 1.0 * step).to(WT)},
            {"moe.w2", wave({E, K, N}, 0.17, 1.1 * step + 0.5).to(WT)}};
  }
  at::Tensor example_input(c10::Device d) const { return moe_input(d); }
  at::Tensor forward(const at::Tensor& x) { return moe->forward(sites::slice(x, 1, 0, K), sites::slice(x, 1, K, E)); }
  const SwigluExperts& experts() const { return moe->experts(); }
};
using SwigluModel = SwigluModelT<at::kFloat>;
using SwigluBf16Model = SwigluModelT<at::kBFloat16>;

// transformers' Qwen3MoeSparseMoeBlock in float32 (tests/hf/README.md): softmax
// over all experts, torch.topk, renormalized when `norm`; each expert hit by
// some token in ascending order, its output times the token's weight added
// with index_add_. The weights are widened to float32 first.
at::Tensor qwen3_moe_reference(const at::Tensor& x, const at::Tensor& logits, const at::Tensor& w13,
                               const at::Tensor& w2, int64_t topk, bool norm) {
  const at::Tensor probs = at::softmax(logits, 1, at::kFloat);
  auto [w, idx] = at::topk(probs, topk, 1);
  if (norm) w = w / w.sum(-1, /*keepdim=*/true);
  const int64_t n = w13.size(1) / 2;
  at::Tensor out = at::zeros_like(x);
  for (int64_t e = 0; e < w13.size(0); ++e) {
    const at::Tensor hit = idx.eq(e);
    const at::Tensor rows = hit.any(1).nonzero().view(-1);
    if (rows.numel() == 0) continue;
    const at::Tensor h = at::mm(x.index_select(0, rows), w13[e].to(at::kFloat).t());
    const at::Tensor a = at::silu(h.narrow(1, 0, n)) * h.narrow(1, n, n);
    const at::Tensor o = at::mm(a, w2[e].to(at::kFloat).t());
    out.index_add_(0, rows, o * (w * hit.to(at::kFloat)).sum(1).index_select(0, rows).unsqueeze(1));
  }
  return out;
}

// Router logits with many exact ties: small integers (and, with `spread`, a
// distinct fraction on some tokens).
at::Tensor tied_logits(int64_t tokens, int64_t experts, uint32_t seed, bool spread) {
  std::mt19937 rng(seed);
  std::vector<float> v(static_cast<std::size_t>(tokens * experts));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(rng() % 3);
    if (spread && (i / static_cast<std::size_t>(experts)) % 2 == 1) v[i] += static_cast<float>(rng() % 1000) * 1e-3f;
  }
  return at::tensor(v, at::kFloat).reshape({tokens, experts});
}

// One call of a fresh SwigluExperts of the given shape on `d`, eagerly.
at::Tensor swiglu_apply(c10::Device d, int64_t experts, int64_t topk, bool norm, const at::Tensor& x,
                        const at::Tensor& logits, const at::Tensor& w13, const at::Tensor& w2) {
  const SwigluExperts ex(experts, x.size(1), w2.size(2), topk, norm, d);
  at::Tensor y = ex.apply({x.to(d), logits.to(d), w13.to(d), w2.to(d), {}, {}});
  sites::sync(d);
  return y.to(at::kCPU);
}

// The units in the last place between a and b (finite floats of one sign).
int64_t ulps(float a, float b) {
  return std::abs(static_cast<int64_t>(gk::numerics::bits_of(a)) - static_cast<int64_t>(gk::numerics::bits_of(b)));
}

const gk::PlannedSlot* find_slot(const gk::SlotPlan& plan, const std::string& name) {
  for (const auto& l : plan.layers())
    for (const auto& s : l.slots)
      if (s.name == name) return &s;
  return nullptr;
}

// GPU child scenario: reload with `member` (a full slot name) treated as
// undeclared (gk::testing::EngineHooks::undeclared_members), so the reload frees the
// captured storage of the tensor `hidden` returns; then let the
// caching allocator hand the freed block to new tensors filled with the byte
// `fill` (as any other owner's data would be), replay anyway, as an engine
// without graphkeep does, and print what happened:
//   "REUSED" or "NO_REUSE"           whether a new tensor took the freed block
//   "REPLAY maxdiff=<x> nan=<n>"    the replay against a fresh model
//   "VICTIM_CORRUPTED bytes=<n>"    the replay wrote into the new tensor
//   "CUDA_ERROR <what>"             e.g. an illegal memory access
// It leaves with _Exit, so a poisoned CUDA context cannot hang the teardown.
template <class Model>
int replay_after_reuse_child(const std::string& member, const std::function<at::Tensor(Model&)>& hidden, int fill) {
  try {
    sites::Rig<Model> rig(sites::gpu(), {}, sites::with_undeclared_unverified(member));
    std::uintptr_t begin = 0;
    int64_t bytes = 0;
    {
      const at::Tensor h = hidden(*rig.model);
      begin = reinterpret_cast<std::uintptr_t>(h.data_ptr());
      bytes = static_cast<int64_t>(h.nbytes());
    }
    rig.reload(1);
    std::vector<at::Tensor> victims;
    at::Tensor victim;
    for (int i = 0; i < 200000 && !victim.defined(); ++i) {
      at::Tensor v = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(sites::gpu()));
      const auto vb = reinterpret_cast<std::uintptr_t>(v.data_ptr());
      if (vb <= begin && begin < vb + static_cast<std::uintptr_t>(bytes)) victim = v;
      victims.push_back(std::move(v));
    }
    std::printf("%s after %zu allocations\n", victim.defined() ? "REUSED" : "NO_REUSE", victims.size());
    std::fflush(stdout);
    at::Tensor before;
    if (victim.defined()) {
      victim.fill_(fill);
      before = victim.to(at::kCPU);
    }
    sites::sync(sites::gpu());
    try {
      const at::Tensor y = rig.replay_unchecked();
      if (victim.defined()) {
        const int64_t changed = victim.to(at::kCPU).ne(before).sum().item<int64_t>();
        if (changed > 0) std::printf("VICTIM_CORRUPTED bytes=%lld\n", static_cast<long long>(changed));
      }
      const at::Tensor want = sites::fresh_output<Model>(sites::gpu(), 1, rig.input);
      const double maxdiff = (y.to(at::kDouble) - want.to(at::kDouble)).abs().nan_to_num(1e30).max().item<double>();
      std::printf("REPLAY maxdiff=%g nan=%lld\n", maxdiff, static_cast<long long>(at::isnan(y).sum().item<int64_t>()));
    } catch (const std::exception& e) {
      std::printf("CUDA_ERROR %s\n", e.what());
    }
    std::fflush(stdout);
    std::_Exit(0);  // inside the rig's scope: no teardown on a poisoned context
  } catch (const std::exception& e) {
    std::printf("SETUP_ERROR %s\n", e.what());  // not a failure the parent accepts
  }
  std::fflush(stdout);
  std::_Exit(0);
}

}  // namespace

// --- GPU child scenarios -------------------------------------------------------------

// Site 2: the reload frees the captured shuffled w2; the replay reads the old
// weights (or whatever reused the block): a wrong result.
GK_TEST_CHILD(moe_site2_freed_shuffled_weight) {
  return sites::replay_after_hidden_reload_child<ShuffleModel>("moe.w2_shuffled_");
}

// Site 4: the freed ab_strides2 block now holds 0x7f bytes: GEMM2 computes
// its A and B addresses with a stride of ~9.2e18 elements: an illegal access.
GK_TEST_CHILD(moe_site4_freed_strides) {
  return replay_after_reuse_child<CutlassModel>(
      "moe.experts_.strides_.ab_strides2", [](CutlassModel& m) { return m.experts().strides().ab_strides2; }, 0x7f);
}

// Site 10: the same with the freed s_strides1 (group-scale row stride of GEMM1).
GK_TEST_CHILD(moe_site10_freed_strides) {
  return replay_after_reuse_child<W4A8Model>(
      "moe.experts_.s_strides1_", [](W4A8Model& m) { return m.experts().s_strides1(); }, 0x7f);
}

// Site 11: the freed w1 scratch now belongs to another tensor; the replay
// writes the staged weights into it (its own output stays right).
GK_TEST_CHILD(moe_site11_freed_scratch) {
  return replay_after_reuse_child<Wna16Model>(
      "moe.kernel_.rdna3_w1_buf_", [](Wna16Model& m) { return m.moe->kernel().w1_buf(); }, 0x5a);
}

TEST_SUITE("cpu") {
  TEST_CASE("moe sites: the catalog lists every key slot with its role") {
    using R = gk::Registry<gk::kernels::MoeTypes>;
    const auto table = R::table();
    auto role_of = [&](std::string_view root, std::string_view path) -> const gk::TableEntry* {
      for (const auto& e : table)
        if (e.root == root && e.path_equals(path)) return &e;
      return nullptr;
    };
    struct Want {
      std::string_view root, path;
      gk::Role role;
      gk::Init init;
    };
    for (const Want& w : {Want{"ShuffledMoe", "w13_shuffled_", gk::Role::derived_weight, gk::Init::copy_new},
                          Want{"ShuffledMoe", "w2_shuffled_", gk::Role::derived_weight, gk::Init::copy_new},
                          Want{"CutlassExperts", "strides_.ab_strides1", gk::Role::metadata, gk::Init::copy_new},
                          Want{"CutlassExperts", "strides_.c_strides2", gk::Role::metadata, gk::Init::copy_new},
                          Want{"CutlassW4A8Experts", "s_strides1_", gk::Role::metadata, gk::Init::copy_new},
                          Want{"W4A8Moe", "w13_packed_", gk::Role::derived_weight, gk::Init::copy_new},
                          Want{"W4A8Moe", "w13_scales_t_", gk::Role::scale, gk::Init::copy_new},
                          Want{"Rdna3Wna16Kernel", "rdna3_w1_buf_", gk::Role::scratch, gk::Init::preserve},
                          Want{"Rdna3Wna16Moe", "kernel_.rdna3_act_buf_", gk::Role::scratch, gk::Init::preserve}}) {
      CAPTURE(w.root);
      CAPTURE(w.path);
      const gk::TableEntry* e = role_of(w.root, w.path);
      REQUIRE(e != nullptr);
      CHECK(e->role.role == w.role);
      CHECK(e->role.effective_init() == w.init);
    }
    const gk::TableEntry* experts = role_of("CutlassMoe", "experts_");
    REQUIRE(experts != nullptr);
    CHECK(experts->kind == gk::TableEntry::Kind::dynamic);
  }

  // Site 2
  // The shuffles are declared by_layout(): patches re-run no PWAL.
  TEST_CASE("site 2 MoE shuffled w13/w2: positive") {
    sites::positive<ShuffleModel>(sites::cpu(), true, /*rerun=*/0);
  }
  TEST_CASE("site 2 MoE shuffled w13/w2: negative (copy-back disabled)") {
    sites::negative_unprotected<ShuffleModel>(sites::cpu(), "moe.w13_shuffled_");
    sites::negative_unprotected<ShuffleModel>(sites::cpu(), "moe.w2_shuffled_");
  }
  TEST_CASE("site 2 MoE shuffled w13/w2: negative (undeclared)") {
    sites::negative_undeclared<ShuffleModel>(sites::cpu(), "moe.w2_shuffled_");
  }

  // Site 4
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides: positive") {
    // The strides are declared from_shapes: a patch runs no PWAL.
    sites::positive<CutlassModel>(sites::cpu(), true, /*rerun=*/0);
  }
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides: ab_strides1 and c_strides2 are one slot with two paths") {
    sites::Rig<CutlassModel> rig(sites::cpu());
    const gk::PlannedSlot* s = find_slot(rig.engine->plan(), "moe.experts_.strides_.ab_strides1");
    REQUIRE(s != nullptr);
    REQUIRE(s->paths.size() == 2);
    CHECK(s->paths[1].str() == "experts_.strides_.c_strides2");
    CHECK(find_slot(rig.engine->plan(), "moe.experts_.strides_.c_strides2") == nullptr);
    const void* captured = rig.model->experts().strides().ab_strides1.data_ptr();
    for (int step = 1; step <= 2; ++step) {
      CAPTURE(step);
      const auto* experts_before = &rig.model->experts();
      rig.reload(step);
      CHECK(&rig.model->experts() != experts_before);  // PWAL really rebuilt the experts object (both lived at once)
      CHECK(rig.model->experts().strides().ab_strides1.data_ptr() == captured);
      CHECK(rig.model->experts().strides().c_strides2.is_same(rig.model->experts().strides().ab_strides1));
      CHECK(sites::same(rig.replay(), sites::fresh_output<CutlassModel>(sites::cpu(), step, rig.input), true));
    }
  }
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides: negative (copy-back disabled: drift found, values unchanged)") {
    sites::unprotected_drift_detected<CutlassModel>(sites::cpu(), "moe.experts_.strides_.ab_strides1");
    sites::unprotected_drift_detected<CutlassModel>(sites::cpu(), "moe.experts_.strides_.c_strides1");
  }
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides: negative (undeclared)") {
    sites::negative_undeclared<CutlassModel>(sites::cpu(), "moe.experts_.strides_.ab_strides2");
  }

  // Site 10
  TEST_CASE("site 10 W4A8 grouped-GEMM a/c/s strides: positive") {
    // Its strides are from_shapes, its packed words by blocks of four
    // checkpoint bytes, its transposed scales by_layout: a patch re-runs
    // nothing.
    sites::positive<W4A8Model>(sites::cpu(), true, /*rerun=*/0);
  }
  TEST_CASE("site 10 W4A8 grouped-GEMM a/c/s strides: negative (copy-back disabled)") {
    sites::negative_unprotected<W4A8Model>(sites::cpu(), "moe.w13_packed_");
    sites::negative_unprotected<W4A8Model>(sites::cpu(), "moe.w2_scales_t_");
    sites::unprotected_drift_detected<W4A8Model>(sites::cpu(), "moe.experts_.s_strides1_");
  }
  TEST_CASE("site 10 W4A8 grouped-GEMM a/c/s strides: negative (undeclared)") {
    sites::negative_undeclared<W4A8Model>(sites::cpu(), "moe.experts_.s_strides1_");
  }

  // Site 11
  TEST_CASE("site 11 RDNA3 WNA16 scratch: positive") {
    sites::positive<Wna16Model>(sites::cpu(), true, /*rerun=*/0);  // scratch only: nothing derived
  }
  TEST_CASE("site 11 RDNA3 WNA16 scratch: negative (copy-back disabled: drift found, output unchanged)") {
    sites::unprotected_drift_detected<Wna16Model>(sites::cpu(), "moe.kernel_.rdna3_w1_buf_");
  }
  TEST_CASE("site 11 RDNA3 WNA16 scratch: negative (undeclared)") {
    sites::negative_undeclared<Wna16Model>(sites::cpu(), "moe.kernel_.rdna3_w1_buf_");
  }

  // The Qwen3-MoE experts
  TEST_CASE("Qwen3-MoE SwigluExperts: the catalog lists its stride arrays") {
    using R = gk::Registry<gk::kernels::MoeTypes>;
    int strides = 0;
    for (const auto& e : R::table()) {
      if (e.root != "SwigluExperts") continue;
      for (const char* p : {"strides_.ab_strides1", "strides_.ab_strides2", "strides_.c_strides1", "strides_.c_strides2"})
        if (e.path_equals(p)) {
          CHECK(e.role.role == gk::Role::metadata);
          CHECK(e.role.effective_init() == gk::Init::copy_new);
          ++strides;
        }
    }
    CHECK(strides == 4);
  }
  TEST_CASE("Qwen3-MoE SwigluExperts: positive (float32 and bfloat16 weights)") {
    sites::positive<SwigluModel>(sites::cpu(), true, /*rerun=*/0);
    sites::positive<SwigluBf16Model>(sites::cpu(), true, /*rerun=*/0);
  }
  TEST_CASE("Qwen3-MoE SwigluExperts: PWAL rebuilds the experts object, the captured strides stay") {
    sites::Rig<SwigluModel> rig(sites::cpu());
    const gk::PlannedSlot* s = find_slot(rig.engine->plan(), "moe.experts_.strides_.ab_strides1");
    REQUIRE(s != nullptr);
    REQUIRE(s->paths.size() == 2);
    CHECK(s->paths[1].str() == "experts_.strides_.c_strides2");
    const void* captured = rig.model->experts().strides().ab_strides2.data_ptr();
    for (int step = 1; step <= 2; ++step) {
      CAPTURE(step);
      const auto* before = &rig.model->experts();
      rig.reload(step);
      CHECK(&rig.model->experts() != before);
      CHECK(rig.model->experts().strides().ab_strides2.data_ptr() == captured);
      CHECK(rig.model->experts().norm_topk_prob());
      CHECK(sites::same(rig.replay(), sites::fresh_output<SwigluModel>(sites::cpu(), step, rig.input), true));
    }
  }
  TEST_CASE("Qwen3-MoE SwigluExperts: negative (copy-back disabled: drift found, values unchanged)") {
    // The strides are the same values after every PWAL, so a forced replay
    // still computes the right output from the old storage; the manifest
    // reports the moved address all the same and replay is refused.
    sites::unprotected_drift_detected<SwigluModel>(sites::cpu(), "moe.experts_.strides_.ab_strides1");
    sites::unprotected_drift_detected<SwigluModel>(sites::cpu(), "moe.experts_.strides_.c_strides1");
  }
  TEST_CASE("Qwen3-MoE SwigluExperts: negative (undeclared)") {
    sites::negative_undeclared<SwigluModel>(sites::cpu(), "moe.experts_.strides_.ab_strides2");
  }
  TEST_CASE("Qwen3-MoE SwigluExperts: equals transformers' sparse block, exact ties included") {
    // (experts, topk): 8/2 and 16/4 are the tiny and small reference models.
    for (auto [experts, topk] : {std::pair<int64_t, int64_t>{8, 2}, {16, 4}, {4, 1}, {6, 6}})
      for (const bool norm : {true, false})
        for (const at::ScalarType wt : {at::kFloat, at::kBFloat16, at::kHalf})
          for (const bool spread : {false, true}) {
            CAPTURE(experts);
            CAPTURE(topk);
            CAPTURE(norm);
            CAPTURE(wt);
            CAPTURE(spread);
            const int64_t tokens = 64, k = 16, n = 8;
            const at::Tensor x = wave({tokens, k}, 0.29, 0.3, 1.0);
            const at::Tensor logits = tied_logits(tokens, experts, static_cast<uint32_t>(experts * 7 + topk), spread);
            // weights of the storage type; float16 with a few subnormals
            const at::Tensor w13 = (wave({experts, 2 * n, k}, 0.37, 0.1) * (wt == at::kHalf ? 1e-4 : 1.0)).to(wt);
            const at::Tensor w2 = wave({experts, k, n}, 0.41, 0.7).to(wt);
            const at::Tensor y = swiglu_apply(sites::cpu(), experts, topk, norm, x, logits, w13, w2);
            const at::Tensor want = qwen3_moe_reference(x, logits, w13, w2, topk, norm);
            const double scale = std::max(1e-30, want.abs().max().item<double>());
            CHECK((y - want).abs().max().item<double>() / scale < 1e-5);
          }
  }
  TEST_CASE("Qwen3-MoE routing: torch_topk_order is torch.topk's order, ties and NaNs included") {
    std::mt19937 rng(12345);
    int64_t cases = 0, tie_orders = 0;
    for (const int64_t n : {1, 2, 3, 4, 5, 8, 16, 17, 33, 64, 128, 160})
      for (const int64_t k : {1, 2, 3, 4, 8, 17, 18, 20}) {
        if (k > n) continue;
        for (int trial = 0; trial < 40; ++trial) {
          std::vector<float> v(static_cast<std::size_t>(n));
          const uint32_t distinct = 1 + trial % 5;
          for (float& f : v) f = static_cast<float>(rng() % distinct) * 0.25f;
          if (trial % 10 == 9) v[rng() % v.size()] = std::numeric_limits<float>::quiet_NaN();
          std::vector<int32_t> q(static_cast<std::size_t>(n));
          gk::numerics::torch_topk_order(v.data(), n, k, q.data());
          const at::Tensor want = std::get<1>(at::topk(at::tensor(v, at::kFloat), k));
          const at::Tensor got = at::tensor(std::vector<int32_t>(q.begin(), q.begin() + k), at::kInt).to(at::kLong);
          INFO("n " << n << " k " << k << " trial " << trial << ": torch " << want << " ours " << got);
          CHECK(at::equal(got, want));
          ++cases;
          // count the cases where lower-index-first would have been wrong
          std::vector<int32_t> stable(static_cast<std::size_t>(n));
          std::iota(stable.begin(), stable.end(), 0);
          std::stable_sort(stable.begin(), stable.end(), [&](int32_t a, int32_t b) {
            const float x = v[static_cast<std::size_t>(a)], y = v[static_cast<std::size_t>(b)];
            return (std::isnan(x) && !std::isnan(y)) || x > y;
          });
          tie_orders += std::equal(q.begin(), q.begin() + k, stable.begin()) ? 0 : 1;
        }
      }
    MESSAGE(cases << " cases, " << tie_orders << " where torch's order is not lower index first");
    CHECK(tie_orders > cases / 10);  // the inputs really exercise the tie order
  }
  TEST_CASE("Qwen3-MoE routing: fexp within 2 ulp, fsilu as ATen's silu") {
    int64_t worst = 0;
    for (int64_t i = 0; i <= 2000000; ++i) {
      const float x = static_cast<float>(-104.0 + (88.7 + 104.0) * static_cast<double>(i) / 2000000.0);
      const float want = static_cast<float>(std::exp(static_cast<double>(x)));
      if (want < std::numeric_limits<float>::min()) continue;  // subnormal results: absolute error only
      worst = std::max(worst, ulps(gk::numerics::fexp(x), want));
    }
    MESSAGE("fexp: worst " << worst << " ulp");
    CHECK(worst <= 2);
    CHECK(gk::numerics::fexp(0.f) == 1.f);
    CHECK(gk::numerics::fexp(-std::numeric_limits<float>::infinity()) == 0.f);
    CHECK(std::isinf(gk::numerics::fexp(100.f)));
    CHECK(std::isnan(gk::numerics::fexp(std::numeric_limits<float>::quiet_NaN())));
    const at::Tensor xs = at::linspace(-30, 30, 6001, at::kFloat);
    const at::Tensor want = at::silu(xs);
    std::vector<float> got(6001);
    for (int64_t i = 0; i < 6001; ++i) got[static_cast<std::size_t>(i)] = gk::numerics::fsilu(xs[i].item<float>());
    CHECK(at::allclose(at::tensor(got, at::kFloat), want, 1e-6, 1e-30));
  }
}

TEST_SUITE("gpu") {
  // Site 2
  TEST_CASE("site 2 MoE shuffled w13/w2 on CUDA graphs: positive") { sites::positive<ShuffleModel>(sites::gpu()); }
  TEST_CASE("site 2 MoE shuffled w13/w2 on CUDA graphs: negative (copy-back disabled)") {
    sites::negative_unprotected<ShuffleModel>(sites::gpu(), "moe.w13_shuffled_");
  }
  TEST_CASE("site 2 MoE shuffled w13/w2 on CUDA graphs: negative (undeclared)") {
    sites::negative_undeclared<ShuffleModel>(sites::gpu(), "moe.w2_shuffled_");
  }
  TEST_CASE("site 2 MoE shuffled w13/w2 on CUDA graphs: replay after a hidden reload is wrong") {
    sites::check_child_shows_failure(gk::testing::run_child("moe_site2_freed_shuffled_weight"));
  }

  // Site 4
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides on CUDA graphs: positive") {
    sites::positive<CutlassModel>(sites::gpu());
  }
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides on CUDA graphs: negative (copy-back disabled)") {
    sites::unprotected_drift_detected<CutlassModel>(sites::gpu(), "moe.experts_.strides_.ab_strides1");
  }
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides on CUDA graphs: negative (undeclared)") {
    sites::negative_undeclared<CutlassModel>(sites::gpu(), "moe.experts_.strides_.ab_strides2");
  }
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides on CUDA graphs: replay over freed strides fails") {
    const gk::testing::ChildResult r = gk::testing::run_child("moe_site4_freed_strides");
    INFO("child output: " << r.output);
    CHECK(r.output.find("REUSED") != std::string::npos);
    sites::check_child_shows_failure(r);
  }

  // Site 10
  TEST_CASE("site 10 W4A8 grouped-GEMM a/c/s strides on CUDA graphs: positive") {
    sites::positive<W4A8Model>(sites::gpu());
  }
  TEST_CASE("site 10 W4A8 grouped-GEMM a/c/s strides on CUDA graphs: negative (copy-back disabled)") {
    sites::negative_unprotected<W4A8Model>(sites::gpu(), "moe.w13_packed_");
    sites::unprotected_drift_detected<W4A8Model>(sites::gpu(), "moe.experts_.s_strides1_");
  }
  TEST_CASE("site 10 W4A8 grouped-GEMM a/c/s strides on CUDA graphs: negative (undeclared)") {
    sites::negative_undeclared<W4A8Model>(sites::gpu(), "moe.experts_.s_strides1_");
  }
  TEST_CASE("site 10 W4A8 grouped-GEMM a/c/s strides on CUDA graphs: replay over freed strides fails") {
    const gk::testing::ChildResult r = gk::testing::run_child("moe_site10_freed_strides");
    INFO("child output: " << r.output);
    CHECK(r.output.find("REUSED") != std::string::npos);
    sites::check_child_shows_failure(r);
  }

  // Site 11
  TEST_CASE("site 11 RDNA3 WNA16 scratch on CUDA graphs: positive") { sites::positive<Wna16Model>(sites::gpu()); }
  TEST_CASE("site 11 RDNA3 WNA16 scratch on CUDA graphs: negative (copy-back disabled: drift found)") {
    sites::unprotected_drift_detected<Wna16Model>(sites::gpu(), "moe.kernel_.rdna3_w1_buf_");
  }
  TEST_CASE("site 11 RDNA3 WNA16 scratch on CUDA graphs: negative (undeclared)") {
    sites::negative_undeclared<Wna16Model>(sites::gpu(), "moe.kernel_.rdna3_w1_buf_");
  }
  // The Qwen3-MoE experts
  TEST_CASE("Qwen3-MoE SwigluExperts on CUDA graphs: positive") {
    sites::positive<SwigluModel>(sites::gpu());
    sites::positive<SwigluBf16Model>(sites::gpu());
  }
  TEST_CASE("Qwen3-MoE SwigluExperts on CUDA graphs: negative (copy-back disabled, undeclared)") {
    sites::unprotected_drift_detected<SwigluModel>(sites::gpu(), "moe.experts_.strides_.ab_strides1");
    sites::negative_undeclared<SwigluModel>(sites::gpu(), "moe.experts_.strides_.ab_strides2");
  }
  TEST_CASE("Qwen3-MoE SwigluExperts: the CUDA kernel equals its CPU twin bit for bit") {
    for (const at::ScalarType wt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      CAPTURE(wt);
      const int64_t tokens = 200, experts = 16, topk = 4, k = 32, n = 16;
      const at::Tensor x = wave({tokens, k}, 0.29, 0.3, 1.0);
      const at::Tensor logits = tied_logits(tokens, experts, 99, true);
      const at::Tensor w13 = wave({experts, 2 * n, k}, 0.37, 0.1).to(wt);
      const at::Tensor w2 = wave({experts, k, n}, 0.41, 0.7).to(wt);
      const at::Tensor on_cpu = swiglu_apply(sites::cpu(), experts, topk, true, x, logits, w13, w2);
      const at::Tensor on_gpu = swiglu_apply(sites::gpu(), experts, topk, true, x, logits, w13, w2);
      CHECK(at::equal(on_cpu, on_gpu));
      const at::Tensor want = qwen3_moe_reference(x, logits, w13, w2, topk, true);
      CHECK((on_gpu - want).abs().max().item<double>() / want.abs().max().item<double>() < 1e-5);
    }
  }

  TEST_CASE("site 11 RDNA3 WNA16 scratch on CUDA graphs: replay writes through the freed scratch") {
    const gk::testing::ChildResult r = gk::testing::run_child("moe_site11_freed_scratch");
    INFO("child output: " << r.output);
    CHECK(r.output.find("REUSED") != std::string::npos);
    MESSAGE("child: " << sites::child_summary(r));
    // The kernel writes its scratch before reading it, so its own output
    // stays right; the damage is to the tensor that now owns the block.
    const bool corrupted = r.output.find("VICTIM_CORRUPTED") != std::string::npos;
    const bool error = r.output.find("CUDA_ERROR") != std::string::npos || r.signaled || r.exit_code != 0;
    CHECK((corrupted || error));
  }
}
