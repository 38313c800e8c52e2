// The Marlin family and closures (sites 5, 6, 12, 13), each as a registered
// class, on the CPU replay backend (suite cpu) and on real CUDA graphs (suite
// gpu, ctest label gpu).
//
//   site 5   MarlinW4A16Linear: split-K lock workspace (gk::workspace(zero)) and
//            g_idx_sort_indices (gk::permutation)
//   site 6   MarlinFp8Linear, MarlinFp4Linear, MarlinMoeLayer: the same lock
//            protocol, each with its own workspace
//   site 12  MacheteW4A16Linear: vLLM's act_perm closure as the registered
//            functor ActPerm
//   site 13  W8A8Int8Linear: the scales CompressedTensorsW8A8Int8 clones in PWAL
#include "site_harness.h"

#include <graphkeep/quant/catalog.h>
#include <graphkeep/quant/act_order.h>
#include <graphkeep/quant/marlin.h>
#include <graphkeep/quant/w8a8.h>

namespace {

using namespace gk::quant;

// --- declarations, checked at compile time -----------------------------------
constexpr auto kW4Table = gk::slot_table<MarlinW4A16Kernel>();
static_assert(kW4Table[1].path_equals("g_idx_sort_indices_") && kW4Table[1].role.role == gk::Role::permutation);
static_assert(kW4Table[2].path_equals("workspace_") && kW4Table[2].role.role == gk::Role::workspace &&
              kW4Table[2].role.effective_init() == gk::Init::zero);
// (The negative tests treat that workspace as undeclared through
// gk::testing::EngineHooks::undeclared_members, an engine's choice at run time: the
// class's declaration above stays what it is. See the test "site 5 Marlin
// W4A16: treating the lock workspace as undeclared leaves the class's
// declaration alone".)
constexpr auto kActPermTable = gk::slot_table<MacheteLinearMethod>();
static_assert(kActPermTable[1].path_equals("act_perm_.act_perm_") &&
              kActPermTable[1].role.role == gk::Role::permutation);
constexpr auto kW8A8Table = gk::slot_table<CompressedTensorsW8A8Int8>();
static_assert(kW8A8Table[0].path_equals("input_scale_") && kW8A8Table[0].role.role == gk::Role::scale);
static_assert(gk::Registry<gk::quant::MarlinTypes>::table().size() > 0);

// Site 12, the closure as a std::function (the compile-fail note).
//
// vLLM keeps `self.act_perm = lambda x: x[:, perm]`. The direct C++ port
//
//   class MacheteLinearMethod {
//     at::Tensor weight_prepacked_;
//     std::function<at::Tensor(const at::Tensor&)> act_perm_;  // [perm](const at::Tensor& x) { return x.index_select(1, perm); }
//     int64_t size_k_, size_n_, group_size_;
//     GRAPHKEEP_DESCRIBE(MacheteLinearMethod, (weight_prepacked_, gk::derived_weight), act_perm_, size_k_,
//                        size_n_, group_size_)
//   };
//
// is rejected when it is compiled:
//
//   error: static assertion failed: graphkeep: MacheteLinearMethod::act_perm_ is a std::function, lambda or
//   functor whose captures graphkeep cannot see: make the functor a registered type (GRAPHKEEP_DESCRIBE) or
//   declare it (act_perm_, gk::opaque("why it captures no device tensor"))
//
// (tests/compile_fail/std_function_member.cpp checks this message for
// std::function members.) gk::quant::ActPerm is that registered functor type.

// --- deterministic checkpoints -------------------------------------------------
at::Tensor wave(at::IntArrayRef shape, double freq, double phase) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return at::sin(at::arange(n, at::kDouble) * freq + phase).to(at::kFloat).reshape(shape);
}

// int4 values in [0, 16), [rows, cols], int64
at::Tensor nibbles(int64_t rows, int64_t cols, int64_t salt, int step) {
  return at::remainder(at::arange(rows * cols, at::kLong) * 7 + at::arange(rows * cols, at::kLong).floor_divide(cols) * 3 +
                           salt + 5 * step,
                       16)
      .reshape({rows, cols});
}

