// Registry: descriptors, slot tables, generated visitors, aliases, containers
// and polymorphic members.
#include "gk_test.h"

#include <graphkeep/registry.h>
#include <graphkeep/registry/table_format.h>

#include <boost/describe/bases.hpp>
#include <boost/describe/members.hpp>
#include <boost/mp11/algorithm.hpp>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace fx {

// An aggregate reflected with Boost.PFR; roles in the field types.
struct Strides {
  gk::Metadata ab_strides1;
  gk::Metadata c_strides1;
  at::Tensor c_strides2;  // role given in the descriptor below
  int64_t num_experts = 0;
};
GRAPHKEEP_AGGREGATE(Strides, ab_strides1, c_strides1, (c_strides2, gk::metadata), num_experts);

// A described class with private members and a constructor.
class Marlin {
 public:
  Marlin() = default;
  Marlin(int64_t sms, at::Tensor ws) : workspace_(std::move(ws)), sms_(sms) {
    sort_ = at::arange(4, at::kLong);
    host_copy_ = at::zeros({2});
  }
  at::Tensor& workspace() { return workspace_; }
  at::Tensor& sort() { return sort_; }
  int64_t sms() const { return sms_; }
  void set_sms(int64_t s) { sms_ = s; }

 private:
  at::Tensor workspace_;
  at::Tensor sort_;
  at::Tensor host_copy_;
  int64_t sms_ = 0;

  GRAPHKEEP_DESCRIBE(Marlin, (workspace_, gk::workspace(gk::Init::zero)), (sort_, gk::permutation),
                     (host_copy_, gk::not_graph_visible("host copy for logging")), sms_)
};

// Polymorphic experts: a registered base with two registered derived types
// and one that is deliberately left unregistered at run time.
class Experts {
 public:
  virtual ~Experts() = default;
  virtual int64_t kind() const = 0;

 protected:
  at::Tensor w13_;
  GRAPHKEEP_DESCRIBE(Experts, (w13_, gk::derived_weight))
};

class CutlassExperts : public Experts {
 public:
  explicit CutlassExperts(int64_t e) {
    w13_ = at::ones({e, 4});
    strides_.ab_strides1 = at::full({e}, 8, at::kLong);
    strides_.c_strides1 = at::full({e}, 16, at::kLong);
    strides_.c_strides2 = strides_.ab_strides1;  // alias: one slot, two paths
    strides_.num_experts = e;
  }
  int64_t kind() const override { return 1; }
  Strides& strides() { return strides_; }

 private:
  Strides strides_;
  GRAPHKEEP_DESCRIBE_DERIVED(CutlassExperts, (Experts), strides_)
};

class TritonExperts : public Experts {
 public:
  TritonExperts() { w13_ = at::zeros({2, 2}); }
  int64_t kind() const override { return 2; }

 private:
  int block_ = 64;
  GRAPHKEEP_DESCRIBE_DERIVED(TritonExperts, (Experts), block_)
};

class UnregisteredExperts : public Experts {
 public:
  UnregisteredExperts() { w13_ = at::zeros({1}); }
  int64_t kind() const override { return 3; }

 private:
  int extra_ = 0;
  GRAPHKEEP_DESCRIBE_DERIVED(UnregisteredExperts, (Experts), extra_)
};

struct ScaleA {
  gk::Scale s;
};
GRAPHKEEP_AGGREGATE(ScaleA, s);
struct ScaleB {
  gk::Scale s;
  gk::Scale t;
};
GRAPHKEEP_AGGREGATE(ScaleB, s, t);

// Everything a quantization method may hold.
class Method {
 public:
  Method() {
    kernel_ = Marlin(132, at::zeros({8}, at::kInt));
    experts_ = std::make_unique<CutlassExperts>(3);
    per_shard_ = {at::ones({2}), at::ones({3})};
    named_["q"] = at::ones({1});
    named_["k"] = at::ones({1});
    maybe_.emplace(at::ones({5}));
    shared_ = std::make_shared<Marlin>(4, at::zeros({2}, at::kInt));
    choice_ = ScaleB{at::ones({1}), at::ones({1})};
  }
  std::unique_ptr<Experts>& experts() { return experts_; }
  Marlin& kernel() { return kernel_; }
  std::vector<at::Tensor>& per_shard() { return per_shard_; }

 private:
  Marlin kernel_;
  std::unique_ptr<Experts> experts_;
  std::vector<at::Tensor> per_shard_;
  std::map<std::string, at::Tensor> named_;
  std::optional<at::Tensor> maybe_;
  std::shared_ptr<Marlin> shared_;
  std::variant<ScaleA, ScaleB> choice_;
  std::vector<int64_t> shape_{1, 2, 3};
  double alpha_ = 0.5;

