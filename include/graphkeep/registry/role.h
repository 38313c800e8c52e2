// graphkeep/registry/role.h
//
// What a tensor member is for, and what a reload does with it.
//
// Every tensor member of a registered class carries a role. The role tells
// the reload engine how to treat the storage that a captured CUDA graph burned
// in: copy PWAL's new value into it, zero it, or keep it as it is.
//
// Two ways to give a member its role; both are checked at compile time:
//
//   1. In the descriptor, for plain `at::Tensor` members (no change to the
//      member's type; the usual migration path):
//
//        GRAPHKEEP_DESCRIBE(MarlinKernel,
//                           (workspace_, gk::workspace(gk::Init::zero)),
//                           (g_idx_sort_indices_, gk::permutation),
//                           (num_sms_))
//
//   2. In the member's type, for aggregates reflected with Boost.PFR:
//
//        struct CutlassStrides {
//          gk::Metadata ab_strides1;        // is-an at::Tensor
//          gk::Workspace<gk::Init::zero> locks;
//          int64_t num_experts;
//        };
//        GRAPHKEEP_AGGREGATE(CutlassStrides, ab_strides1, locks, num_experts)
//
// Roles:
//   parameter          a handle to a parameter or buffer of the owning module
//   workspace          state a kernel reads and writes (lock counters): the
//                      init policy is required (zero, preserve or copy_new)
//   metadata           stride arrays and index metadata read by kernels
//   scale              quantization scales, alphas, global scales
//   derived_weight     weights that PWAL derives (absorbed MLA, shuffled experts)
//   permutation        sort indices, act-order permutations
//   scratch            buffers a kernel owns whose contents do not carry over
//   not_graph_visible  host-only or per-call tensors; requires a reason
//   opaque             a non-tensor member graphkeep must not look into (a
//                      callable, a raw pointer, a foreign class); requires a reason
//
// A derived member (metadata, scale, derived_weight, permutation, copied
// from PWAL's new value) may also say how it follows from the checkpoint, so
// a weight patch can skip its layer's PWAL (Note [Declared derivations]):
//
//   GRAPHKEEP_AGGREGATE(GroupedGemmStrides, (ab_strides1, gk::metadata.from_shapes()), ...)
//
// Note [Declared derivations]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A reload re-runs PWAL, which rebuilds every derived member; a weight
// patch changes a few elements and would re-run it too, for every layer it
// touches (every MoE layer of a 1 % patch). A derivation declares what PWAL
// computes for a member, so the engine can do less:
//   from_shapes()  the member is a function of the class's shapes and
//                  configuration alone, never of checkpoint values (stride
//                  arrays, group indices): a patch leaves it as it is, so a
//                  MoE layer whose experts object holds only such members
//                  takes a patch by scatter, with no PWAL.
//   by_blocks()    the member is computed block by block from one
//                  checkpoint parameter of the layer (per-row or per-group
//                  quantization, 2-D block scales): element (r, c) of the
//                  parameter reaches only the outputs of its block. The
//                  descriptor says which members; the layer binds them to
//                  the parameter, the block shape and the function in
//                  ReloadableLayer::declare_derivations()
//                  (graphkeep/model/block_derivation.h). A patch
//                  recomputes only the blocks it touches, from the captured
//                  parameter with the patch applied, and writes them with
//                  the parameter in one commit (reload/block_landing.cpp).
//                  Packed words are values of a block
//                  (BlockOutput::per_block: GPTQ's int4, eight to a word).
//   by_layout()    the member holds elements of one checkpoint parameter
//                  moved, not computed: a transpose, a shuffle into tiles,
//                  a permutation by fixed indices, a narrow, a pad with a
//                  constant, a broadcast, and compositions of these. The
//                  layer binds it to the parameter and a function that
//                  does the moving (Derivations::layout); the engine
//                  learns where each element goes by running the function
//                  on index tensors at prepare(), and a patch writes the
//                  changed elements at their places (reload/layout_landing.cpp).
// A member without one keeps the correct, slow path: a patch touching its
// layer re-runs PWAL (`gk-slots --rerun` lists those members). Products of
// tensors (absorbed MLA weights), scales computed from a whole tensor and
// permutations by a checkpoint index tensor (act-order) are not declarable:
// their members re-run. A declaration
// cannot lie silently: every full reload, and every patch that re-runs the
// layer, compares what PWAL built with what the declaration predicts, bit
// for bit (from_shapes: the value already captured; by_blocks: the
// function over the parameter's blocks, in two interleaved halves, so that
// a function reading beyond its block differs wherever a half's blocks
// alone give another value than all of them; by_layout: the function on
// the parameter; prepare() checks the same, and a recovering reload too),
// before anything
// reaches captured storage, and refuses a mismatch with a
// gk::DeclarationError naming the class, the member and the first differing
// element (reload/derivations.cpp). Only derived roles take a derivation;
// any other is refused at compile time (gk::parameter is the checkpoint
// itself, a workspace or scratch holds no function of it).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gk {

