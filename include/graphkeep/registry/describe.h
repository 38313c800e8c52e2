// graphkeep/registry/describe.h
//
// GRAPHKEEP_DESCRIBE: how a class with private members and constructors (a
// kernel, a quantization method, a layer) declares its members to the
// registry. Built on Boost.Describe (see docs/registry.md for the measured
// compile cost against Boost.Hana).
//
// List *every* data member, in declaration order, inside the class. Tensor
// members get a role; other members are listed bare:
//
//   class MarlinKernel {
//    public:
//     MarlinKernel(int64_t n, int64_t k, at::Device d);
//     ...
//    private:
//     at::Tensor workspace_;           // split-K lock counters
//     at::Tensor g_idx_sort_indices_;
//     int64_t size_n_, size_k_;
//
//     GRAPHKEEP_DESCRIBE(MarlinKernel,
//                        (workspace_, gk::workspace(gk::Init::zero)),
//                        (g_idx_sort_indices_, gk::permutation),
//                        size_n_, size_k_)
//   };
//
// With base classes, name them first:
//
//   GRAPHKEEP_DESCRIBE_DERIVED(CutlassExperts, (MoeExperts), (ab_strides1_, gk::metadata), ...)
//
// The macro checks the class when it is defined (see Note [Fail-closed
// descriptors]) and reports, with the class and member named:
//   - a tensor member without a role, or a role on a non-tensor member;
//   - a member missing from the list (a layout check: every 8-byte-aligned
//     region of the object must belong to a listed member or a base, so an
//     unlisted at::Tensor is always caught);
//   - a member listed twice;
//   - a member whose type holds tensors but is not registered, a callable, a
//     raw pointer or a class graphkeep cannot look into, unless declared
//     gk::opaque("reason");
//   - a base (GRAPHKEEP_DESCRIBE_DERIVED) that is not registered.
#pragma once

#include <graphkeep/registry/member_kind.h>

#include <boost/describe/bases.hpp>
#include <boost/describe/class.hpp>
#include <boost/describe/members.hpp>
#include <boost/preprocessor/cat.hpp>
#include <boost/preprocessor/comparison/equal.hpp>
#include <boost/preprocessor/control/iif.hpp>
#include <boost/preprocessor/punctuation/comma_if.hpp>
#include <boost/preprocessor/punctuation/is_begin_parens.hpp>
#include <boost/preprocessor/seq/enum.hpp>
#include <boost/preprocessor/seq/for_each.hpp>
#include <boost/preprocessor/seq/for_each_i.hpp>
#include <boost/preprocessor/seq/size.hpp>
#include <boost/preprocessor/seq/transform.hpp>
#include <boost/preprocessor/stringize.hpp>
#include <boost/preprocessor/tuple/elem.hpp>
#include <boost/preprocessor/tuple/size.hpp>
#include <boost/preprocessor/tuple/to_seq.hpp>
#include <boost/preprocessor/variadic/to_seq.hpp>

#include <array>
#include <cstddef>
#include <limits>
#include <string_view>

