// graphkeep/registry/detail/describe_pp.h
//
// Private preprocessor machinery of GRAPHKEEP_DESCRIBE, GRAPHKEEP_DESCRIBE_DERIVED
// and GRAPHKEEP_AGGREGATE. Every macro here is named GK_DETAIL_*; none is part
// of the interface. Users include <graphkeep/registry/describe.h> or
// <graphkeep/registry/aggregate.h>.
#pragma once

#include <graphkeep/registry/detail/descriptor.h>

#include <boost/describe/bases.hpp>
#include <boost/describe/class.hpp>
#include <boost/describe/members.hpp>
#include <boost/preprocessor/cat.hpp>
#include <boost/preprocessor/comparison/equal.hpp>
#include <boost/preprocessor/comparison/greater.hpp>
#include <boost/preprocessor/control/iif.hpp>
#include <boost/preprocessor/punctuation/comma_if.hpp>
#include <boost/preprocessor/punctuation/is_begin_parens.hpp>
#include <boost/preprocessor/seq/elem.hpp>
#include <boost/preprocessor/seq/for_each.hpp>
#include <boost/preprocessor/seq/for_each_i.hpp>
#include <boost/preprocessor/seq/seq.hpp>
#include <boost/preprocessor/seq/size.hpp>
#include <boost/preprocessor/stringize.hpp>
#include <boost/preprocessor/tuple/eat.hpp>
#include <boost/preprocessor/tuple/elem.hpp>
#include <boost/preprocessor/tuple/size.hpp>
#include <boost/preprocessor/tuple/to_seq.hpp>
#include <boost/preprocessor/variadic/to_seq.hpp>

#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>

// ---------------------------------------------------------------------------
// Entries. An entry is `name`, `(name)` or `(name, role)`.
// ---------------------------------------------------------------------------
#define GK_DETAIL_TUPLE(e) BOOST_PP_IIF(BOOST_PP_IS_BEGIN_PARENS(e), e, (e))
#define GK_DETAIL_NAME(e) BOOST_PP_TUPLE_ELEM(0, GK_DETAIL_TUPLE(e))
#define GK_DETAIL_ROLE_2(t) ::gk::detail::to_spec(BOOST_PP_TUPLE_ELEM(1, t))
#define GK_DETAIL_ROLE_1(t) ::gk::RoleSpec{}
#define GK_DETAIL_ROLE(e)                                                                  \
  BOOST_PP_IIF(BOOST_PP_EQUAL(BOOST_PP_TUPLE_SIZE(GK_DETAIL_TUPLE(e)), 2), GK_DETAIL_ROLE_2, \
               GK_DETAIL_ROLE_1)(GK_DETAIL_TUPLE(e))

#define GK_DETAIL_SPEC_OP(r, data, i, e) \
  BOOST_PP_COMMA_IF(i)::gk::detail::member_spec{BOOST_PP_STRINGIZE(GK_DETAIL_NAME(e)), GK_DETAIL_ROLE(e)}
#define GK_DETAIL_OFFSET_OP(r, C, i, e) BOOST_PP_COMMA_IF(i) offsetof(C, GK_DETAIL_NAME(e))
#define GK_DETAIL_SIZE_OP(r, C, i, e) BOOST_PP_COMMA_IF(i) sizeof(decltype(C::GK_DETAIL_NAME(e)))

