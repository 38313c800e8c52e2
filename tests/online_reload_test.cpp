// Online reload: ReloadEngine::stage() loads, processes and checks
// new weights into new storage while the captured graphs keep replaying the
// old ones; commit() copies them in between two replays; abort() or dropping
// the staged object changes nothing. Positive cases against a plain reload
// and a freshly built model, bit for bit; the refusals, each with its message;
// the in-place PWAL hazard staging exists for, with its negative control; and
// a two-thread stress run (GK_ONLINE_ITERS stage/commit/abort rounds, 1,000
// by default) in which every replay must return A's or B's output exactly.
#include "gk_test.h"

#include <graphkeep/capture/replay.h>
#include <graphkeep/delta/make_patch.h>
#include <graphkeep/hashing/content_hash.h>
#include <graphkeep/model/layer.h>
#include <graphkeep/registry.h>
#include <graphkeep/reload/manifest.h>
#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/reload/staged_reload.h>
#include <graphkeep/runtime/host_stream.h>

#include "rig.h"
#include "toy_model.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Rig : gk::testing::Rig<toy::ToyModel, gk::HostReplay> {
  explicit Rig(int64_t d = 8, int64_t h = 16)
      : gk::testing::Rig<toy::ToyModel, gk::HostReplay>(std::make_shared<toy::ToyModel>(d, h),
                                                        at::linspace(-1.0, 1.0, 3 * d).reshape({3, d}),
                                                        [](toy::ToyModel& m) { return m.checkpoint(0); },
                                                        gk::testing::RigSetup().named("toy")) {}
  at::Tensor eager() { return model->forward(input); }
  std::vector<gk::NamedTensor> weights(int step) const { return model->checkpoint(step); }
  gk::StagedReload stage(int step) {
    gk::InMemorySource src(weights(step), concat_label(step));
    return engine->stage(src);
  }
  gk::ReloadReport reload(int step) {
    gk::InMemorySource src(weights(step), concat_label(step));
    return engine->reload(src);
  }
  static std::string concat_label(int step) { return "weights of step " + std::to_string(step); }
};

using toy::captured_addresses;
using toy::fresh_output;

std::vector<gk::NamedTensor> without(std::vector<gk::NamedTensor> v, const std::string& name) {
  std::erase_if(v, [&](const gk::NamedTensor& t) { return t.name == name; });
  return v;
}

// ---------------------------------------------------------------------------
// A layer whose PWAL writes its derived tensor in place once it exists: on a
// reload that is the captured storage (Note [Undo by storage] in
// reload/storage_backups.h). `head_` views the same storage; `busy_` is a
// zero-init workspace the graph writes while it replays (like a lock);
// `hits` is a buffer the graph counts its replays in and PWAL leaves alone
// (a cache: a commit must not revert it to its value at stage() time).
class InPlaceLayer : public torch::nn::Module, public gk::ReloadableLayer {
 public:
  explicit InPlaceLayer(int64_t n) : n_(n) {
    bias_ = register_parameter("bias", at::zeros({n}), false);
    register_buffer("hits", at::zeros({1}, at::kLong));
  }
  at::Tensor hits() { return named_buffers(/*recurse=*/false)["hits"]; }

  std::vector<gk::CheckpointParam> checkpoint_params() const override { return {{"bias", {{"bias", {n_}}}}}; }