enum class Role : std::uint8_t {
  none,  // no role declared
  parameter,
  workspace,
  metadata,
  scale,
  derived_weight,
  permutation,
  scratch,
  not_graph_visible,
  opaque,
};

// What a reload writes into a slot's captured storage after PWAL.
enum class Init : std::uint8_t {
  unspecified,  // only valid for roles that have a default
  copy_new,     // copy PWAL's new value into the old storage
  zero,         // zero the old storage (lock counters must be 0 at launch)
  preserve,     // keep the old contents; only the address matters
};

constexpr std::string_view to_string(Role r) noexcept {
  switch (r) {
    case Role::none: return "none";
    case Role::parameter: return "parameter";
    case Role::workspace: return "workspace";
    case Role::metadata: return "metadata";
    case Role::scale: return "scale";
    case Role::derived_weight: return "derived_weight";
    case Role::permutation: return "permutation";
    case Role::scratch: return "scratch";
    case Role::not_graph_visible: return "not_graph_visible";
    case Role::opaque: return "opaque";
  }
  return "?";
}

constexpr std::string_view to_string(Init i) noexcept {
  switch (i) {
    case Init::unspecified: return "unspecified";
    case Init::copy_new: return "copy_new";
    case Init::zero: return "zero";
    case Init::preserve: return "preserve";
  }
  return "?";
}

// How a derived member follows from the checkpoint (Note [Declared derivations]).
enum class Derive : std::uint8_t {
  undeclared,   // unknown: a patch touching the layer re-runs its PWAL
  from_shapes,  // a function of shapes and configuration, never of checkpoint values
  blocks,       // block by block from a checkpoint parameter (the layer's gk::BlockDerivation)
  layout,       // a checkpoint parameter's elements, moved (the layer's gk::LayoutDerivation)
};

constexpr std::string_view to_string(Derive d) noexcept {
  switch (d) {
    case Derive::undeclared: return "undeclared";
    case Derive::from_shapes: return "from_shapes";
    case Derive::blocks: return "blocks";
    case Derive::layout: return "layout";
  }
  return "?";
}

// A role with its init policy and, for not_graph_visible / opaque, a reason;
// for a derived member, its derivation.
struct RoleSpec {
  Role role = Role::none;
  Init init = Init::unspecified;
  std::string_view reason{};
  Derive derive = Derive::undeclared;

  constexpr RoleSpec with_init(Init i) const noexcept { return {role, i, reason, derive}; }
  // The derivation (Note [Declared derivations]).
  constexpr RoleSpec from_shapes() const noexcept { return {role, init, reason, Derive::from_shapes}; }
  constexpr RoleSpec by_blocks() const noexcept { return {role, init, reason, Derive::blocks}; }
  constexpr RoleSpec by_layout() const noexcept { return {role, init, reason, Derive::layout}; }
  // Roles whose member PWAL derives from the checkpoint, copied from its new value.
  constexpr bool derived() const noexcept {
    return (role == Role::metadata || role == Role::scale || role == Role::derived_weight ||
            role == Role::permutation) &&
           effective_init() == Init::copy_new;
  }
  constexpr bool has_role() const noexcept { return role != Role::none; }
  // True for roles whose storage a captured graph may read or write.
  constexpr bool graph_visible() const noexcept {
    return role != Role::none && role != Role::not_graph_visible && role != Role::opaque;
  }
  // The policy a reload applies (the explicit one, else the role's default).
  constexpr Init effective_init() const noexcept {
    if (init != Init::unspecified) return init;
    return role == Role::scratch ? Init::preserve : Init::copy_new;
  }
  friend constexpr bool operator==(const RoleSpec&, const RoleSpec&) = default;
};

