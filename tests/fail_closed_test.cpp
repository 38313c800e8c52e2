// Fail closed on model shapes graphkeep's own models do not have:
// several declared slots viewing one storage, a PWAL that writes captured
// tensors in place and then fails, a failed PWAL that changed the object
// tree, graphs the manifest cannot vouch for, and options that name no slot.
//
// The promise checked throughout: after every call, either replay is allowed
// and bitwise equal to a freshly built model loaded with the last committed
// weights, or replay is refused with an error that names the cause.
#include "gk_test.h"
#include "rig.h"

#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/registry.h>
#include <graphkeep/reload/collector.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/model/layer.h>
#include <graphkeep/reload/manifest.h>
#include <graphkeep/capture/replay.h>

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// What a layer's next PWAL does; kept outside the described classes, so a
// test changing it is not a configuration change the engine would report.
struct Behaviour {
  bool in_place = false;          // write the derived storage in place instead of rebuilding it
  bool throw_after_write = false; // throw once the derived values are written
  bool shrink_experts = false;    // leave one expert of two (the object tree changes)
  bool drop_extra = false;        // empty the optional member
};
std::map<const void*, Behaviour>& behaviours() {
  static std::map<const void*, Behaviour> b;
  return b;
}

// A term of the output: sum over the elements a view covers, with a weight
// per position, read through the raw pointer and strides a kernel would get.
struct ViewArg {
  const float* p;
  int64_t n, stride;
  float weight;
};
float view_term(const ViewArg& v) {
  float acc = 0.f;
  for (int64_t i = 0; i < v.n; ++i) acc += v.p[i * v.stride] * (v.weight + 0.25f * static_cast<float>(i));
  return acc;
}
ViewArg arg(const at::Tensor& t, float weight) {
  return {t.data_ptr<float>(), t.numel(), t.dim() == 1 ? t.stride(0) : 1, weight};
}

// One expert of a container that PWAL may shrink.
struct Expert {
  gk::DerivedWeight w;
};
GRAPHKEEP_AGGREGATE(Expert, w);
struct Extra {
  gk::Scale s;
};
GRAPHKEEP_AGGREGATE(Extra, s);

// A layer shaped like fused weights in real engines: one derived storage
// `full_` viewed as an exact alias, a prefix (q of a fused QKV), an interior
// view (k) and a strided view, all declared; plus a container of experts and
// an optional member that PWAL rebuilds.
class ViewsLayer : public torch::nn::Module, public gk::ReloadableLayer {
 public:
  explicit ViewsLayer(int64_t n) : n_(n) { bias_ = register_parameter("bias", at::zeros({n}), false); }

  std::vector<gk::CheckpointParam> checkpoint_params() const override { return {{"bias", {{"bias", {n_}}}}}; }

  void process_weights_after_loading() override {
    const Behaviour b = behaviours()[this];
    const at::Tensor values = bias_ * 2.0f + 1.0f;
    if (b.in_place && full_.defined()) {
      // into the captured storage; the views and the tree stay as they are
      full_.copy_(values);
      for (std::size_t e = 0; e < experts_.size(); ++e) experts_[e].w.copy_(values * static_cast<float>(3 + e));
      if (extra_) extra_->s.copy_(values.flip(0));
    } else {
      full_ = values.clone();
      alias_ = full_;
      head_ = full_.narrow(0, 0, n_ / 2);
      interior_ = full_.narrow(0, 1, n_ / 2);
      strided_ = full_.slice(0, 0, n_, 2);
      experts_.clear();
      for (int e = 0; e < (b.shrink_experts ? 1 : 2); ++e) experts_.push_back({values * static_cast<float>(3 + e)});
      extra_.reset();
      if (!b.drop_extra) extra_ = Extra{values.flip(0).contiguous()};
    }
    if (b.throw_after_write) throw std::runtime_error("injected PWAL failure after writing derived tensors");
  }

  gk::ObjectRef registered_members() override { return gk::ObjectRef::of(*this); }

  // y = x + sum of every view (each with its own weights): a stale value in
  // any slot changes y.
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = gk::hostrt::empty(x.sizes(), x.options());
    std::vector<ViewArg> args{arg(full_, 1.f), arg(alias_, 0.5f), arg(head_, 2.f), arg(interior_, 3.f),
                              arg(strided_, 5.f)};
    for (std::size_t e = 0; e < experts_.size(); ++e) args.push_back(arg(experts_[e].w, 7.f + static_cast<float>(e)));
    if (extra_) args.push_back(arg(extra_->s, 11.f));
    std::vector<gk::hostrt::Access> acc{gk::hostrt::reads(x), gk::hostrt::writes(y), gk::hostrt::reads(full_)};
    for (const auto& e : experts_) acc.push_back(gk::hostrt::reads(e.w));
    if (extra_) acc.push_back(gk::hostrt::reads(extra_->s));
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t m = x.numel();
    gk::hostrt::launch("views_sum", std::move(acc), [=] {
      float t = 0.f;
      for (const ViewArg& a : args) t += view_term(a);
      for (int64_t i = 0; i < m; ++i) yp[i] = xp[i] + t;
    });
    return y;
  }

 private:
  at::Tensor bias_;
  at::Tensor full_, alias_, head_, interior_, strided_;
  std::vector<Expert> experts_;
  std::optional<Extra> extra_;
  int64_t n_;
  GRAPHKEEP_DESCRIBE_DERIVED(ViewsLayer, (torch::nn::Module, gk::ReloadableLayer), (bias_, gk::parameter),
                             (full_, gk::derived_weight), (alias_, gk::derived_weight), (head_, gk::derived_weight),
                             (interior_, gk::derived_weight), (strided_, gk::derived_weight), experts_, extra_, n_)
};