// act-order g_idx: a permutation of the channels cut into groups of `gs`.
at::Tensor act_order_g_idx(int64_t k, int64_t gs, int step) {
  return at::remainder(at::arange(k, at::kLong) * 37 + 11 * step, k).floor_divide(gs).to(at::kInt);
}

at::Tensor example_rows(int64_t m, int64_t k, c10::Device d) {
  return (at::cos(at::arange(m * k, at::kDouble) * 0.05) * 1.5).to(at::kFloat).reshape({m, k}).to(d);
}

constexpr int32_t kGarbage = 0x5EED5EED;  // not a slice index: every block times out

// --- models ------------------------------------------------------------------
// Site 5: W4A16 act-order. N = 40 is not a multiple of the 16-wide tile.
struct MarlinW4A16Model : torch::nn::Module {
  static constexpr int64_t M = 6, K = 128, N = 40, GS = 16;
  std::shared_ptr<MarlinW4A16Linear> layer;
  explicit MarlinW4A16Model(c10::Device d) {
    layer = register_module("layer", std::make_shared<MarlinW4A16Linear>(K, N, GS, d, MarlinSplitK{16, 4}));
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    return {{"layer.qweight", pack_int_rows(nibbles(K, N, 1, step), 8, 4)},
            {"layer.scales", 0.02f + 0.01f * (1 + wave({K / GS, N}, 0.29, step))},
            {"layer.g_idx", act_order_g_idx(K, GS, step)}};
  }
  at::Tensor example_input(c10::Device d) const { return example_rows(M, K, d); }
  at::Tensor forward(const at::Tensor& x) { return layer->forward(x); }
  const at::Tensor& workspace() const { return layer->kernel().workspace(); }
  // y = x @ ((q - 8) * scales[g_idx[k]]) in plain ATen
  static at::Tensor reference(int step, const at::Tensor& x) {
    auto ck = MarlinW4A16Model(c10::kCPU).checkpoint(step);
    const at::Tensor w = (nibbles(K, N, 1, step) - 8).to(at::kFloat) * ck[1].value.index_select(0, ck[2].value.to(at::kLong));
    return at::matmul(x.to(at::kDouble), w.to(at::kDouble)).to(at::kFloat);
  }
};

// Site 6: FP8.
struct MarlinFp8Model : torch::nn::Module {
  static constexpr int64_t M = 5, K = 64, N = 48;
  std::shared_ptr<MarlinFp8Linear> layer;
  explicit MarlinFp8Model(c10::Device d) {
    layer = register_module("layer", std::make_shared<MarlinFp8Linear>(K, N, d, MarlinSplitK{16, 4}));
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    return {{"layer.weight", (wave({N, K}, 0.31, step) * 6).to(at::kFloat8_e4m3fn)},
            {"layer.weight_scale", 0.05f + 0.02f * at::cos(at::arange(N, at::kFloat) * 0.7 + step)}};
  }
  at::Tensor example_input(c10::Device d) const { return example_rows(M, K, d); }
  at::Tensor forward(const at::Tensor& x) { return layer->forward(x); }
  const at::Tensor& workspace() const { return layer->kernel().workspace(); }
  static at::Tensor reference(int step, const at::Tensor& x) {
    auto ck = MarlinFp8Model(c10::kCPU).checkpoint(step);
    const at::Tensor w = ck[0].value.to(at::kFloat) * ck[1].value.unsqueeze(1);  // [N, K]
    return at::matmul(x.to(at::kDouble), w.t().to(at::kDouble)).to(at::kFloat);
  }
};

