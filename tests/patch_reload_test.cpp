// Weight patches through the reload engine (reload/patch_stage.cpp): the
// content hashes the engine serves (from the first load, after every reload
// and patch; the content version and its label), patches applied by reload()
// and by stage()+commit() against a full reload of the target, bit for bit,
// through every landing (a fused parameter with a sharded tensor, a plain
// module: the scatter path; a layer with derived tensors, a layer whose PWAL
// transforms its parameter, a layer with its own load_weight(): PWAL re-run,
// kept bases on the device and in host memory), chains, densities 0..100%,
// dense entries; and every bad patch refused with the tensor and the patch
// named, the old weights served bit for bit, replay allowed, and the next
// good patch applied.
#include "gk_test.h"

#include <graphkeep/capture/replay.h>
#include <graphkeep/delta/apply_patch.h>
#include <graphkeep/delta/make_patch.h>
#include <graphkeep/delta/patch_file.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/model/layer.h>
#include <graphkeep/registry.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/reload/served_weights.h>
#include <graphkeep/runtime/host_stream.h>

#include "temp_dir.h"
#include "toy_model.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace pt {

constexpr int64_t D = 8;

// A fused parameter: qkv = [q (2 shards along dim 1); k; v], no PWAL: every
// tensor lands unchanged, the scatter path.
class Fused : public torch::nn::Module, public gk::DescribedLayer<Fused> {
 public:
  Fused() {
    qkv_ = checkpoint_param("qkv", {{"q_proj.weight", {D, D}, at::kFloat, 2, 1}, {"k_proj.weight", {D, D}, at::kFloat},
                                    {"v_proj.weight", {D, D}, at::kFloat}},
                            at::kCPU);
  }
  at::Tensor qkv_;
  GRAPHKEEP_DESCRIBE_DERIVED(Fused, (torch::nn::Module, gk::DescribedLayer<Fused>), (qkv_, gk::parameter))
};

// PWAL replaces its parameter's storage with a transformed copy, as an FP8
// weight replaces its bf16 source: no checkpoint-format values are left in
// captured storage, so a patch needs a kept base.
class Transformed : public torch::nn::Module, public gk::DescribedLayer<Transformed> {
 public:
  Transformed() { w_ = checkpoint_param("w", {D, D}, at::kFloat, at::kCPU); }
  void process_weights_after_loading() override { w_.set_data(w_ * 2.0f + 1.0f); }
  at::Tensor w_;
  GRAPHKEEP_DESCRIBE_DERIVED(Transformed, (torch::nn::Module, gk::DescribedLayer<Transformed>), (w_, gk::parameter))
};

// Its own load_weight() stores the tensor transposed: not default_load's
// layout, so not passthrough.
class Custom : public torch::nn::Module, public gk::DescribedLayer<Custom> {
 public:
  Custom() { w_ = checkpoint_param("w", {D, D}, at::kFloat, at::kCPU); }
  bool load_weight(const gk::LoadRequest& r) override {
    r.target.copy_(r.value.t());
    return true;
  }
  at::Tensor w_;
  GRAPHKEEP_DESCRIBE_DERIVED(Custom, (torch::nn::Module, gk::DescribedLayer<Custom>), (w_, gk::parameter))
};

// Parts of odd lengths fused into one parameter: every part but the first
// starts inside a 32-byte sector, so sector writes (PatchWrites::sectors)
// write each part's ends as elements and its interior as whole sectors.
class OddParts : public torch::nn::Module, public gk::DescribedLayer<OddParts> {
 public:
  explicit OddParts(at::ScalarType t, c10::Device device = c10::kCPU) {
    w_ = checkpoint_param("w", {{"a", {13}, t}, {"b", {1001}, t}, {"c", {77}, t}, {"d", {3}, t}}, device);
  }
  at::Tensor w_;
  GRAPHKEEP_DESCRIBE_DERIVED(OddParts, (torch::nn::Module, gk::DescribedLayer<OddParts>), (w_, gk::parameter))
};

class Model : public torch::nn::Module {
 public:
  Model() {
    fused = register_module("fused", std::make_shared<Fused>());
    toy = register_module("toy", std::make_shared<toy::ToyLinear>(D, D));  // derived kernel: PWAL re-run
    norm = register_module("norm", std::make_shared<toy::PlainScale>(D));  // plain module: scatter
    trans = register_module("trans", std::make_shared<Transformed>());
    custom = register_module("custom", std::make_shared<Custom>());
  }
  std::shared_ptr<Fused> fused;
  std::shared_ptr<toy::ToyLinear> toy;
  std::shared_ptr<toy::PlainScale> norm;
  std::shared_ptr<Transformed> trans;
  std::shared_ptr<Custom> custom;
};

const std::vector<std::pair<std::string, std::vector<int64_t>>> kTensors = {
    {"custom.w", {D, D}},         {"fused.k_proj.weight", {D, D}}, {"fused.q_proj.weight", {D, D}},
    {"fused.v_proj.weight", {D, D}}, {"norm.gamma", {D}},          {"toy.weight", {D, D}},
    {"trans.w", {D, D}}};

// Multiples of 1/64 in [-1, 1] (norm: in [0.5, 1.5]).
at::Tensor random_tensor(std::mt19937_64& rng, const std::vector<int64_t>& shape, bool positive) {
  at::Tensor t = at::empty(shape);
  float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<float>(static_cast<int64_t>(rng() % 129) - 64) / 64.f * (positive ? 0.5f : 1.f) + (positive ? 1.f : 0.f);
  return t;
}

using Weights = std::map<std::string, at::Tensor>;  // whole checkpoint tensors

Weights random_weights(std::mt19937_64& rng) {
  Weights w;
  for (const auto& [name, shape] : kTensors) w[name] = random_tensor(rng, shape, name == "norm.gamma");
  return w;
}

// `w` with a fraction `density` of each tensor's elements changed, except
// the tensors in `keep`.
Weights step(const Weights& w, std::mt19937_64& rng, double density, const std::vector<std::string>& keep = {}) {
  Weights out;
  for (const auto& [name, t] : w) {
    at::Tensor n = t.clone();
    if (std::find(keep.begin(), keep.end(), name) == keep.end()) {
      float* p = n.data_ptr<float>();
      for (int64_t i = 0; i < n.numel(); ++i)
        if (static_cast<double>(rng() % 1000000) / 1e6 < density) p[i] += 1.f / 128.f;
    }
    out[name] = n;
  }
  return out;
}

// A source's view: whole tensors, q in its two shards.
std::vector<gk::NamedTensor> delivered(const Weights& w) {
  std::vector<gk::NamedTensor> out;
  for (const auto& [name, t] : w) {
    if (name == "fused.q_proj.weight") {
      for (int64_t s = 0; s < 2; ++s) out.push_back({name, t.chunk(2, 1)[s].contiguous(), s});
    } else {
      out.push_back({name, t, 0});
    }
  }
  return out;
}
std::vector<gk::NamedTensor> named(const Weights& w) {
  std::vector<gk::NamedTensor> out;
  for (const auto& [name, t] : w) out.push_back({name, t, 0});
  return out;
}

gk::Patch patch_of(const Weights& a, const Weights& b, const std::string& from, const std::string& to,
                   gk::MakePatchOptions::Encoding enc = gk::MakePatchOptions::Encoding::automatic) {
  gk::MakePatchOptions o;
  o.base_version = from;
  o.target_version = to;
  o.encoding = enc;
  return gk::make_patch(named(a), named(b), o);
}

// A model loaded with `w`, its engine prepared with the first load's report,
// and a graph that reads every slot (its output: every slot's values).
template <class M>
struct BasicRig {
  std::shared_ptr<M> model = std::make_shared<M>();
  gk::HostReplay graph{"patch"};
  at::Tensor output;
  std::unique_ptr<gk::ReloadEngine> engine;
  gk::ReloadReport first;

  explicit BasicRig(const Weights& w, gk::PatchBase base = gk::PatchBase::device, std::string label = "step-0") {
    gk::InMemorySource src(delivered(w), "initial weights");
    gk::LoadOptions o;
    o.patch_base = base;
    o.version_label = std::move(label);
    first = gk::load_weights(*model, src, o);
    gk::ReloadOptions defaults;
    defaults.patch_base = base;
    engine = std::make_unique<gk::ReloadEngine>(*model, gk::EngineOptions{defaults, {}});
    engine->prepare(first);
    std::vector<at::Tensor> slots;
    for (const auto& l : engine->plan().layers())
      for (const auto& s : l.slots)
        if (s.defined() && s.role.effective_init() == gk::Init::copy_new) slots.push_back(s.captured);
    graph.capture([&] {
      int64_t n = 0;
      for (const at::Tensor& t : slots) n += t.numel();
      output = gk::hostrt::empty({n}, at::TensorOptions(at::kDouble));
      gk::hostrt::launch_aten("read_all", slots, {output}, [](auto& in, auto& out) {
        std::vector<at::Tensor> flat;
        for (const at::Tensor& t : in) flat.push_back(t.reshape(-1).to(at::kDouble));
        out[0].copy_(at::cat(flat));
      });
    });
    engine->track(graph);
  }
  at::Tensor replay() {
    engine->check_replay_allowed();
    graph.replay();
    return output.clone();
  }
  gk::ReloadReport reload(const Weights& w, std::string label = {}) {
    gk::InMemorySource src(delivered(w), "full weights");
    gk::ReloadOptions o = engine->options().defaults;
    o.version_label = std::move(label);
    return engine->reload(src, o);
  }
};

using Rig = BasicRig<Model>;

// What a rig serves after a full reload of `w`: the oracle.
at::Tensor full_output(const Weights& w0, const Weights& w) {
  Rig r(w0);
  r.reload(w);
  return r.replay();
}

bool same(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && at::equal(a, b); }

std::uint64_t served_hash(const gk::ReloadEngine& e, const std::string& name) {
  REQUIRE(e.served() != nullptr);
  const auto h = e.served()->hash(name);
  REQUIRE(h.has_value());
  return *h;
}

}  // namespace pt