namespace detail {
// `gk::workspace` must be given an init policy; written bare it converts to a
// spec with Init::unspecified, which the registry rejects with a message.
struct workspace_role {
  constexpr RoleSpec operator()(Init i) const noexcept { return {Role::workspace, i, {}}; }
  constexpr operator RoleSpec() const noexcept { return {Role::workspace, Init::unspecified, {}}; }
};
// Roles that need a reason: written bare they carry an empty reason, which the
// registry rejects.
template <Role R>
struct reasoned_role {
  constexpr RoleSpec operator()(std::string_view why) const noexcept { return {R, Init::unspecified, why}; }
  constexpr operator RoleSpec() const noexcept { return {R, Init::unspecified, {}}; }
};
}  // namespace detail

inline constexpr RoleSpec parameter{Role::parameter};
inline constexpr detail::workspace_role workspace{};
inline constexpr RoleSpec metadata{Role::metadata};
inline constexpr RoleSpec scale{Role::scale};
inline constexpr RoleSpec derived_weight{Role::derived_weight};
inline constexpr RoleSpec permutation{Role::permutation};
inline constexpr RoleSpec scratch{Role::scratch};
inline constexpr detail::reasoned_role<Role::not_graph_visible> not_graph_visible{};
inline constexpr detail::reasoned_role<Role::opaque> opaque{};

// A string usable as a template argument (for NotGraphVisible<"why">).
template <std::size_t N>
struct fixed_string {
  char chars[N]{};
  constexpr fixed_string() noexcept = default;  // all '\0', for strings built at compile time
  constexpr fixed_string(const char (&s)[N]) noexcept { std::copy_n(s, N, chars); }
  constexpr std::string_view view() const noexcept { return {chars, N - 1}; }
};

// A tensor member whose role is part of its type. It is an at::Tensor: use it
// exactly like one. Aggregates reflected with Boost.PFR declare roles this way.
template <Role R, Init I = Init::unspecified>
class TensorSlot : public at::Tensor {
 public:
  static constexpr RoleSpec spec{R, I, {}};

  TensorSlot() = default;
  TensorSlot(at::Tensor t) noexcept : at::Tensor(std::move(t)) {}  // NOLINT: implicit by design
  TensorSlot& operator=(at::Tensor t) noexcept {
    at::Tensor::operator=(std::move(t));
    return *this;
  }
  at::Tensor& tensor() noexcept { return *this; }
  const at::Tensor& tensor() const noexcept { return *this; }
};

template <fixed_string Why>
class NotGraphVisibleSlot : public at::Tensor {
 public:
  static constexpr RoleSpec spec{Role::not_graph_visible, Init::unspecified, Why.view()};

  NotGraphVisibleSlot() = default;
  NotGraphVisibleSlot(at::Tensor t) noexcept : at::Tensor(std::move(t)) {}  // NOLINT
  NotGraphVisibleSlot& operator=(at::Tensor t) noexcept {
    at::Tensor::operator=(std::move(t));
    return *this;
  }
};

template <Init I>
using Workspace = TensorSlot<Role::workspace, I>;
using Parameter = TensorSlot<Role::parameter>;
using Metadata = TensorSlot<Role::metadata>;
using Scale = TensorSlot<Role::scale>;
using DerivedWeight = TensorSlot<Role::derived_weight>;
using Permutation = TensorSlot<Role::permutation>;
using Scratch = TensorSlot<Role::scratch>;
template <fixed_string Why>
using NotGraphVisible = NotGraphVisibleSlot<Why>;

}  // namespace gk