  void process_weights_after_loading() override {
    const at::Tensor values = bias_ * 2.0f + 1.0f;
    if (derived_.defined()) {
      derived_.copy_(values);  // in place: what the graphs read, on a reload
    } else {
      derived_ = values.clone();
      head_ = derived_.narrow(0, 0, n_ / 2);
      busy_ = at::zeros({1}, at::kInt);
    }
  }
  gk::ObjectRef registered_members() override { return gk::ObjectRef::of(*this); }

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = gk::hostrt::empty(x.sizes(), x.options());
    const float* xp = x.data_ptr<float>();
    const float* dp = derived_.data_ptr<float>();
    const float* hp = head_.data_ptr<float>();
    int32_t* bp = busy_.data_ptr<int32_t>();
    const at::Tensor h = hits();
    int64_t* counter = h.data_ptr<int64_t>();
    float* yp = y.data_ptr<float>();
    const int64_t m = x.numel(), n = n_, nh = head_.numel();
    gk::hostrt::launch("in_place_sum",
                       {gk::hostrt::reads(x), gk::hostrt::reads(derived_), gk::hostrt::writes(busy_),
                        gk::hostrt::writes(y), gk::hostrt::writes(h)},
                       [=] {
                         counter[0] += 1;
                         bp[0] += 1;
                         float t = 0.f;
                         for (int64_t i = 0; i < n; ++i) t += dp[i] * (1.f + 0.5f * static_cast<float>(i));
                         for (int64_t i = 0; i < nh; ++i) t += 3.f * hp[i];
                         for (int64_t i = 0; i < m; ++i) yp[i] = xp[i] * static_cast<float>(bp[0]) + t;
                         bp[0] -= 1;
                       });
    return y;
  }

  // The negative control: what loading into the live layer and running its
  // PWAL would do, with the parameter handled as a reload handles it (new
  // storage) but without the staging copies.
  void pwal_on_live_model(const at::Tensor& bias) {
    bias_.set_data(bias.clone());
    process_weights_after_loading();
  }

 private:
  at::Tensor bias_, derived_, head_, busy_;
  int64_t n_;
  GRAPHKEEP_DESCRIBE_DERIVED(InPlaceLayer, (torch::nn::Module, gk::ReloadableLayer), (bias_, gk::parameter),
                             (derived_, gk::derived_weight), (head_, gk::derived_weight),
                             (busy_, gk::workspace(gk::Init::zero)), n_)
};

class InPlaceModel : public torch::nn::Module {
 public:
  InPlaceModel() {
    l0 = register_module("l0", std::make_shared<InPlaceLayer>(8));
    l1 = register_module("l1", std::make_shared<InPlaceLayer>(8));
  }
  at::Tensor forward(const at::Tensor& x) { return l1->forward(l0->forward(x)); }
  static std::vector<gk::NamedTensor> checkpoint(int step) {
    auto v = [&](double phase) { return at::sin(at::arange(8, at::kFloat) * 0.7 + phase + 0.37 * step); };
    return {{"l0.bias", v(0.1), 0}, {"l1.bias", v(1.3), 0}};
  }
  std::shared_ptr<InPlaceLayer> l0, l1;
};

struct InPlaceRig : gk::testing::Rig<InPlaceModel, gk::HostReplay> {
  InPlaceRig()
      : gk::testing::Rig<InPlaceModel, gk::HostReplay>(std::make_shared<InPlaceModel>(), at::linspace(-1.0, 1.0, 4),
                                                       [](InPlaceModel&) { return InPlaceModel::checkpoint(0); },
                                                       gk::testing::RigSetup().named("in-place")) {}
  at::Tensor replay() { return replay_unchecked(); }
};

// A layer whose PWAL may drop an optional member and then fail: the object
// tree changed, so a field cannot be pointed back (fail_closed_test.cpp has
// the same shape for reload()).
struct Extra {
  gk::Scale s;
};
GRAPHKEEP_AGGREGATE(Extra, s);
bool drop_extra_and_throw = false;

class OptionalLayer : public torch::nn::Module, public gk::ReloadableLayer {
 public:
  OptionalLayer() { bias_ = register_parameter("bias", at::zeros({4}), false); }
  std::vector<gk::CheckpointParam> checkpoint_params() const override { return {{"bias", {{"bias", {4}}}}}; }
  void process_weights_after_loading() override {
    extra_.reset();
    if (drop_extra_and_throw) throw std::runtime_error("injected PWAL failure after dropping extra_");
    extra_ = Extra{(bias_ * 3.0f).contiguous()};
  }
  gk::ObjectRef registered_members() override { return gk::ObjectRef::of(*this); }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = gk::hostrt::empty(x.sizes(), x.options());
    gk::hostrt::launch_aten("aten::add", {x, extra_->s}, {y},
                            [](auto& in, auto& out) { at::add_out(out[0], in[0], in[1]); });
    return y;
  }

 private:
  at::Tensor bias_;
  std::optional<Extra> extra_;
  GRAPHKEEP_DESCRIBE_DERIVED(OptionalLayer, (torch::nn::Module, gk::ReloadableLayer), (bias_, gk::parameter),
                             extra_)
};