TEST_CASE("the served content: hashes of every checkpoint tensor from the first load on, versions, labels") {
  at::set_num_threads(1);
  std::mt19937_64 rng(7);
  const pt::Weights w0 = pt::random_weights(rng), w1 = pt::step(w0, rng, 0.3);
  pt::Rig rig(w0);
  // The first load's report holds a hash per checkpoint tensor: that of the
  // whole tensor as a source delivers it (q in two shards), computed here
  // independently of the engine.
  REQUIRE(rig.first.served != nullptr);
  CHECK(rig.first.served->hashes().size() == pt::kTensors.size());
  for (const auto& [name, t] : w0) {
    CAPTURE(name);
    CHECK(pt::served_hash(*rig.engine, name) == gk::content_hash(t));
  }
  CHECK_FALSE(rig.engine->served()->hash("fused.qkv").has_value());  // a parameter, not a checkpoint tensor
  CHECK(rig.engine->served()->label() == "step-0");
  CHECK(rig.first.served->kept_base_tensors() == 2);  // trans.w and custom.w; the others land unchanged
  const std::uint64_t v0 = rig.engine->served()->content_version();
  // The content version as Note [Content versions] defines it, from the
  // names and hashes alone (the engine lays its input out once per plan:
  // Note [Served names are the plan's]).
  auto version_of = [](const gk::ServedWeights& s) {
    std::vector<std::pair<std::string, std::uint64_t>> all = s.hashes();
    CHECK(std::is_sorted(all.begin(), all.end()));
    std::string bytes;
    for (const auto& [name, h] : all) {
      CHECK(s.hash(name) == h);
      bytes += name;
      bytes.push_back('\0');
      for (int b = 0; b < 8; ++b) bytes.push_back(static_cast<char>((h >> (8 * b)) & 0xff));
    }
    return gk::content_hash_bytes({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()});
  };
  CHECK(version_of(*rig.engine->served()) == v0);

  const gk::ReloadReport r1 = rig.reload(w1, "step-1");
  REQUIRE(r1.served != nullptr);
  CHECK(r1.served == rig.engine->served());
  for (const auto& [name, t] : w1) CHECK(pt::served_hash(*rig.engine, name) == gk::content_hash(t));
  CHECK(rig.engine->served()->content_version() != v0);
  CHECK(version_of(*rig.engine->served()) == rig.engine->served()->content_version());
  CHECK(rig.engine->served()->label() == "step-1");
  // Reloading step 0 after step 1 is recognised as step 0: the same content
  // version, and its label recalled.
  rig.reload(w0);
  CHECK(rig.engine->served()->content_version() == v0);
  CHECK(rig.engine->served()->label() == "step-0");
  CHECK(rig.engine->served()->describe().find("step-0 (") == 0);

  // prepare() without a report keeps what is served; a report of another
  // model is refused.
  rig.engine->prepare();
  CHECK(rig.engine->served()->content_version() == v0);
  toy::ToyModel other;
  gk::InMemorySource src(other.checkpoint(0));
  const gk::ReloadReport foreign = gk::load_weights(other, src);
  CHECK_THROWS_WITH_AS(rig.engine->prepare(foreign), doctest::Contains("is not this model's"), gk::StateError);
  gk::testing::EngineHooks no_hash;
  no_hash.skip_served_hashes = true;
  gk::InMemorySource src2(other.checkpoint(0));
  const gk::ReloadReport unhashed = gk::testing::load_weights(other, src2, {}, no_hash);
  CHECK(unhashed.served == nullptr);
  CHECK(unhashed.times.hash_ms == 0);
}

TEST_CASE("a patch by reload() and by stage()+commit() serves what a full reload of its target serves, bit for bit") {
  at::set_num_threads(1);
  for (gk::PatchBase base : {gk::PatchBase::device, gk::PatchBase::pinned_host}) {
   for (gk::PatchWrites writes : {gk::PatchWrites::elements, gk::PatchWrites::sectors}) {
    for (bool staged : {false, true}) {
      CAPTURE(gk::to_string(base));
      CAPTURE(gk::to_string(writes));
      CAPTURE(staged);
      std::mt19937_64 rng(11);
      const pt::Weights w0 = pt::random_weights(rng);
      const pt::Weights w1 = pt::step(w0, rng, 0.2, {"norm.gamma"});  // norm unchanged: no entry
      const pt::Weights w2 = pt::step(w1, rng, 0.3);
      pt::Rig rig(w0, base);
      gk::PatchOptions o = rig.engine->options().patch;
      o.patch_writes = writes;
      const at::Tensor out0 = rig.replay();
      const gk::Patch p01 = pt::patch_of(w0, w1, "step-0", "step-1");
      CHECK(p01.find("norm.gamma") == nullptr);
      gk::ReloadReport r;
      if (staged) {
        gk::StagedReload s = rig.engine->stage(p01, o);
        CHECK(pt::same(rig.replay(), out0));  // staging wrote nothing the graphs read
        r = rig.engine->commit(std::move(s));
        CHECK(r.staged);
      } else {
        r = rig.engine->reload(p01, o);
      }
      // Sectors: every 8x8 float tensor here is whole sectors.
      CHECK((r.patch.sectors_written > 0) == (writes == gk::PatchWrites::sectors));
      CHECK(r.patch.applied);
      CHECK(r.patch.tensors == 6);
      CHECK(r.patch.layers_scattered == 1);  // fused (norm is untouched)
      CHECK(r.patch.layers_rerun == 3);      // toy (derived kernel), trans (transformed), custom (load_weight)
      REQUIRE(r.patch.rerun_why.size() == 3);  // each re-run layer, with why
      CHECK(r.patch.rerun_why[0].find("toy: toy.kernel_.") != std::string::npos);
      CHECK(r.patch.rerun_why[0].find("is derived without a declared derivation") != std::string::npos);
      CHECK(r.patch.rerun_why[1].find("trans: parameter 'w' does not land unchanged in captured storage") !=
            std::string::npos);
      CHECK(r.patch.rerun_why[2].find("custom: parameter 'w' does not land unchanged") != std::string::npos);
      const at::Tensor out1 = rig.replay();
      CHECK_FALSE(pt::same(out1, out0));
      CHECK(pt::same(out1, pt::full_output(w0, w1)));
      CHECK(rig.engine->served()->label() == "step-1");
      for (const auto& [name, t] : w1) CHECK(pt::served_hash(*rig.engine, name) == gk::content_hash(t));
      CHECK(rig.engine->served()->kept_base_tensors() == 2);
      // A chain: step 1 -> 2, every tensor touched (the plain module too).
      const gk::Patch p12 = pt::patch_of(w1, w2, "step-1", "step-2");
      CHECK(p12.entries.size() == pt::kTensors.size());
      const gk::ReloadReport r2 = rig.engine->reload(p12, o);
      CHECK(r2.patch.layers_scattered == 2);
      CHECK(pt::same(rig.replay(), pt::full_output(w0, w2)));
      // The served content version is the one a full reload of step 2 gives.
      pt::Rig full(w0, base);
      full.reload(w2);
      CHECK(rig.engine->served()->content_version() == full.engine->served()->content_version());
    }
   }
  }
}

namespace pt {

// Note [Declared derivations] in graphkeep/registry/role.h, on a layer laid
// out as a MoE layer is: four experts' tensors stacked into one parameter,
// and a kernel object whose stride arrays PWAL rebuilds at new addresses.
constexpr int64_t E = 4;
struct DeclaredStrides {  // functions of E and D alone, declared so
  at::Tensor ab, c;
};
GRAPHKEEP_AGGREGATE(DeclaredStrides, (ab, gk::metadata.from_shapes()), (c, gk::metadata.from_shapes()));
struct UndeclaredStrides {  // the same, without the declaration
  at::Tensor ab, c;
};
GRAPHKEEP_AGGREGATE(UndeclaredStrides, (ab, gk::metadata), (c, gk::metadata));

// lies: its "from_shapes" c depends on the weights (a wrong declaration).
template <class Strides>
class Stacked : public torch::nn::Module, public gk::DescribedLayer<Stacked<Strides>> {
 public:
  explicit Stacked(bool lies) : lies_(lies) {
    std::vector<gk::CheckpointTensor> ts;
    for (int64_t e = 0; e < E; ++e) ts.push_back({"experts." + std::to_string(e) + ".w", {D, D}, at::kFloat});
    w_ = this->checkpoint_param("w", std::move(ts), at::kCPU);
  }
  void process_weights_after_loading() override {
    strides_.ab = at::full({E}, D, at::kLong);
    strides_.c = lies_ ? (w_.view({E, D * D}).sum(1) * 64).to(at::kLong) : at::full({E}, 2 * D, at::kLong);
  }
  at::Tensor w_;
  Strides strides_;
  bool lies_;
  GRAPHKEEP_DESCRIBE_DERIVED(Stacked, (torch::nn::Module, gk::DescribedLayer<Stacked<Strides>>), (w_, gk::parameter),
                             strides_, lies_)
};

template <class Strides, bool Lies = false>
class StackedModel : public torch::nn::Module {
 public:
  StackedModel() { moe = register_module("moe", std::make_shared<Stacked<Strides>>(Lies)); }
  std::shared_ptr<Stacked<Strides>> moe;
};

Weights stacked_weights(std::mt19937_64& rng) {
  Weights w;
  for (int64_t e = 0; e < E; ++e) w["moe.experts." + std::to_string(e) + ".w"] = random_tensor(rng, {D, D}, false);
  return w;
}

}  // namespace pt

TEST_CASE("declared from_shapes strides: a patch touching every expert runs no PWAL and serves a full reload's bits") {
  for (bool staged : {false, true}) {
    CAPTURE(staged);
    std::mt19937_64 rng(5);
    const pt::Weights w0 = pt::stacked_weights(rng), w1 = pt::step(w0, rng, 0.1), w2 = pt::step(w1, rng, 0.1);
    pt::BasicRig<pt::StackedModel<pt::DeclaredStrides>> rig(w0), full(w0);
    pt::BasicRig<pt::StackedModel<pt::UndeclaredStrides>> undeclared(w0);
    const at::Tensor out0 = rig.replay();
    for (const auto& [from, to, a, b] : {std::tuple{"step-0", "step-1", &w0, &w1}, {"step-1", "step-2", &w1, &w2}}) {
      const gk::Patch p = pt::patch_of(*a, *b, from, to);
      CHECK(p.entries.size() == static_cast<std::size_t>(pt::E));  // every expert touched
      const gk::ReloadReport r = staged ? rig.engine->commit(rig.engine->stage(p)) : rig.engine->reload(p);
      CHECK(r.patch.layers_rerun == 0);
      CHECK(r.patch.rerun_why.empty());
      CHECK(r.patch.layers_scattered == 1);
      full.reload(*b);
      CHECK(pt::same(rig.replay(), full.replay()));  // the strides too: the graph reads every slot
      CHECK(rig.engine->served()->content_version() == full.engine->served()->content_version());
      // Without the declaration the same patch re-runs the layer's PWAL, to the same bits.
      const gk::ReloadReport u = undeclared.engine->reload(p);
      CHECK(u.patch.layers_rerun == 1);
      REQUIRE(u.patch.rerun_why.size() == 1);
      CHECK(u.patch.rerun_why[0] ==
            "moe: moe.strides_.ab (metadata of UndeclaredStrides) is derived without a declared derivation");
      CHECK(pt::same(undeclared.replay(), full.replay()));
    }
    CHECK_FALSE(pt::same(rig.replay(), out0));
  }
}