class ViewsModel : public torch::nn::Module {
 public:
  ViewsModel() {
    l0 = register_module("l0", std::make_shared<ViewsLayer>(8));
    l1 = register_module("l1", std::make_shared<ViewsLayer>(8));
  }
  at::Tensor forward(const at::Tensor& x) { return l1->forward(l0->forward(x)); }
  static std::vector<gk::NamedTensor> checkpoint(int step) {
    auto v = [&](double phase) { return at::sin(at::arange(8, at::kFloat) * 0.7 + phase + 0.37 * step); };
    return {{"l0.bias", v(0.1), 0}, {"l1.bias", v(1.3), 0}};
  }
  std::shared_ptr<ViewsLayer> l0, l1;
};

struct Rig : gk::testing::Rig<ViewsModel, gk::HostReplay> {
  explicit Rig(gk::ReloadOptions opts = {})
      : gk::testing::Rig<ViewsModel, gk::HostReplay>(
            [] {
              auto m = std::make_shared<ViewsModel>();
              behaviours().clear();
              return m;
            }(),
            at::linspace(-1.0, 1.0, 4), [](ViewsModel&) { return ViewsModel::checkpoint(0); },
            gk::testing::RigSetup().named("views").with(std::move(opts))) {}
  gk::ReloadReport reload(int step, const gk::ReloadOptions& o) {
    return gk::testing::Rig<ViewsModel, gk::HostReplay>::reload(ViewsModel::checkpoint(step), o);
  }
};

at::Tensor fresh(int step, const at::Tensor& input) {
  behaviours().clear();
  auto m = std::make_shared<ViewsModel>();
  gk::InMemorySource src(ViewsModel::checkpoint(step));
  gk::load_weights(*m, src);
  return m->forward(input);
}

gk::ReloadOptions with_mode(gk::ReloadMode mode) {
  gk::ReloadOptions o;
  o.mode = mode;
  return o;
}

}  // namespace

TEST_CASE("slots that view one storage (alias, prefix, interior, strided) reload right in both modes") {
  for (gk::ReloadMode mode : {gk::ReloadMode::streaming, gk::ReloadMode::transactional}) {
    CAPTURE(static_cast<int>(mode));
    Rig rig(with_mode(mode));
    // The plan keeps the views as separate slots of one storage.
    const gk::LayerPlan& l0 = rig.engine->plan().layers()[0];
    const auto storage_of = [&](const std::string& local) {
      for (const auto& s : l0.slots)
        if (s.local == local) return s.storage_begin();
      return std::uintptr_t{0};
    };
    REQUIRE(storage_of("full_") != 0);
    CHECK(storage_of("head_") == storage_of("full_"));
    CHECK(storage_of("interior_") == storage_of("full_"));
    CHECK(storage_of("strided_") == storage_of("full_"));
    CHECK(rig.replay().equal(fresh(0, rig.input)));
    for (int step = 1; step <= 3; ++step) {
      CAPTURE(step);
      const gk::ReloadReport r = rig.reload(step, with_mode(mode));
      CHECK(r.drift == 0);
      CHECK(rig.engine->state() == gk::EngineState::ready);
      // Bitwise equal to a fresh model: with the per-slot undo log the
      // transactional commit left old values in the shared storage here.
      CHECK(rig.replay().equal(fresh(step, rig.input)));
    }
  }
}

TEST_CASE("a transactional reload that fails after committing views of one storage restores the old values") {
  Rig rig(with_mode(gk::ReloadMode::transactional));
  const at::Tensor old = rig.replay();
  gk::ReloadOptions o = with_mode(gk::ReloadMode::transactional);
  int commits = 0;
  // Fail at the second layer's commit: the first layer's commit is undone.
  gk::testing::EngineHooks h;
  h.fault = [&](gk::testing::FaultPoint stage, const std::string&) {
    if (stage == gk::testing::FaultPoint::copy && ++commits == 2)
      throw std::runtime_error("injected fault at the second commit");
  };
  {
    const gk::testing::ScopedHooks hooks(rig.engine.get(), h);
    GK_CHECK_THROWS_WITH_SUBSTR(rig.reload(1, o), std::runtime_error, "injected fault at the second commit");
  }
  CHECK(rig.engine->state() == gk::EngineState::ready);
  CHECK(rig.replay().equal(old));
  CHECK(rig.reload(2, with_mode(gk::ReloadMode::transactional)).drift == 0);
  CHECK(rig.replay().equal(fresh(2, rig.input)));
}