// ---------------------------------------------------------------------------
// Note [Diagnostics at the user's line]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// g++ reports a failed static_assert at the location of its condition. For a
// condition written in a macro body that is a line of this header, followed by
// "in expansion of macro" notes. A token that came from a macro *argument*,
// though, keeps the location where the user wrote it, and g++ reports the
// error there ("in definition of macro" notes follow). So every check names a
// user-written token as its whole condition: it stores the verdict in a
// block-scope constexpr bool named after the member (or after the class, for
// whole-class checks) and asserts that. The bool shadows the member (or the
// class name) only inside its own two-line block; -Wshadow is silenced there.
// The verdict is computed first, into gk_ok, so that the condition never sees
// the shadowing name. (So a member may not be named gk_ok, and the class name
// given to GRAPHKEEP_DESCRIBE must be a plain identifier, as it always is
// inside the class; GRAPHKEEP_AGGREGATE's T may be qualified, so its
// whole-struct checks keep an ordinary condition.) g++ adds a note
// "'member_' evaluates to false" after each such error.
//
// GK_DETAIL_ASSERT(tok, "message", condition...)
// ---------------------------------------------------------------------------
#define GK_DETAIL_ASSERT(tok, msg, ...)        \
  {                                            \
    constexpr bool gk_ok = (__VA_ARGS__);      \
    {                                          \
      [[maybe_unused]] constexpr bool tok = gk_ok; \
      static_assert(tok, msg);                 \
    }                                          \
  }

#if defined(__clang__) || defined(__GNUC__)
#define GK_DETAIL_DIAGNOSTICS_BEGIN                                                          \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Winvalid-offsetof\"") \
      _Pragma("GCC diagnostic ignored \"-Wshadow\"")
#define GK_DETAIL_DIAGNOSTICS_END _Pragma("GCC diagnostic pop")
#else
#define GK_DETAIL_DIAGNOSTICS_BEGIN
#define GK_DETAIL_DIAGNOSTICS_END
#endif

// ---------------------------------------------------------------------------
// The member checks shared by GRAPHKEEP_DESCRIBE and GRAPHKEEP_AGGREGATE.
// Each message names the class and the member, then the fix. C names the
// class in messages; CT is the dependent type whose member m is (GkC of
// GRAPHKEEP_DESCRIBE, GkT of GRAPHKEEP_AGGREGATE, see Note [One error for a
// misspelt member]).
// ---------------------------------------------------------------------------
#define GK_DETAIL_CHECK_OP(r, data, e)                                                     \
  GK_DETAIL_CHECK_MEMBER(BOOST_PP_TUPLE_ELEM(0, data), BOOST_PP_TUPLE_ELEM(1, data), \
                         GK_DETAIL_NAME(e), GK_DETAIL_ROLE(e))
#define GK_DETAIL_CHECK_MEMBER(C, CT, m, spec) GK_DETAIL_CHECK_MEMBER_I(C, CT, m, spec)

// "give it a role" advice shared by the messages about tensors without one.
#define GK_DETAIL_ROLE_ADVICE(m)                                                              \
  "declare it in the descriptor as (" #m ", gk::workspace(gk::Init::zero)), gk::metadata, "  \
  "gk::scale, gk::derived_weight, gk::permutation, gk::scratch or gk::parameter, or mark it " \
  "gk::not_graph_visible(\"reason\") if no captured graph reads it"
#define GK_DETAIL_HOLDER(C, m, kind, what)                                                       \
  GK_DETAIL_ASSERT(m,                                                                            \
                   "graphkeep: " #C "::" #m " is " what " with no role: give the member a role "  \
                   "(a container's tensors share it): " GK_DETAIL_ROLE_ADVICE(m),                \
                   gk_err != gk_e::tensor_without_role ||                                       \
                       ::gk::detail::tensor_holder_kind<gk_m>() != ::gk::detail::tensor_holder::kind)