// A layer whose PWAL hands back a handle the plan does not know: a second
// TensorImpl on its derived storage, kept in a member declared not graph-
// visible. Staging redirects the slot's own handle, not that one, so the
// post-PWAL tensor would be the captured storage: stage() must refuse.
bool reuse_stash = false;
class StashLayer : public torch::nn::Module, public gk::ReloadableLayer {
 public:
  StashLayer() { bias_ = register_parameter("bias", at::zeros({4}), false); }
  std::vector<gk::CheckpointParam> checkpoint_params() const override { return {{"bias", {{"bias", {4}}}}}; }
  void process_weights_after_loading() override {
    if (reuse_stash && stash_.defined()) {
      derived_ = stash_;
      derived_.copy_(bias_ * 3.0f);  // what the graphs read
      return;
    }
    derived_ = (bias_ * 3.0f).contiguous();
    stash_ = derived_.alias();
  }
  gk::ObjectRef registered_members() override { return gk::ObjectRef::of(*this); }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = gk::hostrt::empty(x.sizes(), x.options());
    gk::hostrt::launch_aten("aten::add", {x, derived_}, {y},
                            [](auto& in, auto& out) { at::add_out(out[0], in[0], in[1]); });
    return y;
  }

 private:
  at::Tensor bias_, derived_, stash_;
  GRAPHKEEP_DESCRIBE_DERIVED(StashLayer, (torch::nn::Module, gk::ReloadableLayer), (bias_, gk::parameter),
                             (derived_, gk::derived_weight),
                             (stash_, gk::not_graph_visible("a second handle, for the negative test")))
};

std::vector<gk::NamedTensor> optional_checkpoint(int step) {
  return {{"bias", at::cos(at::arange(4, at::kFloat) + 0.5 * step), 0}};
}

// One layer of type Layer loaded with optional_checkpoint(0), prepared,
// captured on the host backend and replayed once (`before`).
template <class Layer>
struct LayerRig : gk::testing::Rig<Layer, gk::HostReplay> {
  at::Tensor before;
  explicit LayerRig(const char* name)
      : gk::testing::Rig<Layer, gk::HostReplay>(std::make_shared<Layer>(), at::linspace(-1.0, 1.0, 4),
                                                [](Layer&) { return optional_checkpoint(0); },
                                                gk::testing::RigSetup().named(name)) {
    before = this->replay_unchecked();
  }
};

at::Tensor fresh_in_place(int step, const at::Tensor& input) {
  auto m = std::make_shared<InPlaceModel>();
  gk::InMemorySource src(InPlaceModel::checkpoint(step));
  gk::load_weights(*m, src);
  return m->forward(input);
}

}  // namespace

TEST_CASE("stage then commit equals a plain reload and a fresh model, bit for bit; the version counts commits") {
  Rig rig, plain;
  const auto addresses = captured_addresses(rig.engine->plan());
  const at::Tensor old_out = rig.replay();
  CHECK(old_out.equal(fresh_output(0, rig.input)));
  CHECK(rig.engine->weight_version() == 0);

  gk::StagedReload staged = rig.stage(1);
  REQUIRE(staged.pending());
  CHECK(staged.base_version() == 0);
  CHECK(staged.staged_bytes() > 0);
  CHECK(staged.report().staged);
  CHECK(staged.report().tensors_loaded == 3);
  CHECK(staged.report().times.stage_ms > 0);
  // Staged, not committed: the graphs and the model still serve step 0.
  CHECK(rig.engine->replay_allowed());
  CHECK(rig.replay().equal(old_out));
  CHECK(rig.eager().equal(old_out));
  CHECK(rig.engine->weight_version() == 0);

  const gk::ReloadReport r = rig.engine->commit(std::move(staged));
  CHECK_FALSE(staged.pending());
  CHECK(r.staged);
  CHECK(r.weight_version == 1);
  CHECK(r.drift == 0);
  CHECK(r.bytes_copied > 0);
  CHECK(r.times.commit_ms > 0);
  CHECK(r.times.stage_ms > 0);
  CHECK(r.summary().find("pause") != std::string::npos);
  CHECK(rig.engine->weight_version() == 1);
  CHECK(captured_addresses(rig.engine->plan()) == addresses);

  const gk::ReloadReport p = plain.reload(1);
  CHECK(p.weight_version == 1);
  CHECK(plain.engine->weight_version() == 1);
  const at::Tensor staged_out = rig.replay();
  CHECK(staged_out.equal(plain.replay()));
  CHECK(staged_out.equal(fresh_output(1, rig.input)));
  CHECK_FALSE(staged_out.equal(old_out));
  CHECK(rig.eager().equal(staged_out));

  // Exactly one per commit, through either spelling, and per reload.
  gk::StagedReload second = rig.stage(2);
  CHECK(second.base_version() == 1);
  CHECK(second.commit().weight_version == 2);
  CHECK(rig.replay().equal(fresh_output(2, rig.input)));
  rig.reload(3);
  CHECK(rig.engine->weight_version() == 3);
  CHECK(rig.stage(4).commit().weight_version == 4);
  CHECK(rig.replay().equal(fresh_output(4, rig.input)));
  CHECK(captured_addresses(rig.engine->plan()) == addresses);
  CHECK(rig.engine->verify().ok());
}