TEST_CASE("a PWAL that writes captured tensors in place and then throws: restored, or replay refused") {
  SUBCASE("streaming, nothing committed yet: the scribbled values are written back") {
    Rig rig;
    rig.reload(1, {});
    const at::Tensor before = rig.replay();
    behaviours()[rig.model->l0.get()] = {.in_place = true, .throw_after_write = true};
    GK_CHECK_THROWS_WITH_SUBSTR(rig.reload(2, {}), std::runtime_error, "injected PWAL failure");
    CHECK(rig.engine->state() == gk::EngineState::ready);
    // Before the fix the engine stayed ready here and replay read the
    // values PWAL had written in place (step 2's), not step 1's.
    CHECK(rig.replay().equal(before));
    CHECK(rig.replay().equal(fresh(1, rig.input)));
  }
  SUBCASE("transactional: the same") {
    Rig rig(with_mode(gk::ReloadMode::transactional));
    behaviours()[rig.model->l1.get()] = {.in_place = true, .throw_after_write = true};
    CHECK_THROWS_AS(rig.reload(1, with_mode(gk::ReloadMode::transactional)), std::runtime_error);
    CHECK(rig.engine->state() == gk::EngineState::ready);
    CHECK(rig.replay().equal(fresh(0, rig.input)));
  }
  SUBCASE("without the backup (a testing hook switches it off) the model is marked inconsistent") {
    Rig rig;
    gk::testing::EngineHooks h;
    h.skip_in_place_backups = true;
    const gk::testing::ScopedHooks no_backup(rig.engine.get(), std::move(h));
    behaviours()[rig.model->l0.get()] = {.in_place = true, .throw_after_write = true};
    CHECK_THROWS_AS(rig.reload(1, {}), std::runtime_error);
    CHECK(rig.engine->state() == gk::EngineState::inconsistent);
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->check_replay_allowed(), gk::StateError, "skip_in_place_backups");
    // The negative: what replay would serve is neither step's model.
    CHECK_FALSE(rig.replay_unchecked().equal(fresh(0, rig.input)));
    behaviours().clear();
    rig.reload(2, {});
    CHECK(rig.replay().equal(fresh(2, rig.input)));
  }
  SUBCASE("streaming, after an earlier layer committed: inconsistent until a reload succeeds") {
    // A source read as it goes (not resident: no scan of it all first), so
    // l0's copy-back runs while l1's scan runs, before l1's PWAL (Note
    // [Copy back one layer late] in weight_stream.cpp).
    struct AsItGoes : gk::WeightSource {
      std::vector<gk::NamedTensor> v;
      std::size_t i = 0;
      std::optional<gk::NamedTensor> next() override {
        if (i == v.size()) return std::nullopt;
        return v[i++];
      }
      std::string describe() const override { return "weights read as they go"; }
    };
    Rig rig;
    behaviours()[rig.model->l1.get()] = {.in_place = true, .throw_after_write = true};
    AsItGoes src;
    src.v = ViewsModel::checkpoint(1);
    CHECK_THROWS_AS(rig.engine->reload(src, {}), std::runtime_error);
    CHECK(rig.engine->state() == gk::EngineState::inconsistent);
    CHECK_THROWS_AS(rig.engine->check_replay_allowed(), gk::StateError);
    behaviours().clear();
    rig.reload(3, {});
    CHECK(rig.replay().equal(fresh(3, rig.input)));
  }
  SUBCASE("streaming from a resident source: the earlier layer is not yet committed, so nothing changes") {
    // The source is scanned whole first; l0's copy-back then waits for
    // l1's PWAL and checks (Note [Copy back one layer late]), so l1's failure
    // finds l0 processed, not committed: both are rolled back.
    Rig rig;
    behaviours()[rig.model->l1.get()] = {.in_place = true, .throw_after_write = true};
    CHECK_THROWS_AS(rig.reload(1, {}), std::runtime_error);
    CHECK(rig.engine->state() == gk::EngineState::ready);
    CHECK(rig.replay().equal(fresh(0, rig.input)));
    behaviours().clear();
    rig.reload(3, {});
    CHECK(rig.replay().equal(fresh(3, rig.input)));
  }
  SUBCASE("an in-place PWAL that succeeds is committed as is") {
    Rig rig;
    behaviours()[rig.model->l0.get()] = {.in_place = true};
    behaviours()[rig.model->l1.get()] = {.in_place = true};
    rig.reload(1, {});
    CHECK(rig.replay().equal(fresh(1, rig.input)));
  }
}