// Site 6: FP4 (NVFP4 layout).
struct MarlinFp4Model : torch::nn::Module {
  static constexpr int64_t M = 4, K = 128, N = 32;
  std::shared_ptr<MarlinFp4Linear> layer;
  explicit MarlinFp4Model(c10::Device d) {
    layer = register_module("layer", std::make_shared<MarlinFp4Linear>(K, N, d, MarlinSplitK{16, 4}));
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    return {{"layer.weight", at::remainder(at::arange(N * K / 2, at::kLong) * 29 + 7 * step, 256).to(at::kByte).reshape({N, K / 2})},
            {"layer.weight_scale", (0.5f + 0.25f * at::cos(at::arange(N * K / 16, at::kFloat) * 0.9 + step))
                                       .reshape({N, K / 16})
                                       .to(at::kFloat8_e4m3fn)},
            {"layer.weight_scale_2", at::full({1}, 0.1f + 0.01f * static_cast<float>(step))}};
  }
  at::Tensor example_input(c10::Device d) const { return example_rows(M, K, d); }
  at::Tensor forward(const at::Tensor& x) { return layer->forward(x); }
  const at::Tensor& workspace() const { return layer->kernel().workspace(); }
  static at::Tensor reference(int step, const at::Tensor& x) {
    auto ck = MarlinFp4Model(c10::kCPU).checkpoint(step);
    const at::Tensor table = at::tensor({0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f});
    const at::Tensor b = ck[0].value.to(at::kLong);
    const at::Tensor nib = at::stack({at::bitwise_and(b, 15), at::bitwise_right_shift(b, 4)}, 2).reshape({N, K});
    const at::Tensor bs = ck[1].value.to(at::kFloat).repeat_interleave(16, 1);  // [N, K]
    const at::Tensor w = table.index({nib}) * bs * ck[2].value;
    return at::matmul(x.to(at::kDouble), w.t().to(at::kDouble)).to(at::kFloat);
  }
};

// Site 6: MoE, four int4 experts, top-1 router.
struct MarlinMoeModel : torch::nn::Module {
  static constexpr int64_t M = 8, E = 4, K = 64, N = 32, GS = 16;
  std::shared_ptr<MarlinMoeLayer> layer;
  explicit MarlinMoeModel(c10::Device d) {
    layer = register_module("layer", std::make_shared<MarlinMoeLayer>(E, K, N, GS, d, MarlinSplitK{16, 4}));
  }
  static at::Tensor expert_nibbles(int64_t e, int step) { return nibbles(K, N, 3 * e + 2, step); }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    std::vector<at::Tensor> w;
    for (int64_t e = 0; e < E; ++e) w.push_back(pack_int_rows(expert_nibbles(e, step), 8, 4));
    return {{"layer.gate", wave({E, K}, 0.43, 0.3 * step)},
            {"layer.w", at::stack(w)},
            {"layer.scales", 0.02f + 0.01f * (1 + wave({E, K / GS, N}, 0.17, step))}};
  }
  at::Tensor example_input(c10::Device d) const { return example_rows(M, K, d); }
  at::Tensor forward(const at::Tensor& x) { return layer->forward(x); }
  const at::Tensor& workspace() const { return layer->kernel().workspace(); }
  static at::Tensor reference(int step, const at::Tensor& x) {
    auto ck = MarlinMoeModel(c10::kCPU).checkpoint(step);
    const at::Tensor ids = at::matmul(x, ck[0].value.t()).argmax(1);
    at::Tensor y = at::zeros({x.size(0), N}, at::kDouble);
    for (int64_t r = 0; r < x.size(0); ++r) {
      const int64_t e = ids[r].item<int64_t>();
      const at::Tensor w = (expert_nibbles(e, step) - 8).to(at::kFloat) * ck[2].value[e].repeat_interleave(GS, 0);
      y[r] = at::matmul(x[r].to(at::kDouble), w.to(at::kDouble));
    }
    return y.to(at::kFloat);
  }
};

// Site 12: Machete act-order.
struct MacheteModel : torch::nn::Module {
  static constexpr int64_t M = 5, K = 128, N = 32, GS = 16;
  std::shared_ptr<MacheteW4A16Linear> layer;
  explicit MacheteModel(c10::Device d) {
    layer = register_module("layer", std::make_shared<MacheteW4A16Linear>(K, N, GS, d));
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    return {{"layer.qweight", pack_int_rows(nibbles(K, N, 4, step), 8, 4)},
            {"layer.scales", 0.02f + 0.01f * (1 + wave({K / GS, N}, 0.23, step))},
            {"layer.g_idx", act_order_g_idx(K, GS, step)}};
  }
  at::Tensor example_input(c10::Device d) const { return example_rows(M, K, d); }
  at::Tensor forward(const at::Tensor& x) { return layer->forward(x); }
  static at::Tensor reference(int step, const at::Tensor& x) {
    auto ck = MacheteModel(c10::kCPU).checkpoint(step);
    const at::Tensor w = (nibbles(K, N, 4, step) - 8).to(at::kFloat) * ck[1].value.index_select(0, ck[2].value.to(at::kLong));
    return at::matmul(x.to(at::kDouble), w.to(at::kDouble)).to(at::kFloat);
  }
};

