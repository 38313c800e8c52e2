// The model-STRUCTURE fuzzer (the systematic part of failing closed). Random
// registered models, built at run time from a fixed set of described
// building blocks, are reloaded again and again with random weights, random
// PWAL behaviours, injected faults and bad weight sets. After EVERY reload
// call, success or failure, graphkeep's promise must hold:
//
//   either check_replay_allowed() passes and replaying the captured graph
//   gives, bit for bit, the output of a freshly built model of the same
//   structure loaded with the last committed weights (those of the last
//   reload that returned, or the initial ones); or check_replay_allowed()
//   throws a gk::Error with a message. Never a crash, a hang or a leak.
//
//   GK_FUZZ_SEED   the seed (default 1414)
//   GK_FUZZ_ITERS  iterations: random structures, 4-8 reloads each (default 1000)
//   GK_FUZZ_FIRST  the first iteration (default 0)
//   GK_FUZZ_ADOPT  set: every reload adopts the weight set's tensors
//                  (ReloadOptions::adopt_source_tensors) where it can
// Each iteration seeds its own PRNG from (seed, iteration), so a failing one
// replays alone: GK_FUZZ_SEED=s GK_FUZZ_FIRST=i GK_FUZZ_ITERS=1. The loop runs
// in a child process of this binary (--gk-child=structure_fuzz, also runnable
// by hand, printing every operation), so a crash is reported with its
// iteration and operation log, and the run goes on after it.
//
// The generator. Registered classes are described at compile time, so the
// building blocks are fixed and the seed picks the run-time structure:
//   - layers (1-3) with a fused parameter qkv = [q (1-2 shards, dim 0 or 1);
//     k (maybe through a custom load_weight); v], maybe a bias (parameter or
//     loaded buffer), a running buffer PWAL writes, the parameter again under
//     a second member (same TensorImpl or a coinciding view), or no
//     checkpoint tensors at all (a PWAL-only layer); maybe a plain module;
//   - per layer, stride-like metadata declared from_shapes (Note [Declared
//     derivations]: checked at every reload, never to fire here);
//   - per layer, Kernels: vector, map, optional and variant of kernels, a
//     polymorphic unique_ptr, two shared_ptr (one object under two paths, or
//     two), a vector of polymorphic experts, and a ViewGroup: ONE storage
//     (derived, or the parameter itself) under a base, an exact or coinciding
//     alias and prefix, interior, strided and transposed views;
//   - per reload: mode, random weights (complete, shuffled, or missing / wrong
//     shape / wrong dtype / unknown / duplicate / undefined / holding NaN or
//     infinity), a fault at a stage, stage() and commit() instead of reload()
//     (with or without a raw-pointer write to a weight in between), and per
//     layer a PWAL behaviour (a table outside the described
//     classes): rebuild, in place, mixed, change a layout (must be refused),
//     change the object tree (must be refused unless a container only grows:
//     the graphs never read the new part), or throw early / after building
//     part of the state / after in-place writes.
//   - per structure, maybe a second graph that reads no slot: refused at
//     capture, and replay stays refused until it is untracked;
//   - per structure, 0-2 block layers: int8 values and scales derived per
//     block (1, 2, D or 2D rows by 1, 2 or D columns; scales row- or
//     group-major) from a checkpoint parameter, declared by_blocks, so that
//     patches land without PWAL; per operation, maybe a lying PWAL (one
//     scale for the tensor), which a full reload must refuse wherever it
//     changes a value.
// Every forward launches through gk::hostrt and folds EVERY declared tensor
// into the output with its own coefficient (the first test case checks that a
// stale value in any captured slot changes the output).
//
// Patches (one operation in three, graphkeep/delta through
// ReloadEngine::reload(const Patch&) or stage()+commit()): the committed
// weights with a random subset of tensors changed at a random density (0 to
// 100%), made into a patch (automatic, sparse or dense entries), sometimes
// made bad (an unknown name, an index out of range, a duplicate index,
// values and indices of different lengths, a wrong dtype or shape, another
// base, values that miss the target hash), with a fault at a stage and the
// PWAL behaviours above. The promise for a patch: either it is committed and
// replay equals a fresh model loaded with the target (and the engine serves
// the target's content hashes), or it is refused and, if replay was allowed
// before, replay is allowed and equals the old weights. A bad patch is never
// accepted. Each iteration picks where the engine keeps the bases of tensors
// PWAL transforms (the custom loader's k makes the fused parameter one):
// on the device, or nowhere (such patches are then refused).
//
// Recovery. After a failure, a clean reload (rebuild PWAL, complete weights,
// no fault) must succeed and allow replay: it rebuilds every object from the
// weights, the plan still holds every captured storage, and no behaviour here
// leaves state a rebuild does not replace, so no structure makes recovery
// impossible. Not exercised: MismatchPolicy::needs_recapture and
// unprotected_slots (both end in a recapture, which has no fresh-model oracle).
#include "gk_test.h"
#include "rig.h"

#include "engine/compare.h"

#include <graphkeep/reload/reload_engine.h>
#include <graphkeep/capture/replay.h>
#include <graphkeep/delta/make_patch.h>
#include <graphkeep/hashing/content_hash.h>

#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/registry.h>
#include <graphkeep/model/layer.h>

#include <ATen/Parallel.h>

#include <csignal>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <variant>
#include <vector>

namespace sf {

constexpr int64_t D = 4;  // the width of every layer; q, k and v are D x D
constexpr int64_t M = 2;  // rows of the input
int64_t g_live_kernels = 0;  // kernel objects alive (the leak check)

// ---------------------------------------------------------------------------
// The kernels' CPU bodies. Every launch goes through gk::hostrt with raw
// pointers captured by value, so a host capture burns the addresses in like a
// CUDA graph. Accumulation order is fixed: a fresh model is bitwise equal.
// ---------------------------------------------------------------------------
struct Geometry {  // a tensor of at most 2 dims, as a kernel sees it
  const void* p = nullptr;
  at::ScalarType dtype = at::kFloat;
  int64_t n0 = 1, n1 = 1, s0 = 0, s1 = 0;
  std::size_t bytes = 0;  // the extent the kernel touches
};
Geometry geometry(const at::Tensor& t) {
  if (t.dim() > 2) throw std::logic_error("harness: geometry() of a tensor with more than 2 dims");
  Geometry g{t.data_ptr(), t.scalar_type()};
  if (t.dim() >= 1) g.n0 = t.size(0), g.s0 = t.stride(0);
  if (t.dim() == 2) g.n1 = t.size(1), g.s1 = t.stride(1);
  g.bytes = static_cast<std::size_t>((g.n0 - 1) * g.s0 + (g.n1 - 1) * g.s1 + 1) * t.element_size();
  return g;
}
float element(const Geometry& g, int64_t i, int64_t j) {
  const int64_t off = i * g.s0 + j * g.s1;
  switch (g.dtype) {
    case at::kFloat: return static_cast<const float*>(g.p)[off];
    case at::kLong: return static_cast<float>(static_cast<const int64_t*>(g.p)[off]);
    case at::kInt: return static_cast<float>(static_cast<const int32_t*>(g.p)[off]);
    case at::kChar: return static_cast<float>(static_cast<const int8_t*>(g.p)[off]);
    default: return std::numeric_limits<float>::quiet_NaN();
  }
}

// A layer's output under construction: every launch of the layer writes y.
struct Acc {
  at::Tensor x, y;  // [M, D], contiguous
  int64_t next = 0;  // the next fold's index (its column and coefficient)
};

// y[:, k % D] += coef_k * sum_e t[e] * (e % 7 + 1): the output depends on every
// element of t, so a stale slot changes it (checked by the first test case).
void fold(Acc& acc, const at::Tensor& t) {
  if (!t.defined()) return;
  const Geometry g = geometry(t);
  float* y = acc.y.data_ptr<float>();
  const int64_t col = acc.next % D;
  const float coef = static_cast<float>(acc.next % 3 + 1) / static_cast<float>(8 * t.numel());
  acc.next += 1;
  gk::hostrt::launch("fold", {gk::hostrt::reads(g.p, g.bytes), gk::hostrt::writes(acc.y)}, [=] {
    float c = 0.f;
    for (int64_t i = 0; i < g.n0; ++i)
      for (int64_t j = 0; j < g.n1; ++j) c += element(g, i, j) * static_cast<float>((i * g.n1 + j) % 7 + 1);
    for (int64_t r = 0; r < M; ++r) y[r * D + col] += c * coef;
  });
}

// y = 0.5 * x q^T + bias, q = rows [0, D) of the fused parameter.
void gemm(Acc& acc, const at::Tensor& qkv, const at::Tensor& bias) {
  const float* x = acc.x.data_ptr<float>();
  const float* q = qkv.data_ptr<float>();
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* y = acc.y.data_ptr<float>();
  std::vector<gk::hostrt::Access> a{gk::hostrt::reads(acc.x), gk::hostrt::reads(qkv), gk::hostrt::writes(acc.y)};
  if (b != nullptr) a.push_back(gk::hostrt::reads(bias));
  gk::hostrt::launch("qkv_gemm", std::move(a), [=] {
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < D; ++j) {
        float s = b != nullptr ? b[j] : 0.f;
        for (int64_t c = 0; c < D; ++c) s += x[r * D + c] * q[j * D + c] * 0.5f;
        y[r * D + j] = s;
      }
  });
}

// Lock counters must be 0 at launch (graphkeep zeroes them); a held lock is a
// "timeout": that column of y becomes NaN.
void locked(Acc& acc, const at::Tensor& locks) {
  int32_t* l = locks.data_ptr<int32_t>();
  float* y = acc.y.data_ptr<float>();
  gk::hostrt::launch("locked", {gk::hostrt::writes(locks), gk::hostrt::writes(acc.y)}, [=] {
    for (int64_t j = 0; j < D; ++j) {
      if (l[j] != 0) {
        for (int64_t r = 0; r < M; ++r) y[r * D + j] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      l[j] += 1;
      l[j] -= 1;
    }
  });
}

// Scratch is written before it is read: its old contents never matter.
void scratch(Acc& acc, const at::Tensor& s) {
  float* sp = s.data_ptr<float>();
  float* y = acc.y.data_ptr<float>();
  gk::hostrt::launch("scratch", {gk::hostrt::writes(s), gk::hostrt::writes(acc.y)}, [=] {
    for (int64_t j = 0; j < D; ++j) sp[j] = y[j] * 0.5f;
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < D; ++j) y[r * D + j] += sp[j] * 0.25f;
  });
}