TEST_CASE("after a failed PWAL changed the object tree, the next reload recovers or fails with an error") {
  for (gk::ReloadMode mode : {gk::ReloadMode::streaming, gk::ReloadMode::transactional}) {
    for (const Behaviour broken : {Behaviour{.shrink_experts = true}, Behaviour{.drop_extra = true}}) {
      CAPTURE(static_cast<int>(mode));
      CAPTURE(broken.shrink_experts);
      Rig rig(with_mode(mode));
      behaviours()[rig.model->l0.get()] = broken;
      GK_CHECK_THROWS_WITH_SUBSTR(rig.reload(1, with_mode(mode)), gk::MismatchError, "no longer resolves");
      CHECK(rig.engine->state() == gk::EngineState::inconsistent);
      CHECK_THROWS_AS(rig.engine->check_replay_allowed(), gk::StateError);
      // PWAL still breaks the tree: an error again, never a crash (this
      // reload used to dereference the path that no longer resolves).
      CHECK_THROWS_AS(rig.reload(2, with_mode(mode)), gk::MismatchError);
      CHECK(rig.engine->state() == gk::EngineState::inconsistent);
      // PWAL builds the tree again: the reload recovers the model.
      behaviours().clear();
      const gk::ReloadReport r = rig.reload(3, with_mode(mode));
      CHECK(r.drift == 0);
      CHECK(rig.engine->state() == gk::EngineState::ready);
      CHECK(gk::lint_drift(rig.engine->plan()).empty());
      CHECK(rig.replay().equal(fresh(3, rig.input)));
    }
  }
}

namespace {

// A kernel that keeps a raw allocation (a stand-in for a library handle's
// workspace or a caching-allocator block) and reads it in its launch.
class RawBlockKernel {
 public:
  RawBlockKernel() = default;
  explicit RawBlockKernel(const at::Tensor& w)
      : w_(w * 1.0f), block_(c10::GetCPUAllocator()->allocate(4 * sizeof(float))) {
    float* b = static_cast<float*>(block_.get());
    for (int i = 0; i < 4; ++i) b[i] = 0.5f * static_cast<float>(i);
  }
  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor y = gk::hostrt::empty(x.sizes(), x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = w_.data_ptr<float>();
    const float* bp = static_cast<const float*>(block_.get());
    float* yp = y.data_ptr<float>();
    const int64_t n = x.numel();
    gk::hostrt::launch("raw_block",
                       {gk::hostrt::reads(x), gk::hostrt::reads(w_), gk::hostrt::reads(bp, 4 * sizeof(float)),
                        gk::hostrt::writes(y)},
                       [=] {
                         for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] * wp[i] + bp[i % 4];
                       });
    return y;
  }
  const void* block() const { return block_.get(); }

 private:
  at::Tensor w_;
  c10::DataPtr block_;
  GRAPHKEEP_DESCRIBE(RawBlockKernel, (w_, gk::derived_weight),
                     (block_, gk::opaque("a library workspace, allocated once per kernel")))
};

class RawLayer : public torch::nn::Module, public gk::ReloadableLayer {
 public:
  RawLayer() { weight_ = register_parameter("weight", at::ones({4}), false); }
  std::vector<gk::CheckpointParam> checkpoint_params() const override { return {{"weight", {{"weight", {4}}}}}; }
  void process_weights_after_loading() override { kernel_ = RawBlockKernel(weight_); }
  gk::ObjectRef registered_members() override { return gk::ObjectRef::of(*this); }
  at::Tensor forward(const at::Tensor& x) { return kernel_.forward(x); }
  const RawBlockKernel& kernel() const { return kernel_; }

 private:
  RawBlockKernel kernel_;
  at::Tensor weight_;
  GRAPHKEEP_DESCRIBE_DERIVED(RawLayer, (torch::nn::Module, gk::ReloadableLayer), kernel_, (weight_, gk::parameter))
};

class RawModel : public torch::nn::Module {
 public:
  RawModel() { layer = register_module("layer", std::make_shared<RawLayer>()); }
  std::shared_ptr<RawLayer> layer;
};

// A model whose forward is plain ATen: nothing goes through gk::hostrt.
class EagerModel : public torch::nn::Module {
 public:
  EagerModel() { weight = register_parameter("weight", at::ones({4}), false); }
  at::Tensor forward(const at::Tensor& x) { return x * weight; }
  at::Tensor weight;
};

// Captures a graph that copies `input` into `output` and reads nothing else:
// none of any model's slots.
void capture_copy_of(gk::HostReplay& graph, const at::Tensor& input, at::Tensor& output) {
  graph.capture([&] {
    output = gk::hostrt::empty(input.sizes(), input.options());
    const float* x = input.data_ptr<float>();
    float* y = output.data_ptr<float>();
    const int64_t n = input.numel();
    gk::hostrt::launch("copy", {gk::hostrt::reads(input), gk::hostrt::writes(output)}, [=] {
      for (int64_t i = 0; i < n; ++i) y[i] = x[i];
    });
  });
}

gk::InMemorySource raw_weights(int step) {
  return gk::InMemorySource({{"layer.weight", at::arange(4, at::kFloat) + static_cast<float>(step), 0}});
}

}  // namespace