TEST_CASE("a from_shapes declaration that lies is refused at the next full reload, naming the member and element") {
  std::mt19937_64 rng(6);
  const pt::Weights w0 = pt::stacked_weights(rng), w1 = pt::step(w0, rng, 0.5);
  pt::BasicRig<pt::StackedModel<pt::DeclaredStrides, /*Lies=*/true>> rig(w0);
  const at::Tensor out0 = rig.replay();
  const std::uint64_t version0 = rig.engine->served()->content_version();
  GK_CHECK_THROWS_WITH_SUBSTR(rig.reload(w1), gk::DeclarationError,
                              "DeclaredStrides::c is declared metadata.from_shapes() (a function of shapes and "
                              "configuration alone), but PWAL of layer 'moe' built moe.strides_.c with other values "
                              "from these weights: element 0 was ");
  GK_CHECK_THROWS_WITH_SUBSTR(rig.reload(w1), gk::DeclarationError,
                              "It depends on the checkpoint's values: drop .from_shapes() from its declaration");
  // The element and both values, as PWAL computes c (the same op on the same
  // stacked shape): the captured one from w0, the new one from w1.
  const auto c_of = [](const pt::Weights& w) {
    std::vector<at::Tensor> experts;
    for (int64_t e = 0; e < pt::E; ++e) experts.push_back(w.at("moe.experts." + std::to_string(e) + ".w"));
    return (at::stack(experts).view({pt::E, -1}).sum(1) * 64).to(at::kLong);
  };
  const at::Tensor c0 = c_of(w0), c1 = c_of(w1);
  REQUIRE(c0[0].item<int64_t>() != c1[0].item<int64_t>());
  std::ostringstream values;
  values << "built moe.strides_.c with other values from these weights: element 0 was "
         << static_cast<double>(c0[0].item<int64_t>()) << " and is now " << static_cast<double>(c1[0].item<int64_t>())
         << ". It depends";
  GK_CHECK_THROWS_WITH_SUBSTR(rig.reload(w1), gk::DeclarationError, values.str());
  // Nothing of the refused reload is served: the old weights, bit for bit, replay allowed.
  CHECK(pt::same(rig.replay(), out0));
  CHECK(rig.engine->served()->content_version() == version0);
  // The same weights again are no lie (PWAL gives the captured strides back).
  CHECK_NOTHROW(rig.reload(w0));
  CHECK(pt::same(rig.replay(), out0));
  // A streaming reload reads the comparison's verdict a layer late, at the
  // layer's copy-back (Note [Verdicts read late]): refused all the same,
  // before anything is copied, and a reload of good weights recovers.
  gk::ReloadOptions streaming = rig.engine->options().defaults;
  streaming.mode = gk::ReloadMode::streaming;
  gk::InMemorySource lying(pt::delivered(w1), "full weights");
  GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->reload(lying, streaming), gk::DeclarationError, values.str());
  gk::InMemorySource good(pt::delivered(w0), "full weights");
  CHECK_NOTHROW(rig.engine->reload(good, streaming));
  CHECK(pt::same(rig.replay(), out0));
}

namespace pt {

// Block derivations (graphkeep/model/block_derivation.h) on an int8 layer
// quantized per block, as FP8 per row or W4A16 per group are: two checkpoint
// tensors fused into w [8, 16], PWAL builds q (int8, like w) and a scale per
// block. Each variant is one way a declaration can be right or wrong.
enum class Blocks {
  rows,           // 1 x 16 blocks, scales [8]: declared right
  groups,         // 2 x 4 blocks, scales stored group-major [4, 4]: declared right (transposed)
  wrong_shape,    // PWAL per 1 x 16; declared 2 x 8 (as many scales): a wrong block shape
  reads_beyond,   // PWAL one scale for the tensor; the function the amax of all the blocks it gets
  unbound,        // declared by_blocks() in the descriptor, bound by nothing
  not_by_blocks,  // bound, but its descriptor does not say by_blocks()
  bad_source,     // bound to a derived tensor as its source
  undeclared,     // rows, no declaration at all: a patch re-runs PWAL
  groups_undeclared,  // groups, the same
  packed,         // groups, two values per block (the scale, its negation), group-major [4, 2, 4]: declared right
  packed_untransposed,  // the same PWAL, declared block-major ([4, 4, 2]): a wrong layout of as many values
  packed_undeclared,    // packed, no declaration
};
constexpr int64_t QR = 8, QC = 16;

struct QuantBlocks {  // the derived members, declared by blocks
  at::Tensor q, s;
};
GRAPHKEEP_AGGREGATE(QuantBlocks, (q, gk::derived_weight.by_blocks()), (s, gk::scale.by_blocks()));
struct QuantPlain {  // the same members, without .by_blocks()
  at::Tensor q, s;
};
GRAPHKEEP_AGGREGATE(QuantPlain, (q, gk::derived_weight), (s, gk::scale));

// blocks [B, bh, bw] float -> {int8 [B, bh, bw], float scale [B]}; with
// `whole`, one scale for all the blocks given.
std::vector<at::Tensor> quantize_blocks(const at::Tensor& blocks, bool whole = false) {
  at::Tensor amax = blocks.abs().amax({1, 2});
  if (whole) amax = amax.max().expand_as(amax);
  const at::Tensor scale = (amax / 127.0).clamp_min(1e-12).contiguous();
  const at::Tensor q = at::round(blocks / scale.view({-1, 1, 1})).clamp(-127, 127).to(at::kChar);
  return {q, scale};
}

template <class Members>
class Quantized : public torch::nn::Module, public gk::DescribedLayer<Quantized<Members>> {
 public:
  explicit Quantized(Blocks kind) : kind_(kind) {
    w_ = this->checkpoint_param("w", {{"a.weight", {QR / 2, QC}, at::kFloat}, {"b.weight", {QR / 2, QC}, at::kFloat}},
                                at::kCPU);
  }
  // PWAL's block shape (the truth) and the declared one.
  std::pair<int64_t, int64_t> built() const {
    if (grouped()) return {2, 4};
    if (kind_ == Blocks::reads_beyond) return {QR, QC};
    return {1, QC};
  }
  std::pair<int64_t, int64_t> declared() const {
    if (kind_ == Blocks::wrong_shape) return {2, 8};
    if (kind_ == Blocks::reads_beyond) return {1, QC};
    return built();
  }
  bool packed() const {
    return kind_ == Blocks::packed || kind_ == Blocks::packed_untransposed || kind_ == Blocks::packed_undeclared;
  }
  bool grouped() const { return kind_ == Blocks::groups || kind_ == Blocks::groups_undeclared || packed(); }
  gk::BlockOutput scale_output() const {
    if (kind_ == Blocks::packed_untransposed) return {m_.s, gk::BlockLayout::one_per_block, 2};
    return {m_.s, grouped() ? gk::BlockLayout::one_per_block_transposed : gk::BlockLayout::one_per_block,
            packed() ? 2 : 1};
  }
  // {scale, -scale} per block: [B] -> [B, 2].
  static at::Tensor pack(const at::Tensor& scale) { return at::stack({scale, scale.neg()}, 1); }
  void process_weights_after_loading() override {
    const auto [bh, bw] = built();
    const at::Tensor blocks = w_.reshape({QR / bh, bh, QC / bw, bw}).permute({0, 2, 1, 3}).reshape({-1, bh, bw});
    std::vector<at::Tensor> qs = quantize_blocks(blocks);
    m_.q = qs[0].reshape({QR / bh, QC / bw, bh, bw}).permute({0, 2, 1, 3}).reshape({QR, QC}).contiguous();
    m_.s = packed() ? pack(qs[1]) : qs[1];
    if (grouped()) m_.s = m_.s.reshape({QR / bh, QC / bw, -1}).permute({1, 2, 0}).contiguous();
    if (kind_ == Blocks::reads_beyond) m_.s = m_.s.expand({QR}).contiguous();  // one value, per row
  }
  void declare_derivations(gk::Derivations& d) const override {
    if (kind_ == Blocks::unbound || kind_ == Blocks::undeclared || kind_ == Blocks::groups_undeclared ||
        kind_ == Blocks::packed_undeclared)
      return;
    const auto [bh, bw] = declared();
    const bool whole = kind_ == Blocks::reads_beyond, two = packed();
    d.blocks("int8 per block", kind_ == Blocks::bad_source ? m_.s.view({QR, 1}) : w_, {bh, bw},
             {{m_.q, gk::BlockLayout::same_as_source}, scale_output()}, [whole, two](const at::Tensor& blocks) {
               std::vector<at::Tensor> qs = quantize_blocks(blocks, whole);
               if (two) qs[1] = pack(qs[1]);
               return qs;
             });
  }
  at::Tensor w_;
  Members m_;
  Blocks kind_;
  GRAPHKEEP_DESCRIBE_DERIVED(Quantized, (torch::nn::Module, gk::DescribedLayer<Quantized<Members>>),
                             (w_, gk::parameter), m_, kind_)
};

template <class Members, Blocks Kind>
class QuantModel : public torch::nn::Module {
 public:
  QuantModel() { lin = register_module("lin", std::make_shared<Quantized<Members>>(Kind)); }
  std::shared_ptr<Quantized<Members>> lin;
};

// Layout-derived members (Note [Layout derivations]) of w = [a; b], [QR, QC]:
//   t  w transposed, padded with a column of ones: [QC, QR + 1];
//   p  w's rows in a fixed order, then row 0 twice more (a broadcast): [QR + 2, QC].
struct Moved {
  at::Tensor t, p;
};
GRAPHKEEP_AGGREGATE(Moved, (t, gk::derived_weight.by_layout()), (p, gk::scale.by_layout()));
struct MovedPlain {  // the same members, without .by_layout()
  at::Tensor t, p;
};
GRAPHKEEP_AGGREGATE(MovedPlain, (t, gk::derived_weight), (p, gk::scale));

enum class Moves {
  right,
  undeclared,   // no declaration: a patch re-runs PWAL (with Moved: bound by nothing)
  computes,     // the function doubles p's values: not a layout
  wrong_order,  // the function reverses the rows where PWAL permutes them otherwise
  cast,         // the function widens to float64
};

template <class Members>
class Mover : public torch::nn::Module, public gk::DescribedLayer<Mover<Members>> {
 public:
  explicit Mover(Moves kind) : kind_(kind) {
    w_ = this->checkpoint_param("w", {{"a.weight", {QR / 2, QC}, at::kFloat}, {"b.weight", {QR / 2, QC}, at::kFloat}},
                                at::kCPU);
  }
  static at::Tensor transpose_pad(const at::Tensor& w) { return at::constant_pad_nd(w.t(), {0, 1}, 1.0).contiguous(); }
  static at::Tensor permute_rows(const at::Tensor& w, bool reversed) {
    const at::Tensor order = reversed ? at::arange(QR - 1, -1, -1, at::kLong)
                                      : at::tensor(std::vector<int64_t>{3, 0, 7, 1, 6, 2, 5, 4}, at::kLong);
    return at::cat({w.index_select(0, order), w.narrow(0, 0, 1).expand({2, QC})}).contiguous();
  }
  void process_weights_after_loading() override {
    m_.t = transpose_pad(w_);
    m_.p = permute_rows(w_, false);
  }
  void declare_derivations(gk::Derivations& d) const override {
    if (kind_ == Moves::undeclared) return;
    d.layout("transpose, a column of ones", w_, m_.t, [](const at::Tensor& w) { return transpose_pad(w); });
    d.layout("rows reordered, row 0 twice more", w_, m_.p, [k = kind_](const at::Tensor& w) {
      if (k == Moves::computes) return permute_rows(w, false) * 2;
      if (k == Moves::cast) return permute_rows(w, false).to(at::kDouble);
      return permute_rows(w, k == Moves::wrong_order);
    });
  }
  at::Tensor w_;
  Members m_;
  Moves kind_;
  GRAPHKEEP_DESCRIBE_DERIVED(Mover, (torch::nn::Module, gk::DescribedLayer<Mover<Members>>), (w_, gk::parameter), m_,
                             kind_)
};

template <class Members, Moves Kind>
class MoverModel : public torch::nn::Module {
 public:
  MoverModel() { lin = register_module("lin", std::make_shared<Mover<Members>>(Kind)); }
  std::shared_ptr<Mover<Members>> lin;
};

Weights quant_weights(std::mt19937_64& rng) {
  return {{"lin.a.weight", random_tensor(rng, {QR / 2, QC}, false)},
          {"lin.b.weight", random_tensor(rng, {QR / 2, QC}, false)}};
}

// A patch w1 -> w2 whose commit fails after its writes (an injected fault)
// leaves `rig` serving w1's bits, the derived members too; the same patch
// then lands as `full` serves w2 after a full reload.
template <class Rig>
void check_failed_commit_restores(Rig& rig, Rig& full, const Weights& w1, std::mt19937_64& rng) {
  const at::Tensor out1 = rig.replay();
  const Weights w2 = step(w1, rng, 0.5);
  {
    const gk::testing::ScopedHooks hooks(rig.engine.get(), gk::testing::fault_at(gk::testing::FaultPoint::scatter, "lin"));
    CHECK_THROWS_WITH(rig.engine->reload(patch_of(w1, w2, "one", "two")), doctest::Contains("injected"));
  }
  CHECK(same(rig.replay(), out1));
  rig.engine->reload(patch_of(w1, w2, "one", "two"));
  full.reload(w2);
  CHECK(same(rig.replay(), full.replay()));
}

// An index past the end of a tensor whose layer lands through a declared
// derivation (blocks, layout) is refused before anything is written, by
// reload() and by stage(), naming the tensor: `rig` still serves w1's bits
// and replay stays allowed. (Never a device-side assert: the index is
// checked against the checkpoint tensor before it is mapped.)
template <class Rig>
void check_index_past_end_refused(Rig& rig, const Weights& w1, std::mt19937_64& rng) {
  const at::Tensor out1 = rig.replay();
  const Weights w2 = step(w1, rng, 0.1);
  for (const std::int64_t past : {std::int64_t{0}, std::int64_t{1} << 20}) {
    CAPTURE(past);
    gk::Patch p = patch_of(w1, w2, "one", "past the end");
    gk::PatchEntry& e = p.entries.back();
    REQUIRE(e.encoding == gk::PatchEncoding::sparse);
    e.indices = e.indices.clone();
    e.indices[-1] = e.numel() + past;
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->reload(p), gk::WeightError, "'" + e.name + "'");
    GK_CHECK_THROWS_WITH_SUBSTR((void)rig.engine->stage(p), gk::WeightError, "out of range");
    CHECK(rig.engine->replay_allowed());
    CHECK(same(rig.replay(), out1));
  }
}