TEST_CASE("abort() and dropping the staged object leave the model as it was, and reloadable") {
  Rig rig;
  const at::Tensor before = rig.replay();
  {
    gk::StagedReload dropped = rig.stage(1);
    CHECK(dropped.pending());
  }
  CHECK(rig.replay().equal(before));
  CHECK(rig.eager().equal(before));  // the fields point at the captured tensors again
  CHECK(rig.engine->weight_version() == 0);

  gk::StagedReload staged = rig.stage(2);  // the dropped one is no longer outstanding
  staged.abort();
  CHECK_FALSE(staged.pending());
  staged.abort();  // idempotent
  CHECK(rig.replay().equal(before));
  CHECK(rig.eager().equal(before));
  CHECK(rig.engine->weight_version() == 0);
  GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->commit(std::move(staged)), gk::StateError, "empty StagedReload");

  // Move-assigning over a pending one aborts it.
  gk::StagedReload a = rig.stage(3);
  a = gk::StagedReload();
  CHECK_FALSE(a.pending());
  CHECK(rig.replay().equal(before));

  // Still reloadable both ways.
  rig.reload(5);
  CHECK(rig.replay().equal(fresh_output(5, rig.input)));
  rig.stage(6).commit();
  CHECK(rig.replay().equal(fresh_output(6, rig.input)));
  CHECK(rig.engine->weight_version() == 2);
}