// y[:, j] += 0.25 * x[:, perm[j] % D]
void gather(Acc& acc, const at::Tensor& perm) {
  const float* x = acc.x.data_ptr<float>();
  const int64_t* p = perm.data_ptr<int64_t>();
  float* y = acc.y.data_ptr<float>();
  gk::hostrt::launch("gather", {gk::hostrt::reads(acc.x), gk::hostrt::reads(perm), gk::hostrt::writes(acc.y)}, [=] {
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < D; ++j) y[r * D + j] += 0.25f * x[r * D + p[j] % D];
  });
}

// ---------------------------------------------------------------------------
// The building blocks: described classes and an aggregate. PWAL derives every
// tensor from the layer's fused parameter qkv [3D, D] and a per-object salt.
// ---------------------------------------------------------------------------
struct KernelBase {
  at::Tensor w_;
  int64_t salt_ = 0;  // a configuration value
  KernelBase() { ++g_live_kernels; }
  KernelBase(const at::Tensor& qkv, int64_t salt) : w_(qkv * (0.25f * static_cast<float>(salt + 1))), salt_(salt) {
    ++g_live_kernels;
  }
  KernelBase(const KernelBase& o) : w_(o.w_), salt_(o.salt_) { ++g_live_kernels; }
  KernelBase& operator=(const KernelBase&) = default;
  virtual ~KernelBase() { --g_live_kernels; }
  virtual void contribute(Acc& acc) const = 0;
  virtual char kind() const = 0;
  GRAPHKEEP_DESCRIBE(KernelBase, (w_, gk::derived_weight), salt_)
};

struct ScaleKernel final : KernelBase {
  at::Tensor scale_, locks_, scratch_;
  ScaleKernel() = default;
  ScaleKernel(const at::Tensor& qkv, int64_t salt)
      : KernelBase(qkv, salt), scale_(qkv.abs().amax(1) + 0.5f * static_cast<float>(salt)),
        locks_(at::zeros({D}, at::kInt)), scratch_(at::zeros({D})) {}
  void contribute(Acc& acc) const override {
    fold(acc, w_);
    fold(acc, scale_);
    locked(acc, locks_);
    scratch(acc, scratch_);
  }
  char kind() const override { return 'S'; }
  GRAPHKEEP_DESCRIBE_DERIVED(ScaleKernel, (KernelBase), (scale_, gk::scale),
                             (locks_, gk::workspace(gk::Init::zero)), (scratch_, gk::scratch))
};

struct PermMeta {
  gk::Metadata offsets;  // role in the type
  at::Tensor bias;       // role in the descriptor
  int64_t rows = 0;
};
GRAPHKEEP_AGGREGATE(PermMeta, offsets, (bias, gk::scale), rows);

struct PermKernel final : KernelBase {
  at::Tensor perm_;
  PermMeta meta_;
  PermKernel() = default;
  PermKernel(const at::Tensor& qkv, int64_t salt) : KernelBase(qkv, salt) {
    perm_ = at::argsort(qkv.select(1, salt % D), /*stable=*/true, /*dim=*/0, /*descending=*/false);
    meta_.offsets = perm_ * 3 + salt;
    meta_.bias = qkv.select(0, salt % (3 * D)) * 0.5f + 0.25f;
    meta_.rows = 3 * D;
  }
  void contribute(Acc& acc) const override {
    fold(acc, w_);
    fold(acc, perm_);
    gather(acc, perm_);
    fold(acc, meta_.offsets);
    fold(acc, meta_.bias);
  }
  char kind() const override { return 'P'; }
  GRAPHKEEP_DESCRIBE_DERIVED(PermKernel, (KernelBase), (perm_, gk::permutation), meta_)
};

std::unique_ptr<KernelBase> make_kernel(char kind, const at::Tensor& qkv, int64_t salt) {
  if (kind == 'P') return std::make_unique<PermKernel>(qkv, salt);
  return std::make_unique<ScaleKernel>(qkv, salt);
}

// What the seed chooses for one layer.
struct LayerSpec {
  int64_t index = 0;
  int64_t dense = 0, named = 0, experts = 0, expert_types = 0;  // expert i is a PermKernel when bit i is set
  int64_t var_alt = 0, poly = 0;  // poly: 0 none, 1 ScaleKernel, 2 PermKernel
  int64_t shared = 0;             // 0 none, 1 shared_a only, 2 shared_b = shared_a (alias), 3 two objects
  bool opt = false, views = false, views_of_param = false, coinciding_alias = false;
  int64_t view_mask = 0;          // bits: alias, prefix, interior, strided, transposed
  bool bias = false, bias_buffer = false, running = false;
  int64_t qkv_alias = 0;          // 0 none, 1 the parameter's TensorImpl, 2 a coinciding view of it
  int64_t q_shards = 1, q_shard_dim = 0;
  bool custom_load = false;       // load_weight() stores k_proj transposed
  bool frozen = false;            // no checkpoint tensors: PWAL-only, from the constructor's qkv
  friend bool operator==(const LayerSpec&, const LayerSpec&) = default;
};
std::ostream& operator<<(std::ostream& os, const LayerSpec& s) {
  static const char* const shared[] = {"none", "one", "alias", "two"};
  os << "l" << s.index << "{dense=" << s.dense << " named=" << s.named << (s.opt ? " opt" : "")
     << " var=" << (s.var_alt ? 'P' : 'S') << " poly=" << "-SP"[s.poly]
     << " shared=" << shared[s.shared] << " experts=[";
  for (int64_t i = 0; i < s.experts; ++i) os << ((s.expert_types >> i) & 1 ? 'P' : 'S');
  os << "]";
  if (s.views) {
    os << " views(" << (s.views_of_param ? "of qkv" : "own storage") << ":";
    const char* names[] = {s.coinciding_alias ? "alias=view_as" : "alias=same", "prefix", "interior", "strided", "transposed"};
    for (int b = 0; b < 5; ++b)
      if ((s.view_mask >> b) & 1) os << " " << names[b];
    os << ")";
  }
  os << (s.bias ? (s.bias_buffer ? " bias(buffer)" : " bias") : "") << (s.running ? " running-buffer" : "")
     << (s.qkv_alias == 1 ? " qkv_alias=same" : s.qkv_alias == 2 ? " qkv_alias=view_as" : "")
     << (s.frozen ? " frozen" : "") << (s.custom_load ? " custom_load" : "") << " q_shards=" << s.q_shards
     << "/dim" << s.q_shard_dim << "}";
  return os;
}

// Members over ONE storage: a base, an alias of it, and overlapping views.
struct ViewGroup {
  at::Tensor base_, alias_, prefix_, interior_, strided_, transposed_;
  int64_t mask_ = 0;
  int64_t len_ = 0;  // the views' extent (the base's length without a mutation)
  ViewGroup() = default;
  ViewGroup(const at::Tensor& qkv, const LayerSpec& s, int64_t extra = 0) : mask_(s.view_mask) {
    if (!s.views) return;
    len_ = s.views_of_param ? 3 * D * D : 6 * D;
    base_ = s.views_of_param ? qkv.view({-1}) : qkv.reshape({-1}).narrow(0, 2 * D, len_ + extra) * 0.75f + 0.125f;
    if (mask_ & 1) alias_ = s.coinciding_alias ? base_.view_as(base_) : base_;
    if (mask_ & 2) prefix_ = base_.narrow(0, 0, len_ / 4);
    if (mask_ & 4) interior_ = base_.narrow(0, len_ / 3, len_ / 4);
    if (mask_ & 8) strided_ = base_.slice(0, 0, len_, 2);
    if (mask_ & 16) transposed_ = base_.narrow(0, 0, len_ / 2).view({2, len_ / 4}).t();
  }
  void contribute(Acc& acc) const {
    for (const at::Tensor* t : {&base_, &alias_, &prefix_, &interior_, &strided_, &transposed_}) fold(acc, *t);
  }
  GRAPHKEEP_DESCRIBE(ViewGroup, (base_, gk::derived_weight), (alias_, gk::derived_weight), (prefix_, gk::scale),
                     (interior_, gk::metadata), (strided_, gk::derived_weight), (transposed_, gk::scale), mask_, len_)
};

// Stride-like metadata of the layer's shape alone, declared so (Note
// [Declared derivations]): every reload of every structure, fault and PWAL
// behaviour checks the declaration, which must never fire here.
struct ShapeStrides {
  at::Tensor ab, c;
};
GRAPHKEEP_AGGREGATE(ShapeStrides, (ab, gk::metadata.from_shapes()), (c, gk::metadata.from_shapes()));

// Every container kind the registry walks.
struct Kernels {
  std::vector<ScaleKernel> dense;
  std::map<std::string, PermKernel> named;
  std::optional<PermKernel> opt;
  std::variant<ScaleKernel, PermKernel> var;
  std::unique_ptr<KernelBase> poly;
  std::shared_ptr<KernelBase> shared_a, shared_b;  // shared_b may be shared_a: one object, two paths
  std::vector<std::unique_ptr<KernelBase>> experts;
  ViewGroup views;
  ShapeStrides strides;

  void contribute(Acc& acc) const {
    for (const auto& k : dense) k.contribute(acc);
    for (const auto& [name, k] : named) k.contribute(acc);
    if (opt) opt->contribute(acc);
    std::visit([&](const auto& k) { k.contribute(acc); }, var);
    for (const KernelBase* k : {poly.get(), shared_a.get(), shared_b.get()})
      if (k != nullptr) k->contribute(acc);
    for (const auto& e : experts) e->contribute(acc);
    views.contribute(acc);
    fold(acc, strides.ab);
    fold(acc, strides.c);
  }
  GRAPHKEEP_DESCRIBE(Kernels, dense, named, opt, var, poly, shared_a, shared_b, experts, views, strides)
};

Kernels build_kernels(const LayerSpec& s, const at::Tensor& qkv) {
  Kernels k;
  int64_t salt = 0;
  for (int64_t i = 0; i < s.dense; ++i) k.dense.emplace_back(qkv, salt++);
  for (int64_t i = 0; i < s.named; ++i) k.named.emplace("e" + std::to_string(i), PermKernel(qkv, salt++));
  if (s.opt) k.opt.emplace(qkv, salt++);
  if (s.var_alt == 1) k.var = PermKernel(qkv, salt++);
  else k.var = ScaleKernel(qkv, salt++);
  if (s.poly != 0) k.poly = make_kernel(s.poly == 2 ? 'P' : 'S', qkv, salt++);
  if (s.shared != 0) k.shared_a = make_kernel('S', qkv, salt++);
  if (s.shared == 2) k.shared_b = k.shared_a;
  if (s.shared == 3) k.shared_b = make_kernel('P', qkv, salt++);
  for (int64_t i = 0; i < s.experts; ++i) k.experts.push_back(make_kernel((s.expert_types >> i) & 1 ? 'P' : 'S', qkv, salt++));
  k.views = ViewGroup(qkv, s);
  k.strides.ab = at::full({D}, 3 * D, at::kLong);
  k.strides.c = at::arange(D, at::kLong) * D + s.index;
  return k;
}