// A chain of two patches (a small step, then a large one) on a model of
// class Declared, by reload() and by stage() + commit(), with element and
// sector writes: each serves what a full reload serves, bit for bit, the
// served content version too, and the same patch on Undeclared re-runs
// PWAL to the same bits. `check(r, u)` adds the checks of the declared
// landing's report r and the undeclared one's u. `chunk` (> 0): block
// derivations land that many source elements per call of their function
// (testing::EngineHooks::land_chunk_elements), a block or two.
template <class Declared, class Undeclared, class Check>
void check_patch_chain(std::uint64_t seed, double small, double large, const Check& check,
                       std::int64_t chunk = 0) {
  for (gk::PatchWrites writes : {gk::PatchWrites::elements, gk::PatchWrites::sectors})
    for (bool staged : {false, true}) {
      CAPTURE(staged);
      std::mt19937_64 rng(seed);
      const Weights w0 = quant_weights(rng), w1 = step(w0, rng, small), w2 = step(w1, rng, large);
      BasicRig<Declared> rig(w0), full(w0);
      gk::testing::EngineHooks h;
      h.land_chunk_elements = chunk;
      const gk::testing::ScopedHooks chunked(rig.engine.get(), std::move(h));
      BasicRig<Undeclared> slow(w0);
      const at::Tensor out0 = rig.replay();
      gk::PatchOptions o = rig.engine->options().patch;
      o.patch_writes = writes;
      for (const auto& [from, to, a, b] : {std::tuple{"step-0", "step-1", &w0, &w1}, {"step-1", "step-2", &w1, &w2}}) {
        const gk::Patch p = patch_of(*a, *b, from, to);
        const gk::ReloadReport r = staged ? rig.engine->commit(rig.engine->stage(p, o)) : rig.engine->reload(p, o);
        CHECK(r.patch.layers_rerun == 0);
        CHECK(r.patch.rerun_why.empty());
        CHECK(r.patch.layers_scattered == 1);
        full.reload(*b);
        CHECK(same(rig.replay(), full.replay()));  // the graph reads every slot, the derived members too
        CHECK(rig.engine->served()->content_version() == full.engine->served()->content_version());
        const gk::ReloadReport u = slow.engine->reload(p);
        CHECK(u.patch.layers_rerun == 1);
        CHECK(same(slow.replay(), full.replay()));
        check(r, u);
      }
      CHECK_FALSE(same(rig.replay(), out0));
    }
}

// One whole row of a changed on a model of class Model, whose
// derivation has `blocks` blocks: 16 entries, at least as many as the
// blocks, so every block is recomputed (Note [Recomputing every block] in
// reload/block_landing.cpp), the untouched ones to the bits they had, by
// reload() and by stage() + commit().
template <class Model>
void check_every_block_recomputed(std::uint64_t seed, std::size_t blocks) {
  std::mt19937_64 rng(seed);
  const Weights w0 = quant_weights(rng);
  Weights w1 = w0;
  w1["lin.a.weight"] = w0.at("lin.a.weight").clone();
  w1["lin.a.weight"][2] += 0.5f;
  BasicRig<Model> full(w0);
  full.reload(w1);
  for (bool staged : {false, true}) {
    CAPTURE(staged);
    BasicRig<Model> rig(w0);
    const gk::Patch p = patch_of(w0, w1, "step-0", "row 2");
    REQUIRE(p.entries.size() == 1);
    CHECK(p.entries[0].count() == QC);
    const gk::ReloadReport r = staged ? rig.engine->commit(rig.engine->stage(p)) : rig.engine->reload(p);
    CHECK(r.patch.layers_rerun == 0);
    CHECK(r.patch.blocks_recomputed == blocks);
    CHECK(same(rig.replay(), full.replay()));
    CHECK(rig.engine->served()->content_version() == full.engine->served()->content_version());
  }
}

}  // namespace pt

TEST_CASE("block derivations: a patch recomputes only the blocks it touches, without PWAL, to a full reload's bits") {
  at::set_num_threads(1);
  auto blocks = [](const gk::ReloadReport& r, const gk::ReloadReport& u) {
    CHECK(r.patch.blocks_recomputed > 0);
    CHECK(u.patch.blocks_recomputed == 0);
  };
  {
    INFO("per row");
    pt::check_patch_chain<pt::QuantModel<pt::QuantBlocks, pt::Blocks::rows>,
                          pt::QuantModel<pt::QuantPlain, pt::Blocks::undeclared>>(9, 0.02, 0.3, blocks);
  }
  {
    INFO("2x4 groups, scales group-major");
    pt::check_patch_chain<pt::QuantModel<pt::QuantBlocks, pt::Blocks::groups>,
                          pt::QuantModel<pt::QuantPlain, pt::Blocks::groups_undeclared>>(9, 0.02, 0.3, blocks);
  }
  {
    INFO("2x4 groups, two values per block, group-major (packed words' layout)");
    pt::check_patch_chain<pt::QuantModel<pt::QuantBlocks, pt::Blocks::packed>,
                          pt::QuantModel<pt::QuantPlain, pt::Blocks::packed_undeclared>>(9, 0.02, 0.3, blocks);
  }
  // The same with a landing of a block or two per call of the function:
  // the touched blocks' chunks, and every block's, in many pieces.
  {
    INFO("per row, one block per call");
    pt::check_patch_chain<pt::QuantModel<pt::QuantBlocks, pt::Blocks::rows>,
                          pt::QuantModel<pt::QuantPlain, pt::Blocks::undeclared>>(9, 0.05, 0.3, blocks, pt::QC);
  }
  {
    INFO("2x4 groups, two values per block, three blocks per call");
    pt::check_patch_chain<pt::QuantModel<pt::QuantBlocks, pt::Blocks::packed>,
                          pt::QuantModel<pt::QuantPlain, pt::Blocks::packed_undeclared>>(9, 0.05, 0.3, blocks, 24);
  }

  // Only the touched blocks: one element of row 5 recomputes one row.
  std::mt19937_64 rng(10);
  const pt::Weights w0 = pt::quant_weights(rng);
  pt::Weights w1 = w0;
  w1["lin.b.weight"] = w0.at("lin.b.weight").clone();
  w1["lin.b.weight"][1][3] += 0.25f;  // row 4 + 1 of the fused parameter
  pt::BasicRig<pt::QuantModel<pt::QuantBlocks, pt::Blocks::rows>> rig(w0), full(w0);
  const gk::ReloadReport r = rig.engine->reload(pt::patch_of(w0, w1, "step-0", "one"));
  CHECK(r.patch.blocks_recomputed == 1);
  CHECK(r.patch.elements == 1);
  full.reload(w1);
  CHECK(pt::same(rig.replay(), full.replay()));

  // As many entries as blocks: every block, each output written whole.
  {
    INFO("every block: per row");
    pt::check_every_block_recomputed<pt::QuantModel<pt::QuantBlocks, pt::Blocks::rows>>(11, pt::QR);
  }
  {
    INFO("every block: 2x4 groups, scales group-major");
    pt::check_every_block_recomputed<pt::QuantModel<pt::QuantBlocks, pt::Blocks::groups>>(11, pt::QR * pt::QC / 8);
  }
  {
    INFO("every block: 2x4 groups, two values per block");
    pt::check_every_block_recomputed<pt::QuantModel<pt::QuantBlocks, pt::Blocks::packed>>(11, pt::QR * pt::QC / 8);
  }

  // The derived writes take the smaller form (Note [Patches through block
  // derivations]): one touched row stays sparse, below the two copies of
  // q (int8) a whole write takes; one element in every row touches all of
  // q, which is written whole, at two copies (new bits, undo) of q and s
  // beside the parameter's own 8 entries (an index of up to 8 bytes, a
  // value and an undo of 4 each). Written sparse, q's index alone (8 bytes
  // per 1-byte element) would be 1,024 bytes.
  const std::size_t q_bytes = pt::QR * pt::QC, s_bytes = pt::QR * sizeof(float);
  {
    const gk::StagedReload one = rig.engine->stage(pt::patch_of(w1, w0, "one", "step-0"));
    CHECK(one.staged_bytes() < 2 * q_bytes);
  }
  pt::Weights every = w1;
  for (const char* t : {"lin.a.weight", "lin.b.weight"}) {
    every[t] = w1.at(t).clone();
    for (int64_t row = 0; row < pt::QR / 2; ++row) every[t][row][row] += 0.5f;
  }
  {
    const gk::StagedReload all = rig.engine->stage(pt::patch_of(w1, every, "one", "every row"));
    CHECK(all.report().patch.blocks_recomputed == static_cast<std::size_t>(pt::QR));
    CHECK(all.staged_bytes() <= 2 * (q_bytes + s_bytes) + pt::QR * (8 + 4 + 4));
  }
  {
    pt::BasicRig<pt::QuantModel<pt::QuantBlocks, pt::Blocks::rows>> whole(w1), expect(w1);
    whole.engine->reload(pt::patch_of(w1, every, "one", "every row"));
    expect.reload(every);
    CHECK(pt::same(whole.replay(), expect.replay()));
  }

  pt::check_index_past_end_refused(rig, w1, rng);
  // A commit that fails after its writes puts the derived blocks back too.
  pt::check_failed_commit_restores(rig, full, w1, rng);
}

