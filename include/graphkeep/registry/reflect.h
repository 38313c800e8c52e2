// graphkeep/registry/reflect.h
//
// One compile-time view of a registered type, whichever way it was declared
// (GRAPHKEEP_DESCRIBE through Boost.Describe, GRAPHKEEP_AGGREGATE through
// Boost.PFR). The visitors and the slot table are written against it only.
//
//   using R = gk::reflect<MarlinKernel>;
//   R::name                 "MarlinKernel"
//   R::size                 number of listed members
//   R::members[i]           {name, declared role}
//   R::get<I>(obj)          member I of obj (an lvalue)
//   R::member_type<I>       its type
//   R::bases                boost::mp11::mp_list of base classes
#pragma once

#include <graphkeep/registry/aggregate.h>
#include <graphkeep/registry/describe.h>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#include <cstddef>
#include <string_view>
#include <type_traits>

namespace gk {

template <class T>
concept Registered = detail::registered<T>;

namespace detail {

template <class T>
struct described_reflection {
  static_assert(access::checked<T>());  // runs the descriptor checks of a class template
  static constexpr std::string_view name = access::type_name<T>();
  static constexpr auto members = access::members<T>();
  using descriptors = boost::describe::describe_members<T, boost::describe::mod_any_access>;
  // Empty when the descriptor lists a name T lacks: T's own checks report
  // it, and nothing here adds an error (Note [One error for a misspelt
  // member] in detail/describe_pp.h).
  static constexpr std::size_t size = boost::mp11::mp_size<descriptors>::value;
  static_assert(size == members.size() || size == 0);

  template <std::size_t I>
  static auto& get(T& obj) noexcept { return obj.*(boost::mp11::mp_at_c<descriptors, I>::pointer); }
  template <std::size_t I>
  using member_type =
      std::remove_cvref_t<decltype(std::declval<T&>().*(boost::mp11::mp_at_c<descriptors, I>::pointer))>;

  template <class D>
  using base_of = typename D::type;
  using bases = boost::mp11::mp_transform<
      base_of, boost::describe::describe_bases<T, boost::describe::mod_any_access>>;
};

template <class T>
struct aggregate_reflection {
  static constexpr auto info = gk_reflect(static_cast<T*>(nullptr));
  static constexpr std::string_view name = info.name;
  static constexpr auto members = info.members;
  static constexpr std::size_t size = members.size();

  template <std::size_t I>
  static auto& get(T& obj) noexcept { return boost::pfr::get<I>(obj); }
  template <std::size_t I>
  using member_type = boost::pfr::tuple_element_t<I, T>;
  using bases = boost::mp11::mp_list<>;
};

template <class T>
struct reflection_of {
  using tag = decltype(gk_reflect(static_cast<T*>(nullptr)));
  using type = std::conditional_t<std::is_same_v<tag, described<T>>, described_reflection<T>,
                                  aggregate_reflection<T>>;
};

}  // namespace detail

template <Registered T>
using reflect = typename detail::reflection_of<T>::type;

}  // namespace gk