// Site 13: W8A8 int8, q_proj and k_proj fused.
struct W8A8Model : torch::nn::Module {
  static constexpr int64_t M = 6, K = 64, NQ = 32, NK = 16;
  std::shared_ptr<W8A8Int8Linear> layer;
  explicit W8A8Model(c10::Device d) {
    layer = register_module("layer", std::make_shared<W8A8Int8Linear>(
                                         K, std::vector<std::string>{"q_proj", "k_proj"}, std::vector<int64_t>{NQ, NK}, d));
  }
  static at::Tensor int8_weight(int64_t rows, int64_t salt, int step) {
    return (at::remainder(at::arange(rows * K, at::kLong) * 13 + salt + 7 * step, 255) - 127).to(at::kChar).reshape({rows, K});
  }
  std::vector<gk::NamedTensor> checkpoint(int step) const {
    const float s = static_cast<float>(step);
    return {{"layer.q_proj.weight", int8_weight(NQ, 1, step)},
            {"layer.k_proj.weight", int8_weight(NK, 5, step)},
            {"layer.q_proj.weight_scale", at::full({1}, 0.010f + 0.001f * s)},
            {"layer.k_proj.weight_scale", at::full({1}, 0.013f - 0.001f * s)},
            {"layer.q_proj.input_scale", at::full({1}, 0.020f + 0.002f * s)},
            {"layer.k_proj.input_scale", at::full({1}, 0.015f + 0.004f * s)}};
  }
  at::Tensor example_input(c10::Device d) const { return example_rows(M, K, d); }
  at::Tensor forward(const at::Tensor& x) { return layer->forward(x); }
  static at::Tensor reference(int step, const at::Tensor& x) {
    auto ck = W8A8Model(c10::kCPU).checkpoint(step);
    const at::Tensor s_in = at::maximum(ck[4].value, ck[5].value);
    const at::Tensor xq = at::clamp(at::round(x / s_in), -128, 127);
    const at::Tensor w = at::cat({ck[0].value, ck[1].value}).to(at::kDouble);
    const at::Tensor sw = at::cat({ck[2].value.expand({NQ}), ck[3].value.expand({NK})}).to(at::kDouble);
    return (at::matmul(xq.to(at::kDouble), w.t()) * s_in.to(at::kDouble) * sw).to(at::kFloat);
  }
};

// --- checks ------------------------------------------------------------------
// The kernel computes what it claims: equal (to float rounding) to a plain
// ATen computation from the checkpoint, for two steps.
template <class Model>
void matches_reference() {
  for (int step = 0; step <= 1; ++step) {
    CAPTURE(step);
    const at::Tensor x = Model(c10::kCPU).example_input(c10::kCPU);
    const at::Tensor got = sites::fresh_output<Model>(c10::kCPU, step, x);
    const at::Tensor want = Model::reference(step, x);
    INFO("max |got - want| = " << (got - want).abs().max().item<float>());
    CHECK(at::allclose(got, want, 1e-4, 1e-4));
    CHECK(at::isfinite(got).all().item<bool>());
  }
}

// CPU twin and CUDA kernel agree bitwise (same per-slice summation order,
// no FMA contraction on the device).
template <class Model>
void cpu_and_gpu_agree() {
  const at::Tensor x = Model(c10::kCPU).example_input(c10::kCPU);
  for (int step = 0; step <= 1; ++step) {
    CAPTURE(step);
    const at::Tensor cpu = sites::fresh_output<Model>(sites::cpu(), step, x);
    const at::Tensor gpu = sites::fresh_output<Model>(sites::gpu(), step, x.to(sites::gpu()));
    INFO("max |cpu - gpu| = " << (cpu - gpu).abs().max().item<float>());
    CHECK(sites::same(cpu, gpu, true));
  }
}