// ---------------------------------------------------------------------------
// PWAL behaviours. The knob lives OUTSIDE the described classes (a table keyed
// by layer index), so turning it is not itself a configuration change.
// ---------------------------------------------------------------------------
enum class Pwal { rebuild, in_place, mixed, shape, tree, throw_early, throw_partial, throw_in_place };
const char* to_string(Pwal p) {
  const char* n[] = {"rebuild", "in_place", "mixed", "shape", "tree", "throw_early", "throw_partial", "throw_in_place"};
  return n[static_cast<int>(p)];
}
struct Behaviour {
  Pwal kind = Pwal::rebuild;
  uint64_t arg = 0;  // which mutation / how far before throwing
};
std::vector<Behaviour> g_pwal;      // set by the harness around each reload; empty: rebuild
std::vector<std::string> g_notes;   // what the PWALs did, for the log
bool g_must_fail = false;           // a PWAL changed a captured layout or shrank the tree
gk::PatchBase g_patch_base = gk::PatchBase::device;  // per iteration: where loads keep patch bases
gk::PatchWrites g_patch_writes = gk::PatchWrites::elements;  // per iteration: how patch commits write

struct TensorRefs final : gk::Walker {
  std::vector<at::Tensor*> all;
  void tensor(const gk::SlotPath&, const gk::RoleSpec&, std::string_view, at::Tensor& t) override { all.push_back(&t); }
};
// Copies src's values into dst's tensors in place (walk order, the first
// `limit`). Returns false, writing nothing, when the two trees differ.
bool copy_into(Kernels& dst, Kernels& src, std::size_t limit) {
  TensorRefs a, b;
  gk::walk(dst, a);
  gk::walk(src, b);
  if (a.all.size() != b.all.size()) return false;
  for (std::size_t i = 0; i < a.all.size(); ++i) {
    const at::Tensor &x = *a.all[i], &y = *b.all[i];
    if (x.defined() != y.defined() || (x.defined() && (!x.sizes().equals(y.sizes()) || x.dtype() != y.dtype())))
      return false;
  }
  for (std::size_t i = 0; i < a.all.size() && i < limit; ++i)
    if (a.all[i]->defined()) a.all[i]->copy_(*b.all[i]);
  return true;
}

// Replaces the containers selected by `bits` with src's (new objects, new tensors).
void move_fields(Kernels& dst, Kernels& src, uint64_t bits) {
  if (bits & 1) dst.dense = std::move(src.dense);
  if (bits & 2) dst.named = std::move(src.named);
  if (bits & 4) dst.opt = std::move(src.opt);
  if (bits & 8) dst.var = std::move(src.var);
  if (bits & 16) dst.poly = std::move(src.poly);
  if (bits & 32) dst.shared_a = std::move(src.shared_a), dst.shared_b = std::move(src.shared_b);
  if (bits & 64) dst.experts = std::move(src.experts);
  if (bits & 128) dst.views = std::move(src.views);
}

class FuzzLayer : public torch::nn::Module, public gk::ReloadableLayer {
 public:
  explicit FuzzLayer(const LayerSpec& s) : spec_(s) {
    const at::Tensor init = at::arange(3 * D * D, at::kFloat).reshape({3 * D, D}).remainder(7).sub(3).div(4);
    qkv_ = register_parameter("qkv", s.frozen ? init : at::zeros({3 * D, D}), /*requires_grad=*/false);
    if (s.bias) bias_ = s.bias_buffer ? register_buffer("bias", at::zeros({D})) : register_parameter("bias", at::zeros({D}), false);
    if (s.running) running_ = register_buffer("running", at::zeros({D}));
  }
  // A fused parameter: q (maybe sharded), k and v concatenate into qkv.
  std::vector<gk::CheckpointParam> checkpoint_params() const override {
    if (spec_.frozen) return {};
    std::vector<gk::CheckpointParam> p{{"qkv", {{"q_proj.weight", {D, D}, at::kFloat, spec_.q_shards, spec_.q_shard_dim},
                                                {"k_proj.weight", {D, D}}, {"v_proj.weight", {D, D}}}}};
    if (spec_.bias) p.push_back({"bias", {{"bias", {D}}}});
    return p;
  }
  bool load_weight(const gk::LoadRequest& r) override {
    if (!spec_.custom_load || r.param.tensors[r.tensor_index].name != "k_proj.weight") return false;
    r.target.narrow(0, D, D).copy_(r.value.t());
    return true;
  }
  void process_weights_after_loading() override;
  gk::ObjectRef registered_members() override { return gk::ObjectRef::of(*this); }

  at::Tensor forward(const at::Tensor& x) const {
    Acc acc{x, gk::hostrt::empty({M, D}, x.options())};
    gemm(acc, qkv_, bias_ ? *bias_ : at::Tensor());
    fold(acc, qkv_);  // k and v count too
    if (qkv_alias_) fold(acc, *qkv_alias_);
    if (running_) fold(acc, *running_);
    k_.contribute(acc);
    return acc.y;
  }

 private:
  void mutate(const char* what, std::vector<std::pair<std::string, std::function<void()>>> options, uint64_t arg);

  at::Tensor qkv_;
  std::optional<at::Tensor> bias_, running_;  // handles to the bias parameter and the running buffer
  std::optional<at::Tensor> qkv_alias_;       // the parameter again, under another member
  Kernels k_;
  LayerSpec spec_;
  GRAPHKEEP_DESCRIBE_DERIVED(FuzzLayer, (torch::nn::Module, gk::ReloadableLayer), (qkv_, gk::parameter),
                             (bias_, gk::parameter), (running_, gk::parameter), (qkv_alias_, gk::parameter),
                             k_, spec_)
};

void FuzzLayer::mutate(const char* what, std::vector<std::pair<std::string, std::function<void()>>> options,
                       uint64_t arg) {
  auto& [name, apply] = options[arg % options.size()];
  apply();
  g_notes.push_back("l" + std::to_string(spec_.index) + " " + what + " " + name);
  // Growing a container the graphs never read is harmless; anything else
  // changes a captured slot and must not be accepted.
  g_must_fail = g_must_fail || name.find("grow") == std::string::npos;
}

void FuzzLayer::process_weights_after_loading() {
  const Behaviour b = spec_.index < static_cast<int64_t>(g_pwal.size()) ? g_pwal[spec_.index] : Behaviour{};
  const std::string where = "injected PWAL failure in l" + std::to_string(spec_.index);
  if (b.kind == Pwal::throw_early) throw std::runtime_error(where + " before anything was built");
  Kernels fresh = build_kernels(spec_, qkv_);
  const at::Tensor running = qkv_.amax(0);
  // The parameter was re-materialized by the loader: re-derive its handles.
  if (spec_.qkv_alias == 1) qkv_alias_ = qkv_;
  if (spec_.qkv_alias == 2) qkv_alias_ = qkv_.view_as(qkv_);
  switch (b.kind) {
    case Pwal::in_place:  // write into the captured tensors; rebuild if the tree differs
    case Pwal::mixed:     // ... then replace some containers with new objects
      if (copy_into(k_, fresh, SIZE_MAX)) {
        if (b.kind == Pwal::mixed) move_fields(k_, fresh, b.arg);
        if (running_) running_->copy_(running);
        return;
      }
      break;
    case Pwal::throw_in_place:  // scribble into some captured tensors, then fail
      copy_into(k_, fresh, b.arg % 16);
      if (running_ && (b.arg & 16)) running_->copy_(running);
      throw std::runtime_error(where + " after in-place writes");
    case Pwal::throw_partial:  // replace some objects with new ones, then fail
      move_fields(k_, fresh, b.arg);
      if (running_ && (b.arg & 256)) running_->set_data(running);
      throw std::runtime_error(where + " after building part of the state");
    default: break;
  }
  k_ = std::move(fresh);
  if (running_) running_->set_data(running);  // a new storage for the buffer, like a rebuilt kernel's
  const at::Tensor& q = qkv_;
  if (b.kind == Pwal::shape) {
    std::vector<std::pair<std::string, std::function<void()>>> m{
        {"var.w_ gains a row", [&] { std::visit([&](auto& k) { k.w_ = at::cat({k.w_, at::zeros({1, D})}); }, k_.var); }},
        {"var.salt_ changes (configuration)", [&] { std::visit([](auto& k) { k.salt_ += 1; }, k_.var); }}};
    if (k_.var.index() == 0)
      m.push_back({"var.scale_ becomes double", [&] { auto& s = std::get<0>(k_.var).scale_; s = s.to(at::kDouble); }});
    if (spec_.views && !spec_.views_of_param)
      m.push_back({"views.base_ 4 elements longer", [&] { k_.views = ViewGroup(q, spec_, 4); }});
    if (spec_.views && (spec_.view_mask & 4))
      m.push_back({"views.interior_ shifted by one element", [&] {
                     k_.views.interior_ = k_.views.base_.narrow(0, k_.views.len_ / 3 + 1, k_.views.len_ / 4);
                   }});
    if (spec_.views && (spec_.view_mask & 8))
      m.push_back({"views.strided_ step 3", [&] { k_.views.strided_ = k_.views.base_.slice(0, 0, k_.views.len_, 3); }});
    if (spec_.views && (spec_.view_mask & 16))
      m.push_back({"views.transposed_ made contiguous", [&] { k_.views.transposed_ = k_.views.transposed_.contiguous(); }});
    mutate("shape", std::move(m), b.arg);
  } else if (b.kind == Pwal::tree) {
    std::vector<std::pair<std::string, std::function<void()>>> m{
        {"dense grows", [&] { k_.dense.emplace_back(q, 99); }},
        {"named grows", [&] { k_.named.emplace("zz", PermKernel(q, 98)); }},
        {"var switches alternative", [&] {
           if (k_.var.index() == 0) k_.var = PermKernel(q, 97);
           else k_.var = ScaleKernel(q, 97);
         }}};
    if (!k_.dense.empty()) m.push_back({"dense shrinks", [&] { k_.dense.pop_back(); }});
    if (!k_.named.empty()) m.push_back({"named loses a key", [&] { k_.named.erase(k_.named.begin()); }});
    if (k_.opt) m.push_back({"opt emptied", [&] { k_.opt.reset(); }});
    else m.push_back({"opt grows (was empty)", [&] { k_.opt.emplace(q, 95); }});
    if (k_.poly) {
      m.push_back({"poly emptied", [&] { k_.poly.reset(); }});
      m.push_back({"poly changes dynamic type", [&] { k_.poly = make_kernel(k_.poly->kind() == 'S' ? 'P' : 'S', q, 94); }});
    }
    if (spec_.shared == 2) m.push_back({"shared_b split from shared_a", [&] { k_.shared_b = make_kernel('S', q, 93); }});
    if (!k_.experts.empty()) {
      m.push_back({"experts shrink", [&] { k_.experts.pop_back(); }});
      m.push_back({"experts[0] changes dynamic type",
                   [&] { k_.experts[0] = make_kernel(k_.experts[0]->kind() == 'S' ? 'P' : 'S', q, 92); }});
    }
    if (spec_.views) m.push_back({"views cleared", [&] { k_.views = ViewGroup(); }});
    mutate("tree", std::move(m), b.arg);
  }
}