TEST_CASE("a graph reading memory that nothing owns is refused at capture, unless the range is allowed") {
  auto model = std::make_shared<RawModel>();
  gk::InMemorySource src = raw_weights(0);
  gk::load_weights(*model, src);
  const at::Tensor input = at::ones({4});
  at::Tensor output;
  SUBCASE("refused: the message names a raw allocation and the opaque member that may hold it") {
    gk::ReloadEngine engine(*model);
    engine.prepare();
    engine.add_static_io("input", input);
    gk::HostReplay graph("raw");
    graph.capture([&] { output = model->layer->forward(input); });
    const std::string msg = gk::testing::message_of<gk::DriftError>([&] { engine.track(graph); });
    INFO(msg);
    CHECK(msg.find("replay refused at capture") != std::string::npos);
    CHECK(msg.find("in no tensor the collector reaches (a raw allocation") != std::string::npos);
    CHECK(msg.find("opaque members of the layers this node reads that could hold it: layer.kernel_.block_") !=
          std::string::npos);
    CHECK(msg.find("allow_address_range") != std::string::npos);
    CHECK(engine.state() == gk::EngineState::drift);
    CHECK_THROWS_AS(engine.check_replay_allowed(), gk::DriftError);
    // Still refused after a reload: the graph stays tracked.
    gk::InMemorySource next = raw_weights(1);
    CHECK_THROWS_AS(engine.reload(next), gk::DriftError);
    CHECK_THROWS_AS(engine.check_replay_allowed(), gk::DriftError);
  }
  SUBCASE("allowed by name, with a reason: tracked, replay allowed, the range named in the manifest") {
    gk::ReloadEngine engine(*model);
    engine.prepare();
    engine.add_static_io("input", input);
    CHECK_THROWS_AS(engine.allow_address_range("block", model->layer->kernel().block(), 16, ""), gk::StateError);
    engine.allow_address_range("kernel block", model->layer->kernel().block(), 4 * sizeof(float),
                               "a library workspace, allocated once per kernel");
    gk::HostReplay graph("raw");
    graph.capture([&] { output = model->layer->forward(input); });
    engine.track(graph);
    CHECK(engine.replay_allowed());
    const gk::CaptureManifest* m = engine.manifest(graph);
    REQUIRE(m != nullptr);
    bool named = false;
    for (const auto& e : m->entries()) named = named || e.owner.find("kernel block (allowed: a library") == 0;
    CHECK(named);
  }
}

namespace {

// A layer whose launch also lists one word that is not an operand: a stand-in
// for stale host bytes in a CUDA kernel's parameters (Note [Stale bytes in
// kernel parameters]). Which raw block the word points at depends on the call.
class NoisyLayer : public torch::nn::Module, public gk::ReloadableLayer {
 public:
  NoisyLayer() { weight_ = register_parameter("weight", at::ones({4}), false); }
  std::vector<gk::CheckpointParam> checkpoint_params() const override { return {{"weight", {{"weight", {4}}}}}; }
  void process_weights_after_loading() override {}
  gk::ObjectRef registered_members() override { return gk::ObjectRef::of(*this); }
  at::Tensor forward(const at::Tensor& x, const void* stale) {
    at::Tensor y = gk::hostrt::empty(x.sizes(), x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = weight_.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t n = x.numel();
    gk::hostrt::launch("noisy", {gk::hostrt::reads(x), gk::hostrt::reads(weight_), gk::hostrt::reads(stale, 8),
                                 gk::hostrt::writes(y)},
                       [=] {
                         for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] * wp[i];
                       });
    return y;
  }

 private:
  at::Tensor weight_;
  GRAPHKEEP_DESCRIBE_DERIVED(NoisyLayer, (torch::nn::Module, gk::ReloadableLayer), (weight_, gk::parameter))
};

class NoisyModel : public torch::nn::Module {
 public:
  NoisyModel() { layer = register_module("layer", std::make_shared<NoisyLayer>()); }
  std::shared_ptr<NoisyLayer> layer;
};

}  // namespace