TEST_CASE("a block derivation that lies or binds wrongly is refused at prepare() and at full reloads, naming the member") {
  at::set_num_threads(1);
  std::mt19937_64 rng(12);
  const pt::Weights w0 = pt::quant_weights(rng);
  // A wrong block shape: PWAL quantizes rows, the declaration 2 x 8 blocks.
  GK_CHECK_THROWS_WITH_SUBSTR((pt::BasicRig<pt::QuantModel<pt::QuantBlocks, pt::Blocks::wrong_shape>>(w0)),
                              gk::DeclarationError,
                              "QuantBlocks::q is declared derived_weight.by_blocks() and bound to block derivation "
                              "'int8 per block' (blocks of 2x8 of 'w', same_as_source), but PWAL of layer 'lin' built "
                              "lin.m_.q otherwise: element ");
  // Two values per block declared block-major where PWAL stores them
  // group-major: as many elements, other places.
  GK_CHECK_THROWS_WITH_SUBSTR((pt::BasicRig<pt::QuantModel<pt::QuantBlocks, pt::Blocks::packed_untransposed>>(w0)),
                              gk::DeclarationError,
                              "QuantBlocks::s is declared scale.by_blocks() and bound to block derivation 'int8 per "
                              "block' (blocks of 2x4 of 'w', one_per_block, 2 per block), but PWAL of layer 'lin' built "
                              "lin.m_.s otherwise: element ");
  // A function that reads beyond its block agrees with PWAL over all the
  // blocks at once, and not over each half apart.
  GK_CHECK_THROWS_WITH_SUBSTR((pt::BasicRig<pt::QuantModel<pt::QuantBlocks, pt::Blocks::reads_beyond>>(w0)),
                              gk::DeclarationError, "or a block depends on more than its own elements");
  GK_CHECK_THROWS_WITH_SUBSTR((pt::BasicRig<pt::QuantModel<pt::QuantBlocks, pt::Blocks::unbound>>(w0)),
                              gk::DeclarationError,
                              "QuantBlocks::q (lin.m_.q) is declared derived_weight.by_blocks(), but layer 'lin' binds "
                              "no block derivation to it: bind it in the layer's declare_derivations()");
  GK_CHECK_THROWS_WITH_SUBSTR((pt::BasicRig<pt::QuantModel<pt::QuantPlain, pt::Blocks::not_by_blocks>>(w0)),
                              gk::DeclarationError,
                              "QuantPlain::q is an output of block derivation 'int8 per block' of layer 'lin', but its "
                              "descriptor declares it derived_weight: declare it gk::derived_weight.by_blocks()");
  GK_CHECK_THROWS_WITH_SUBSTR((pt::BasicRig<pt::QuantModel<pt::QuantBlocks, pt::Blocks::bad_source>>(w0)),
                              gk::DeclarationError,
                              "block derivation 'int8 per block' of layer 'lin' reads a source that is not a "
                              "checkpoint parameter of the layer");
  // A refused prepare() leaves a prepared engine as it was; a declaration
  // that only lies on some weights is refused at the full reload that shows
  // it, before anything is copied.
  pt::BasicRig<pt::QuantModel<pt::QuantBlocks, pt::Blocks::rows>> rig(w0);
  const at::Tensor out0 = rig.replay();
  rig.model->lin->kind_ = pt::Blocks::wrong_shape;
  CHECK_THROWS_AS(rig.engine->prepare(), gk::DeclarationError);
  CHECK(pt::same(rig.replay(), out0));
  rig.model->lin->kind_ = pt::Blocks::rows;
  CHECK(rig.engine->plan().layers().back().derivations.size() == 1);
}

TEST_CASE("layout derivations: a patch writes the changed elements where the layout put them, without PWAL") {
  at::set_num_threads(1);
  using Right = pt::MoverModel<pt::Moved, pt::Moves::right>;
  using Plain = pt::MoverModel<pt::MovedPlain, pt::Moves::undeclared>;
  pt::check_patch_chain<Right, Plain>(31, 0.05, 0.4, [](const gk::ReloadReport& r, const gk::ReloadReport& u) {
    CHECK(r.patch.layout_elements >= 2 * r.patch.elements);  // each element is in t and at least once in p
    CHECK(u.patch.layout_elements == 0);
    REQUIRE(u.patch.landings.size() == 1);
    CHECK(u.patch.landings[0].rerun);
    CHECK(u.patch.landings[0].why.find("is derived without a declared derivation") != std::string::npos);
  });

  // One element of row 0 lands in t once and in p three times (its row, and
  // the two copies); the pad's ones stay.
  std::mt19937_64 rng(32);
  const pt::Weights w0 = pt::quant_weights(rng);
  pt::Weights w1 = w0;
  w1["lin.a.weight"] = w0.at("lin.a.weight").clone();
  w1["lin.a.weight"][0][5] += 0.25f;
  pt::BasicRig<Right> rig(w0), full(w0);
  const gk::ReloadReport r = rig.engine->reload(pt::patch_of(w0, w1, "step-0", "one"));
  CHECK(r.patch.elements == 1);
  CHECK(r.patch.layout_elements == 4);
  REQUIRE(r.patch.landings.size() == 1);  // the layer's landing, as the report gives it per layer
  CHECK(r.patch.landings[0].layer == "lin");
  CHECK_FALSE(r.patch.landings[0].rerun);
  CHECK(r.patch.landings[0].layout_elements == 4);
  CHECK(r.patch.landings[0].blocks_recomputed == 0);
  full.reload(w1);
  CHECK(pt::same(rig.replay(), full.replay()));
  CHECK(at::equal(rig.model->lin->m_.t.select(1, pt::QR), at::ones({pt::QC})));

  pt::check_index_past_end_refused(rig, w1, rng);
  // A commit that fails after its writes puts the moved elements back too.
  pt::check_failed_commit_restores(rig, full, w1, rng);
}

TEST_CASE("a layout derivation that computes, lies or binds wrongly is refused at prepare(), naming the member") {
  at::set_num_threads(1);
  std::mt19937_64 rng(33);
  const pt::Weights w0 = pt::quant_weights(rng);
  GK_CHECK_THROWS_WITH_SUBSTR((pt::BasicRig<pt::MoverModel<pt::Moved, pt::Moves::computes>>(w0)),
                              gk::DeclarationError,
                              "Moved::p (lin.m_.p) is bound to layout derivation 'rows reordered, row 0 twice more' of "
                              "layer 'lin', but the function computes values instead of moving elements of 'w': output "
                              "element 0 is 98, -98 and 454 for source elements numbered i + 1, -(i + 1) and 2i + 131");
  GK_CHECK_THROWS_WITH_SUBSTR((pt::BasicRig<pt::MoverModel<pt::Moved, pt::Moves::wrong_order>>(w0)),
                              gk::DeclarationError,
                              "Moved::p is declared scale.by_layout() and bound to layout derivation 'rows reordered, "
                              "row 0 twice more' of 'w', but PWAL of layer 'lin' built lin.m_.p otherwise: element 0 is ");
  GK_CHECK_THROWS_WITH_SUBSTR((pt::BasicRig<pt::MoverModel<pt::Moved, pt::Moves::cast>>(w0)), gk::DeclarationError,
                              "layout derivation 'rows reordered, row 0 twice more' of layer 'lin' maps an int64 tensor "
                              "shaped as its source [8, 16] to Double [10, 16]");
  GK_CHECK_THROWS_WITH_SUBSTR((pt::BasicRig<pt::MoverModel<pt::Moved, pt::Moves::undeclared>>(w0)),
                              gk::DeclarationError,
                              "Moved::t (lin.m_.t) is declared derived_weight.by_layout(), but layer 'lin' binds no "
                              "layout derivation to it");
  GK_CHECK_THROWS_WITH_SUBSTR((pt::BasicRig<pt::MoverModel<pt::MovedPlain, pt::Moves::right>>(w0)),
                              gk::DeclarationError,
                              "MovedPlain::t is an output of layout derivation 'transpose, a column of ones' of layer "
                              "'lin', but its descriptor declares it derived_weight: declare it "
                              "gk::derived_weight.by_layout()");
}

// Sector writes against element writes on `device`: four parts of odd
// lengths fused into one parameter (every part but the first starts inside
// a sector), each element size, densities from 0.1 % to 100 %, staged and
// not; each serves the target's bits. A write changed after it was made is
// refused at the stage; a fault after the scatter writes the undo back.
static void check_sector_writes(c10::Device device) {
  // Bits of a tensor, to compare exactly (NaN payloads included).
  auto bytes = [](const at::Tensor& t) { return t.contiguous().view(-1).view(at::kByte).cpu(); };
  std::mt19937_64 rng(23);
  for (at::ScalarType type : {at::kByte, at::kBFloat16, at::kFloat, at::kDouble}) {
    for (double density : {0.001, 0.05, 0.5, 1.0}) {
      CAPTURE(type);
      CAPTURE(density);
      std::map<std::string, at::Tensor> base, target;
      for (const auto& [name, n] : std::vector<std::pair<std::string, int64_t>>{{"a", 13}, {"b", 1001}, {"c", 77}, {"d", 3}}) {
        const at::Tensor b = at::randint(0, 64, {n}, at::TensorOptions(at::kLong)).to(type);
        at::Tensor t = b.clone();
        for (int64_t i = 0; i < n; ++i)  // every part's first and last elements, and `density` of the rest
          if (i == 0 || i == n - 1 || static_cast<double>(rng() % 1000000) / 1e6 < density)
            t[i] = (b[i].item<double>() + 1.0) * (type == at::kByte ? 1.0 : 0.5);
        base[name] = b.to(device);
        target[name] = t.to(device);
      }
      std::vector<gk::NamedTensor> bn, tn;
      for (const auto& [name, t] : base) bn.push_back({name, t, 0});
      for (const auto& [name, t] : target) tn.push_back({name, t, 0});
      const gk::Patch p = gk::make_patch(bn, tn, {.base_version = "b", .target_version = "t"});
      const at::Tensor want = at::cat({target["a"], target["b"], target["c"], target["d"]});
      for (gk::PatchWrites writes : {gk::PatchWrites::elements, gk::PatchWrites::sectors}) {
        for (bool staged : {false, true}) {
          CAPTURE(gk::to_string(writes));
          CAPTURE(staged);
          auto layer = std::make_shared<pt::OddParts>(type, device);
          gk::InMemorySource src(bn, "base");
          gk::ReloadEngine engine(*layer);
          engine.prepare(gk::load_weights(*layer, src));
          gk::PatchOptions o = engine.options().patch;
          o.patch_writes = writes;
          if (staged && density == 0.05) {
            // Negative: one byte of one of the commit's writes changed once
            // it is made (as a wrong sector image would be): the stage's
            // target hashes read those very writes, so the patch is refused
            // there, naming a tensor, and nothing was written.
            gk::testing::EngineHooks h;
            int changed = 0;
            h.patch_writes = [&](at::Tensor& v, bool sectors) {
              if (changed > 0 || v.numel() == 0 || sectors != (writes == gk::PatchWrites::sectors)) return;
              v = v.clone();  // (element writes may be the patch's own values)
              v.view(-1).view(at::kByte).narrow(0, 0, 1).bitwise_xor_(1);
              ++changed;
            };
            gk::testing::set_hooks(engine, h);
            GK_CHECK_THROWS_WITH_SUBSTR(engine.stage(p, o), gk::WeightError, "target hash");
            CHECK(changed == 1);
            CHECK(at::equal(bytes(layer->w_), bytes(at::cat({base["a"], base["b"], base["c"], base["d"]}))));
            gk::testing::set_hooks(engine, {});
          }
          if (staged && density == 0.5) {
            // A fault after the commit's scatter: the undo (gathered at the
            // stage, on the device in one launch) writes the old bits back.
            gk::testing::EngineHooks h;
            h.fault = [](gk::testing::FaultPoint point, const std::string&) {
              if (point == gk::testing::FaultPoint::scatter) throw std::runtime_error("injected after the scatter");
            };
            gk::testing::set_hooks(engine, h);
            GK_CHECK_THROWS_WITH_SUBSTR(engine.commit(engine.stage(p, o)), std::runtime_error, "injected");
            CHECK(at::equal(bytes(layer->w_), bytes(at::cat({base["a"], base["b"], base["c"], base["d"]}))));
            gk::testing::set_hooks(engine, {});
          }
          gk::ReloadReport r;
          if (staged) r = engine.commit(engine.stage(p, o));
          else r = engine.reload(p, o);
          CHECK(at::equal(bytes(layer->w_), bytes(want)));
          CHECK(engine.served()->label() == "t");
          // Part "b" (1,001 elements) spans whole sectors at every size; a
          // dense entry (the encoding make_patch picks at high density) is a copy.
          if (writes == gk::PatchWrites::elements) CHECK(r.patch.sectors_written == 0);
          else if (density >= 0.05 && p.find("b")->encoding == gk::PatchEncoding::sparse) CHECK(r.patch.sectors_written > 0);
        }
      }
    }
  }
}