#define GK_DETAIL_CHECK_MEMBER_I(C, CT, m, spec)                                                   \
  {                                                                                                \
    using gk_e = ::gk::detail::member_error;                                                       \
    using gk_m = decltype(CT::m);                                                                  \
    constexpr gk_e gk_err = ::gk::detail::check_member<gk_m>(spec);                                \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " is an at::Tensor with no role: "                   \
                     GK_DETAIL_ROLE_ADVICE(m),                                                     \
                     gk_err != gk_e::tensor_without_role ||                                        \
                         ::gk::detail::tensor_holder_kind<gk_m>() != ::gk::detail::tensor_holder::tensor) \
    GK_DETAIL_HOLDER(C, m, vector, "a std::vector of at::Tensor")                                  \
    GK_DETAIL_HOLDER(C, m, deque, "a std::deque of at::Tensor")                                    \
    GK_DETAIL_HOLDER(C, m, array, "a std::array of at::Tensor")                                    \
    GK_DETAIL_HOLDER(C, m, c_array, "an array of at::Tensor")                                      \
    GK_DETAIL_HOLDER(C, m, optional, "a std::optional of at::Tensor")                              \
    GK_DETAIL_HOLDER(C, m, unique_ptr, "a std::unique_ptr to at::Tensor")                          \
    GK_DETAIL_HOLDER(C, m, shared_ptr, "a std::shared_ptr to at::Tensor")                          \
    GK_DETAIL_HOLDER(C, m, map, "a std::map of at::Tensor")                                        \
    GK_DETAIL_HOLDER(C, m, unordered_map, "a std::unordered_map of at::Tensor")                    \
    GK_DETAIL_HOLDER(C, m, variant, "a std::variant holding at::Tensor")                           \
    GK_DETAIL_HOLDER(C, m, pair, "a std::pair holding at::Tensor")                                 \
    GK_DETAIL_HOLDER(C, m, tuple, "a std::tuple holding at::Tensor")                               \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " has a role but holds no tensor: roles apply to "   \
                     "at::Tensor members and containers of them; list " #m " without a role",      \
                     gk_err != gk_e::role_on_non_tensor)                                           \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " has a role in its type (gk::TensorSlot) and "      \
                     "another in the descriptor: keep one of them",                                \
                     gk_err != gk_e::role_twice)                                                   \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " is a workspace without an init policy: write "     \
                     "gk::workspace(gk::Init::zero) for lock counters, gk::Init::preserve to "     \
                     "keep its contents, or gk::Init::copy_new to take PWAL's value",              \
                     gk_err != gk_e::workspace_without_init)                                       \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " is declared not graph-visible or opaque without "  \
                     "a reason: write gk::not_graph_visible(\"why no captured graph reads it\") "  \
                     "or gk::opaque(\"why it holds no device memory\")",                           \
                     gk_err != gk_e::reason_missing)                                               \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " holds tensors and cannot be opaque: give a "       \
                     "tensor member a role (gk::not_graph_visible(\"reason\") if no captured "     \
                     "graph reads it), list a member of a registered type bare, and register a "   \
                     "struct that holds tensors",                                                  \
                     gk_err != gk_e::opaque_on_tensor)                                             \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " holds both gk::TensorSlot tensors (role in the "   \
                     "type) and plain at::Tensor ones, which would get no role: use typed slots "  \
                     "(gk::Scale, ...) for all of them, or plain at::Tensor for all with the "     \
                     "role in the descriptor",                                                     \
                     gk_err != gk_e::mixed_tensor_roles)                                           \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " has a type that holds tensors but is not "         \
                     "registered: register that type with GRAPHKEEP_DESCRIBE (classes) or "        \
                     "GRAPHKEEP_AGGREGATE (aggregates) so its tensors get roles",                  \
                     gk_err != gk_e::unregistered_tensor_holder)                                   \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " is a std::function, lambda or functor whose "      \
                     "captures graphkeep cannot see: make the functor a registered type "          \
                     "(GRAPHKEEP_DESCRIBE) or declare it (" #m                                     \
                     ", gk::opaque(\"why it captures no device tensor\"))",                        \
                     gk_err != gk_e::callable)                                                     \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " is a raw pointer, which may cache a device "       \
                     "address that a reload moves: hold the at::Tensor instead, or declare it ("   \
                     #m ", gk::opaque(\"why it never points into device memory\"))",               \
                     gk_err != gk_e::raw_pointer)                                                  \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " is a reference member: graphkeep cannot re-point " \
                     "it after a reload; hold the object by value or by smart pointer",            \
                     gk_err != gk_e::reference)                                                    \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " has a class type graphkeep cannot look into: "     \
                     "register it (GRAPHKEEP_DESCRIBE), declare it (" #m ", gk::opaque("           \
                     "\"reason\")), or, if it holds no tensor, specialize gk::tensor_free_type "   \
                     "for it",                                                                     \
                     gk_err != gk_e::unknown_class)                                                \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " is a map of tensors with a key that is not a "     \
                     "string, an integer or an enum: slot paths cannot name its elements",         \
                     gk_err != gk_e::unsupported_map_key)                                          \
    GK_DETAIL_ASSERT(m,                                                                            \
                     "graphkeep: " #C "::" #m " declares a derivation (.from_shapes()) but "       \
                     "its role is not a derived one: only gk::metadata, "                          \
                     "gk::scale, gk::derived_weight and gk::permutation members, copied from "     \
                     "PWAL's new value, derive from the checkpoint; drop the derivation",          \
                     gk_err != gk_e::derivation_on_non_derived)                                    \
  }