TEST_CASE("refused commits and stages name the cause and change nothing") {
  Rig rig;
  const at::Tensor before = rig.replay();
  auto unchanged = [&](std::uint64_t version) {
    CHECK(rig.engine->replay_allowed());
    CHECK(rig.replay().equal(before));
    CHECK(rig.eager().equal(before));
    CHECK(rig.engine->weight_version() == version);
  };

  SUBCASE("a second stage() while one is outstanding") {
    gk::StagedReload first = rig.stage(1);
    GK_CHECK_THROWS_WITH_SUBSTR(rig.stage(2), gk::StateError,
                                "stage() while a staged reload is outstanding (staged at weight version 0)");
    unchanged(0);
    CHECK(first.pending());
    first.commit();
    CHECK(rig.replay().equal(fresh_output(1, rig.input)));
  }
  SUBCASE("reload() while a stage is outstanding") {
    gk::StagedReload first = rig.stage(1);
    GK_CHECK_THROWS_WITH_SUBSTR(rig.reload(2), gk::StateError,
                                "reload() while a staged reload is outstanding");
    unchanged(0);
    first.abort();
    rig.reload(2);
    CHECK(rig.replay().equal(fresh_output(2, rig.input)));
  }
  SUBCASE("a staged reload of another engine") {
    Rig other;
    gk::StagedReload foreign = other.stage(1);
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->commit(std::move(foreign)), gk::StateError,
                                "belongs to another ReloadEngine");
    unchanged(0);
    CHECK(foreign.pending());  // still the other engine's to commit
    CHECK(other.engine->commit(std::move(foreign)).weight_version == 1);
    CHECK(other.replay().equal(fresh_output(1, other.input)));
  }
  SUBCASE("committed twice") {
    gk::StagedReload s = rig.stage(1);
    gk::StagedReload moved = std::move(s);
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->commit(std::move(s)), gk::StateError, "empty StagedReload");
    rig.engine->commit(std::move(moved));
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->commit(std::move(moved)), gk::StateError, "already committed");
    CHECK(rig.engine->weight_version() == 1);
  }
  SUBCASE("stale: the tracked graphs changed") {
    gk::StagedReload s = rig.stage(1);
    rig.engine->track(rig.graph);  // tracked again
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->commit(std::move(s)), gk::StateError,
                                "the staged reload is stale: the tracked graphs changed since staging");
    unchanged(0);
    CHECK(s.pending());
    s.abort();
  }
  SUBCASE("stale: prepare() ran again, then a reload") {
    gk::StagedReload s = rig.stage(1);
    rig.engine->prepare();  // drops the outstanding stage (recapture is not needed here: same model)
    rig.engine->track(rig.graph);
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->commit(std::move(s)), gk::StateError, "prepare() ran again since staging");
    unchanged(0);
    rig.reload(2);  // allowed: nothing is outstanding any more
    const std::string msg = gk::testing::message_of<gk::StateError>([&] { rig.engine->commit(std::move(s)); });
    CHECK(msg.find("weight version 0 when staged, 1 now: a reload() or another commit ran in between") !=
          std::string::npos);
    CHECK(rig.replay().equal(fresh_output(2, rig.input)));
    CHECK(rig.engine->weight_version() == 1);
  }
  SUBCASE("stale: another commit in between") {
    gk::StagedReload s1 = rig.stage(1);
    rig.engine->prepare();
    rig.engine->track(rig.graph);
    rig.stage(2).commit();
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->commit(std::move(s1)), gk::StateError,
                                "weight version 0 when staged, 1 now");
    CHECK(rig.replay().equal(fresh_output(2, rig.input)));
    CHECK(rig.engine->weight_version() == 1);
  }
  SUBCASE("stale: the engine is not ready") {
    gk::StagedReload s = rig.stage(1);
    gk::HostReplay empty{"empty"};
    empty.capture([] {});
    CHECK_THROWS_AS(rig.engine->track(empty), gk::DriftError);  // fails closed: replay refused
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->commit(std::move(s)), gk::StateError, "the engine is not ready (drift");
    CHECK(rig.engine->weight_version() == 0);
    rig.graph.replay();
    CHECK(rig.output.equal(before));  // nothing was written
  }
  SUBCASE("a field re-pointed between stage() and commit()") {
    gk::StagedReload s = rig.stage(1);
    rig.model->norm->gamma.set_data(rig.model->norm->gamma.clone());
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->commit(std::move(s)), gk::StateError,
                                "norm.gamma no longer points at its captured storage");
    CHECK(rig.engine->weight_version() == 0);
    rig.graph.replay();
    CHECK(rig.output.equal(before));
  }
  SUBCASE("hooks a stage cannot honour") {
    // (Options it cannot honour do not compile: gk::StageOptions has no
    // mode or on_mismatch, and a ReloadOptions is refused,
    // compile_fail.stage_with_reload_options.)
    const gk::testing::ScopedHooks unprotected(rig.engine.get(), gk::testing::unprotect({"l1.kernel_.scale_"}));
    gk::InMemorySource src2(rig.weights(1));
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->stage(src2), gk::StateError, "unprotected_slots");
    unchanged(0);
  }
}

TEST_CASE("a stage that fails (bad source, PWAL, mismatch, before_commit) throws and changes nothing") {
  Rig rig;
  const at::Tensor before = rig.replay();
  auto unchanged = [&] {
    CHECK(rig.engine->replay_allowed());
    CHECK(rig.engine->state() == gk::EngineState::ready);
    CHECK(rig.replay().equal(before));
    CHECK(rig.eager().equal(before));
    CHECK(rig.engine->weight_version() == 0);
    CHECK(rig.engine->verify().ok());
  };
  SUBCASE("a missing tensor") {
    gk::InMemorySource src(without(rig.weights(1), "l2.weight"), "the trainer's update");
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->stage(src), gk::WeightError,
                                "the trainer's update ended before the model was complete: 1 checkpoint tensor(s) "
                                "missing: 'l2.weight'");
    unchanged();
  }
  SUBCASE("a wrong shape") {
    auto w = rig.weights(1);
    w[0].value = at::zeros({16, 9});
    gk::InMemorySource src(std::move(w));
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->stage(src), gk::WeightError,
                                "weight 'l1.weight' has shape [16, 9] but the model expects [16, 8]");
    unchanged();
  }
  SUBCASE("PWAL throws") {
    rig.model->l2->faults.throw_in_pwal = true;
    gk::InMemorySource src(rig.weights(1));
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->stage(src), std::runtime_error, "injected PWAL failure");
    rig.model->l2->faults = {};
    unchanged();
  }
  SUBCASE("PWAL changes a captured layout") {
    rig.model->l1->faults.pad_on_pwal = 2;
    gk::InMemorySource src(rig.weights(1));
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->stage(src), gk::MismatchError, "l1.kernel_.q_: shape [16, 8] -> [18, 8]");
    rig.model->l1->faults = {};
    unchanged();
  }
  SUBCASE("before_commit (the stage/commit boundary) throws") {
    gk::ReloadOptions o;
    int calls = 0;
    o.before_commit = [&] {
      calls += 1;
      throw std::runtime_error("vote: another rank failed");
    };
    gk::InMemorySource src(rig.weights(1));
    GK_CHECK_THROWS_WITH_SUBSTR(rig.engine->stage(src, o.stage()), std::runtime_error, "vote: another rank failed");
    CHECK(calls == 1);
    unchanged();
  }
  // And the engine stages and commits normally afterwards.
  rig.stage(7).commit();
  CHECK(rig.replay().equal(fresh_output(7, rig.input)));
}