// A plain module (no ReloadableLayer): its parameter reloads as is, its
// buffer is kept.
class PlainGain : public torch::nn::Module {
 public:
  PlainGain() {
    gamma = register_parameter("gamma", at::ones({D}), false);
    shift = register_buffer("shift", at::linspace(-0.5, 0.5, D));
  }
  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor y = gk::hostrt::empty({M, D}, x.options());
    const float *xp = x.data_ptr<float>(), *g = gamma.data_ptr<float>(), *sh = shift.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    gk::hostrt::launch("gain", {gk::hostrt::reads(x), gk::hostrt::reads(gamma), gk::hostrt::reads(shift),
                                gk::hostrt::writes(y)},
                       [=] {
                         for (int64_t i = 0; i < M * D; ++i) yp[i] = xp[i] * g[i % D] + sh[i % D];
                       });
    return y;
  }
  at::Tensor gamma, shift;
};

// Block-derived members (Note [Declared derivations]): int8 values and a
// float scale per block of a checkpoint parameter w = [a; b], [2D, D],
// declared by_blocks with the seed's block shape and scale layout (values
// per block, transposed or not), and maybe a member t declared by_layout
// (a transpose padded with ones, reversed rows with a broadcast row, 2x2
// tiles). A patch touching the layer recomputes the touched blocks and
// writes the moved elements instead of running PWAL. A lying PWAL
// (g_block_lie, per operation) uses one scale for the whole tensor and
// pads with 2 or reverses t's rows: a full reload must refuse it wherever
// that changes a value (the declared functions stay honest, so what a patch
// computes is a fresh model's).
struct BlockSpec {
  int64_t index = 0;
  int64_t bh = 1, bw = D;   // divide 2D and D
  bool transposed = false;  // the scales stored [D / bw, per_block, 2D / bh]
  int64_t per_block = 1;    // values per block: the scale, then its negation, ... (packed words' layout)
  int64_t layout = 0;       // a layout-derived member t of w: none, transposed + a column of ones,
                            // rows reversed + row 0 twice more, 2x2 tiles
  friend bool operator==(const BlockSpec&, const BlockSpec&) = default;
};
std::ostream& operator<<(std::ostream& os, const BlockSpec& s) {
  return os << "b" << s.index << "{blocks " << s.bh << "x" << s.bw << (s.transposed ? " scales transposed" : "")
            << (s.per_block > 1 ? " " + std::to_string(s.per_block) + " per block" : "")
            << (s.layout > 0 ? " layout " + std::to_string(s.layout) : "") << "}";
}
bool g_block_lie = false;

struct BlockQuant {
  at::Tensor q, s, t;
};
GRAPHKEEP_AGGREGATE(BlockQuant, (q, gk::derived_weight.by_blocks()), (s, gk::scale.by_blocks()),
                    (t, gk::derived_weight.by_layout()));

// The layout-derived member (Note [Layout derivations]) of w [2D, D];
// `pad` is the constant a transpose pads with (a lying PWAL pads with 2).
at::Tensor moved(const at::Tensor& w, int64_t kind, double pad = 1.0) {
  switch (kind) {
    case 1: return at::constant_pad_nd(w.t(), {0, 1}, pad).contiguous();                    // [D, 2D + 1]
    case 2: return at::cat({w.flip({0}), w.narrow(0, 0, 1).expand({2, D})}).contiguous();  // [2D + 2, D]
    case 3: return w.reshape({D, 2, D / 2, 2}).permute({0, 2, 1, 3}).reshape({2 * D, D}).contiguous();
    default: return {};
  }
}

// blocks [B, bh, bw] -> {int8 [B, bh, bw], float [B, per_block]: the scale,
// -scale, 2 scale, ...}; `whole`: one scale for all.
std::vector<at::Tensor> quantize_blocks(const at::Tensor& blocks, bool whole, int64_t per_block) {
  at::Tensor amax = blocks.abs().amax({1, 2});
  if (whole) amax = amax.max().expand_as(amax);
  const at::Tensor scale = (amax / 127.0).clamp_min(1e-12).contiguous();
  const at::Tensor q = at::round(blocks / scale.view({-1, 1, 1})).clamp(-127, 127).to(at::kChar);
  if (per_block == 1) return {q, scale};
  const at::Tensor factors = at::arange(per_block, scale.options()).remainder(2).mul(-2).add(1) *
                             at::arange(per_block, scale.options()).div(2, "floor").add(1);  // 1, -1, 2, -2, ...
  return {q, (scale.view({-1, 1}) * factors.view({1, -1})).contiguous()};
}

class BlockLayer : public torch::nn::Module, public gk::DescribedLayer<BlockLayer> {
 public:
  explicit BlockLayer(const BlockSpec& s) : spec_(s) {
    w_ = checkpoint_param("w", {{"a.weight", {D, D}, at::kFloat}, {"b.weight", {D, D}, at::kFloat}}, at::kCPU);
  }
  void process_weights_after_loading() override {
    const int64_t bh = spec_.bh, bw = spec_.bw, n = 2 * D;
    const at::Tensor blocks = w_.reshape({n / bh, bh, D / bw, bw}).permute({0, 2, 1, 3}).reshape({-1, bh, bw});
    const std::vector<at::Tensor> qs = quantize_blocks(blocks, g_block_lie, spec_.per_block);
    m_.q = qs[0].reshape({n / bh, D / bw, bh, bw}).permute({0, 2, 1, 3}).reshape({n, D}).contiguous();
    m_.s = spec_.transposed ? qs[1]
                                  .reshape({n / bh, D / bw, spec_.per_block})
                                  .permute({1, 2, 0})
                                  .reshape({D / bw * spec_.per_block, n / bh})
                                  .contiguous()
                            : qs[1];
    // A lying PWAL reverses a tiled or reversed layout's rows back, or pads with 2.
    m_.t = g_block_lie && spec_.layout > 1 ? moved(w_, spec_.layout).flip({0}).contiguous()
                                           : moved(w_, spec_.layout, g_block_lie ? 2.0 : 1.0);
    if (g_block_lie) g_notes.push_back("b" + std::to_string(spec_.index) + " PWAL: one scale for the tensor (a lie)");
  }
  void declare_derivations(gk::Derivations& d) const override {
    d.blocks("fuzz int8 per block", w_, {spec_.bh, spec_.bw},
             {{m_.q, gk::BlockLayout::same_as_source},
              {m_.s, spec_.transposed ? gk::BlockLayout::one_per_block_transposed : gk::BlockLayout::one_per_block,
               spec_.per_block}},
             [m = spec_.per_block](const at::Tensor& blocks) { return quantize_blocks(blocks, false, m); });
    if (spec_.layout > 0)
      d.layout("fuzz layout " + std::to_string(spec_.layout), w_, m_.t,
               [k = spec_.layout](const at::Tensor& w) { return moved(w, k); });
  }
  void contribute(Acc& acc) const {
    fold(acc, w_);
    fold(acc, m_.q);
    fold(acc, m_.s);
    fold(acc, m_.t);
  }

 private:
  at::Tensor w_;
  BlockQuant m_;
  BlockSpec spec_;
  GRAPHKEEP_DESCRIBE_DERIVED(BlockLayer, (torch::nn::Module, gk::DescribedLayer<BlockLayer>), (w_, gk::parameter), m_,
                             spec_)
};

struct ModelSpec {
  std::vector<LayerSpec> layers;
  int64_t norm_after = -1;  // a plain module after this layer
  std::vector<BlockSpec> blocks;  // block layers after the others
};
std::string describe(const ModelSpec& s) {
  std::ostringstream os;
  for (const auto& l : s.layers) os << l << " ";
  if (s.norm_after >= 0) os << "norm(plain module) after l" << s.norm_after;
  for (const auto& b : s.blocks) os << " " << b;
  return os.str();
}

class FuzzModel : public torch::nn::Module {
 public:
  explicit FuzzModel(const ModelSpec& s) : spec_(s) {
    for (const auto& l : s.layers)
      layers_.push_back(register_module("l" + std::to_string(l.index), std::make_shared<FuzzLayer>(l)));
    if (s.norm_after >= 0) norm_ = register_module("norm", std::make_shared<PlainGain>());
    for (const auto& b : s.blocks)
      blocks_.push_back(register_module("b" + std::to_string(b.index), std::make_shared<BlockLayer>(b)));
  }
  at::Tensor forward(at::Tensor x) const {
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      x = layers_[i]->forward(x);
      if (static_cast<int64_t>(i) == spec_.norm_after) x = norm_->forward(x);
    }
    if (blocks_.empty()) return x;
    Acc acc{x, gk::hostrt::empty({M, D}, x.options())};
    const float* xp = x.data_ptr<float>();
    float* yp = acc.y.data_ptr<float>();
    gk::hostrt::launch("block_input", {gk::hostrt::reads(x), gk::hostrt::writes(acc.y)}, [=] {
      for (int64_t i = 0; i < M * D; ++i) yp[i] = xp[i];
    });
    for (const auto& b : blocks_) b->contribute(acc);
    return acc.y;
  }

 private:
  ModelSpec spec_;
  std::vector<std::shared_ptr<FuzzLayer>> layers_;
  std::shared_ptr<PlainGain> norm_;
  std::vector<std::shared_ptr<BlockLayer>> blocks_;
};