// ---------------------------------------------------------------------------
// GRAPHKEEP_DESCRIBE
// ---------------------------------------------------------------------------

// Note [One error for a misspelt member]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A listed name that is not a member of C would break every use of it (its
// type, its offset, its size, its member pointer): a score of errors. So the
// expansion uses no listed name non-dependently. Every use sits in a generic
// lambda (or a member template) on a dependent GkC (= C), where `GkC::m` is
// looked up only at instantiation, behind an `if constexpr` on `requires {
// GkC::m; }`; only a static_assert that the name resolves sees a misspelt
// one, and it names the class and the member at the user's line:
//
//  - GRAPHKEEP_DESCRIBE: gk_names_resolve<GkC> says whether every listed name
//    resolves. gk_static_checks asserts each name, then runs the other
//    checks only if all resolve. Boost.Describe's member list is the other
//    user of the names: BOOST_DESCRIBE_CLASS would write `&C::m`
//    non-dependently, which g++ reports on its own ("'m' is not a member of
//    'C'", then a follow-up), so GK_DETAIL_DESCRIBE_BOOST writes the private
//    member list itself, empty unless all names resolve. gk::reflect<C> then
//    has no members (reflect.h), so a walk or a slot table of C adds no error
//    either.
//  - GRAPHKEEP_AGGREGATE: Boost.PFR needs no names, so each field's checks
//    are guarded by its own name alone (and the offset order of two fields
//    by both names).
//
// (In `requires { GkC::m; }` a missing name is a substitution failure only
// because GkC is dependent; with C itself it would be a hard error.) A
// misspelt name thus gives exactly one error, graphkeep's; the compile-fail
// tests misspelt_member and aggregate_misspelt_field hold that.
//
// What the guards cost at compile time: docs/compile_cost.md, "Re-measured
// after the one-error descriptors".
#define GK_DETAIL_RESOLVES(CT, m) requires { CT::m; }
#define GK_DETAIL_RESOLVES_OP(r, CT, e) &&GK_DETAIL_RESOLVES(CT, GK_DETAIL_NAME(e))
#define GK_DETAIL_ALL_RESOLVE(CT, seq) (true BOOST_PP_SEQ_FOR_EACH(GK_DETAIL_RESOLVES_OP, CT, seq))
#define GK_DETAIL_EXISTS_OP(r, C, e) GK_DETAIL_CHECK_EXISTS(C, GK_DETAIL_NAME(e))
#define GK_DETAIL_CHECK_EXISTS(C, m) GK_DETAIL_CHECK_EXISTS_I(C, m)
#define GK_DETAIL_CHECK_EXISTS_I(C, m)                                                       \
  GK_DETAIL_ASSERT(m,                                                                        \
                   "graphkeep: " #C " has no member named " #m ", which its descriptor lists: " \
                   "list the data members of " #C " by their names, in declaration order",   \
                   GK_DETAIL_RESOLVES(GkC, m))