  GRAPHKEEP_DESCRIBE(Method, kernel_, experts_, (per_shard_, gk::scale), (named_, gk::scale),
                     (maybe_, gk::scratch), shared_, choice_, shape_, alpha_)
};

}  // namespace fx

GRAPHKEEP_REGISTER_TYPE(fx::CutlassExperts);
GRAPHKEEP_REGISTER_TYPE(fx::TritonExperts);

namespace {

struct Recorder final : gk::Walker {
  std::vector<std::string> tensors, configs, opaques;
  std::vector<gk::RoleSpec> roles;
  void tensor(const gk::SlotPath& p, const gk::RoleSpec& r, std::string_view, at::Tensor&) override {
    tensors.push_back(p.str());
    roles.push_back(r);
  }
  void config(const gk::SlotPath& p, std::string_view, gk::ConfigRef v) override {
    configs.push_back(p.str() + "=" + (v.ops ? v.ops->repr(v.ptr) : "?"));
  }
  void opaque(const gk::SlotPath& p, std::string_view, std::string_view) override {
    opaques.push_back(p.str());
  }
};

std::set<std::string> paths_of(const std::vector<gk::Slot>& slots) {
  std::set<std::string> out;
  for (const auto& s : slots)
    for (const auto& p : s.paths) out.insert(p.str());
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Compile-time tables
// ---------------------------------------------------------------------------
namespace table_checks {
constexpr auto strides = gk::slot_table<fx::Strides>();
static_assert(strides.size() == 3);
static_assert(strides[0].path_equals("ab_strides1") && strides[0].role.role == gk::Role::metadata);
static_assert(strides[2].path_equals("c_strides2") && strides[2].role.role == gk::Role::metadata);

constexpr auto marlin = gk::slot_table<fx::Marlin>();
static_assert(marlin.size() == 3);
static_assert(marlin[0].path_equals("workspace_") && marlin[0].role.role == gk::Role::workspace &&
              marlin[0].role.init == gk::Init::zero);
static_assert(marlin[1].role.effective_init() == gk::Init::copy_new);
static_assert(marlin[2].role.role == gk::Role::not_graph_visible &&
              marlin[2].role.reason == "host copy for logging");

constexpr auto cutlass = gk::slot_table<fx::CutlassExperts>();
static_assert(cutlass.size() == 4);  // base w13_ first, then the nested strides
static_assert(cutlass[0].path_equals("w13_") && cutlass[0].owner == "Experts");
static_assert(cutlass[1].path_equals("strides_.ab_strides1") && cutlass[1].owner == "Strides");

constexpr auto method = gk::slot_table<fx::Method>();
// kernel_ (3) + experts_ (dynamic + w13_) + per_shard_ + named_ + maybe_ + shared_ (3) + choice_ (1 + 2)
static_assert(method.size() == 3 + 2 + 1 + 1 + 1 + 3 + 3);
static_assert(method[0].path_equals("kernel_.workspace_"));
static_assert(method[3].path_equals("experts_") && method[3].kind == gk::TableEntry::Kind::dynamic);
static_assert(method[5].path_equals("per_shard_[*]") && method[5].kind == gk::TableEntry::Kind::each);
static_assert(method[6].path_equals("named_[*]") && method[6].role.role == gk::Role::scale);
static_assert(method[7].path_equals("maybe_") && method[7].role.effective_init() == gk::Init::preserve);

using List = gk::TypeList<fx::Strides, fx::Marlin, fx::CutlassExperts, fx::Method>;
static_assert(gk::Registry<List>::table().size() == 3 + 3 + 4 + 14);
static_assert(gk::Registry<List>::names[1] == "Marlin");
}  // namespace table_checks

TEST_CASE("member classification follows the fail-closed rules") {
  using gk::detail::check_member;
  using E = gk::detail::member_error;
  CHECK(check_member<at::Tensor>(gk::RoleSpec{}) == E::tensor_without_role);
  CHECK(check_member<at::Tensor>(gk::scale) == E::ok);
  CHECK(check_member<int>(gk::scale) == E::role_on_non_tensor);
  CHECK(check_member<gk::Scale>(gk::scale) == E::role_twice);
  CHECK(check_member<at::Tensor>(gk::workspace) == E::workspace_without_init);
  CHECK(check_member<at::Tensor>(gk::not_graph_visible) == E::reason_missing);
  CHECK(check_member<std::function<void()>>(gk::RoleSpec{}) == E::callable);
  CHECK(check_member<std::function<void()>>(gk::opaque("stateless")) == E::ok);
  CHECK(check_member<int*>(gk::RoleSpec{}) == E::raw_pointer);
  CHECK(check_member<std::vector<at::Tensor>>(gk::RoleSpec{}) == E::tensor_without_role);
  CHECK(check_member<std::vector<fx::Strides>>(gk::RoleSpec{}) == E::ok);
  CHECK(check_member<std::unique_ptr<fx::Experts>>(gk::RoleSpec{}) == E::ok);
  CHECK(check_member<std::vector<int64_t>>(gk::RoleSpec{}) == E::ok);
  CHECK(check_member<at::Tensor>(gk::opaque("x")) == E::opaque_on_tensor);
  struct Plain {
    int a;
    double b;
  };
  struct HoldsTensor {
    int a;
    at::Tensor t;
  };
  CHECK(check_member<Plain>(gk::RoleSpec{}) == E::ok);
  CHECK(check_member<HoldsTensor>(gk::RoleSpec{}) == E::unregistered_tensor_holder);
  CHECK(check_member<std::optional<HoldsTensor>>(gk::RoleSpec{}) == E::unregistered_tensor_holder);
  auto lambda = [](int x) { return x; };
  CHECK(check_member<decltype(lambda)>(gk::RoleSpec{}) == E::callable);
}

// Note [Declared derivations] in graphkeep/registry/role.h.
namespace fx {
struct DerivedStrides {
  at::Tensor ab, c, locks, w;
};
GRAPHKEEP_AGGREGATE(DerivedStrides, (ab, gk::metadata.from_shapes()), (c, gk::metadata),
                    (locks, gk::workspace(gk::Init::zero)), (w, gk::derived_weight.from_shapes()));
}  // namespace fx

TEST_CASE("derivations: only derived roles take one, and the table says what a patch does with each member") {
  using gk::detail::check_member;
  using E = gk::detail::member_error;
  CHECK(check_member<at::Tensor>(gk::metadata.from_shapes()) == E::ok);
  CHECK(check_member<at::Tensor>(gk::scale.from_shapes()) == E::ok);
  CHECK(check_member<at::Tensor>(gk::permutation.from_shapes()) == E::ok);
  CHECK(check_member<std::vector<at::Tensor>>(gk::derived_weight.from_shapes()) == E::ok);
  CHECK(check_member<at::Tensor>(gk::parameter.from_shapes()) == E::derivation_on_non_derived);
  CHECK(check_member<at::Tensor>(gk::workspace(gk::Init::zero).from_shapes()) == E::derivation_on_non_derived);
  CHECK(check_member<at::Tensor>(gk::workspace(gk::Init::copy_new).from_shapes()) == E::derivation_on_non_derived);
  CHECK(check_member<at::Tensor>(gk::scratch.from_shapes()) == E::derivation_on_non_derived);
  CHECK(check_member<at::Tensor>(gk::metadata.with_init(gk::Init::preserve).from_shapes()) ==
        E::derivation_on_non_derived);
  // The derivation survives with_init and is part of the role (aliases must agree on it).
  CHECK(gk::scale.from_shapes().with_init(gk::Init::copy_new).derive == gk::Derive::from_shapes);
  CHECK_FALSE(gk::metadata.from_shapes() == gk::metadata);
  constexpr auto t = gk::slot_table<fx::DerivedStrides>();
  CHECK(gk::patch_column(t[0]) == "from_shapes");
  CHECK(gk::patch_column(t[1]) == "re-run");
  CHECK(gk::patch_column(t[2]) == "-");
  CHECK(gk::patch_column(t[3]) == "from_shapes");
  const auto forced = gk::forces_rerun(t);
  REQUIRE(forced.size() == 1);
  CHECK(forced[0]->path() == "c");
  const std::string json = gk::format_table_json(t);
  CHECK(json.find("\"patch\": \"from_shapes\"") != std::string::npos);
  CHECK(gk::format_table_text(t).find("re-run") != std::string::npos);
}

TEST_CASE("a walk reports tensors, configuration and opaque members with their paths") {
  fx::Method m;
  Recorder r;
  gk::ObjectRef::of(m).walk(r);
  const std::vector<std::string> expected = {
      "kernel_.workspace_", "kernel_.sort_",      "kernel_.host_copy_",
      "experts_.w13_",      "experts_.strides_.ab_strides1", "experts_.strides_.c_strides1",
      "experts_.strides_.c_strides2", "per_shard_[0]", "per_shard_[1]",
      "named_[k]",          "named_[q]",          "maybe_",
      "shared_.workspace_", "shared_.sort_",      "shared_.host_copy_",
      "choice_.s",          "choice_.t"};
  CHECK(r.tensors == expected);
  CHECK(std::find(r.configs.begin(), r.configs.end(), "kernel_.sms_=132") != r.configs.end());
  CHECK(std::find(r.configs.begin(), r.configs.end(), "shape_=[1, 2, 3]") != r.configs.end());
  CHECK(std::find(r.configs.begin(), r.configs.end(), "experts_.strides_.num_experts=3") !=
        r.configs.end());
  CHECK(std::find(r.configs.begin(), r.configs.end(), "alpha_=0.5") != r.configs.end());
  // roles: typed role of the aggregate field, declared role of containers
  CHECK(r.roles[4].role == gk::Role::metadata);
  CHECK(r.roles[7].role == gk::Role::scale);
}

TEST_CASE("for_each_slot visits every graph-visible slot exactly once and merges aliases") {
  fx::Method m;
  const auto slots = gk::collect_slots(gk::ObjectRef::of(m));
  // 17 locations, 2 not graph-visible, one alias pair -> 14 slots
  CHECK(slots.size() == 14);
  std::map<const at::TensorImpl*, int> seen;
  for (const auto& s : slots) ++seen[s.tensor->unsafeGetTensorImpl()];
  for (const auto& [impl, n] : seen) CHECK(n == 1);

  const auto alias = std::find_if(slots.begin(), slots.end(), [](const gk::Slot& s) { return s.paths.size() == 2; });
  REQUIRE(alias != slots.end());
  CHECK(alias->paths[0].str() == "experts_.strides_.ab_strides1");
  CHECK(alias->paths[1].str() == "experts_.strides_.c_strides2");

  const auto all = gk::collect_slots(gk::ObjectRef::of(m), gk::SlotFilter::all);
  CHECK(all.size() == 16);
  CHECK(paths_of(all).count("kernel_.host_copy_") == 1);
  CHECK(paths_of(slots).count("kernel_.host_copy_") == 0);
}

TEST_CASE("aliases with different roles are a declaration error") {
  fx::Strides s;
  s.ab_strides1 = at::ones({2}, at::kLong);
  s.c_strides1 = at::ones({2}, at::kLong);
  s.c_strides2 = s.ab_strides1;
  CHECK_NOTHROW(gk::collect_slots(gk::ObjectRef::of(s)));

  fx::ScaleB sb{at::ones({1}), at::ones({1})};
  sb.t = sb.s;
  CHECK_NOTHROW(gk::collect_slots(gk::ObjectRef::of(sb)));  // same role: fine

  fx::Method m;
  m.kernel().sort() = m.kernel().workspace();  // permutation aliasing a workspace
  GK_CHECK_THROWS_WITH_SUBSTR(gk::collect_slots(gk::ObjectRef::of(m)), gk::DeclarationError,
                              "kernel_.sort_ (Marlin) and kernel_.workspace_ (Marlin) hold the same tensor but declare different roles");
}

TEST_CASE("paths re-resolve after the object tree is rebuilt, and break when its shape changes") {
  fx::Method m;
  const auto slots = gk::collect_slots(gk::ObjectRef::of(m));
  auto find = [&](std::string_view p) -> const gk::Slot& {
    for (const auto& s : slots)
      if (s.path() == p) return s;
    FAIL("no slot " << p);
    return slots.front();
  };
  const gk::Slot& strides = find("experts_.strides_.ab_strides1");
  const gk::Slot& shard1 = find("per_shard_[1]");

  // PWAL rebuilds the experts object: the same path finds the new tensor.
  m.experts() = std::make_unique<fx::CutlassExperts>(3);
  at::Tensor* fresh = strides.paths[0].resolve_tensor(&m);
  REQUIRE(fresh != nullptr);
  CHECK(fresh == &static_cast<fx::CutlassExperts&>(*m.experts()).strides().ab_strides1.tensor());

  // A different dynamic type breaks the path at the polymorphic step.
  m.experts() = std::make_unique<fx::TritonExperts>();
  CHECK(strides.paths[0].resolve_tensor(&m) == nullptr);
  CHECK(strides.paths[0].broken_at(&m) == 1);

  // A shorter container breaks the element step.
  m.per_shard().resize(1);
  CHECK(shard1.paths[0].resolve_tensor(&m) == nullptr);
}

TEST_CASE("an unregistered dynamic type is a run-time error that names it") {
  fx::Method m;
  m.experts() = std::make_unique<fx::UnregisteredExperts>();
  GK_CHECK_THROWS_WITH_SUBSTR(gk::collect_slots(gk::ObjectRef::of(m)), gk::DeclarationError,
                              "experts_ (a member of Method) points to a fx::UnregisteredExperts, which is not a registered dynamic type");
  // once registered, it walks
  gk::register_dynamic_type(gk::type_ops<fx::UnregisteredExperts>());
  CHECK(paths_of(gk::collect_slots(gk::ObjectRef::of(m))).count("experts_.w13_") == 1);
}

TEST_CASE("the registry lists registered types and formats its table") {
  using R = gk::Registry<gk::TypeList<fx::Strides, fx::Marlin>>;
  constexpr auto t = R::table();
  const std::string text = gk::format_table_text(t);
  CHECK(text.find("Marlin") != std::string::npos);
  CHECK(text.find("workspace_") != std::string::npos);
  CHECK(text.find("host copy for logging") != std::string::npos);
  const std::string json = gk::format_table_json(t);
  CHECK(json.find("\"path\": \"c_strides2\"") != std::string::npos);
  CHECK(json.find("\"init\": \"zero\"") != std::string::npos);
}

// GRAPHKEEP_DESCRIBE writes Boost.Describe's private member list itself (Note
// [One error for a misspelt member] in registry/detail/describe_pp.h): Boost's
// own queries must see what BOOST_DESCRIBE_CLASS would have given them.
TEST_CASE("Boost.Describe sees the members and bases a descriptor lists") {
  namespace bd = boost::describe;
  fx::Marlin m(132, at::zeros({4}));
  std::vector<std::string> names;
  std::vector<unsigned> modifiers;
  std::vector<const void*> addresses;
  boost::mp11::mp_for_each<bd::describe_members<fx::Marlin, bd::mod_any_access>>([&](auto d) {
    names.emplace_back(d.name);
    modifiers.push_back(d.modifiers);
    addresses.push_back(static_cast<const void*>(&(m.*d.pointer)));
  });
  CHECK(names == std::vector<std::string>{"workspace_", "sort_", "host_copy_", "sms_"});
  for (unsigned mod : modifiers) CHECK(mod == bd::mod_private);
  REQUIRE(addresses.size() == 4);
  CHECK(addresses[0] == static_cast<const void*>(&m.workspace()));
  CHECK(addresses[1] == static_cast<const void*>(&m.sort()));
  CHECK(boost::mp11::mp_size<bd::describe_members<fx::Marlin, bd::mod_public>>::value == 0);
  CHECK(boost::mp11::mp_size<bd::describe_members<fx::Marlin, bd::mod_protected>>::value == 0);

  using Bases = bd::describe_bases<fx::CutlassExperts, bd::mod_any_access>;
  CHECK(boost::mp11::mp_size<Bases>::value == 1);
  CHECK(std::is_same_v<typename boost::mp11::mp_front<Bases>::type, fx::Experts>);
  std::vector<std::string> inherited;
  boost::mp11::mp_for_each<bd::describe_members<fx::CutlassExperts, bd::mod_any_access | bd::mod_inherited>>(
      [&](auto d) { inherited.emplace_back(d.name); });
  CHECK(inherited == std::vector<std::string>{"w13_", "strides_"});
  CHECK(gk::reflect<fx::Marlin>::size == 4);
}

TEST_CASE("config values compare, copy and restore through their ops") {
  fx::Marlin k(10, at::zeros({1}, at::kInt));
  struct Cfg final : gk::Walker {
    gk::ConfigRef sms;
    void tensor(const gk::SlotPath&, const gk::RoleSpec&, std::string_view, at::Tensor&) override {}
    void config(const gk::SlotPath& p, std::string_view, gk::ConfigRef v) override {
      if (p.str() == "sms_") sms = v;
    }
  } w;
  gk::ObjectRef::of(k).walk(w);
  REQUIRE(w.sms.ops != nullptr);
  auto snapshot = w.sms.ops->copy(w.sms.ptr);
  CHECK(w.sms.ops->equal(w.sms.ptr, snapshot.get()));
  k.set_sms(11);
  CHECK_FALSE(w.sms.ops->equal(w.sms.ptr, snapshot.get()));
  w.sms.ops->assign(w.sms.ptr, snapshot.get());
  CHECK(k.sms() == 10);
}