// ---------------------------------------------------------------------------
// Random structures, weights and reload operations
// ---------------------------------------------------------------------------
using Rng = std::mt19937_64;
int64_t pick(Rng& rng, int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); }

ModelSpec random_structure(Rng& rng) {
  ModelSpec s;
  const int64_t n = 1 + pick(rng, 3);
  for (int64_t i = 0; i < n; ++i) {
    LayerSpec l;
    l.index = i;
    l.dense = pick(rng, 3), l.named = pick(rng, 3), l.experts = pick(rng, 3), l.expert_types = pick(rng, 4);
    l.var_alt = pick(rng, 2), l.poly = pick(rng, 3), l.shared = pick(rng, 4);
    l.opt = pick(rng, 2), l.views = pick(rng, 4) != 0, l.views_of_param = pick(rng, 2);
    l.view_mask = pick(rng, 32), l.coinciding_alias = pick(rng, 2);
    l.bias = pick(rng, 2), l.bias_buffer = pick(rng, 2), l.running = pick(rng, 2), l.qkv_alias = pick(rng, 3);
    l.q_shards = 1 + pick(rng, 2), l.q_shard_dim = pick(rng, 2), l.custom_load = pick(rng, 3) == 0;
    l.frozen = pick(rng, 8) == 0;
    s.layers.push_back(l);
  }
  s.norm_after = pick(rng, 2) ? pick(rng, n) : -1;
  const int64_t nb = pick(rng, 3);
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t rows[] = {1, 2, D, 2 * D}, cols[] = {1, 2, D};
    s.blocks.push_back({i, rows[pick(rng, 4)], cols[pick(rng, 3)], pick(rng, 2) == 1, 1 + pick(rng, 3), pick(rng, 4)});
  }
  return s;
}

// Multiples of 1/64 in [-1, 1]: exact, and a stale value always differs.
at::Tensor random_tensor(Rng& rng, at::IntArrayRef shape) {
  at::Tensor t = at::empty(shape);
  float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(pick(rng, 129) - 64) / 64.f;
  return t;
}

std::vector<gk::NamedTensor> random_weights(const ModelSpec& s, Rng& rng) {
  std::vector<gk::NamedTensor> out;
  for (const auto& l : s.layers) {
    if (l.frozen) continue;
    const std::string p = "l" + std::to_string(l.index) + ".";
    const at::Tensor q = random_tensor(rng, {D, D});
    for (int64_t k = 0; k < l.q_shards; ++k)
      out.push_back({p + "q_proj.weight", q.chunk(l.q_shards, l.q_shard_dim)[k].contiguous(), k});
    out.push_back({p + "k_proj.weight", random_tensor(rng, {D, D}), 0});
    out.push_back({p + "v_proj.weight", random_tensor(rng, {D, D}), 0});
    if (l.bias) out.push_back({p + "bias", random_tensor(rng, {D}), 0});
  }
  if (s.norm_after >= 0) out.push_back({"norm.gamma", random_tensor(rng, {D}) * 0.5f + 1.f, 0});  // never 0: no column is lost
  for (const auto& b : s.blocks) {
    const std::string p = "b" + std::to_string(b.index) + ".";
    out.push_back({p + "a.weight", random_tensor(rng, {D, D}), 0});
    out.push_back({p + "b.weight", random_tensor(rng, {D, D}), 0});
  }
  return out;
}

enum class BadSet { none, missing, wrong_shape, wrong_dtype, unknown_name, duplicate, undefined, non_finite };
const char* to_string(BadSet b) {
  const char* n[] = {"complete",  "missing",  "wrong_shape", "wrong_dtype",
                     "unknown_name", "duplicate", "undefined", "non_finite"};
  return n[static_cast<int>(b)];
}

enum class BadPatch { none, unknown_name, out_of_range, duplicate, length, dtype, shape, base, target };
const char* to_string(BadPatch b) {
  const char* n[] = {"good", "unknown_name", "out_of_range", "duplicate", "length", "dtype", "shape", "base", "target"};
  return n[static_cast<int>(b)];
}

struct Op {
  bool patch = false, staged = false;  // a weight patch, by reload(patch) or stage()+commit()
  double density = 0;
  int encoding = 0;                    // gk::MakePatchOptions::Encoding
  BadPatch bad_patch = BadPatch::none;
  bool recovery = false;
  gk::ReloadMode mode = gk::ReloadMode::streaming;
  bool restore_in_place_writes = true;
  bool shuffled = false;
  BadSet bad = BadSet::none;
  std::string fault_stage, fault_layer;
  std::vector<Behaviour> pwal;
  // With `poke` (a staged reload of weights, not a patch), one element of one
  // weight is written through its raw pointer between stage() and commit()
  // (what a trainer's kernel does: no version counter moves).
  bool poke = false;
  bool block_lie = false;  // the block layers' PWAL lies (g_block_lie)
};

Op random_op(const ModelSpec& s, Rng& rng, bool recovery) {
  Op op;
  op.recovery = recovery;
  op.mode = pick(rng, 2) ? gk::ReloadMode::transactional : gk::ReloadMode::streaming;
  op.pwal.assign(s.layers.size(), Behaviour{});
  if (recovery) return op;  // clean: rebuild PWAL, complete weights, no fault
  op.restore_in_place_writes = pick(rng, 8) != 0;
  op.shuffled = pick(rng, 3) == 0;
  for (auto& b : op.pwal) b = {static_cast<Pwal>(pick(rng, 3)), rng()};  // rebuild, in_place or mixed
  const int64_t r = pick(rng, 10);
  if (r >= 4 && r != 7 && r != 8) {  // one layer's PWAL misbehaves
    Behaviour& b = op.pwal[pick(rng, static_cast<int64_t>(s.layers.size()))];
    b = {static_cast<Pwal>(3 + pick(rng, 5)), rng()};
  }
  if (r == 7 || r == 9) {  // a fault at a stage
    using FP = gk::testing::FaultPoint;  // by enumerator, so that a renamed point cannot go stale here
    const FP stages[] = {FP::detach, FP::load, FP::pwal, FP::check, FP::copy, FP::before_copies};
    op.fault_stage = std::string(gk::testing::to_string(stages[pick(rng, 6)]));
    const int64_t n = static_cast<int64_t>(s.layers.size()), nb = static_cast<int64_t>(s.blocks.size());
    const int64_t layer = pick(rng, n + (s.norm_after >= 0 ? 1 : 0) + nb);
    op.fault_layer = layer < n ? "l" + std::to_string(layer)
                     : layer < n + nb ? "b" + std::to_string(layer - n)
                                      : "norm";
  }
  if (!s.blocks.empty() && pick(rng, 5) == 0) op.block_lie = true;
  if (r == 8 || (r == 9 && pick(rng, 2))) op.bad = static_cast<BadSet>(1 + pick(rng, 7));
  // One op in four is staged (no fault: stage() and commit() have their own
  // tests of faults), and half of those write a weight between the two.
  if (op.fault_stage.empty() && pick(rng, 4) == 0) {
    op.staged = true;
    op.poke = pick(rng, 2) == 0;
  }
  if (pick(rng, 3) == 0) {  // a patch instead (a transactional stage by nature: no weight-set faults)
    op.patch = true;
    op.staged = pick(rng, 2);
    op.poke = false;
    const double densities[] = {0.0, 0.05, 0.25, 0.5, 1.0};
    op.density = densities[pick(rng, 5)];
    op.encoding = static_cast<int>(pick(rng, 3));
    op.bad = BadSet::none;
    op.bad_patch = pick(rng, 4) == 0 ? static_cast<BadPatch>(1 + pick(rng, 8)) : BadPatch::none;
    if (op.fault_stage == gk::testing::to_string(gk::testing::FaultPoint::before_copies))  // a patch's own stage
      op.fault_stage = std::string(gk::testing::to_string(gk::testing::FaultPoint::scatter));
  }
  return op;
}

std::vector<gk::NamedTensor> corrupt(std::vector<gk::NamedTensor> w, const Op& op, Rng& rng, std::string& what) {
  if (op.shuffled) std::shuffle(w.begin(), w.end(), rng);
  if (op.bad == BadSet::none || w.empty()) return w;
  const std::size_t i = static_cast<std::size_t>(pick(rng, static_cast<int64_t>(w.size())));
  what = w[i].name + (w[i].shard ? " shard " + std::to_string(w[i].shard) : "");
  switch (op.bad) {
    case BadSet::missing: w.erase(w.begin() + static_cast<std::ptrdiff_t>(i)); break;
    case BadSet::wrong_shape: w[i].value = at::zeros({w[i].value.size(0), D + 1}); break;  // no tensor is D+1 wide
    case BadSet::wrong_dtype: w[i].value = w[i].value.to(at::kDouble); break;
    case BadSet::unknown_name: w[i].name += "_x"; break;
    case BadSet::duplicate: {
      gk::NamedTensor copy = w[i];
      w.insert(w.begin() + static_cast<std::ptrdiff_t>(pick(rng, static_cast<int64_t>(w.size()))), std::move(copy));
      break;
    }
    case BadSet::undefined: w[i].value = at::Tensor(); break;
    case BadSet::non_finite: {  // a diverged trainer's tensor: refused by default, never served
      w[i].value = w[i].value.clone();
      const float bad[] = {std::nanf(""), INFINITY, -INFINITY};
      w[i].value.reshape({-1})[pick(rng, w[i].value.numel())] = bad[pick(rng, 3)];
      break;
    }
    case BadSet::none: break;
  }
  return w;
}