TEST_CASE("sector writes serve what element writes serve, at every alignment, element size and density") {
  at::set_num_threads(1);
  check_sector_writes(c10::kCPU);
}

TEST_CASE("patches at densities 0 to 100%, dense and sparse entries, and one that changes nothing") {
  at::set_num_threads(1);
  std::mt19937_64 rng(5);
  pt::Weights w = pt::random_weights(rng);
  const pt::Weights start = w;
  pt::Rig rig(w);
  int n = 0;
  for (double density : {0.0, 0.001, 0.01, 0.1, 0.5, 1.0}) {
    for (auto enc : {gk::MakePatchOptions::Encoding::automatic, gk::MakePatchOptions::Encoding::dense}) {
      CAPTURE(density);
      const pt::Weights next = pt::step(w, rng, density);
      gk::MakePatchOptions o;
      o.base_version = "v" + std::to_string(n);
      o.target_version = "v" + std::to_string(n + 1);
      o.encoding = enc;
      o.record_unchanged = density == 0.0;  // entries of no element: only the base check
      const gk::Patch p = gk::make_patch(pt::named(w), pt::named(next), o);
      const gk::ReloadReport r = rig.engine->reload(p);
      CHECK(pt::same(rig.replay(), pt::full_output(start, next)));
      if (density == 0.0 && enc == gk::MakePatchOptions::Encoding::automatic) {
        CHECK(r.patch.elements == 0);
        CHECK(r.patch.tensors == pt::kTensors.size());  // every base hash checked
      }
      w = next;
      ++n;
    }
  }
  CHECK(rig.engine->served()->label() == "v" + std::to_string(n));
}