TEST_CASE("a raw word that a second capture does not repeat is stale bytes, not an address (track with forward)") {
  auto model = std::make_shared<NoisyModel>();
  gk::InMemorySource src = raw_weights(0);
  gk::load_weights(*model, src);
  const at::Tensor input = at::arange(4, at::kFloat) + 1.0f;
  at::Tensor output;
  std::vector<c10::DataPtr> junk;  // raw blocks no tensor owns
  for (int i = 0; i < 3; ++i) junk.push_back(c10::GetCPUAllocator()->allocate(8));
  int calls = 0;
  bool vary = true;  // the stale word changes from capture to capture
  const std::function<void()> forward = [&] {
    const void* stale = junk[vary ? static_cast<std::size_t>(calls) % junk.size() : 0].get();
    ++calls;
    output = model->layer->forward(input, stale);
  };

  SUBCASE("negative: without the forward, track() cannot tell and refuses the graph") {
    gk::ReloadEngine engine(*model);
    engine.prepare();
    engine.add_static_io("input", input);
    gk::HostReplay graph("noisy");
    graph.capture(forward);
    const std::string msg = gk::testing::message_of<gk::DriftError>([&] { engine.track(graph); });
    CHECK(msg.find("in no tensor the collector reaches (a raw allocation") != std::string::npos);
    CHECK(calls == 1);
    CHECK(engine.state() == gk::EngineState::drift);
  }
  SUBCASE("positive: with the forward, the word is captured once more, not repeated, and classified unstable") {
    gk::ReloadEngine engine(*model);
    engine.prepare();
    engine.add_static_io("input", input);
    gk::HostReplay graph("noisy");
    graph.capture(forward);
    engine.track(graph, forward);
    CHECK(calls == 2);  // one recapture
    CHECK(engine.replay_allowed());
    const gk::CaptureManifest* m = engine.manifest(graph);
    REQUIRE(m != nullptr);
    CHECK(m->count(gk::AddressClass::unknown) == 0);
    CHECK(m->count(gk::AddressClass::unstable) == 1);
    CHECK(m->count(gk::AddressClass::slot) == 1);
    // The kept graph is the second capture, and reloads verify it.
    for (int step = 1; step <= 2; ++step) {
      gk::InMemorySource next = raw_weights(step);
      const gk::ReloadReport r = engine.reload(next);
      CHECK(r.drift == 0);
      graph.replay();
      CHECK(at::equal(output, input * (at::arange(4, at::kFloat) + static_cast<float>(step))));
    }
  }
  SUBCASE("negative: a raw word the second capture repeats is a real read, and still refused") {
    vary = false;
    gk::ReloadEngine engine(*model);
    engine.prepare();
    engine.add_static_io("input", input);
    gk::HostReplay graph("noisy");
    graph.capture(forward);
    const std::string msg = gk::testing::message_of<gk::DriftError>([&] { engine.track(graph, forward); });
    CHECK(calls == 2);
    CHECK(msg.find("reads 1 address(es) that no slot, pool, static buffer or allowed range owns") != std::string::npos);
    CHECK(engine.state() == gk::EngineState::drift);
  }
  SUBCASE("a clean capture is not captured again") {
    gk::ReloadEngine engine(*model);
    engine.prepare();
    engine.add_static_io("input", input);
    engine.allow_address_range("junk0", junk[0].get(), 8, "the test's block");
    vary = false;
    gk::HostReplay graph("noisy");
    graph.capture(forward);
    engine.track(graph, forward);
    CHECK(calls == 1);
    CHECK(engine.replay_allowed());
  }
}

namespace {

// The host backend, but reporting some addresses as lying in free allocator
// blocks, as the CUDA backend does from the caching allocator's snapshot.
class FreeBlockReplay final : public gk::ReplayBackend {
 public:
  std::vector<std::uintptr_t> free_addresses;
  void capture(const std::function<void()>& f) override { host_.capture(f); }
  void recapture(const std::function<void()>& f) override { host_.recapture(f); }
  void replay() override { host_.replay(); }
  bool captured() const override { return host_.captured(); }
  std::vector<gk::CapturedAddress> addresses() const override { return host_.addresses(); }
  bool in_private_pool(std::uintptr_t a) const override { return host_.in_private_pool(a); }
  std::vector<bool> in_live_allocation(const std::vector<std::uintptr_t>& addresses) const override {
    std::vector<bool> live;
    for (std::uintptr_t a : addresses)
      live.push_back(std::find(free_addresses.begin(), free_addresses.end(), a) == free_addresses.end());
    return live;
  }
  std::string name() const override { return "free-block"; }
  c10::Device device() const override { return c10::kCPU; }

 private:
  gk::HostReplay host_{"free-block"};
};

}  // namespace

TEST_CASE("a raw word into memory no live allocation covers is stale bytes; a live one is still refused") {
  auto model = std::make_shared<NoisyModel>();
  gk::InMemorySource src = raw_weights(0);
  gk::load_weights(*model, src);
  const at::Tensor input = at::arange(4, at::kFloat) + 1.0f;
  at::Tensor output;
  c10::DataPtr block = c10::GetCPUAllocator()->allocate(8);
  const auto word = reinterpret_cast<std::uintptr_t>(block.get());
  const std::function<void()> forward = [&] { output = model->layer->forward(input, block.get()); };
  gk::ReloadEngine engine(*model);
  engine.prepare();
  engine.add_static_io("input", input);
  SUBCASE("negative: the backend reports the block live: refused, even with the forward") {
    FreeBlockReplay graph;
    graph.capture(forward);
    const std::string msg = gk::testing::message_of<gk::DriftError>([&] { engine.track(graph, forward); });
    CHECK(msg.find("in no tensor the collector reaches (a raw allocation") != std::string::npos);
  }
  SUBCASE("positive: the backend reports it free: unstable, tracked, and reloads verify the graph") {
    FreeBlockReplay graph;
    graph.free_addresses = {word};
    graph.capture(forward);
    engine.track(graph);  // no recapture needed
    CHECK(engine.replay_allowed());
    const gk::CaptureManifest* m = engine.manifest(graph);
    REQUIRE(m != nullptr);
    CHECK(m->count(gk::AddressClass::unstable) == 1);
    CHECK(m->count(gk::AddressClass::unknown) == 0);
    gk::InMemorySource next = raw_weights(1);
    CHECK(engine.reload(next).drift == 0);
    graph.replay();
    CHECK(at::equal(output, input * (at::arange(4, at::kFloat) + 1.0f)));
  }
}