// Garbage in the captured lock workspace: every block times out (NaN
// outputs, on the GPU after a bounded spin, never a hang) and leaves the
// locks alone; a reload with graphkeep zeroes the captured workspace in place
// (gk::Init::zero) and the replay is right again.
template <class Model>
void garbage_locks_then_reload(c10::Device dev) {
  sites::Rig<Model> rig(dev);
  const at::Tensor ws = rig.model->workspace();  // the captured workspace
  const void* captured = ws.data_ptr();
  CHECK(ws.eq(0).all().item<bool>());
  const at::Tensor y0 = rig.replay();
  CHECK(sites::same(y0, sites::fresh_output<Model>(dev, 0, rig.input), true));
  CHECK(ws.eq(0).all().item<bool>());  // a complete launch leaves every lock at 0
  ws.fill_(kGarbage);
  sites::sync(dev);
  const at::Tensor bad = rig.replay_unchecked();
  CHECK(at::isnan(bad).all().item<bool>());
  CHECK(ws.eq(kGarbage).all().item<bool>());
  CHECK(at::isnan(rig.replay_unchecked()).all().template item<bool>());  // still stuck: nothing clears the locks
  const gk::ReloadReport r = rig.reload(1);
  CHECK(r.drift == 0);
  CHECK(r.slots_zeroed >= 1);
  CHECK(rig.model->workspace().data_ptr() == captured);
  CHECK(ws.eq(0).all().item<bool>());
  const at::Tensor y1 = rig.replay();
  CHECK(sites::same(y1, sites::fresh_output<Model>(dev, 1, rig.input), true));
  CHECK(ws.eq(0).all().item<bool>());
}

// Copy-back (here: zeroing) of the lock workspace disabled: the reload leaves
// the field on PWAL's new workspace, the manifest finds the drift, and the
// graph keeps launching on the captured locks, which nothing zeroed: a replay
// anyway times out.
template <class Model>
void locks_unprotected(c10::Device dev, const std::string& slot) {
  sites::Rig<Model> rig(dev, {}, gk::testing::unprotect({slot}));
  const at::Tensor captured = rig.model->workspace();  // keeps the captured storage alive
  captured.fill_(kGarbage);
  sites::sync(dev);
  GK_CHECK_THROWS_WITH_SUBSTR(rig.reload(1), gk::DriftError, slot);
  CHECK_THROWS_AS(rig.engine->check_replay_allowed(), gk::DriftError);
  CHECK(rig.model->workspace().data_ptr() != captured.data_ptr());
  CHECK(captured.eq(kGarbage).all().item<bool>());
  CHECK(at::isnan(rig.replay_unchecked()).all().template item<bool>());
}

}  // namespace

// GPU child scenarios: reload with a member treated as undeclared
// (gk::testing::EngineHooks::undeclared_members), so the reload frees the captured
// tensor, then replay anyway.
GK_TEST_CHILD(marlin_hidden_locks) {
  return sites::replay_after_hidden_reload_child<MarlinW4A16Model>("layer.kernel_.workspace_");
}
GK_TEST_CHILD(machete_hidden_act_perm) {
  return sites::replay_after_hidden_reload_child<MacheteModel>("layer.quant_method_.act_perm_.act_perm_");
}
GK_TEST_CHILD(w8a8_hidden_input_scale) {
  return sites::replay_after_hidden_reload_child<W8A8Model>("layer.scheme_.input_scale_");
}