namespace gk::detail {

// One entry of a descriptor: the member's name and its declared role.
struct member_spec {
  std::string_view name;
  RoleSpec role;
};

// gk_reflect(C*) of a described class returns this tag.
template <class C>
struct described {
  using type = C;
};

// A friend of every described class: the registry reads private descriptors
// through it.
struct access {
  template <class C>
  static constexpr std::string_view type_name() noexcept { return C::gk_type_name(); }
  template <class C>
  static constexpr auto members() noexcept { return C::gk_members(); }
  // Odr-uses C::gk_static_checks. For a class template, a member function is
  // instantiated only when used, so its checks would otherwise never run;
  // reflect<C> calls this (see Note [Fail-closed descriptors]).
  template <class C>
  static constexpr bool checked() noexcept {
    static_cast<void>(&C::gk_static_checks);
    return true;
  }
};

inline constexpr std::size_t no_hole = std::numeric_limits<std::size_t>::max();

// Note [Fail-closed descriptors]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Boost.Describe lists what the author wrote, so a member the author forgot
// is invisible to it. The layout check closes that gap without a mirror
// struct: take every listed member's [offsetof, offsetof + sizeof) and the
// bases' footprint (plus the vptr of a polymorphic class), and search for an
// 8-byte-aligned 8-byte window of the object that none of them covers. An
// unlisted at::Tensor (8 bytes, 8-aligned) always creates such a window, as
// does any unlisted member holding a pointer; tail padding of a base cannot
// hide one, because a base aligned to 8 has less than 8 bytes of it. The
// offsets come from `offsetof` in a member function body (a complete-class
// context, with access to private members); GCC and Clang accept it for
// non-standard-layout classes, so the warning is silenced locally. For a
// class template that body is instantiated only when odr-used: reflect<C>
// does so (access::checked), so a described class template is checked as
// soon as a slot table, walk or registry uses one of its specializations.
template <std::size_t N>
constexpr std::size_t first_hole(std::size_t object_size, std::size_t prefix,
                                 const std::array<std::size_t, N>& offsets,
                                 const std::array<std::size_t, N>& sizes) {
  for (std::size_t w = 0; w + 8 <= object_size; w += 8) {
    bool covered = w + 8 <= prefix;
    for (std::size_t i = 0; i < N && !covered; ++i)
      covered = offsets[i] < w + 8 && w < offsets[i] + sizes[i];
    if (!covered) return w;
  }
  return no_hole;
}

template <class C, class BaseDescriptors>
struct base_footprint;
template <class C, template <class...> class L, class... Ds>
struct base_footprint<C, L<Ds...>> {
  static constexpr std::size_t value() {
    // A polymorphic class without a polymorphic base has its own vptr at
    // offset 0, before its bases; otherwise the vptr is inside a base.
    constexpr bool polymorphic_base = (std::is_polymorphic_v<typename Ds::type> || ...);
    std::size_t end = std::is_polymorphic_v<C> && !polymorphic_base ? sizeof(void*) : 0;
    (
        [&] {
          using B = typename Ds::type;
          if constexpr (!std::is_empty_v<B>) {
            end = (end + alignof(B) - 1) / alignof(B) * alignof(B) + sizeof(B);
          }
        }(),
        ...);
    return end;
  }
};

template <class C>
constexpr std::size_t prefix_size() {
  return base_footprint<C, boost::describe::describe_bases<C, boost::describe::mod_any_access>>::value();
}

template <class B>
constexpr bool base_ok() {
  return registered<B> || module_type<B> || std::is_empty_v<B> ||
         (std::is_polymorphic_v<B> && sizeof(B) == sizeof(void*));  // a pure interface
}

template <std::size_t N>
constexpr std::size_t count_name(const std::array<member_spec, N>& specs, std::string_view name) {
  std::size_t n = 0;
  for (const auto& s : specs) n += s.name == name ? 1 : 0;
  return n;
}

}  // namespace gk::detail

// ---------------------------------------------------------------------------
// Preprocessor plumbing. An entry is `name`, `(name)` or `(name, role)`.
// ---------------------------------------------------------------------------
#define GK_PP_TUPLE(e) BOOST_PP_IIF(BOOST_PP_IS_BEGIN_PARENS(e), e, (e))
#define GK_PP_NAME(e) BOOST_PP_TUPLE_ELEM(0, GK_PP_TUPLE(e))
#define GK_PP_ROLE_2(t) ::gk::detail::to_spec(BOOST_PP_TUPLE_ELEM(1, t))
#define GK_PP_ROLE_1(t) ::gk::RoleSpec{}
#define GK_PP_ROLE(e) \
  BOOST_PP_IIF(BOOST_PP_EQUAL(BOOST_PP_TUPLE_SIZE(GK_PP_TUPLE(e)), 2), GK_PP_ROLE_2, GK_PP_ROLE_1)(GK_PP_TUPLE(e))

#define GK_PP_NAME_OP(s, data, e) GK_PP_NAME(e)
#define GK_PP_NAMES(seq) BOOST_PP_SEQ_ENUM(BOOST_PP_SEQ_TRANSFORM(GK_PP_NAME_OP, ~, seq))

#define GK_PP_SPEC_OP(r, data, i, e) \
  BOOST_PP_COMMA_IF(i)::gk::detail::member_spec{BOOST_PP_STRINGIZE(GK_PP_NAME(e)), GK_PP_ROLE(e)}
#define GK_PP_OFFSET_OP(r, C, i, e) BOOST_PP_COMMA_IF(i) offsetof(C, GK_PP_NAME(e))
#define GK_PP_SIZE_OP(r, C, i, e) BOOST_PP_COMMA_IF(i) sizeof(decltype(C::GK_PP_NAME(e)))
#define GK_PP_CHECK_OP(r, C, e) GK_DETAIL_CHECK_MEMBER(C, GK_PP_NAME(e), GK_PP_ROLE(e))