TEST_CASE("a capture that records nothing, or reads none of the model's slots, is refused") {
  const at::Tensor input = at::ones({4});
  at::Tensor output;
  SUBCASE("plain ATen ops on the CPU backend record no launch") {
    auto model = std::make_shared<EagerModel>();
    gk::ReloadEngine engine(*model);
    engine.prepare();
    gk::HostReplay graph("eager");
    graph.capture([&] { output = model->forward(input); });
    CHECK(graph.addresses().empty());
    GK_CHECK_THROWS_WITH_SUBSTR(engine.track(graph), gk::DriftError,
                                "recorded no launch and no address: on the CPU replay backend a forward must "
                                "launch through gk::hostrt");
    CHECK_THROWS_AS(engine.check_replay_allowed(), gk::DriftError);
  }
  SUBCASE("a graph that reads only its input") {
    auto model = std::make_shared<RawModel>();
    gk::InMemorySource src = raw_weights(0);
    gk::load_weights(*model, src);
    gk::ReloadEngine engine(*model);
    engine.prepare();
    engine.add_static_io("input", input);
    gk::HostReplay graph("copy");
    capture_copy_of(graph, input, output);
    GK_CHECK_THROWS_WITH_SUBSTR(engine.track(graph), gk::DriftError, "reads none of the model's 2 slots");
    CHECK_FALSE(engine.replay_allowed());
  }
}

// Note [Capture verdicts last] in reload/capture_tracking.cpp. Before it, the first
// successful reload() set the engine back to ready: verification re-checks
// the recorded addresses only, and an empty manifest (or one of static I/O)
// passes, so the refused graph replayed the old weights' output.
TEST_CASE("a graph refused at capture stays refused across reload(), stage() and commit() until untrack()") {
  const at::Tensor input = at::ones({4});
  at::Tensor output;
  SUBCASE("a forward of plain ATen ops: reload() keeps replay refused") {
    auto model = std::make_shared<EagerModel>();
    gk::ReloadEngine engine(*model);
    engine.prepare();
    gk::HostReplay graph("eager");
    graph.capture([&] { output = model->forward(input); });
    CHECK_THROWS_AS(engine.track(graph), gk::DriftError);
    for (int step = 1; step <= 2; ++step) {
      gk::InMemorySource next({{"weight", at::full({4}, static_cast<float>(step)), 0}});
      GK_CHECK_THROWS_WITH_SUBSTR(engine.reload(next), gk::DriftError,
                                  "after the reload, replay stays refused: graph 'eager' was refused at capture and "
                                  "is still tracked");
      CHECK(engine.state() == gk::EngineState::drift);
      GK_CHECK_THROWS_WITH_SUBSTR(engine.check_replay_allowed(), gk::DriftError, "recorded no launch");
      CHECK(model->weight.equal(at::full({4}, static_cast<float>(step))));  // the weights did load
    }
    // The verdict ends with the graph; the next reload that succeeds allows replay.
    engine.untrack(graph);
    CHECK_FALSE(engine.replay_allowed());
    gk::InMemorySource again({{"weight", at::full({4}, 3.0f), 0}});
    CHECK(engine.reload(again).drift == 0);
    CHECK(engine.replay_allowed());
    CHECK(model->weight.equal(at::full({4}, 3.0f)));
  }
  SUBCASE("a graph that reads no slot: stage() is refused, and a reload stays refused") {
    auto model = std::make_shared<RawModel>();
    gk::InMemorySource src = raw_weights(0);
    gk::load_weights(*model, src);
    gk::ReloadEngine engine(*model);
    engine.prepare();
    engine.add_static_io("input", input);
    gk::HostReplay graph("copy");
    capture_copy_of(graph, input, output);
    CHECK_THROWS_AS(engine.track(graph), gk::DriftError);
    gk::InMemorySource s1 = raw_weights(1);
    GK_CHECK_THROWS_WITH_SUBSTR(engine.stage(s1), gk::StateError, "stage() refused: the engine is drift");
    gk::InMemorySource s2 = raw_weights(2);
    GK_CHECK_THROWS_WITH_SUBSTR(engine.reload(s2), gk::DriftError, "reads none of the model's 2 slots");
    CHECK_FALSE(engine.replay_allowed());
    // A second, good graph does not lift the first one's verdict.
    gk::HostReplay good("good");
    good.capture([&] { output = model->layer->forward(input); });
    engine.allow_address_range("kernel block", model->layer->kernel().block(), 4 * sizeof(float), "a workspace");
    engine.track(good);
    CHECK_FALSE(engine.replay_allowed());
    engine.untrack(graph);
    CHECK_FALSE(engine.replay_allowed());  // until a reload succeeds
    gk::InMemorySource s25 = raw_weights(2);
    CHECK(engine.reload(s25).drift == 0);
    CHECK(engine.replay_allowed());  // the good graph verifies
    gk::InMemorySource s3 = raw_weights(3);
    gk::StagedReload staged = engine.stage(s3);
    const gk::ReloadReport r = engine.commit(std::move(staged));
    CHECK(r.drift == 0);
    CHECK(r.addresses_verified > 0);
    CHECK(engine.replay_allowed());
    // (No replay: PWAL gave the kernel a new raw block, and the allowed range
    // names the freed one; only the reload's verdicts are under test here.)
  }
  SUBCASE("a graph refused between stage() and commit(): the commit is refused and replay stays refused") {
    auto model = std::make_shared<EagerModel>();
    gk::ReloadEngine engine(*model);
    engine.prepare();
    gk::InMemorySource next({{"weight", at::full({4}, 2.0f), 0}});
    gk::StagedReload staged = engine.stage(next);
    gk::HostReplay graph("eager");
    graph.capture([&] { output = model->forward(input); });
    CHECK_THROWS_AS(engine.track(graph), gk::DriftError);
    CHECK_THROWS_AS(engine.commit(std::move(staged)), gk::StateError);
    CHECK(model->weight.equal(at::ones({4})));
    CHECK_FALSE(engine.replay_allowed());
  }
}