TEST_SUITE("cpu") {
  // site 5
  TEST_CASE("site 5 Marlin W4A16 act-order: kernel matches an ATen reference") { matches_reference<MarlinW4A16Model>(); }
  TEST_CASE("site 5 Marlin W4A16 workspace + g_idx_sort_indices: positive") {
    sites::positive<MarlinW4A16Model>(sites::cpu());
  }
  TEST_CASE("site 5 Marlin W4A16: negative (g_idx_sort_indices copy-back disabled)") {
    sites::negative_unprotected<MarlinW4A16Model>(sites::cpu(), "layer.kernel_.g_idx_sort_indices_");
  }
  TEST_CASE("site 5 Marlin W4A16: negative (lock workspace hidden from the registry)") {
    sites::negative_undeclared<MarlinW4A16Model>(sites::cpu(), "layer.kernel_.workspace_");
  }
  TEST_CASE("site 5 Marlin W4A16: treating the lock workspace as undeclared leaves the class's declaration alone") {
    const std::string ws = "layer.kernel_.workspace_";
    sites::Rig<MarlinW4A16Model> rig(sites::cpu(), {}, sites::with_undeclared(ws));
    CHECK(rig.engine->plan().find_slot(ws) == nullptr);
    CHECK(rig.engine->plan().find_slot("layer.kernel_.g_idx_sort_indices_") != nullptr);
    // The collector reports it as not graph-visible, with the option as its reason.
    const gk::CollectorReport r = gk::collect_tensors(*rig.model, &rig.engine->plan());
    CHECK(r.count(gk::CollectedTensor::Coverage::not_graph_visible) == 1);
    for (const gk::CollectedTensor& t : r.tensors)
      if (t.coverage == gk::CollectedTensor::Coverage::not_graph_visible) {
        CHECK(t.path == ws);
        CHECK(t.role.reason == gk::kUndeclaredMemberReason);
      }
    // Another engine on the same class plans it with its declared role.
    sites::Rig<MarlinW4A16Model> plain(sites::cpu());
    const gk::PlannedSlot* s = plain.engine->plan().find_slot(ws);
    REQUIRE(s != nullptr);
    CHECK(s->role.role == gk::Role::workspace);
    CHECK(s->role.effective_init() == gk::Init::zero);
    CHECK(plain.track_error.empty());
  }
  TEST_CASE("site 5 Marlin W4A16: garbage locks time out, a reload zeroes them") {
    garbage_locks_then_reload<MarlinW4A16Model>(sites::cpu());
  }
  TEST_CASE("site 5 Marlin W4A16: negative (lock workspace copy-back disabled keeps garbage)") {
    locks_unprotected<MarlinW4A16Model>(sites::cpu(), "layer.kernel_.workspace_");
  }
  // site 6
  TEST_CASE("site 6 Marlin FP8: kernel matches an ATen reference") { matches_reference<MarlinFp8Model>(); }
  TEST_CASE("site 6 Marlin FP8 workspace: positive") { sites::positive<MarlinFp8Model>(sites::cpu()); }
  TEST_CASE("site 6 Marlin FP8: negative (scales copy-back disabled)") {
    sites::negative_unprotected<MarlinFp8Model>(sites::cpu(), "layer.kernel_.scales_");
  }
  TEST_CASE("site 6 Marlin FP8: garbage locks time out, a reload zeroes them") {
    garbage_locks_then_reload<MarlinFp8Model>(sites::cpu());
  }
  TEST_CASE("site 6 Marlin FP4: kernel matches an ATen reference") { matches_reference<MarlinFp4Model>(); }
  TEST_CASE("site 6 Marlin FP4 workspace: positive") { sites::positive<MarlinFp4Model>(sites::cpu()); }
  TEST_CASE("site 6 Marlin FP4: negative (global scale copy-back disabled)") {
    sites::negative_unprotected<MarlinFp4Model>(sites::cpu(), "layer.kernel_.global_scale_");
  }
  TEST_CASE("site 6 Marlin FP4: garbage locks time out, a reload zeroes them") {
    garbage_locks_then_reload<MarlinFp4Model>(sites::cpu());
  }
  TEST_CASE("site 6 Marlin MoE: kernel matches an ATen reference") { matches_reference<MarlinMoeModel>(); }
  TEST_CASE("site 6 Marlin MoE workspace: positive") { sites::positive<MarlinMoeModel>(sites::cpu()); }
  TEST_CASE("site 6 Marlin MoE: negative (expert weights copy-back disabled)") {
    sites::negative_unprotected<MarlinMoeModel>(sites::cpu(), "layer.kernel_.qweight_");
  }
  TEST_CASE("site 6 Marlin MoE: garbage locks time out, a reload zeroes them") {
    garbage_locks_then_reload<MarlinMoeModel>(sites::cpu());
  }
  TEST_CASE("site 6 Marlin MoE: negative (lock workspace copy-back disabled keeps garbage)") {
    locks_unprotected<MarlinMoeModel>(sites::cpu(), "layer.kernel_.workspace_");
  }
  // site 12
  TEST_CASE("site 12 Machete act-order: kernel matches an ATen reference") { matches_reference<MacheteModel>(); }
  TEST_CASE("site 12 Machete act_perm functor: positive") { sites::positive<MacheteModel>(sites::cpu()); }
  TEST_CASE("site 12 Machete act_perm functor: negative (act_perm copy-back disabled)") {
    sites::negative_unprotected<MacheteModel>(sites::cpu(), "layer.quant_method_.act_perm_.act_perm_");
  }
  TEST_CASE("site 12 Machete act_perm functor: negative (act_perm hidden from the registry)") {
    sites::negative_undeclared<MacheteModel>(sites::cpu(), "layer.quant_method_.act_perm_.act_perm_");
  }
  // site 13
  TEST_CASE("site 13 W8A8 int8: kernel matches an ATen reference") { matches_reference<W8A8Model>(); }
  TEST_CASE("site 13 W8A8 cloned scales: positive") { sites::positive<W8A8Model>(sites::cpu()); }
  TEST_CASE("site 13 W8A8 cloned scales: negative (weight scale copy-back disabled)") {
    sites::negative_unprotected<W8A8Model>(sites::cpu(), "layer.scheme_.weight_scale_");
  }
  TEST_CASE("site 13 W8A8 cloned scales: negative (input scale copy-back disabled)") {
    sites::negative_unprotected<W8A8Model>(sites::cpu(), "layer.scheme_.input_scale_");
  }
  TEST_CASE("site 13 W8A8 cloned scales: negative (input scale hidden from the registry)") {
    sites::negative_undeclared<W8A8Model>(sites::cpu(), "layer.scheme_.input_scale_");
  }
}