#define GK_DETAIL_DUP_OP(r, C, e) GK_DETAIL_CHECK_UNIQUE(C, GK_DETAIL_NAME(e))
#define GK_DETAIL_CHECK_UNIQUE(C, m) GK_DETAIL_CHECK_UNIQUE_I(C, m)
#define GK_DETAIL_CHECK_UNIQUE_I(C, m)                                                     \
  GK_DETAIL_ASSERT(m,                                                                      \
                   "graphkeep: " #C "::" #m " is listed more than once in its descriptor: " \
                   "list each member once (aliases of one tensor are found at run time)",  \
                   ::gk::detail::count_name(GkC::gk_members(), #m) == 1)

// See Note [Fail-closed descriptors] and Note [Naming the unlisted bytes] in
// detail/descriptor.h. The first error is the one at the user's line; the
// second, inside gk::detail::unlisted_bytes<...>, carries the names.
#define GK_DETAIL_CHECK_LAYOUT(C, seq)                                                             \
  {                                                                                                \
    constexpr ::gk::detail::layout_gap gk_gap = ::gk::detail::find_gap(                            \
        #C, sizeof(GkC), ::gk::detail::prefix_size<GkC>(), ::gk::detail::prefix_name<GkC>(),       \
        ::std::array<::std::size_t, BOOST_PP_SEQ_SIZE(seq)>{                                       \
            {BOOST_PP_SEQ_FOR_EACH_I(GK_DETAIL_OFFSET_OP, GkC, seq)}},                             \
        ::std::array<::std::size_t, BOOST_PP_SEQ_SIZE(seq)>{                                       \
            {BOOST_PP_SEQ_FOR_EACH_I(GK_DETAIL_SIZE_OP, GkC, seq)}},                               \
        GkC::gk_members());                                                                        \
    GK_DETAIL_ASSERT(C,                                                                            \
                     "graphkeep: " #C " has a data member that its descriptor does not list, or a " \
                     "base that GRAPHKEEP_DESCRIBE_DERIVED does not name (the next error, in "      \
                     "gk::detail::unlisted_bytes<...>, gives the listed members around it, its "   \
                     "offset and size): list every member of " #C ", tensors with a role, others " \
                     "bare",                                                                       \
                     !gk_gap.found)                                                                \
    static_assert(::gk::detail::unlisted_bytes<::gk::detail::gap_name<gk_gap.length>(gk_gap)>::ok); \
  }

#define GK_DETAIL_BASE_OP(r, C, B) GK_DETAIL_CHECK_BASE(C, B)
#define GK_DETAIL_CHECK_BASE(C, B)                                                             \
  GK_DETAIL_ASSERT(C,                                                                          \
                   "graphkeep: " #C " derives from " #B ", which is neither registered, a "    \
                   "torch::nn::Module, an empty class nor a pure interface: describe " #B     \
                   " with GRAPHKEEP_DESCRIBE so its members are walked",                      \
                   ::gk::detail::base_ok<B>())
#define GK_DETAIL_CHECK_BASES(C, BASES) BOOST_PP_SEQ_FOR_EACH(GK_DETAIL_BASE_OP, C, BOOST_PP_TUPLE_TO_SEQ(BASES))

// Boost.Describe's descriptor of C: the bases and the (empty) public and
// protected member lists as BOOST_DESCRIBE_CLASS writes them, and the private
// member list written here in the same protocol (what member_descriptor_fn_impl
// returns, over one descriptor per member: gk::detail::member_desc), but with
// dependent member pointers behind one `if constexpr` (Note [One error for a
// misspelt member]). describe_members<C> sees what BOOST_DESCRIBE_CLASS(C,
// BASES, (), (), (names...)) would give it. The protocol is Boost.Describe's
// internal one (boost/describe/detail/members.hpp of Boost 1.81); the test
// "Boost.Describe sees the members and bases a descriptor lists"
// (tests/registry_test.cpp) fails if a Boost release changes it.
#define GK_DETAIL_MEMBER_DESC_OP(r, data, i, e) , ::gk::detail::member_desc<GkC, i, &GkC::GK_DETAIL_NAME(e)>()
#define GK_DETAIL_DESCRIBE_BOOST(C, BASES, seq)                                                      \
  BOOST_DESCRIBE_MAYBE_UNUSED friend BOOST_DESCRIBE_BASES_(C BOOST_DESCRIBE_PP_UNPACK BASES)         \
  BOOST_DESCRIBE_MAYBE_UNUSED friend BOOST_DESCRIBE_PUBLIC_MEMBERS_(C)                               \
  BOOST_DESCRIBE_MAYBE_UNUSED friend BOOST_DESCRIBE_PROTECTED_MEMBERS_(C)                            \
  BOOST_DESCRIBE_MAYBE_UNUSED friend inline auto boost_private_member_descriptor_fn(C**) {           \
    return []<class GkC>(GkC*) {                                                                     \
      if constexpr (GkC::template gk_names_resolve<GkC>)                                             \
        return ::boost::describe::detail::member_descriptor_fn_impl<::boost::describe::mod_private>( \
            0 BOOST_PP_SEQ_FOR_EACH_I(GK_DETAIL_MEMBER_DESC_OP, ~, seq));                              \
      else                                                                                           \
        return ::boost::describe::detail::list<>();                                                  \
    }(static_cast<C*>(nullptr));                                                                     \
  }

// derived: 1 for GRAPHKEEP_DESCRIBE_DERIVED (BASES is checked), 0 otherwise.
#define GK_DETAIL_DESCRIBE_SEQ(C, BASES, derived, seq)                                           \
  GK_DETAIL_DESCRIBE_BOOST(C, BASES, seq)                                                        \
  friend struct ::gk::detail::access;                                                            \
  template <class GkC>                                                                           \
  static constexpr bool gk_names_resolve = GK_DETAIL_ALL_RESOLVE(GkC, seq);                      \
  friend constexpr ::gk::detail::described<C> gk_reflect(C*) noexcept { return {}; }             \
  static constexpr ::std::string_view gk_type_name() noexcept { return #C; }                     \
  static constexpr auto gk_members() noexcept {                                                  \
    return ::std::array<::gk::detail::member_spec, BOOST_PP_SEQ_SIZE(seq)>{                      \
        {BOOST_PP_SEQ_FOR_EACH_I(GK_DETAIL_SPEC_OP, ~, seq)}};                                   \
  }                                                                                              \
  static void gk_static_checks() noexcept {                                                      \
    GK_DETAIL_DIAGNOSTICS_BEGIN                                                                  \
    []<class GkC>(GkC*) {                                                                        \
      BOOST_PP_IIF(derived, GK_DETAIL_CHECK_BASES, BOOST_PP_TUPLE_EAT(2))(C, BASES)              \
      BOOST_PP_SEQ_FOR_EACH(GK_DETAIL_EXISTS_OP, C, seq)                                         \
      if constexpr (GkC::template gk_names_resolve<GkC>) {                                       \
        BOOST_PP_SEQ_FOR_EACH(GK_DETAIL_CHECK_OP, (C, GkC), seq)                                 \
        BOOST_PP_SEQ_FOR_EACH(GK_DETAIL_DUP_OP, C, seq)                                          \
        GK_DETAIL_CHECK_LAYOUT(C, seq)                                                           \
      }                                                                                          \
    }(static_cast<C*>(nullptr));                                                                 \
    GK_DETAIL_DIAGNOSTICS_END                                                                    \
  }

#define GK_DETAIL_DESCRIBE(C, BASES, ...) \
  GK_DETAIL_DESCRIBE_SEQ(C, BASES, 0, BOOST_PP_VARIADIC_TO_SEQ(__VA_ARGS__))
#define GK_DETAIL_DESCRIBE_DERIVED(C, BASES, ...) \
  GK_DETAIL_DESCRIBE_SEQ(C, BASES, 1, BOOST_PP_VARIADIC_TO_SEQ(__VA_ARGS__))

// ---------------------------------------------------------------------------
// GRAPHKEEP_AGGREGATE
// ---------------------------------------------------------------------------
// The per-field checks run on GkT, the dependent name of T inside
// gk_aggregate_checks; T names the struct in messages as the user wrote it.
// For each field: that its name is a field of T, then, only if it is (Note
// [One error for a misspelt member]), that it is the field at its position
// and the member checks.
#define GK_DETAIL_AGG_FIELD_OP(r, T, i, e) GK_DETAIL_AGG_FIELD(T, i, GK_DETAIL_NAME(e), GK_DETAIL_ROLE(e))
#define GK_DETAIL_AGG_FIELD(T, i, m, spec) GK_DETAIL_AGG_FIELD_I(T, i, m, spec)
#define GK_DETAIL_AGG_FIELD_I(T, i, m, spec)                                                     \
  {                                                                                              \
    constexpr bool gk_has = GK_DETAIL_RESOLVES(GkT, m);                                          \
    GK_DETAIL_ASSERT(m,                                                                          \
                     "graphkeep: " #T " has no field named " #m ", which GRAPHKEEP_AGGREGATE "   \
                     "lists: list the fields of " #T " by their names, in declaration order",    \
                     gk_has)                                                                     \
    if constexpr (gk_has) {                                                                      \
      GK_DETAIL_AGG_ORDER_I(T, i, m)                                                             \
      GK_DETAIL_CHECK_MEMBER_I(T, GkT, m, spec)                                                  \
    }                                                                                            \
  }
#define GK_DETAIL_AGG_ORDER_I(T, i, m)                                                       \
  GK_DETAIL_ASSERT(m,                                                                        \
                   "graphkeep: " #T "::" #m " is not field number " #i " of " #T ": list the " \
                   "fields in GRAPHKEEP_AGGREGATE in declaration order",                     \
                   ::gk::detail::field_is<GkT, i, decltype(GkT::m)>())

// Fields of the same type listed swapped pass the type check above, but would
// give each other's names and roles to the wrong fields. Non-static members of
// an aggregate (all public) have increasing offsets in declaration order, so
// each listed field must not come before the one listed ahead of it.
#define GK_DETAIL_AGG_NEXT_OP(r, data, i, e)                                               \
  GK_DETAIL_AGG_NEXT(BOOST_PP_TUPLE_ELEM(0, data),                                         \
                     GK_DETAIL_NAME(BOOST_PP_SEQ_ELEM(i, BOOST_PP_TUPLE_ELEM(1, data))),  \
                     GK_DETAIL_NAME(e))
#define GK_DETAIL_AGG_NEXT(T, prev, m) GK_DETAIL_AGG_NEXT_I(T, prev, m)
#define GK_DETAIL_AGG_NEXT_I(T, prev, m)                                                       \
  if constexpr (GK_DETAIL_RESOLVES(GkT, prev) && GK_DETAIL_RESOLVES(GkT, m))                   \
    GK_DETAIL_ASSERT(m,                                                                        \
                     "graphkeep: " #T "::" #m " is listed after " #prev " but declared before " \
                     "it: list the fields in GRAPHKEEP_AGGREGATE in declaration order",        \
                     offsetof(GkT, prev) <= offsetof(GkT, m))
#define GK_DETAIL_AGG_OFFSET_ORDER(T, seq)                                                \
  BOOST_PP_IIF(BOOST_PP_GREATER(BOOST_PP_SEQ_SIZE(seq), 1), GK_DETAIL_AGG_OFFSET_ORDER_I, \
               BOOST_PP_TUPLE_EAT(2))(T, seq)
#define GK_DETAIL_AGG_OFFSET_ORDER_I(T, seq) \
  BOOST_PP_SEQ_FOR_EACH_I(GK_DETAIL_AGG_NEXT_OP, (T, seq), BOOST_PP_SEQ_TAIL(seq))

#define GK_DETAIL_AGG_DUP_OP(r, T, e) GK_DETAIL_AGG_DUP(T, GK_DETAIL_NAME(e))
#define GK_DETAIL_AGG_DUP(T, m) GK_DETAIL_AGG_DUP_I(T, m)
#define GK_DETAIL_AGG_DUP_I(T, m)                                                              \
  GK_DETAIL_ASSERT(m,                                                                          \
                   "graphkeep: " #T "::" #m " is listed more than once in GRAPHKEEP_AGGREGATE: " \
                   "list each field once",                                                     \
                   ::gk::detail::count_name(gk_reflect(static_cast<GkT*>(nullptr)).members, #m) == 1)

// The whole-struct checks stay at namespace scope (T may be a qualified name,
// which cannot name a local bool; see Note [Diagnostics at the user's line]);
// the per-field ones run in gk_aggregate_checks, at the field's name, each
// behind the check that its name is a field (Note [One error for a misspelt
// member]).
#define GK_DETAIL_AGGREGATE_SEQ(T, seq)                                                             \
  [[maybe_unused]] constexpr ::gk::detail::aggregate<T, BOOST_PP_SEQ_SIZE(seq)> gk_reflect(         \
      T*) noexcept {                                                                                \
    return {#T, {{BOOST_PP_SEQ_FOR_EACH_I(GK_DETAIL_SPEC_OP, ~, seq)}}};                            \
  }                                                                                                 \
  static_assert(::std::is_aggregate_v<T>,                                                           \
                "graphkeep: " #T " is not an aggregate (it has constructors, private members or "   \
                "virtual functions): describe it with GRAPHKEEP_DESCRIBE inside the class");        \
  static_assert(!::gk::detail::aggregate_has_base<T>(),                                             \
                "graphkeep: " #T " derives from a base class, and GRAPHKEEP_AGGREGATE (Boost.PFR) " \
                "cannot reflect inherited fields: describe " #T " inside the class with "           \
                "GRAPHKEEP_DESCRIBE_DERIVED(" #T ", (Base), fields...), or hold the base as a "     \
                "field and list it");                                                               \
  static_assert(::gk::detail::pfr_field_count<T, BOOST_PP_SEQ_SIZE(seq)>() ==                       \
                    BOOST_PP_SEQ_SIZE(seq),                                                         \
                "graphkeep: " #T " has a different number of fields than GRAPHKEEP_AGGREGATE "      \
                "lists (the note below gives both): list every field of " #T                        \
                " in declaration order, tensors with a role, others bare");                         \
  [[maybe_unused]] inline void gk_aggregate_checks(T*) noexcept {                                   \
    GK_DETAIL_DIAGNOSTICS_BEGIN                                                                     \
    []<class GkT>(GkT*) {                                                                           \
      BOOST_PP_SEQ_FOR_EACH_I(GK_DETAIL_AGG_FIELD_OP, T, seq)                                       \
      GK_DETAIL_AGG_OFFSET_ORDER(T, seq)                                                            \
      BOOST_PP_SEQ_FOR_EACH(GK_DETAIL_AGG_DUP_OP, T, seq)                                           \
    }(static_cast<T*>(nullptr));                                                                    \
    GK_DETAIL_DIAGNOSTICS_END                                                                       \
  }                                                                                                 \
  static_assert(true, "")

#define GK_DETAIL_AGGREGATE(T, ...) GK_DETAIL_AGGREGATE_SEQ(T, BOOST_PP_VARIADIC_TO_SEQ(__VA_ARGS__))