std::string describe(const Op& op, const std::string& bad_what) {
  std::ostringstream os;
  if (op.patch) {
    os << "PATCH " << (op.staged ? "stage+commit" : "reload") << " density=" << op.density << " encoding="
       << op.encoding << " " << to_string(op.bad_patch) << (bad_what.empty() ? "" : "(" + bad_what + ")") << " pwal=[";
    for (std::size_t i = 0; i < op.pwal.size(); ++i)
      os << (i ? " " : "") << "l" << i << ":" << to_string(op.pwal[i].kind)
         << (op.pwal[i].kind >= Pwal::mixed ? "/" + std::to_string(op.pwal[i].arg & 511) : "");
    os << "]";
    if (!op.fault_stage.empty()) os << " fault=" << op.fault_stage << "@" << op.fault_layer;
    if (op.block_lie) os << " block-lie";
    return os.str();
  }
  os << (op.recovery ? "RECOVERY " : "") << (op.mode == gk::ReloadMode::streaming ? "streaming" : "transactional")
     << (op.restore_in_place_writes ? "" : " restore_in_place_writes=false") << (op.shuffled ? " shuffled" : "")
     << " weights=" << to_string(op.bad) << (bad_what.empty() ? "" : "(" + bad_what + ")") << " pwal=[";
  for (std::size_t i = 0; i < op.pwal.size(); ++i)
    os << (i ? " " : "") << "l" << i << ":" << to_string(op.pwal[i].kind)
       << (op.pwal[i].kind >= Pwal::mixed ? "/" + std::to_string(op.pwal[i].arg & 511) : "");
  os << "]";
  if (!op.fault_stage.empty()) os << " fault=" << op.fault_stage << "@" << op.fault_layer;
  if (op.staged && !op.patch) os << (op.poke ? " staged+poke" : " staged");
  if (op.block_lie) os << " block-lie";
  return os.str();
}

// ---------------------------------------------------------------------------
// One iteration: a random structure, captured, then reloaded 4-8 times
// ---------------------------------------------------------------------------
std::map<std::string, int64_t> g_counts;

at::Tensor fresh_output(const ModelSpec& s, const std::vector<gk::NamedTensor>& w, const at::Tensor& x) {
  g_pwal.clear();
  auto m = std::make_shared<FuzzModel>(s);
  gk::InMemorySource src(w, "fresh-model weights");
  gk::load_weights(*m, src);
  return m->forward(x);
}

std::vector<gk::NamedTensor> deep_copy(const std::vector<gk::NamedTensor>& w) {
  std::vector<gk::NamedTensor> out;
  for (const auto& t : w) out.push_back({t.name, t.value.clone(), t.shard});
  return out;
}

std::string values(const at::Tensor& t) {
  std::ostringstream os;
  os.precision(9);
  const at::Tensor c = t.contiguous();
  for (int64_t i = 0; i < c.numel(); ++i) os << (i ? " " : "") << c.data_ptr<float>()[i];
  return os.str();
}

// A model loaded with `w`, its engine prepared, its forward captured and tracked.
struct Rig {
  std::shared_ptr<FuzzModel> model;
  at::Tensor input, output;
  gk::HostReplay graph{"structure-fuzz"};  // outlives the engine
  std::unique_ptr<gk::ReloadEngine> engine;

  Rig(const ModelSpec& s, const std::vector<gk::NamedTensor>& w) : model(std::make_shared<FuzzModel>(s)) {
    g_pwal.clear();
    gk::InMemorySource src(w, "initial weights");
    gk::ReloadOptions defaults;
    defaults.patch_base = g_patch_base;  // where loads, and re-run layers of patches, keep bases
    const gk::ReloadReport loaded = gk::load_weights(*model, src, defaults.first_load());
    engine = std::make_unique<gk::ReloadEngine>(*model, gk::EngineOptions{defaults, {}});
    engine->prepare(loaded);  // the served content, for patches
    input = at::linspace(-1.0, 1.0, M * D).reshape({M, D});
    engine->add_static_io("input", input);
    graph.capture([&] { output = model->forward(input); });
    engine->track(graph);
  }
};

// The INVARIANT. Returns "" when it holds, else what broke.
std::string check_invariant(Rig& rig, const at::Tensor& expected, bool& allowed) {
  allowed = false;
  try {
    rig.engine->check_replay_allowed();
  } catch (const gk::Error& e) {
    if (std::string(e.what()).empty()) return "check_replay_allowed() threw a gk::Error with an empty message";
    g_counts["after: replay refused"] += 1;
    return {};
  } catch (const std::exception& e) {
    return std::string("check_replay_allowed() threw a non-graphkeep exception: ") + e.what();
  }
  allowed = true;
  try {
    rig.graph.replay();
  } catch (const std::exception& e) {
    return std::string("replay is allowed but threw: ") + e.what();
  }
  if (!demo::bitwise_equal(rig.output, expected))
    return "replay is allowed but differs from a fresh model loaded with the last committed weights\n    replay: " +
           values(rig.output) + "\n    fresh:  " + values(expected);
  g_counts["after: replay allowed and equal"] += 1;
  return {};
}

// GK_FUZZ_ADOPT, and how a reproduction line repeats it.
bool adopting() { return std::getenv("GK_FUZZ_ADOPT") != nullptr; }
std::string adopt_env() { return adopting() ? "GK_FUZZ_ADOPT=1 " : ""; }

// One reload call with the op's options and PWAL behaviours.
struct Outcome {
  std::string label, message;  // label: "ok", the gk::Error kind, "injected fault" or "unexpected exception"
};
Outcome reload_once(gk::ReloadEngine& engine, const Op& op, std::vector<gk::NamedTensor> weights) {
  gk::ReloadOptions o;
  o.mode = op.mode;
  o.adopt_source_tensors = adopting();
  o.patch_base = g_patch_base;
  gk::testing::EngineHooks hooks;
  hooks.skip_in_place_backups = !op.restore_in_place_writes;
  if (!op.fault_stage.empty())
    hooks.fault = [stage = op.fault_stage, layer = op.fault_layer](gk::testing::FaultPoint s, const std::string& l) {
      if (gk::testing::to_string(s) == stage && l == layer)
        throw std::runtime_error("injected fault at " + stage + "@" + layer);
    };
  const gk::testing::ScopedHooks scoped(&engine, std::move(hooks));
  g_pwal = op.pwal;
  g_block_lie = op.block_lie;
  g_notes.clear();
  g_must_fail = false;
  for (const auto& b : op.pwal) g_counts[std::string("pwal: ") + to_string(b.kind)] += 1;
  Outcome r{"ok", "ok"};
  try {
    gk::ReloadReport rep;
    if (op.staged) {
      // The poked tensor is the caller's own copy (the oracle's weights are
      // not touched): copied at staging, the poke changes nothing served;
      // adopted, the commit must see it (Note [Adopted tensors are hashed]).
      std::vector<at::Tensor> pokeable;
      for (const auto& t : weights)
        if (t.value.defined() && t.value.numel() > 0 && t.value.scalar_type() == at::kFloat) pokeable.push_back(t.value);
      gk::InMemorySource src(std::move(weights), "fuzz weights");
      gk::StagedReload staged = engine.stage(src, o.stage());
      if (op.poke && !pokeable.empty()) {
        const at::Tensor& t = pokeable[static_cast<std::size_t>(op.pwal.empty() ? 0 : op.pwal[0].arg) % pokeable.size()];
        static_cast<float*>(t.data_ptr())[0] += 1.0f;
      }
      rep = engine.commit(std::move(staged));
    } else {
      gk::InMemorySource src(std::move(weights), "fuzz weights");
      rep = engine.reload(src, o);
    }
    if (rep.tensors_adopted > 0) g_counts["reload: tensors adopted"] += static_cast<int64_t>(rep.tensors_adopted);
  } catch (const gk::Error& e) {
    const char* kinds[] = {"DeclarationError", "WeightError", "MismatchError", "DriftError", "StateError", "InternalError"};
    r.label = kinds[static_cast<int>(e.kind())];
    r.message = r.label + ": " + e.what();
  } catch (const std::exception& e) {
    r.label = std::string(e.what()).rfind("injected ", 0) == 0 ? "injected fault" : "unexpected exception";
    r.message = r.label + ": " + e.what();
  }
  g_pwal.clear();
  g_block_lie = false;
  g_counts["reload: " + r.label] += 1;
  if (op.block_lie) g_counts["reload with a lying block PWAL: " + r.label] += 1;
  return r;
}

// q arrives in shards; a patch is over whole checkpoint tensors.
std::vector<gk::NamedTensor> to_whole(const ModelSpec& s, const std::vector<gk::NamedTensor>& w) {
  std::map<std::string, std::vector<at::Tensor>> shards;
  for (const auto& t : w) {
    auto& v = shards[t.name];
    if (v.size() <= static_cast<std::size_t>(t.shard)) v.resize(static_cast<std::size_t>(t.shard) + 1);
    v[static_cast<std::size_t>(t.shard)] = t.value;
  }
  std::vector<gk::NamedTensor> out;
  for (const auto& [name, v] : shards) {
    int64_t dim = 0;
    for (const auto& l : s.layers)
      if (name == "l" + std::to_string(l.index) + ".q_proj.weight") dim = l.q_shard_dim;
    out.push_back({name, v.size() == 1 ? v.front() : at::cat(v, dim), 0});
  }
  return out;
}
std::vector<gk::NamedTensor> to_delivered(const ModelSpec& s, const std::vector<gk::NamedTensor>& whole) {
  std::vector<gk::NamedTensor> out;
  for (const auto& t : whole) {
    const LayerSpec* q = nullptr;
    for (const auto& l : s.layers)
      if (t.name == "l" + std::to_string(l.index) + ".q_proj.weight") q = &l;
    if (q == nullptr || q->q_shards == 1) {
      out.push_back(t);
      continue;
    }
    for (int64_t k = 0; k < q->q_shards; ++k) out.push_back({t.name, t.value.chunk(q->q_shards, q->q_shard_dim)[k].contiguous(), k});
  }
  return out;
}

// `whole` with a random half of its tensors changed at `density` (values
// stay multiples of 1/64 in [-1, 1]; norm.gamma stays away from 0).
std::vector<gk::NamedTensor> changed(const std::vector<gk::NamedTensor>& whole, double density, bool all, Rng& rng) {
  std::vector<gk::NamedTensor> out;
  for (const auto& t : whole) {
    at::Tensor v = t.value.clone();
    if (all || pick(rng, 2)) {
      float* p = v.data_ptr<float>();
      for (int64_t i = 0; i < v.numel(); ++i)
        if (static_cast<double>(pick(rng, 1000)) < density * 1000.0) p[i] = p[i] > 0.5f ? p[i] - 0.25f : p[i] + 0.25f;
    }
    out.push_back({t.name, v, 0});
  }
  return out;
}