TEST_SUITE("gpu") {
  // site 5
  TEST_CASE("site 5 Marlin W4A16 on CUDA: CPU twin and kernel agree bitwise") { cpu_and_gpu_agree<MarlinW4A16Model>(); }
  TEST_CASE("site 5 Marlin W4A16 workspace + g_idx_sort_indices on CUDA graphs: positive") {
    sites::positive<MarlinW4A16Model>(sites::gpu());
  }
  TEST_CASE("site 5 Marlin W4A16 on CUDA graphs: negative (g_idx_sort_indices copy-back disabled)") {
    sites::negative_unprotected<MarlinW4A16Model>(sites::gpu(), "layer.kernel_.g_idx_sort_indices_");
  }
  TEST_CASE("site 5 Marlin W4A16 on CUDA graphs: negative (lock workspace hidden from the registry)") {
    sites::negative_undeclared<MarlinW4A16Model>(sites::gpu(), "layer.kernel_.workspace_");
  }
  TEST_CASE("site 5 Marlin W4A16 on CUDA graphs: garbage locks time out, a reload zeroes them") {
    garbage_locks_then_reload<MarlinW4A16Model>(sites::gpu());
  }
  TEST_CASE("site 5 Marlin W4A16 on CUDA graphs: negative (lock workspace copy-back disabled keeps garbage)") {
    locks_unprotected<MarlinW4A16Model>(sites::gpu(), "layer.kernel_.workspace_");
  }
  TEST_CASE("site 5 Marlin W4A16 on CUDA graphs: hidden workspace freed by a reload, replay times out or is wrong") {
    sites::check_child_shows_failure(gk::testing::run_child("marlin_hidden_locks"));
  }
  // site 6
  TEST_CASE("site 6 Marlin FP8 on CUDA: CPU twin and kernel agree bitwise") { cpu_and_gpu_agree<MarlinFp8Model>(); }
  TEST_CASE("site 6 Marlin FP8 workspace on CUDA graphs: positive") { sites::positive<MarlinFp8Model>(sites::gpu()); }
  TEST_CASE("site 6 Marlin FP8 on CUDA graphs: negative (scales copy-back disabled)") {
    sites::negative_unprotected<MarlinFp8Model>(sites::gpu(), "layer.kernel_.scales_");
  }
  TEST_CASE("site 6 Marlin FP8 on CUDA graphs: garbage locks time out, a reload zeroes them") {
    garbage_locks_then_reload<MarlinFp8Model>(sites::gpu());
  }
  TEST_CASE("site 6 Marlin FP4 on CUDA: CPU twin and kernel agree bitwise") { cpu_and_gpu_agree<MarlinFp4Model>(); }
  TEST_CASE("site 6 Marlin FP4 workspace on CUDA graphs: positive") { sites::positive<MarlinFp4Model>(sites::gpu()); }
  TEST_CASE("site 6 Marlin FP4 on CUDA graphs: negative (global scale copy-back disabled)") {
    sites::negative_unprotected<MarlinFp4Model>(sites::gpu(), "layer.kernel_.global_scale_");
  }
  TEST_CASE("site 6 Marlin FP4 on CUDA graphs: garbage locks time out, a reload zeroes them") {
    garbage_locks_then_reload<MarlinFp4Model>(sites::gpu());
  }
  TEST_CASE("site 6 Marlin MoE on CUDA: CPU twin and kernel agree bitwise") { cpu_and_gpu_agree<MarlinMoeModel>(); }
  TEST_CASE("site 6 Marlin MoE workspace on CUDA graphs: positive") { sites::positive<MarlinMoeModel>(sites::gpu()); }
  TEST_CASE("site 6 Marlin MoE on CUDA graphs: negative (expert weights copy-back disabled)") {
    sites::negative_unprotected<MarlinMoeModel>(sites::gpu(), "layer.kernel_.qweight_");
  }
  TEST_CASE("site 6 Marlin MoE on CUDA graphs: garbage locks time out, a reload zeroes them") {
    garbage_locks_then_reload<MarlinMoeModel>(sites::gpu());
  }
  TEST_CASE("site 6 Marlin MoE on CUDA graphs: negative (lock workspace copy-back disabled keeps garbage)") {
    locks_unprotected<MarlinMoeModel>(sites::gpu(), "layer.kernel_.workspace_");
  }
  // site 12
  TEST_CASE("site 12 Machete act-order on CUDA: CPU twin and kernel agree bitwise") { cpu_and_gpu_agree<MacheteModel>(); }
  TEST_CASE("site 12 Machete act_perm functor on CUDA graphs: positive") { sites::positive<MacheteModel>(sites::gpu()); }
  TEST_CASE("site 12 Machete act_perm functor on CUDA graphs: negative (act_perm copy-back disabled)") {
    sites::negative_unprotected<MacheteModel>(sites::gpu(), "layer.quant_method_.act_perm_.act_perm_");
  }
  TEST_CASE("site 12 Machete act_perm functor on CUDA graphs: negative (act_perm hidden from the registry)") {
    sites::negative_undeclared<MacheteModel>(sites::gpu(), "layer.quant_method_.act_perm_.act_perm_");
  }
  TEST_CASE("site 12 Machete act_perm on CUDA graphs: hidden permutation freed by a reload, replay is wrong") {
    sites::check_child_shows_failure(gk::testing::run_child("machete_hidden_act_perm"));
  }
  // site 13
  TEST_CASE("site 13 W8A8 int8 on CUDA: CPU twin and kernel agree bitwise") { cpu_and_gpu_agree<W8A8Model>(); }
  TEST_CASE("site 13 W8A8 cloned scales on CUDA graphs: positive") { sites::positive<W8A8Model>(sites::gpu()); }
  TEST_CASE("site 13 W8A8 cloned scales on CUDA graphs: negative (weight scale copy-back disabled)") {
    sites::negative_unprotected<W8A8Model>(sites::gpu(), "layer.scheme_.weight_scale_");
  }
  TEST_CASE("site 13 W8A8 cloned scales on CUDA graphs: negative (input scale hidden from the registry)") {
    sites::negative_undeclared<W8A8Model>(sites::gpu(), "layer.scheme_.input_scale_");
  }
  TEST_CASE("site 13 W8A8 on CUDA graphs: hidden input scale freed by a reload, replay is wrong") {
    sites::check_child_shows_failure(gk::testing::run_child("w8a8_hidden_input_scale"));
  }
}
