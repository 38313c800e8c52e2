// graphkeep/registry/aggregate.h
//
// GRAPHKEEP_AGGREGATE: how a plain struct of tensors and configuration
// declares itself. Boost.PFR reflects the fields (their exact number and
// types, so an unlisted field is always caught); the macro gives the names,
// which Boost 1.81's PFR cannot, and optionally roles.
//
//   struct CutlassMoeStrides {
//     gk::Metadata ab_strides1;   // role in the type ...
//     at::Tensor c_strides1;      // ... or in the descriptor, below
//     int64_t num_experts = 0;
//   };
//   GRAPHKEEP_AGGREGATE(CutlassMoeStrides, ab_strides1, (c_strides1, gk::metadata), num_experts)
//
// Place the macro at namespace scope, in the struct's namespace, after the
// struct. List every field in declaration order.
//
// Known limit: a `std::array<at::Tensor, N>` or `at::Tensor[N]` field crashes
// g++ 12 inside PFR (an internal compiler error); use std::vector or named
// fields, or GRAPHKEEP_DESCRIBE.
#pragma once

#include <graphkeep/registry/describe.h>

#include <boost/pfr/core.hpp>
#include <boost/preprocessor/comparison/greater.hpp>
#include <boost/preprocessor/seq/elem.hpp>
#include <boost/preprocessor/seq/seq.hpp>
#include <boost/preprocessor/tuple/eat.hpp>

#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace gk::detail {

// gk_reflect(T*) of a registered aggregate returns this.
template <class T, std::size_t N>
struct aggregate {
  using type = T;
  std::string_view name;
  std::array<member_spec, N> members;
};

// True when field I of T has type M, or when I is out of range (the count
// check reports that case).
template <class T, std::size_t I, class M>
constexpr bool field_is() {
  if constexpr (I < pfr_field_count<T>())
    return std::is_same_v<boost::pfr::tuple_element_t<I, T>, M>;
  else
    return true;
}

}  // namespace gk::detail

#define GK_PP_AGG_ORDER_OP(r, T, i, e) GK_DETAIL_AGG_ORDER(T, i, GK_PP_NAME(e))
#define GK_DETAIL_AGG_ORDER(T, i, m) GK_DETAIL_AGG_ORDER_I(T, i, m)
#define GK_DETAIL_AGG_ORDER_I(T, i, m)                                                     \
  static_assert(::gk::detail::field_is<T, i, decltype(T::m)>(),                            \
                "graphkeep: " #T "::" #m " is not field number " #i " of " #T ": list the " \
                "fields in GRAPHKEEP_AGGREGATE in declaration order");

// Fields of the same type listed swapped pass the type check above, but would
// give each other's names and roles to the wrong fields. Non-static members of
// an aggregate (all public) have increasing offsets in declaration order, so
// each listed field must not come before the one listed ahead of it.
#define GK_PP_AGG_NEXT_OP(r, data, i, e)                                            \
  GK_DETAIL_AGG_NEXT(BOOST_PP_TUPLE_ELEM(0, data),                                  \
                     GK_PP_NAME(BOOST_PP_SEQ_ELEM(i, BOOST_PP_TUPLE_ELEM(1, data))), \
                     GK_PP_NAME(e))
#define GK_DETAIL_AGG_NEXT(T, prev, m) GK_DETAIL_AGG_NEXT_I(T, prev, m)
#define GK_DETAIL_AGG_NEXT_I(T, prev, m)                                                   \
  static_assert(offsetof(T, prev) <= offsetof(T, m),                                       \
                "graphkeep: " #T "::" #m " is listed after " #prev " but declared before " \
                "it: list the fields in GRAPHKEEP_AGGREGATE in declaration order");
#define GK_DETAIL_AGG_OFFSET_ORDER(T, seq)                                                          \
  BOOST_PP_IIF(BOOST_PP_GREATER(BOOST_PP_SEQ_SIZE(seq), 1), GK_DETAIL_AGG_OFFSET_ORDER_I,           \
               BOOST_PP_TUPLE_EAT(2))(T, seq)
#define GK_DETAIL_AGG_OFFSET_ORDER_I(T, seq)                                          \
  GK_PP_OFFSETOF_BEGIN                                                                \
  BOOST_PP_SEQ_FOR_EACH_I(GK_PP_AGG_NEXT_OP, (T, seq), BOOST_PP_SEQ_TAIL(seq))        \
  GK_PP_OFFSETOF_END

#define GK_PP_AGG_DUP_OP(r, T, e) GK_DETAIL_AGG_DUP(T, GK_PP_NAME(e))
#define GK_DETAIL_AGG_DUP(T, m) GK_DETAIL_AGG_DUP_I(T, m)
#define GK_DETAIL_AGG_DUP_I(T, m)                                                            \
  static_assert(::gk::detail::count_name(gk_reflect(static_cast<T*>(nullptr)).members, #m) == 1, \
                "graphkeep: " #T "::" #m " is listed more than once in GRAPHKEEP_AGGREGATE: "   \
                "list each field once");

#define GK_DETAIL_AGGREGATE(T, seq)                                                               \
  [[maybe_unused]] constexpr ::gk::detail::aggregate<T, BOOST_PP_SEQ_SIZE(seq)> gk_reflect(       \
      T*) noexcept {                                                                              \
    return {#T, {{BOOST_PP_SEQ_FOR_EACH_I(GK_PP_SPEC_OP, ~, seq)}}};                              \
  }                                                                                               \
  static_assert(::std::is_aggregate_v<T>,                                                         \
                "graphkeep: " #T " is not an aggregate (it has constructors, private members or " \
                "virtual functions): describe it with GRAPHKEEP_DESCRIBE inside the class");      \
  static_assert(!::gk::detail::aggregate_has_base<T>(),                                          \
                "graphkeep: " #T " derives from a base class, and GRAPHKEEP_AGGREGATE (Boost.PFR) " \
                "cannot reflect inherited fields: describe " #T " inside the class with "         \
                "GRAPHKEEP_DESCRIBE_DERIVED(" #T ", (Base), fields...), or hold the base as a "   \
                "field and list it");                                                            \
  static_assert(::gk::detail::pfr_field_count<T, BOOST_PP_SEQ_SIZE(seq)>() ==                     \
                    BOOST_PP_SEQ_SIZE(seq),                                                       \
                "graphkeep: " #T " has a different number of fields than GRAPHKEEP_AGGREGATE "    \
                "lists (the note below gives both): list every field of " #T                      \
                " in declaration order, tensors with a role, others bare");                       \
  BOOST_PP_SEQ_FOR_EACH_I(GK_PP_AGG_ORDER_OP, T, seq)                                             \
  GK_DETAIL_AGG_OFFSET_ORDER(T, seq)                                                              \
  BOOST_PP_SEQ_FOR_EACH(GK_PP_AGG_DUP_OP, T, seq)                                                 \
  [[maybe_unused]] inline void gk_aggregate_checks(T*) noexcept {                                 \
    BOOST_PP_SEQ_FOR_EACH(GK_PP_CHECK_OP, T, seq)                                                 \
  }                                                                                               \
  static_assert(true, "")

// Registers aggregate T: every field, in declaration order. See above.
#define GRAPHKEEP_AGGREGATE(T, ...) GK_DETAIL_AGGREGATE(T, BOOST_PP_VARIADIC_TO_SEQ(__VA_ARGS__))