// The patch from `base` to `target`, made bad as the op says; `what` names the damage.
gk::Patch make_fuzz_patch(const ModelSpec& s, const std::vector<gk::NamedTensor>& base,
                          const std::vector<gk::NamedTensor>& target, const Op& op, Rng& rng, std::string& what) {
  gk::MakePatchOptions o;
  o.base_version = "committed";
  o.target_version = "next";
  o.encoding = static_cast<gk::MakePatchOptions::Encoding>(op.encoding);
  const bool indexed = op.bad_patch == BadPatch::out_of_range || op.bad_patch == BadPatch::duplicate ||
                       op.bad_patch == BadPatch::length;
  if (indexed) o.encoding = gk::MakePatchOptions::Encoding::sparse;
  o.record_unchanged = op.bad_patch != BadPatch::none;  // an entry to damage, whatever changed
  if (op.bad_patch == BadPatch::base) {
    gk::Patch p = gk::make_patch(to_whole(s, random_weights(s, rng)), target, o);
    if (!p.entries.empty()) what = "made from other weights";  // a model of frozen layers has no tensor
    return p;
  }
  gk::Patch p = gk::make_patch(base, target, o);
  if (op.bad_patch == BadPatch::none || p.entries.empty()) return p;
  std::vector<std::size_t> candidates;
  for (std::size_t i = 0; i < p.entries.size(); ++i)
    if (!indexed || p.entries[i].count() >= 2) candidates.push_back(i);
  if (candidates.empty()) return p;  // nothing to damage: the patch stays good
  gk::PatchEntry& e = p.entries[candidates[static_cast<std::size_t>(pick(rng, static_cast<int64_t>(candidates.size())))]];
  what = e.name;
  switch (op.bad_patch) {
    case BadPatch::unknown_name:
      e.name += "_x";
      std::sort(p.entries.begin(), p.entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
      break;
    case BadPatch::out_of_range: e.indices = e.indices.clone(), e.indices[-1] = static_cast<int>(e.numel()); break;
    case BadPatch::duplicate: e.indices = e.indices.clone(), e.indices[1] = e.indices[0]; break;
    case BadPatch::length: e.values = e.values.narrow(0, 1, e.values.numel() - 1); break;
    case BadPatch::dtype: e.dtype = at::kDouble, e.values = e.values.to(at::kDouble); break;
    case BadPatch::shape: e.shape = {e.numel(), 1}; break;
    case BadPatch::target:
      if (e.count() == 0) {  // no value to damage: a target hash that is not the base's
        e.target_hash ^= 1;
      } else {
        e.values = e.values.clone();
        e.values.view(-1)[0] = e.values.view(-1)[0] + 1.0f / 64;
      }
      break;
    default: break;
  }
  return p;
}

Outcome patch_once(gk::ReloadEngine& engine, const Op& op, const gk::Patch& patch) {
  gk::testing::EngineHooks hooks;
  if (!op.fault_stage.empty())
    hooks.fault = [stage = op.fault_stage, layer = op.fault_layer](gk::testing::FaultPoint s, const std::string& l) {
      if (gk::testing::to_string(s) == stage && l == layer)
        throw std::runtime_error("injected fault at " + stage + "@" + layer);
    };
  const gk::testing::ScopedHooks scoped(&engine, std::move(hooks));
  g_pwal = op.pwal;
  g_block_lie = op.block_lie;
  g_notes.clear();
  g_must_fail = false;
  Outcome r{"ok", "ok"};
  try {
    gk::PatchOptions o;
    o.patch_writes = g_patch_writes;
    const gk::ReloadReport rep = op.staged ? engine.commit(engine.stage(patch, o)) : engine.reload(patch, o);
    g_counts["patch: layers scattered"] += static_cast<int64_t>(rep.patch.layers_scattered);
    g_counts["patch: layers re-run"] += static_cast<int64_t>(rep.patch.layers_rerun);
    g_counts["patch: sectors written"] += static_cast<int64_t>(rep.patch.sectors_written);
    g_counts["patch: derived blocks recomputed"] += static_cast<int64_t>(rep.patch.blocks_recomputed);
    g_counts["patch: layout elements written"] += static_cast<int64_t>(rep.patch.layout_elements);
  } catch (const gk::Error& e) {
    const char* kinds[] = {"DeclarationError", "WeightError", "MismatchError", "DriftError", "StateError", "InternalError"};
    r.label = kinds[static_cast<int>(e.kind())];
    r.message = r.label + ": " + e.what();
  } catch (const std::exception& e) {
    r.label = std::string(e.what()).rfind("injected ", 0) == 0 ? "injected fault" : "unexpected exception";
    r.message = r.label + ": " + e.what();
  }
  g_pwal.clear();
  g_block_lie = false;
  g_counts["patch: " + r.label + (op.bad_patch != BadPatch::none ? " (bad patch)" : "")] += 1;
  return r;
}

// Runs iteration `it`; every line is printed as it happens (a crash keeps the
// log), and a violation is printed as a block the parent collects.
void run_iteration(uint64_t seed, int64_t it) {
  Rng rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(it));
  const ModelSpec spec = random_structure(rng);
  g_patch_base = pick(rng, 3) == 0 ? gk::PatchBase::none : gk::PatchBase::device;
  // Every other iteration writes whole sectors (Note [Sector images]); not
  // drawn from rng, so the iterations' structures stay those of their seeds.
  g_patch_writes = (it & 1) != 0 ? gk::PatchWrites::sectors : gk::PatchWrites::elements;
  std::vector<std::string> log;
  auto violation = [&](const std::string& key, const std::string& what) {
    std::printf("@@VIOLATION %s\n", key.c_str());
    std::printf("seed %llu, iteration %lld  (reproduce: %sGK_FUZZ_SEED=%llu GK_FUZZ_FIRST=%lld GK_FUZZ_ITERS=1 "
                "test_structure_fuzz)\nstructure: %s\n",
                static_cast<unsigned long long>(seed), static_cast<long long>(it), adopt_env().c_str(),
                static_cast<unsigned long long>(seed),
                static_cast<long long>(it), describe(spec).c_str());
    for (const auto& l : log) std::printf("  %s\n", l.c_str());
    std::printf("VIOLATION: %s\n@@END\n", what.c_str());
    std::fflush(stdout);
    g_counts["violations"] += 1;
  };
  std::printf("@@ITER %lld %s\n", static_cast<long long>(it), describe(spec).c_str());
  std::fflush(stdout);
  g_counts["iterations"] += 1;

  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> captured;
  {
    std::vector<gk::NamedTensor> committed = random_weights(spec, rng);
    gk::HostReplay stray("reads-no-slot");  // destroyed after the engine
    std::unique_ptr<Rig> rig_ptr;
    at::Tensor expected;
    try {  // the structure is valid: none of this may fail
      rig_ptr = std::make_unique<Rig>(spec, committed);
      expected = fresh_output(spec, committed, rig_ptr->input);
    } catch (const std::exception& e) {
      return violation("setup failed", std::string("setup of a valid structure threw: ") + e.what());
    }
    Rig& rig = *rig_ptr;
    for (const auto& l : rig.engine->plan().layers())
      for (const auto& s : l.slots)
        if (s.defined()) captured.push_back(s.captured.storage().getWeakStorageImpl());
    g_counts["slots planned"] += static_cast<int64_t>(rig.engine->plan().num_slots());
    bool allowed = false;
    if (std::string v = check_invariant(rig, expected, allowed); !v.empty() || !allowed)
      return violation("after capture", v.empty() ? "replay refused right after capture" : v);

    const int64_t n_ops = 4 + pick(rng, 5);
    // One structure in four also tracks a graph that reads no slot (it
    // copies the input): refused at capture, and replay must stay refused
    // through every reload until it is untracked, at op `untrack_at`
    // (Note [Capture verdicts last]).
    bool stray_tracked = false;
    int64_t untrack_at = -1;
    if (pick(rng, 4) == 0) {
      at::Tensor out;
      stray.capture([&] {
        out = gk::hostrt::empty(rig.input.sizes(), rig.input.options());
        const float* x = rig.input.data_ptr<float>();
        float* y = out.data_ptr<float>();
        const int64_t n = rig.input.numel();
        gk::hostrt::launch("copy_input", {gk::hostrt::reads(rig.input), gk::hostrt::writes(out)}, [=] {
          for (int64_t i = 0; i < n; ++i) y[i] = x[i];
        });
      });
      try {
        rig.engine->track(stray);
        return violation("a graph reading no slot", "track() accepted a graph that reads none of the model's slots");
      } catch (const gk::DriftError&) {
      }
      stray_tracked = true;
      untrack_at = pick(rng, n_ops);
      log.push_back("tracked a graph that reads no slot: refused; untracked before reload " + std::to_string(untrack_at));
      g_counts["graphs reading no slot"] += 1;
    }
    bool failed = false;
    // After a failure the next reload is, 2 times in 3, a clean recovery;
    // else another random one (a failure on a failed model). The sequence
    // ends with a success.
    for (int64_t k = 0; k < n_ops || failed; ++k) {
      if (stray_tracked && k == untrack_at) {
        rig.engine->untrack(stray);
        stray_tracked = false;
      }
      const Op op = random_op(spec, rng, failed && (k >= n_ops || pick(rng, 3) != 0));
      std::vector<gk::NamedTensor> good = random_weights(spec, rng);
      std::string bad_what;
      const bool was_allowed = rig.engine->replay_allowed();
      gk::Patch patch;
      std::vector<gk::NamedTensor> target_whole;
      if (op.patch) {
        target_whole = changed(to_whole(spec, committed), op.density, op.bad_patch != BadPatch::none, rng);
        patch = make_fuzz_patch(spec, to_whole(spec, committed), target_whole, op, rng, bad_what);
        good = to_delivered(spec, target_whole);
      }
      std::vector<gk::NamedTensor> sent = op.patch ? good : corrupt(op.poke ? deep_copy(good) : good, op, rng, bad_what);
      const std::string what = "reload " + std::to_string(k) + ": " + describe(op, bad_what);
      std::printf("  %s\n", what.c_str());  // before the call: a crash keeps it
      std::fflush(stdout);
      const Outcome r = op.patch ? patch_once(*rig.engine, op, patch) : reload_once(*rig.engine, op, std::move(sent));
      const bool ok = r.label == "ok";
      std::string line = what;
      for (const auto& n : g_notes) line += " {" + n + "}";
      line += " -> " + r.message.substr(0, r.message.find('\n')) + " | state " + std::string(gk::to_string(rig.engine->state()));
      log.push_back(line);
      std::printf("    %s\n", line.substr(what.size()).c_str());
      if (ok) {
        committed = deep_copy(good);
        expected = fresh_output(spec, committed, rig.input);
      }
      const std::string key = std::string(op.patch ? "patch, " : op.recovery ? "recovery, " : "reload, ") +
                              (op.patch ? (op.staged ? "staged" : "reload") :
                               op.mode == gk::ReloadMode::streaming ? "streaming" : "transactional") +
                              (ok ? " ok" : " failed (" + r.label + ")");
      // The INVARIANT, after every call; then what else this call promised.
      const std::string v = check_invariant(rig, expected, allowed);
      std::string broke;
      if (r.label == "unexpected exception") broke = "the reload threw a non-graphkeep exception";
      // (a model of frozen layers has no tensor to corrupt: bad_what stays empty)
      else if (ok && op.bad == BadSet::non_finite && !bad_what.empty())
        broke = "accepted a weight holding NaN or infinity";
      else if (ok && g_must_fail) broke = "accepted a PWAL that changed a captured slot";
      else if (!v.empty()) broke = v.substr(0, v.find('\n'));
      else if (stray_tracked && allowed) broke = "replay allowed while a graph refused at capture is tracked";
      else if (op.recovery && !stray_tracked && !(ok && allowed)) broke = "a clean recovery reload did not restore replay";
      else if (op.patch && ok && op.bad_patch != BadPatch::none && !bad_what.empty()) broke = "accepted a bad patch";
      else if (op.patch && !ok && was_allowed && !allowed) broke = "a refused patch left replay refused";
      else if (op.patch && ok)
        for (const auto& t : target_whole)
          if (rig.engine->served() == nullptr || rig.engine->served()->hash(t.name) != gk::content_hash(t.value))
            broke = "after a patch the engine does not serve the target's content hash of " + t.name;
      if (!broke.empty())
        return violation(key + ": " + broke,
                         broke + "\n  reload: " + r.message.substr(0, r.message.find('\n')) + "\n  after it: " +
                             (v.empty() ? (allowed ? "replay allowed and equal to a fresh model" : "replay refused") : v));
      g_counts["recoveries"] += op.recovery ? 1 : 0;
      failed = !ok;
    }
  }  // model, engine and graph are gone: nothing of theirs may be alive
  for (const auto& w : captured)
    if (!w.expired()) return violation("leak", "a captured storage is still alive after model, engine and graph were destroyed");
  if (g_live_kernels != 0) return violation("leak", std::to_string(g_live_kernels) + " kernel objects still alive");
}