TEST_CASE("unprotected_slots must name slots: an unknown name is an error that suggests the closest") {
  Rig rig;
  const std::vector<std::string> names = rig.engine->slot_names();
  CHECK(std::find(names.begin(), names.end(), "l0.head_") != names.end());
  CHECK(std::find(names.begin(), names.end(), "l1.experts_[1].w") != names.end());
  CHECK(std::find(names.begin(), names.end(), "l0.bias") != names.end());
  // On a prepared engine: refused at once, the engine keeps no hook, the
  // model is untouched and replay stays allowed.
  gk::testing::EngineHooks o;
  o.unprotected_slots = {"l0.haed_"};
  // The whole message: the hook's real name (ReloadOptions has no such field).
  std::string whole;
  try {
    gk::testing::set_hooks(*rig.engine, o);
  } catch (const gk::StateError& e) {
    whole = e.message();
  }
  CHECK(whole == "gk::testing::EngineHooks::unprotected_slots names 'l0.haed_', which is no slot of the model; "
                 "closest: 'l0.head_', 'l1.head_', 'l0.full_' (slot names: module path, then parameter or member "
                 "path, as "
                 "ReloadEngine::slot_names() lists them)");
  CHECK(gk::testing::hooks(*rig.engine).unprotected_slots.empty());
  CHECK(rig.reload(1, {}).drift == 0);
  CHECK(rig.replay().equal(fresh(1, rig.input)));
  // At prepare(), for an engine not yet prepared.
  gk::ReloadEngine other(*rig.model);
  gk::testing::set_hooks(other, o);
  CHECK_THROWS_AS(other.prepare(), gk::StateError);
  // A real name is accepted and disables that slot's copy-back. The graph
  // reads the storage through full_, which was copied; the head_ view moved
  // anyway, and a moved view of a storage a graph reads is drift.
  o.unprotected_slots = {"l0.head_"};
  gk::testing::set_hooks(*rig.engine, o);
  GK_CHECK_THROWS_WITH_SUBSTR(rig.reload(2, {}), gk::DriftError, "l0.head_ now points at other storage");
}

TEST_CASE("a graph destroyed while tracked is dropped and reported, never used") {
  behaviours().clear();
  auto model = std::make_shared<ViewsModel>();
  gk::InMemorySource src(ViewsModel::checkpoint(0));
  gk::load_weights(*model, src);
  gk::ReloadEngine engine(*model);
  engine.prepare();
  const at::Tensor input = at::linspace(-1.0, 1.0, 4);
  engine.add_static_io("input", input);
  at::Tensor output;
  {
    // Declared after the engine, so destroyed first: the order a user's
    // code easily has.
    auto graph = std::make_unique<gk::HostReplay>("short-lived");
    graph->capture([&] { output = model->forward(input); });
    engine.track(*graph);
    CHECK(engine.manifest(*graph) != nullptr);
  }
  // A new graph (the allocator may well give it the same address) has no
  // manifest: the destroyed one's is not found through a reused pointer.
  auto again = std::make_unique<gk::HostReplay>("again");
  CHECK(engine.manifest(*again) == nullptr);
  gk::InMemorySource next(ViewsModel::checkpoint(1));
  const gk::ReloadReport r = engine.reload(next);
  REQUIRE(r.graphs_destroyed.size() == 1);
  CHECK(r.graphs_destroyed[0] == "short-lived");
  CHECK(engine.verify().ok());
  // A copy of a graph has a lifetime of its own.
  gk::HostReplay a("a");
  a.capture([&] { output = model->forward(input); });
  {
    gk::HostReplay b = a;
    CHECK_FALSE(b.lifetime().expired());
  }
  CHECK_FALSE(a.lifetime().expired());
}