TEST_CASE("in-place PWAL: staging hands PWAL copies, so the graphs read the old values until commit") {
  SUBCASE("the negative control: PWAL on the live model changes what replay returns at once") {
    InPlaceRig rig;
    const at::Tensor before = rig.replay();
    rig.model->l0->pwal_on_live_model(InPlaceModel::checkpoint(1)[0].value);
    CHECK_FALSE(rig.replay().equal(before));  // the served model changed mid-flight: the hazard is real
  }
  SUBCASE("stage: replay unchanged until commit; then a plain reload's and a fresh model's output") {
    InPlaceRig rig, plain;
    const at::Tensor before = rig.replay();
    CHECK(before.equal(fresh_in_place(0, rig.input)));
    gk::InMemorySource src(InPlaceModel::checkpoint(1));
    gk::StagedReload staged = rig.engine->stage(src);
    CHECK(rig.replay().equal(before));
    CHECK(rig.model->forward(rig.input).equal(before));
    rig.engine->commit(std::move(staged));
    gk::InMemorySource src2(InPlaceModel::checkpoint(1));
    plain.engine->reload(src2);
    const at::Tensor after = rig.replay();
    CHECK(after.equal(plain.replay()));
    CHECK(after.equal(fresh_in_place(1, rig.input)));
    CHECK_FALSE(after.equal(before));
    // A buffer the graphs write and PWAL leaves alone keeps what the graphs
    // wrote between stage() and commit(), as with a plain reload.
    const int64_t hits_before = rig.model->l0->hits().item<int64_t>();
    gk::InMemorySource src4(InPlaceModel::checkpoint(1));
    gk::StagedReload again = rig.engine->stage(src4);
    rig.replay();
    rig.replay();
    again.commit();
    CHECK(rig.model->l0->hits().item<int64_t>() == hits_before + 2);
    // And aborted: unchanged again.
    gk::InMemorySource src3(InPlaceModel::checkpoint(2));
    rig.engine->stage(src3).abort();
    CHECK(rig.replay().equal(after));
    CHECK(rig.engine->verify().ok());
  }
}

