// The MoE failure sites (2, 4, 10, 11), each as a registered layer, on the
// CPU replay backend (suite cpu) and on real CUDA graphs (suite gpu).
//   site 2   shuffled expert weights (AITER shuffle)       gk::kernels::ShuffledMoe
//   site 4   CUTLASS grouped GEMM stride arrays             gk::kernels::CutlassMoe / CutlassExperts
//   site 10  W4A8 grouped GEMM a/c/s stride arrays          gk::kernels::W4A8Moe / CutlassW4A8Experts
//   site 11  kernel-owned scratch (RDNA3 WNA16)             gk::kernels::Rdna3Wna16Moe / Rdna3Wna16Kernel
#include "site_harness.h"

#include <graphkeep/kernels/catalog.h>
#include <graphkeep/reload/collector.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

namespace {

using gk::kernels::CutlassExperts;
using gk::kernels::CutlassW4A8Experts;

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

const gk::PlannedSlot* find_slot(const gk::SlotPlan& plan, const std::string& name) {
  for (const auto& l : plan.layers())
    for (const auto& s : l.slots)
      if (s.name == name) return &s;
  return nullptr;
}

// GPU child scenario: reload with `member` (a full slot name) treated as
// undeclared (ReloadOptions::undeclared_members), so the reload frees the
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
    gk::ReloadOptions opts;
    opts.verify = false;
    sites::Rig<Model> rig(sites::gpu(), sites::with_undeclared(member, opts));
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
      "moe.experts_.ab_strides2_", [](CutlassModel& m) { return m.experts().ab_strides2(); }, 0x7f);
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
                          Want{"CutlassExperts", "ab_strides1_", gk::Role::metadata, gk::Init::copy_new},
                          Want{"CutlassExperts", "c_strides2_", gk::Role::metadata, gk::Init::copy_new},
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
  TEST_CASE("site 2 MoE shuffled w13/w2: positive") { sites::positive<ShuffleModel>(sites::cpu()); }
  TEST_CASE("site 2 MoE shuffled w13/w2: negative (copy-back disabled)") {
    sites::negative_unprotected<ShuffleModel>(sites::cpu(), "moe.w13_shuffled_");
    sites::negative_unprotected<ShuffleModel>(sites::cpu(), "moe.w2_shuffled_");
  }
  TEST_CASE("site 2 MoE shuffled w13/w2: negative (undeclared)") {
    sites::negative_undeclared<ShuffleModel>(sites::cpu(), "moe.w2_shuffled_");
  }

  // Site 4
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides: positive") { sites::positive<CutlassModel>(sites::cpu()); }
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides: ab_strides1 and c_strides2 are one slot with two paths") {
    sites::Rig<CutlassModel> rig(sites::cpu());
    const gk::PlannedSlot* s = find_slot(rig.engine->plan(), "moe.experts_.ab_strides1_");
    REQUIRE(s != nullptr);
    REQUIRE(s->paths.size() == 2);
    CHECK(s->paths[1].str() == "experts_.c_strides2_");
    CHECK(find_slot(rig.engine->plan(), "moe.experts_.c_strides2_") == nullptr);
    const void* captured = rig.model->experts().ab_strides1().data_ptr();
    for (int step = 1; step <= 2; ++step) {
      CAPTURE(step);
      const auto* experts_before = &rig.model->experts();
      rig.reload(step);
      CHECK(&rig.model->experts() != experts_before);  // PWAL really rebuilt the experts object (both lived at once)
      CHECK(rig.model->experts().ab_strides1().data_ptr() == captured);
      CHECK(rig.model->experts().c_strides2().is_same(rig.model->experts().ab_strides1()));
      CHECK(sites::same(rig.replay(), sites::fresh_output<CutlassModel>(sites::cpu(), step, rig.input), true));
    }
  }
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides: negative (copy-back disabled: drift found, values unchanged)") {
    sites::unprotected_drift_detected<CutlassModel>(sites::cpu(), "moe.experts_.ab_strides1_");
    sites::unprotected_drift_detected<CutlassModel>(sites::cpu(), "moe.experts_.c_strides1_");
  }
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides: negative (undeclared)") {
    sites::negative_undeclared<CutlassModel>(sites::cpu(), "moe.experts_.ab_strides2_");
  }

  // Site 10
  TEST_CASE("site 10 W4A8 grouped-GEMM a/c/s strides: positive") { sites::positive<W4A8Model>(sites::cpu()); }
  TEST_CASE("site 10 W4A8 grouped-GEMM a/c/s strides: negative (copy-back disabled)") {
    sites::negative_unprotected<W4A8Model>(sites::cpu(), "moe.w13_packed_");
    sites::negative_unprotected<W4A8Model>(sites::cpu(), "moe.w2_scales_t_");
    sites::unprotected_drift_detected<W4A8Model>(sites::cpu(), "moe.experts_.s_strides1_");
  }
  TEST_CASE("site 10 W4A8 grouped-GEMM a/c/s strides: negative (undeclared)") {
    sites::negative_undeclared<W4A8Model>(sites::cpu(), "moe.experts_.s_strides1_");
  }

  // Site 11
  TEST_CASE("site 11 RDNA3 WNA16 scratch: positive") { sites::positive<Wna16Model>(sites::cpu()); }
  TEST_CASE("site 11 RDNA3 WNA16 scratch: negative (copy-back disabled: drift found, output unchanged)") {
    sites::unprotected_drift_detected<Wna16Model>(sites::cpu(), "moe.kernel_.rdna3_w1_buf_");
  }
  TEST_CASE("site 11 RDNA3 WNA16 scratch: negative (undeclared)") {
    sites::negative_undeclared<Wna16Model>(sites::cpu(), "moe.kernel_.rdna3_w1_buf_");
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
    sites::unprotected_drift_detected<CutlassModel>(sites::gpu(), "moe.experts_.ab_strides1_");
  }
  TEST_CASE("site 4 CUTLASS grouped-GEMM strides on CUDA graphs: negative (undeclared)") {
    sites::negative_undeclared<CutlassModel>(sites::gpu(), "moe.experts_.ab_strides2_");
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