// The counts so far, one line (the parent keeps the last one of a child).
void print_counts() {
  std::printf("@@COUNTS ");
  for (const auto& [k, v] : g_counts) std::printf("%s=%lld;", k.c_str(), static_cast<long long>(v));
  std::printf("\n");
  std::fflush(stdout);
}

struct Config {
  uint64_t seed = 1414;
  int64_t iters = 1000, first = 0;
};
Config config_from_env() {
  Config c;
  if (const char* s = std::getenv("GK_FUZZ_SEED")) c.seed = std::strtoull(s, nullptr, 0);
  if (const char* s = std::getenv("GK_FUZZ_ITERS")) c.iters = std::strtoll(s, nullptr, 0);
  if (const char* s = std::getenv("GK_FUZZ_FIRST")) c.first = std::strtoll(s, nullptr, 0);
  return c;
}

}  // namespace sf

GRAPHKEEP_REGISTER_TYPE(sf::ScaleKernel);
GRAPHKEEP_REGISTER_TYPE(sf::PermKernel);

// The fuzz loop, in its own process. A hang is cut by an alarm.
GK_TEST_CHILD(structure_fuzz) {
  at::set_num_threads(1);
  const sf::Config c = sf::config_from_env();
  std::signal(SIGALRM, [](int) {
    const char msg[] = "@@HANG an iteration ran for more than 120 s\n";
    (void)!write(1, msg, sizeof msg - 1);
    _exit(3);
  });
  for (int64_t it = c.first; it < c.first + c.iters; ++it) {
    alarm(120);
    sf::run_iteration(c.seed, it);
    sf::print_counts();
  }
  alarm(0);
  std::printf("@@DONE\n");
  return 0;
}

TEST_CASE("the oracle sees every declared slot: a stale value in any captured storage changes the output") {
  // Without this, "replay equals a fresh model" could hold by accident.
  at::set_num_threads(1);
  int64_t slots = 0;
  for (uint64_t it = 0; it < 16; ++it) {
    sf::Rng rng(it);
    const sf::ModelSpec spec = sf::random_structure(rng);
    CAPTURE(sf::describe(spec));
    const auto w = sf::random_weights(spec, rng);
    sf::Rig rig(spec, w);
    const at::Tensor expected = sf::fresh_output(spec, w, rig.input);
    rig.graph.replay();
    REQUIRE(demo::bitwise_equal(rig.output, expected));
    for (const auto& l : rig.engine->plan().layers())
      for (const auto& s : l.slots) {
        if (!s.defined() || s.role.effective_init() == gk::Init::preserve) continue;  // scratch: never read before written
        CAPTURE(s.name);
        at::Tensor e = s.captured.dim() == 2 ? s.captured[0][0] : s.captured[0];
        const at::Tensor old = e.clone();
        e.add_(1);
        rig.graph.replay();
        CHECK_FALSE(demo::bitwise_equal(rig.output, expected));
        e.copy_(old);
        ++slots;
      }
    rig.graph.replay();
    CHECK(demo::bitwise_equal(rig.output, expected));
  }
  MESSAGE("perturbed " << slots << " captured slots; each changed the replayed output");
}

TEST_CASE("found by this fuzzer: a PWAL that moves a view to another offset of its storage must be refused") {
  // One derived storage under two slots: base_ [24] and interior_ =
  // base_.narrow(0, 8, 6). PWAL rebuilds both but takes interior_ one element
  // further on: the same shape, strides and storage size, another storage
  // offset. Accepted, the commit copies interior_'s new values over base_'s
  // in the captured storage, and the replay matches no model at all.
  at::set_num_threads(1);
  for (gk::ReloadMode mode : {gk::ReloadMode::streaming, gk::ReloadMode::transactional}) {
    CAPTURE(static_cast<int>(mode));
    sf::LayerSpec l;
    l.views = true, l.view_mask = 4;  // own storage: base_ and interior_
    const sf::ModelSpec spec{{l}, -1, {}};
    sf::Rng rng(1);
    const auto w0 = sf::random_weights(spec, rng), w1 = sf::random_weights(spec, rng);
    sf::Rig rig(spec, w0);
    sf::Op op;
    op.mode = mode;
    op.pwal = {{sf::Pwal::shape, 4}};  // the 5th layout change for this layer: interior_ shifted
    const sf::Outcome r = sf::reload_once(*rig.engine, op, w1);
    REQUIRE(sf::g_notes.size() == 1);
    REQUIRE(sf::g_notes[0].find("interior_ shifted") != std::string::npos);
    CHECK(r.label == "MismatchError");
    bool allowed = false;  // and whatever happened, the INVARIANT
    CHECK(sf::check_invariant(rig, sf::fresh_output(spec, r.label == "ok" ? w1 : w0, rig.input), allowed) == "");
  }
}

TEST_CASE("random model structures: after every reload, replay equals a fresh model or is refused with an error") {
  const sf::Config cfg = sf::config_from_env();
  std::map<std::string, int64_t> counts;
  std::map<std::string, std::pair<int64_t, std::string>> groups;  // violation key -> (count, shortest example)
  const auto t0 = std::chrono::steady_clock::now();
  int64_t first = cfg.first, restarts = 0;
  const int64_t end = cfg.first + cfg.iters;
  while (first < end && restarts < 25) {
    setenv("GK_FUZZ_FIRST", std::to_string(first).c_str(), 1);
    setenv("GK_FUZZ_ITERS", std::to_string(end - first).c_str(), 1);
    const gk::testing::ChildResult r = gk::testing::run_child("structure_fuzz");
    std::istringstream in(r.output);
    std::string line, key, block, iter_log;
    std::map<std::string, int64_t> snapshot;
    int64_t last_iter = first - 1;
    bool done = false, in_block = false;
    while (std::getline(in, line)) {
      if (in_block) {
        if (line == "@@END") {
          auto& g = groups[key];  // keep the shortest example: the easiest to reproduce
          if (g.first++ == 0 || block.size() < g.second.size()) g.second = block;
          in_block = false;
        } else {
          block += line + "\n";
        }
      } else if (line.rfind("@@VIOLATION ", 0) == 0) {
        key = line.substr(12), block.clear(), in_block = true;
      } else if (line.rfind("@@ITER ", 0) == 0) {
        last_iter = std::stoll(line.substr(7)), iter_log = line.substr(7) + "\n";
      } else if (line.rfind("@@COUNTS ", 0) == 0) {
        snapshot.clear();
        std::istringstream items(line.substr(9));
        for (std::string item; std::getline(items, item, ';');)
          if (const auto eq = item.rfind('='); eq != std::string::npos) snapshot[item.substr(0, eq)] = std::stoll(item.substr(eq + 1));
      } else if (line == "@@DONE") {
        done = true;
      } else {
        iter_log += line + "\n";
      }
    }
    for (const auto& [k, v] : snapshot) counts[k] += v;
    if (done && r.exited && r.exit_code == 0) break;
    // A crash or a hang: report the iteration with its log, go on after it.
    auto& g = groups["crash or hang (exit code " + std::to_string(r.exit_code) + (r.signaled ? ", signal" : "") + ")"];
    const std::string example = "seed " + std::to_string(cfg.seed) + ", iteration " + iter_log +
                                "(reproduce: " + sf::adopt_env() + "GK_FUZZ_SEED=" + std::to_string(cfg.seed) + " GK_FUZZ_FIRST=" +
                                std::to_string(last_iter) + " GK_FUZZ_ITERS=1 test_structure_fuzz --gk-child=structure_fuzz)\n";
    if (g.first++ == 0 || example.size() < g.second.size()) g.second = example;
    counts["violations"] += 1;
    counts["crashes"] += 1;
    first = last_iter + 1;
    ++restarts;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ostringstream summary;
  summary << "structure fuzz: seed " << cfg.seed << ", iterations [" << cfg.first << ", " << end << "), " << secs
          << " s\n";
  for (const auto& [k, v] : counts) summary << "  " << k << ": " << v << "\n";
  MESSAGE(summary.str());
  for (const auto& [k, g] : groups)
    FAIL_CHECK(g.first << " x " << k << "\nshortest example:\n" << g.second);
  CHECK(counts["violations"] == 0);
  CHECK(counts["iterations"] + counts["crashes"] == cfg.iters);  // else: stopped after 25 crashes
  if (sf::adopting()) CHECK(counts["reload: tensors adopted"] > 0);  // the adopting path really ran
}