TEST_CASE("stress: one thread replays, another stages; the serving thread commits or aborts between replays") {
  // libtorch's intra-op pool is not needed here and would only add threads
  // ThreadSanitizer cannot see into (tests/tsan.supp).
  at::set_num_threads(1);
  // GK_ONLINE_ITERS rounds (1,000 by default); GK_ONLINE_HIDDEN sets the
  // hidden size (512): scripts/tsan.sh makes the model smaller, so that the
  // instrumented replays still overlap each stage several times.
  auto env_int = [](const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v != nullptr ? std::atoi(v) : fallback;
  };
  const int rounds = env_int("GK_ONLINE_ITERS", 1000);
  const int64_t d = 128, h = env_int("GK_ONLINE_HIDDEN", 512);
  constexpr int A = 1, B = 2;
  Rig rig(d, h);
  // The two outputs every replay must return exactly, computed up front.
  rig.reload(A);
  const at::Tensor out_a = rig.replay();
  rig.reload(B);
  const at::Tensor out_b = rig.replay();
  rig.reload(A);
  REQUIRE(rig.replay().equal(out_a));
  REQUIRE_FALSE(out_a.equal(out_b));
  REQUIRE(out_a.equal(fresh_output(A, rig.input, d, h)));
  const std::vector<gk::NamedTensor> weights_a = rig.weights(A), weights_b = rig.weights(B);
  const std::uint64_t v0 = rig.engine->weight_version();
  // Two rounds in three stage a weight patch instead (A -> B or B -> A):
  // the plain module's is scattered, the linear layers' PWAL runs again.
  const gk::Patch to_b = gk::make_patch(weights_a, weights_b, {.base_version = "A", .target_version = "B"});
  const gk::Patch to_a = gk::make_patch(weights_b, weights_a, {.base_version = "B", .target_version = "A"});
  int patches = 0;

  // The serving thread's lock, held around each replay and around commit/abort.
  std::mutex serve_mu;
  // The handshake: the staging thread posts a staged reload and what to do
  // with it; the serving thread does it between two replays and answers.
  std::mutex box_mu;
  std::condition_variable box_cv;
  std::optional<gk::StagedReload> box;
  bool box_commit = false, box_done = false, stop = false;
  std::string stager_error;

  std::atomic<long> replays{0}, mixed{0}, wrong{0}, not_allowed{0};
  std::atomic<bool> staging{false};
  std::atomic<long> during_stage{0};  // replays that began or ended while stage() ran
  int committed = 0, aborted = 0;
  double stage_ms = 0, pause_ms = 0;  // summed: the stages, and the commits' pauses
  int serving = A;  // what the serving thread committed last
  const auto t0 = std::chrono::steady_clock::now();

  std::thread server([&] {
    while (true) {
      {
        std::lock_guard<std::mutex> serve(serve_mu);
        if (!rig.engine->replay_allowed()) not_allowed += 1;
        const bool began_during = staging.load();
        rig.graph.replay();
        if (began_during || staging.load()) during_stage += 1;
        const at::Tensor& out = rig.output;
        const bool is_a = out.equal(out_a), is_b = out.equal(out_b);
        if (!is_a && !is_b) mixed += 1;
        if (!(serving == A ? is_a : is_b)) wrong += 1;
        replays += 1;
      }
      std::unique_lock<std::mutex> box_lock(box_mu);
      if (box && !box_done) {
        std::lock_guard<std::mutex> serve(serve_mu);  // between two replays
        gk::StagedReload staged = std::move(*box);
        box.reset();
        try {
          if (box_commit) {
            const int target = (rig.engine->weight_version() - v0) % 2 == 0 ? B : A;
            pause_ms += rig.engine->commit(std::move(staged)).times.commit_ms;
            serving = target;
            committed += 1;
          } else {
            staged.abort();
            aborted += 1;
          }
        } catch (const std::exception& e) {
          stager_error = e.what();
          stop = true;
        }
        box_done = true;
        box_cv.notify_all();
      }
      if (stop) break;
    }
  });

  std::thread stager([&] {
    int commits = 0;  // requested and done (a failed one stops the run)
    for (int i = 0; i < rounds; ++i) {
      // Each commit flips A <-> B; every fourth round is aborted instead.
      const bool commit = i % 4 != 3;
      const int target = commits % 2 == 0 ? B : A;
      if (commit) commits += 1;
      gk::StagedReload staged;
      try {
        gk::InMemorySource src(target == A ? weights_a : weights_b);
        const bool patch = i % 3 != 0;
        staging = true;
        // Without the serving lock: replays go on meanwhile.
        // A stage from a source waits after a layer, while none has yet,
        // until a replay overlapped it (at most 2 s): on a loaded machine the
        // scheduler may otherwise run every stage between two replays.
        gk::StageOptions so = rig.engine->options().defaults.stage();
        so.after_layer = [&](const std::string&) {
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
          while (during_stage.load() == 0 && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        };
        staged = patch ? rig.engine->stage(target == A ? to_a : to_b) : rig.engine->stage(src, so);
        staging = false;
        patches += patch ? 1 : 0;
        stage_ms += staged.report().times.stage_ms;
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> box_lock(box_mu);
        stager_error = e.what();
        break;
      }
      std::unique_lock<std::mutex> box_lock(box_mu);
      if (stop) break;
      box.emplace(std::move(staged));
      box_commit = commit;
      box_done = false;
      box_cv.wait(box_lock, [&] { return box_done || stop; });
      if (stop) break;
    }
    std::lock_guard<std::mutex> box_lock(box_mu);
    stop = true;
  });
  stager.join();
  server.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("online reload stress: " << rounds << " rounds (" << committed << " commits, " << aborted
          << " aborts; " << patches << " weight patches), " << replays.load() << " replays (" << during_stage.load() << " during a stage) in "
          << seconds << " s; mean stage "
          << stage_ms / rounds << " ms, mean pause (commit) " << pause_ms / std::max(committed, 1) << " ms");
  CHECK(stager_error.empty());
  INFO(stager_error);
  CHECK(committed + aborted == rounds);
  CHECK(mixed.load() == 0);
  CHECK(wrong.load() == 0);
  CHECK(not_allowed.load() == 0);
  CHECK(replays.load() >= rounds);
  CHECK(during_stage.load() > 0);  // the stages really overlapped replays
  CHECK(rig.engine->weight_version() == v0 + static_cast<std::uint64_t>(committed));
  CHECK(rig.replay().equal(serving == A ? out_a : out_b));
  CHECK(rig.engine->verify().ok());
  CHECK(patches > 0);
  for (const gk::NamedTensor& t : serving == A ? weights_a : weights_b)  // what is served, by content
    CHECK(rig.engine->served()->hash(t.name) == gk::content_hash(t.value));
}

TEST_CASE("a failed stage that changed the object tree: replay stays right, the next stage waits for a reload") {
  LayerRig<OptionalLayer> rig("optional");
  gk::ReloadEngine& engine = *rig.engine;
  gk::HostReplay& graph = rig.graph;
  const at::Tensor& input = rig.input;
  const at::Tensor& output = rig.output;
  const at::Tensor& before = rig.before;

  drop_extra_and_throw = true;
  gk::InMemorySource bad(optional_checkpoint(1));
  GK_CHECK_THROWS_WITH_SUBSTR(engine.stage(bad), std::runtime_error, "injected PWAL failure after dropping extra_");
  drop_extra_and_throw = false;
  // The graphs read the captured storage, which the stage never wrote.
  CHECK(engine.replay_allowed());
  graph.replay();
  CHECK(output.equal(before));
  CHECK(engine.weight_version() == 0);
  // The fields could not all be pointed back: stage() waits for a reload.
  gk::InMemorySource next(optional_checkpoint(1));
  GK_CHECK_THROWS_WITH_SUBSTR(engine.stage(next), gk::StateError,
                              "a failed stage() could not point every field back at its captured tensor");
  gk::InMemorySource recover(optional_checkpoint(2));
  engine.reload(recover);
  graph.replay();
  CHECK(output.equal(input + optional_checkpoint(2)[0].value * 3.0f));
  gk::InMemorySource again(optional_checkpoint(3));
  engine.stage(again).commit();
  graph.replay();
  CHECK(output.equal(input + optional_checkpoint(3)[0].value * 3.0f));
  CHECK(engine.weight_version() == 2);
}

TEST_CASE("a PWAL that reaches a captured storage through a handle no slot knows: stage() refuses") {
  LayerRig<StashLayer> rig("stash");
  gk::ReloadEngine& engine = *rig.engine;
  gk::HostReplay& graph = rig.graph;
  const at::Tensor& input = rig.input;
  const at::Tensor& output = rig.output;
  const at::Tensor& before = rig.before;
  reuse_stash = true;
  gk::InMemorySource src(optional_checkpoint(1));
  const std::string msg = gk::testing::message_of<gk::StateError>([&] { engine.stage(src); });
  CHECK(msg.find("derived_ views a captured storage through a handle that is no slot location") != std::string::npos);
  CHECK(msg.find("its captured values were written back") != std::string::npos);
  reuse_stash = false;
  // The write went through that handle into what the graphs read (replays
  // during the stage could see it); the stage's copy of the old values was
  // written back, so replay is right again.
  CHECK(engine.replay_allowed());
  graph.replay();
  CHECK(output.equal(before));
  CHECK(engine.weight_version() == 0);
  gk::InMemorySource good(optional_checkpoint(2));
  engine.stage(good).commit();
  graph.replay();
  CHECK(output.equal(input + optional_checkpoint(2)[0].value * 3.0f));
}