// The member checks shared by GRAPHKEEP_DESCRIBE and GRAPHKEEP_AGGREGATE.
// Each message names the class and the member, then the fix.
#define GK_DETAIL_CHECK_MEMBER(C, m, spec) GK_DETAIL_CHECK_MEMBER_I(C, m, spec)
#define GK_DETAIL_CHECK_MEMBER_I(C, m, spec)                                                        \
  {                                                                                                 \
    using gk_e = ::gk::detail::member_error;                                                        \
    constexpr gk_e gk_err = ::gk::detail::check_member<decltype(C::m)>(spec);                       \
    static_assert(gk_err != gk_e::tensor_without_role,                                              \
                  "graphkeep: " #C "::" #m " is an at::Tensor with no role: declare it in the "     \
                  "descriptor as (" #m ", gk::workspace(gk::Init::zero)), gk::metadata, gk::scale, "  \
                  "gk::derived_weight, gk::permutation, gk::scratch or gk::parameter, or mark it "  \
                  "gk::not_graph_visible(\"reason\") if no captured graph reads it");               \
    static_assert(gk_err != gk_e::role_on_non_tensor,                                               \
                  "graphkeep: " #C "::" #m " has a role but holds no tensor: roles apply to "        \
                  "at::Tensor members and containers of them; list " #m " without a role");        \
    static_assert(gk_err != gk_e::role_twice,                                                       \
                  "graphkeep: " #C "::" #m " has a role in its type (gk::TensorSlot) and another "   \
                  "in the descriptor: keep one of them");                                           \
    static_assert(gk_err != gk_e::workspace_without_init,                                           \
                  "graphkeep: " #C "::" #m " is a workspace without an init policy: write "          \
                  "gk::workspace(gk::Init::zero) for lock counters, gk::Init::preserve to keep "    \
                  "its contents, or gk::Init::copy_new to take PWAL's value");                       \
    static_assert(gk_err != gk_e::reason_missing,                                                   \
                  "graphkeep: " #C "::" #m " is declared not graph-visible or opaque without a "     \
                  "reason: write gk::not_graph_visible(\"why no captured graph reads it\") or "      \
                  "gk::opaque(\"why it holds no device memory\")");                                 \
    static_assert(gk_err != gk_e::opaque_on_tensor,                                                 \
                  "graphkeep: " #C "::" #m " holds tensors and cannot be opaque: give a tensor "     \
                  "member a role (gk::not_graph_visible(\"reason\") if no captured graph reads "    \
                  "it), list a member of a registered type bare, and register a struct that "       \
                  "holds tensors");                                                                 \
    static_assert(gk_err != gk_e::mixed_tensor_roles,                                               \
                  "graphkeep: " #C "::" #m " holds both gk::TensorSlot tensors (role in the type) " \
                  "and plain at::Tensor ones, which would get no role: use typed slots (gk::Scale, " \
                  "...) for all of them, or plain at::Tensor for all with the role in the "         \
                  "descriptor");                                                                    \
    static_assert(gk_err != gk_e::unregistered_tensor_holder,                                       \
                  "graphkeep: " #C "::" #m " has a type that holds tensors but is not registered: "  \
                  "register that type with GRAPHKEEP_DESCRIBE (classes) or GRAPHKEEP_AGGREGATE "     \
                  "(aggregates) so its tensors get roles");                                         \
    static_assert(gk_err != gk_e::callable,                                                         \
                  "graphkeep: " #C "::" #m " is a std::function, lambda or functor whose captures "  \
                  "graphkeep cannot see: make the functor a registered type (GRAPHKEEP_DESCRIBE) "   \
                  "or declare it (" #m ", gk::opaque(\"why it captures no device tensor\"))");       \
    static_assert(gk_err != gk_e::raw_pointer,                                                      \
                  "graphkeep: " #C "::" #m " is a raw pointer, which may cache a device address "    \
                  "that a reload moves: hold the at::Tensor instead, or declare it (" #m            \
                  ", gk::opaque(\"why it never points into device memory\"))");                       \
    static_assert(gk_err != gk_e::reference,                                                        \
                  "graphkeep: " #C "::" #m " is a reference member: graphkeep cannot re-point it "   \
                  "after a reload; hold the object by value or by smart pointer");                  \
    static_assert(gk_err != gk_e::unknown_class,                                                    \
                  "graphkeep: " #C "::" #m " has a class type graphkeep cannot look into: register " \
                  "it (GRAPHKEEP_DESCRIBE), declare it (" #m ", gk::opaque(\"reason\")), or, if it "  \
                  "holds no tensor, specialize gk::tensor_free_type for it");                       \
    static_assert(gk_err != gk_e::unsupported_map_key,                                              \
                  "graphkeep: " #C "::" #m " is a map of tensors with a key that is not a string, "  \
                  "an integer or an enum: slot paths cannot name its elements");                     \
  }

#define GK_PP_DUP_OP(r, C, e) GK_DETAIL_CHECK_UNIQUE(C, GK_PP_NAME(e))
#define GK_DETAIL_CHECK_UNIQUE(C, m) GK_DETAIL_CHECK_UNIQUE_I(C, m)
#define GK_DETAIL_CHECK_UNIQUE_I(C, m)                                                   \
  static_assert(::gk::detail::count_name(C::gk_members(), #m) == 1,                      \
                "graphkeep: " #C "::" #m " is listed more than once in its descriptor: " \
                "list each member once (aliases of one tensor are found at run time)");

#if defined(__clang__) || defined(__GNUC__)
#define GK_PP_OFFSETOF_BEGIN \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Winvalid-offsetof\"")
#define GK_PP_OFFSETOF_END _Pragma("GCC diagnostic pop")
#else
#define GK_PP_OFFSETOF_BEGIN
#define GK_PP_OFFSETOF_END
#endif

#define GK_DETAIL_DESCRIBE(C, BASES, seq)                                                         \
  BOOST_DESCRIBE_CLASS(C, BASES, (), (), (GK_PP_NAMES(seq)))                                       \
  friend struct ::gk::detail::access;                                                             \
  friend constexpr ::gk::detail::described<C> gk_reflect(C*) noexcept { return {}; }              \
  static constexpr ::std::string_view gk_type_name() noexcept { return #C; }                      \
  static constexpr auto gk_members() noexcept {                                                   \
    return ::std::array<::gk::detail::member_spec, BOOST_PP_SEQ_SIZE(seq)>{                       \
        {BOOST_PP_SEQ_FOR_EACH_I(GK_PP_SPEC_OP, ~, seq)}};                                        \
  }                                                                                               \
  static void gk_static_checks() noexcept {                                                       \
    BOOST_PP_SEQ_FOR_EACH(GK_PP_CHECK_OP, C, seq)                                                 \
    BOOST_PP_SEQ_FOR_EACH(GK_PP_DUP_OP, C, seq)                                                   \
    GK_PP_OFFSETOF_BEGIN                                                                          \
    static_assert(::gk::detail::first_hole(                                                       \
                      sizeof(C), ::gk::detail::prefix_size<C>(),                                  \
                      ::std::array<::std::size_t, BOOST_PP_SEQ_SIZE(seq)>{                        \
                          {BOOST_PP_SEQ_FOR_EACH_I(GK_PP_OFFSET_OP, C, seq)}},                    \
                      ::std::array<::std::size_t, BOOST_PP_SEQ_SIZE(seq)>{                        \
                          {BOOST_PP_SEQ_FOR_EACH_I(GK_PP_SIZE_OP, C, seq)}}) == ::gk::detail::no_hole, \
                  "graphkeep: " #C " has a data member that its descriptor does not list (the "  \
                  "note below gives its byte offset as the first number), or a base that "        \
                  "GRAPHKEEP_DESCRIBE_DERIVED does not name: list every member of " #C ", "       \
                  "tensors with a role, others bare");                                            \
    GK_PP_OFFSETOF_END                                                                            \
  }

// Describes a class without bases. Place it inside the class, after the
// members; see the header comment for the entry syntax.
#define GRAPHKEEP_DESCRIBE(C, ...) GK_DETAIL_DESCRIBE(C, (), BOOST_PP_VARIADIC_TO_SEQ(__VA_ARGS__))

// Describes a class with bases: BASES is a parenthesized list, e.g. (Base).
// Each base must be registered itself, a torch::nn::Module, or empty.
#define GRAPHKEEP_DESCRIBE_DERIVED(C, BASES, ...)                 \
  GK_DETAIL_DESCRIBE(C, BASES, BOOST_PP_VARIADIC_TO_SEQ(__VA_ARGS__)) \
  BOOST_PP_SEQ_FOR_EACH(GK_PP_BASE_OP, C, BOOST_PP_TUPLE_TO_SEQ(BASES))

#define GK_PP_BASE_OP(r, C, B) GK_DETAIL_CHECK_BASE(C, B)
#define GK_DETAIL_CHECK_BASE(C, B)                                                               \
  static_assert(::gk::detail::base_ok<B>(),                                                      \
                "graphkeep: " #C " derives from " #B ", which is neither registered, a "         \
                "torch::nn::Module, an empty class nor a pure interface: describe " #B " with " \
                "GRAPHKEEP_DESCRIBE so its members are walked");