TEST_CASE("bad patches are refused naming the tensor and the patch; the old weights stay served bit for bit") {
  at::set_num_threads(1);
  std::mt19937_64 rng(3);
  const pt::Weights w0 = pt::random_weights(rng), w1 = pt::step(w0, rng, 0.25), w2 = pt::step(w1, rng, 0.25);
  pt::Rig rig(w0);
  const at::Tensor out0 = rig.replay();
  const std::uint64_t v0 = rig.engine->served()->content_version();
  const gk::Patch good = pt::patch_of(w0, w1, "step-0", "step-1");
  auto served_unchanged = [&] {
    CHECK(rig.engine->replay_allowed());
    CHECK(pt::same(rig.replay(), out0));
    CHECK(rig.engine->served()->content_version() == v0);
  };
  // An entry of `good` (by name), to corrupt one field of.
  auto with_entry = [&](const std::string& name, auto&& edit) {
    gk::Patch p = good;
    for (gk::PatchEntry& e : p.entries)
      if (e.name == name) edit(e);
    return p;
  };
  struct Case {
    std::string what;
    gk::Patch patch;
    std::vector<std::string> says;
  };
  gk::Patch renamed = good;
  renamed.entries.back().name = "trans.w_typo";  // still sorted after its neighbours
  const std::vector<Case> cases = {
      {"unknown name", renamed, {"'trans.w_typo'", "unknown name", "in-memory patch"}},
      {"index out of range", with_entry("fused.k_proj.weight", [](gk::PatchEntry& e) {
         e.indices = e.indices.clone();
         e.indices[-1] = static_cast<int>(pt::D * pt::D);
       }),
       {"'fused.k_proj.weight'", "out of range"}},
      {"duplicate index", with_entry("toy.weight", [](gk::PatchEntry& e) {
         e.indices = e.indices.clone();
         e.indices[1] = e.indices[0];
       }),
       {"'toy.weight'"}},
      {"values/indices length", with_entry("custom.w", [](gk::PatchEntry& e) { e.values = e.values.narrow(0, 1, e.values.numel() - 1); }),
       {"'custom.w'"}},
      {"dtype", with_entry("trans.w", [](gk::PatchEntry& e) {
         e.dtype = at::kDouble;
         e.values = e.values.to(at::kDouble);
       }),
       {"'trans.w'", "Double", "Float"}},
      {"shape", with_entry("fused.v_proj.weight", [](gk::PatchEntry& e) { e.shape = {pt::D * pt::D}; }),
       {"'fused.v_proj.weight'", "in the model"}},
      {"target hash", with_entry("fused.q_proj.weight", [](gk::PatchEntry& e) {
         e.values = e.values.clone();
         e.values[0] = e.values[0] + 1.0f;
       }),
       {"'fused.q_proj.weight'", "target hash", "step-1"}},
      {"target hash, re-run layer", with_entry("toy.weight", [](gk::PatchEntry& e) {
         e.values = e.values.clone();
         e.values[0] = e.values[0] + 1.0f;
       }),
       {"'toy.weight'", "target hash"}},
      {"base hash", pt::patch_of(w1, w2, "step-1", "step-2"), {"base hash", "step-0 (", "its base is 'step-1'"}},
      {"NaN, scatter layer", with_entry("fused.q_proj.weight", [](gk::PatchEntry& e) {
         e.values = e.values.clone();
         e.values[1] = std::numeric_limits<float>::quiet_NaN();
       }),
       {"'fused.q_proj.weight'", "non-finite value (nan at element", "allow_non_finite"}},
      {"infinity, re-run layer", with_entry("toy.weight", [](gk::PatchEntry& e) {
         e.values = e.values.clone();
         e.values[0] = -std::numeric_limits<float>::infinity();
       }),
       {"'toy.weight'", "non-finite value (-inf at element", "allow_non_finite"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    for (bool staged : {false, true}) {
      CAPTURE(staged);
      try {
        if (staged) rig.engine->stage(c.patch);
        else rig.engine->reload(c.patch);
        FAIL("accepted a bad patch");
      } catch (const gk::WeightError& e) {
        for (const std::string& s : c.says) CHECK_MESSAGE(std::string(e.what()).find(s) != std::string::npos, e.what());
      }
      served_unchanged();
    }
  }
  // A patch file is named by its path.
  gk::testing::TempDir dir;
  gk::Patch base_mismatch = pt::patch_of(w1, w2, "step-1", "step-2");
  gk::write_patch(dir.file("p.safetensors"), base_mismatch);
  CHECK_THROWS_WITH_AS(rig.engine->reload(gk::read_patch(dir.file("p.safetensors"))),
                       doctest::Contains("p.safetensors"), gk::WeightError);
  served_unchanged();
  // Faults at every stage of a patch, on every layer: refused, nothing changed.
  for (gk::testing::FaultPoint s : {gk::testing::FaultPoint::detach, gk::testing::FaultPoint::load, gk::testing::FaultPoint::pwal,
                               gk::testing::FaultPoint::check, gk::testing::FaultPoint::copy, gk::testing::FaultPoint::scatter})
    for (const char* layer : {"fused", "toy", "trans", "custom"}) {
      CAPTURE(gk::testing::to_string(s));
      CAPTURE(layer);
      // The scatter path (fused) has no detach and no PWAL.
      if ((s == gk::testing::FaultPoint::detach || s == gk::testing::FaultPoint::pwal) && std::string(layer) == "fused") continue;
      const gk::testing::ScopedHooks hooks(rig.engine.get(), gk::testing::fault_at(s, layer));
      CHECK_THROWS_WITH(rig.engine->reload(good), doctest::Contains("injected"));
      served_unchanged();
    }
  // After every refusal the good patch applies, then a patch against the
  // old base is refused.
  rig.engine->reload(good);
  CHECK(pt::same(rig.replay(), pt::full_output(w0, w1)));
  CHECK_THROWS_WITH_AS(rig.engine->reload(good), doctest::Contains("base hash"), gk::WeightError);
  // A well-formed patch (its target hash right) that writes a NaN: refused by
  // default, served under ReloadOptions::allow_non_finite.
  pt::Weights w1nan = w1;
  w1nan["fused.q_proj.weight"] = w1.at("fused.q_proj.weight").clone();
  w1nan["fused.q_proj.weight"].view(-1)[5] = std::numeric_limits<float>::quiet_NaN();
  const gk::Patch nan_patch = pt::patch_of(w1, w1nan, "step-1", "step-1-nan");
  const at::Tensor out1 = rig.replay();
  CHECK_THROWS_WITH_AS(rig.engine->reload(nan_patch), doctest::Contains("non-finite value (nan at element 5"),
                       gk::WeightError);
  CHECK(pt::same(rig.replay(), out1));
  gk::PatchOptions any;
  any.allow_non_finite = true;
  rig.engine->reload(nan_patch, any);
  CHECK(at::isnan(rig.replay()).any().item<bool>());
}

TEST_CASE("without a kept base, a patch touching a transformed parameter is refused, saying how to keep one") {
  at::set_num_threads(1);
  std::mt19937_64 rng(9);
  const pt::Weights w0 = pt::random_weights(rng), w1 = pt::step(w0, rng, 0.1);
  pt::Rig rig(w0, gk::PatchBase::none);
  const at::Tensor out0 = rig.replay();
  CHECK(rig.engine->served()->kept_base_tensors() == 0);
  CHECK_THROWS_WITH_AS(rig.engine->reload(pt::patch_of(w0, w1, "step-0", "step-1")),
                       doctest::Contains("ReloadOptions::patch_base"), gk::WeightError);
  CHECK(pt::same(rig.replay(), out0));
  // Patches that touch only what lands unchanged (or re-runs PWAL over
  // passthrough parameters) still apply.
  pt::Weights w1b = w0;
  for (const char* n : {"fused.q_proj.weight", "norm.gamma", "toy.weight"}) w1b[n] = w1.at(n);
  rig.engine->reload(pt::patch_of(w0, w1b, "step-0", "step-1b"));
  CHECK(pt::same(rig.replay(), pt::full_output(w0, w1b)));
  // A full reload with a kept base makes the rest patchable.
  rig.reload(w1b);
  CHECK(rig.engine->served()->kept_base_tensors() == 0);
  gk::ReloadOptions keep = rig.engine->options().defaults;
  keep.patch_base = gk::PatchBase::device;
  gk::InMemorySource src(pt::delivered(w1b));
  rig.engine->reload(src, keep);
  CHECK(rig.engine->served()->kept_base_tensors() == 2);
  CHECK(rig.engine->served()->kept_base_bytes() == 2 * pt::D * pt::D * sizeof(float));
  rig.engine->reload(pt::patch_of(w1b, w1, "step-1b", "step-1"));
  CHECK(pt::same(rig.replay(), pt::full_output(w0, w1)));
}

TEST_CASE("verify_served hashes the written tensors again; a stale staged patch and an unknown content are refused") {
  at::set_num_threads(1);
  std::mt19937_64 rng(13);
  const pt::Weights w0 = pt::random_weights(rng), w1 = pt::step(w0, rng, 0.1), w2 = pt::step(w1, rng, 0.1);
  pt::Rig rig(w0);
  gk::testing::EngineHooks verifying;
  verifying.verify_served = true;
  gk::testing::set_hooks(*rig.engine, verifying);
  const gk::ReloadReport r = rig.engine->reload(pt::patch_of(w0, w1, "step-0", "step-1"));
  CHECK(r.times.hash_ms > 0);
  CHECK(pt::same(rig.replay(), pt::full_output(w0, w1)));
  // A full reload verifies too.
  gk::InMemorySource src(pt::delivered(w2));
  rig.engine->reload(src);
  // A staged patch goes stale when the weights change under it.
  gk::StagedReload s = rig.engine->stage(pt::patch_of(w2, w1, "step-2", "step-1"));
  s.abort();
  gk::StagedReload s2 = rig.engine->stage(pt::patch_of(w2, w1, "step-2", "step-1"));
  const at::Tensor out2 = rig.replay();
  CHECK_THROWS_WITH_AS(rig.reload(w0), doctest::Contains("outstanding"), gk::StateError);
  rig.engine->commit(std::move(s2));
  CHECK(pt::same(rig.replay(), pt::full_output(w0, w1)));
  CHECK_FALSE(pt::same(out2, rig.replay()));
  // Hashing off: the served content becomes unknown, and a patch is refused.
  gk::testing::EngineHooks off;
  off.skip_served_hashes = true;
  gk::testing::set_hooks(*rig.engine, off);
  gk::InMemorySource src2(pt::delivered(w0));
  const gk::ReloadReport r0 = rig.engine->reload(src2);
  gk::testing::set_hooks(*rig.engine, {});
  CHECK(r0.served == nullptr);
  CHECK(rig.engine->served() == nullptr);
  CHECK_THROWS_WITH_AS(rig.engine->reload(pt::patch_of(w0, w1, "step-0", "step-1")),
                       doctest::Contains("does not know the content it serves"), gk::StateError);
  // A slot whose copy-back is skipped (a fused parameter, passthrough)
  // leaves captured storage other than what was loaded: verify_served
  // refuses, and the model is inconsistent
  // (replay refused, the content unknown, the version moved: the captured
  // storage was written).
  gk::InMemorySource src3(pt::delivered(w1));
  rig.engine->reload(src3);
  std::string slot;
  for (const std::string& n : rig.engine->slot_names())
    if (n.find("qkv") != std::string::npos) slot = n;
  REQUIRE_FALSE(slot.empty());
  gk::testing::EngineHooks skipping;
  skipping.verify_served = true;
  skipping.unprotected_slots = {slot};
  gk::testing::set_hooks(*rig.engine, skipping);
  const std::uint64_t version = rig.engine->weight_version();
  gk::InMemorySource src4(pt::delivered(w2));
  GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->reload(src4), gk::WeightError,
                              "gk::testing::EngineHooks::verify_served: checkpoint tensor '");
  CHECK_FALSE(rig.engine->replay_allowed());
  CHECK(rig.engine->served() == nullptr);
  CHECK(rig.engine->weight_version() == version + 1);
  // (The skipped slot's field now holds PWAL's tensor: the next reload
  // refuses until the graphs are captured again, as unprotected_slots says.)
}

namespace pt {
// PWAL that doubles its parameter through a raw pointer when asked: no
// version counter moves, so only the bytes can tell that the parameter no
// longer holds what was loaded.
class RawDouble : public torch::nn::Module, public gk::DescribedLayer<RawDouble> {
 public:
  RawDouble() { w_ = checkpoint_param("w", {D, D}, at::kFloat, at::kCPU); }
  void process_weights_after_loading() override {
    if (!double_raw) return;
    float* p = static_cast<float*>(w_.mutable_data_ptr());
    for (int64_t i = 0; i < w_.numel(); ++i) p[i] *= 2.f;
  }
  bool double_raw = false;
  at::Tensor w_;
  GRAPHKEEP_DESCRIBE_DERIVED(RawDouble, (torch::nn::Module, gk::DescribedLayer<RawDouble>), (w_, gk::parameter),
                             double_raw)
};
class RawModel : public torch::nn::Module {
 public:
  RawModel() {
    fused = register_module("fused", std::make_shared<Fused>());
    raw = register_module("raw", std::make_shared<RawDouble>());
  }
  std::shared_ptr<Fused> fused;
  std::shared_ptr<RawDouble> raw;
};
}  // namespace pt

// Note [Hashing while copying]: a streaming reload takes the hashes after
// PWAL from its copy into captured storage. They must be of the bytes PWAL
// left, not of those loaded: a PWAL that doubles its parameter through a
// raw pointer (no version counter moves, adopted or not) leaves it no
// longer passthrough, and a patch of it is refused instead of scattered
// into values it was not made from.
TEST_CASE("a streaming reload hashes what it copies: a parameter PWAL wrote through a raw pointer is not patched") {
  at::set_num_threads(1);
  std::mt19937_64 rng(5);
  const std::vector<std::string> names = {"fused.k_proj.weight", "fused.q_proj.weight", "fused.v_proj.weight", "raw.w"};
  auto weights = [&] {
    pt::Weights w;
    for (const std::string& n : names) w[n] = pt::random_tensor(rng, {pt::D, pt::D}, false);
    return w;
  };
  const pt::Weights w0 = weights();
  for (bool adopt : {false, true}) {
    CAPTURE(adopt);
    pt::BasicRig<pt::RawModel> rig(w0);
    gk::ReloadOptions o = rig.engine->options().defaults;
    o.mode = gk::ReloadMode::streaming;
    o.adopt_source_tensors = adopt;
    // PWAL leaves raw.w: passthrough after the streaming reload; a patch
    // scatters into both layers and serves what a first load of its target
    // serves.
    const pt::Weights w1 = weights(), w2 = pt::step(w1, rng, 0.3);
    {
      gk::InMemorySource src(pt::delivered(w1), "w1");
      const gk::ReloadReport r = rig.engine->reload(src, o);
      CHECK(r.tensors_adopted == (adopt ? 1u : 0u));  // raw.w (fused.qkv arrives in parts)
    }
    const gk::ReloadReport p = rig.engine->reload(pt::patch_of(w1, w2, "w1", "w2"));
    CHECK(p.patch.layers_scattered == 2);
    CHECK(p.patch.layers_rerun == 0);
    CHECK(pt::same(rig.replay(), pt::BasicRig<pt::RawModel>(w2).replay()));
    // PWAL doubles raw.w through its pointer. The bug is real: the version
    // counters did not move (an adopted tensor is not refused) and the
    // served bytes are not those loaded.
    rig.model->raw->double_raw = true;
    const pt::Weights w3 = weights(), w4 = pt::step(w3, rng, 0.3);
    pt::Weights w3_source = w3;
    w3_source["raw.w"] = w3.at("raw.w").clone();  // adopted: PWAL writes the source's tensor
    {
      gk::InMemorySource src(pt::delivered(w3_source), "w3");
      rig.engine->reload(src, o);
    }
    rig.model->raw->double_raw = false;
    const at::Tensor served3 = rig.replay();
    const at::Tensor raw3 = served3.narrow(0, served3.numel() - pt::D * pt::D, pt::D * pt::D);
    CHECK(pt::same(raw3, (w3.at("raw.w") * 2).reshape(-1).to(at::kDouble)));
    // Caught: a patch touching raw.w is refused, naming the in-place write,
    // and the served weights stay; one touching only fused.qkv scatters.
    CHECK_THROWS_WITH_AS(rig.engine->reload(pt::patch_of(w3, w4, "w3", "w4")),
                         doctest::Contains("wrote parameter 'raw.w' in place"), gk::WeightError);
    CHECK(pt::same(rig.replay(), served3));
    pt::Weights w4_fused = w3;
    for (const std::string& n : names)
      if (n != "raw.w") w4_fused[n] = w4.at(n);
    const gk::ReloadReport pf = rig.engine->reload(pt::patch_of(w3, w4_fused, "w3", "w4-fused"));
    CHECK(pf.patch.layers_scattered == 1);
    const at::Tensor served4 = rig.replay();
    CHECK(pt::same(served4.narrow(0, served4.numel() - pt::D * pt::D, pt::D * pt::D), raw3));
    CHECK_FALSE(pt::same(served4, served3));
  }
}

// ---------------------------------------------------------------------------
// The CUDA scatter (label gpu): a plain module's parameters on the device
// take the scatter path; every element size (1, 2, 4, 8 bytes), int32 and
// int64 indices (a tensor of more than 2^31 elements), entries split across
// several tasks and launches, dense entries; against gk::apply_patch, the
// reference, bit for bit; and the undo after a fault at FaultPoint::scatter.
// ---------------------------------------------------------------------------
TEST_SUITE("gpu patch") {

TEST_CASE("the device's sector images serve what element writes serve, at every alignment, element size and density") {
  REQUIRE(gk::testing::cuda_available());
  check_sector_writes(c10::Device(c10::kCUDA, 0));
}

TEST_CASE("the CUDA scatter writes every element size and index width exactly, across tasks and launches") {
  REQUIRE(gk::testing::cuda_available());
  const c10::Device dev(c10::kCUDA, 0);
  struct Plain : torch::nn::Module {
    explicit Plain(const std::vector<gk::NamedTensor>& w) {
      for (const gk::NamedTensor& t : w) register_parameter(t.name, t.value.clone(), /*requires_grad=*/false);
    }
  };
  at::Generator g = at::detail::createCPUGenerator(31);
  auto random_bits = [&](at::ScalarType type, std::int64_t n) {
    const auto size = static_cast<std::int64_t>(c10::elementSize(type));
    return at::randint(0, 256, {n * size}, g, at::TensorOptions(at::kByte)).to(dev).view(type);
  };
  // Changes `fraction` of t's elements (flipped low bits: NaN payloads and all).
  auto change = [&](const at::Tensor& t, double fraction) {
    const at::ScalarType bits = t.element_size() == 1 ? at::kByte : t.element_size() == 2 ? at::kShort
                                : t.element_size() == 4 ? at::kInt : at::kLong;
    at::Tensor b = t.clone().view(bits);
    const at::Tensor mask = at::rand({t.numel()}, g).to(dev) < fraction;
    b.masked_fill_(mask, 0).bitwise_xor_(mask.to(bits));  // some become 0, then flip bit 0
    return b.view(t.scalar_type());
  };
  std::vector<gk::NamedTensor> base = {
      {"u8", random_bits(at::kByte, 3 * 16384 + 5), 0},
      {"fp8", random_bits(at::kFloat8_e4m3fn, 70001), 0},
      {"bf16", random_bits(at::kBFloat16, 40'000'000), 0},  // 50%: 20M indices, 1,221 tasks, 2 launches
      {"f32", random_bits(at::kFloat, 1 << 20), 0},
      {"i64", random_bits(at::kLong, 300'000), 0},
      {"dense", random_bits(at::kFloat, 4096), 0},
  };
  std::vector<gk::NamedTensor> target;
  for (const auto& t : base) {
    const double f = t.name == "bf16" ? 0.5 : t.name == "dense" ? 0.9 : 0.01;
    target.push_back({t.name, change(t.value, f), 0});
  }
  auto model = std::make_shared<Plain>(base);
  gk::InMemorySource src(base);
  // Random bits: the floating-point tensors hold NaN and infinities, which
  // this test moves on purpose (the refusal is tested on the CPU).
  gk::ReloadOptions any_bits;
  any_bits.allow_non_finite = true;
  gk::PatchOptions any_patch;
  any_patch.allow_non_finite = true;
  const gk::ReloadReport first = gk::load_weights(*model, src, any_bits.first_load());
  gk::ReloadEngine engine(*model, gk::EngineOptions{any_bits, any_patch});
  engine.prepare(first);
  const gk::Patch p = gk::make_patch(base, target, {.base_version = "a", .target_version = "b"});
  REQUIRE(p.find("dense")->encoding == gk::PatchEncoding::dense);
  REQUIRE((p.find("u8")->indices.scalar_type() == at::kInt));
  auto params = [&] {
    std::vector<gk::NamedTensor> out;
    for (const auto& t : base) out.push_back({t.name, model->named_parameters()[t.name], 0});
    return out;
  };
  auto equal_bits = [](const at::Tensor& a, const at::Tensor& b) {
    return at::equal(a.contiguous().view(-1).view(at::kByte), b.contiguous().view(-1).view(at::kByte));
  };
  // A fault after the scatter: written back, bit for bit.
  {
    const gk::testing::ScopedHooks hooks(&engine, gk::testing::fault_at(gk::testing::FaultPoint::scatter, ""));
    CHECK_THROWS_WITH(engine.reload(p), doctest::Contains("injected"));
  }
  {
    const std::vector<gk::NamedTensor> now = params();
    for (std::size_t i = 0; i < now.size(); ++i) CHECK(equal_bits(now[i].value, base[i].value));
  }
  gk::PatchOptions automatic = engine.options().patch;
  automatic.patch_writes = gk::PatchWrites::automatic;
  const gk::ReloadReport r = engine.reload(p, automatic);
  CHECK(r.patch.layers_scattered == 1);
  const std::vector<gk::NamedTensor> want = gk::apply_patch(p, base);
  const std::vector<gk::NamedTensor> got = params();
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(got[i].name);
    CHECK(equal_bits(got[i].value, want[i].value));
    CHECK(equal_bits(got[i].value, target[i].value));
  }
  CHECK(r.patch.sectors_written > 0);  // PatchWrites::automatic on a GPU
  MESSAGE("patch of " << p.payload_bytes() << " bytes: stage " << r.times.stage_ms << " ms, pause " << r.times.commit_ms
                      << " ms (scatter " << r.times.copy_ms << " ms, " << r.patch.sectors_written << " sectors)");
  // The same patch as element writes, from the base again.
  {
    gk::InMemorySource again(base);
    engine.reload(again);
    gk::PatchOptions o = engine.options().patch;
    o.patch_writes = gk::PatchWrites::elements;
    const gk::ReloadReport re = engine.reload(p, o);
    CHECK(re.patch.sectors_written == 0);
    const std::vector<gk::NamedTensor> by_elements = params();
    for (std::size_t i = 0; i < by_elements.size(); ++i) {
      CAPTURE(by_elements[i].name);
      CHECK(equal_bits(by_elements[i].value, target[i].value));
    }
  }

  // int64 indices: a tensor of more than 2^31 elements (2 GiB of bytes).
  const std::int64_t n = (std::int64_t{1} << 31) + 4096;
  const at::Tensor big = at::zeros({n}, at::TensorOptions(at::kByte).device(dev));
  at::Tensor big_target = big.clone();
  const at::Tensor where = at::tensor({std::int64_t{0}, std::int64_t{12345}, (std::int64_t{1} << 31) - 1,
                                       std::int64_t{1} << 31, n - 1}, at::kLong).to(dev);
  big_target.index_fill_(0, where, 7);
  auto big_model = std::make_shared<Plain>(std::vector<gk::NamedTensor>{{"big", big, 0}});
  gk::InMemorySource big_src(std::vector<gk::NamedTensor>{{"big", big, 0}});
  gk::ReloadEngine big_engine(*big_model);
  big_engine.prepare(gk::load_weights(*big_model, big_src));
  const gk::Patch bp = gk::make_patch({{"big", big, 0}}, {{"big", big_target, 0}}, {});
  REQUIRE((bp.entries.front().indices.scalar_type() == at::kLong));
  big_engine.reload(bp);
  CHECK(equal_bits(big_model->named_parameters()["big"], big_target));
}

TEST_CASE("the device's non-finite scan names the first bad element the host names, in every float dtype") {
  // The scan of reload/cuda/finite_check.cu (blocks striding over each
  // tensor, the lowest hit kept): against the known first position, across
  // vector and 64 KiB boundaries, unaligned heads and tails, and the
  // tensors of one launch.
  REQUIRE(gk::testing::cuda_available());
  const c10::Device dev(c10::kCUDA, 0);
  std::mt19937_64 rng(41);
  for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf, at::kFloat8_e5m2, at::kFloat8_e4m3fn, at::kDouble}) {
    for (std::int64_t n : {std::int64_t{1} << 10, (std::int64_t{1} << 22) + 3, std::int64_t{3} << 20}) {
      std::vector<std::vector<std::int64_t>> cases = {{0}, {n - 1}, {7, 8, 9}, {n / 2, n / 2 + 1}};
      // Around 64 KiB chunks (the elements of one thread block).
      const auto per_chunk = static_cast<std::int64_t>(65536 / c10::elementSize(t));
      for (const std::vector<std::int64_t>& c : std::vector<std::vector<std::int64_t>>{
               {per_chunk - 1, per_chunk + 5}, {per_chunk, 3 * per_chunk + 7}, {3 * per_chunk + 7, 5 * per_chunk}})
        if (c.back() < n) cases.push_back(c);
      for (int k = 0; k < 3; ++k) cases.push_back({static_cast<std::int64_t>(rng() % n), static_cast<std::int64_t>(rng() % n)});
      for (const std::vector<std::int64_t>& bad : cases) {
        CAPTURE(c10::toString(t));
        CAPTURE(n);
        CAPTURE(bad.front());
        torch::nn::Module m;
        // Two parameters scanned in one launch: the bad one second.
        m.register_parameter("clean", at::zeros({1000}, at::TensorOptions().dtype(t).device(dev)), false);
        m.register_parameter("big", at::zeros({n}, at::TensorOptions().dtype(t).device(dev)), false);
        // The source's tensor a view at an odd element offset half the
        // time (data not 16-byte aligned: the scan's head and tail).
        const std::int64_t off = bad.front() % 2 == 0 ? 0 : 3;
        at::Tensor v = at::ones({n + off}, at::TensorOptions().device(dev)).to(t).narrow(0, off, n);
        for (std::int64_t e : bad) v[e] = std::nan("");
        gk::InMemorySource src({{"clean", at::ones({1000}, at::TensorOptions().device(dev)).to(t)}, {"big", v}});
        const std::string msg = gk::testing::message_of<gk::WeightError>([&] { gk::load_weights(m, src); });
        CAPTURE(msg);
        CHECK(msg.find("weight 'big'") != std::string::npos);
        CHECK(msg.find(gk::detail::concat(" at element ", *std::min_element(bad.begin(), bad.end()), " of ")) !=
              std::string::npos);
      }
    }
    // Negative: the largest finite values are no hit.
    torch::nn::Module m;
    m.register_parameter("big", at::zeros({4099}, at::TensorOptions().dtype(t).device(dev)), false);
    const double top = t == at::kFloat8_e4m3fn ? 448.0 : t == at::kFloat8_e5m2 ? -57344.0 : -65504.0;
    gk::InMemorySource ok({{"big", at::full({4099}, top, at::TensorOptions().device(dev)).to(t)}});
    CHECK_NOTHROW(gk::load_weights(m, ok));
  }
}

TEST_CASE("the device's non-finite scan answers every tensor of a layer with more tensors than one launch takes") {
  // reload/non_finite.cpp launches a batch of cuda::kMaxFiniteTasks (512)
  // tensors as soon as it is full, each answering into its own part of one
  // result: a bad element in the first, second or a later batch, at either
  // edge of one, is named by the parameter that holds it.
  REQUIRE(gk::testing::cuda_available());
  const c10::Device dev(c10::kCUDA, 0);
  constexpr int kParams = 1300;
  for (int bad : {0, 511, 512, 1023, 1024, kParams - 1}) {
    CAPTURE(bad);
    torch::nn::Module m;
    std::vector<gk::NamedTensor> weights;
    for (int i = 0; i < kParams; ++i) {
      const at::ScalarType t = i % 3 == 0 ? at::kFloat : at::kBFloat16;
      const std::string name = gk::detail::concat("p", i);
      m.register_parameter(name, at::zeros({64}, at::TensorOptions().dtype(t).device(dev)), false);
      at::Tensor v = at::ones({64}, at::TensorOptions().device(dev)).to(t);
      if (i == bad) v[5] = std::nan("");
      if (i == kParams - 1 && bad != i) v[9] = -std::numeric_limits<double>::infinity();  // a later hit
      weights.push_back({name, v});
    }
    gk::InMemorySource src(std::move(weights));
    const std::string msg = gk::testing::message_of<gk::WeightError>([&] { gk::load_weights(m, src); });
    CAPTURE(msg);
    CHECK(msg.find(gk::detail::concat("weight 'p", bad, "'")) != std::string::npos);
    CHECK(msg.find(" at element 5 of ") != std::string::npos);
  }
}

}  // TEST_SUITE("gpu patch")
