// graphkeep/registry/type_registry.h
//
// The static registry: a compile-time list of registered types, checked as a
// whole, with its concatenated constexpr slot table.
//
//   using ProjectTypes = gk::TypeList<MarlinKernel, CutlassMoeExperts, ...>;
//   using R = gk::Registry<ProjectTypes>;
//   constexpr auto table = R::table();          // every slot of every type
//   R::register_dynamic_types();                // for polymorphic members
//
// Lists compose: gk::concat_t<KernelTypes, QuantTypes>.
#pragma once

#include <graphkeep/registry/slot_table.h>
#include <graphkeep/registry/walk.h>

#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace gk {

template <class... Ts>
struct TypeList {};

template <class... Ls>
struct concat;
template <>
struct concat<> {
  using type = TypeList<>;
};
template <class... As>
struct concat<TypeList<As...>> {
  using type = TypeList<As...>;
};
template <class... As, class... Bs, class... Rest>
struct concat<TypeList<As...>, TypeList<Bs...>, Rest...> {
  using type = typename concat<TypeList<As..., Bs...>, Rest...>::type;
};
template <class... Ls>
using concat_t = typename concat<Ls...>::type;

namespace detail {
// The checks are function templates of the offending types, so that g++
// names them ("In instantiation of ... [with T = ns::Kernel]") right above
// the message.
template <class T>
constexpr std::string_view registry_name() {
  static_assert(registered<T>,
                "graphkeep: every type in a gk::Registry must be registered (GRAPHKEEP_DESCRIBE "
                "or GRAPHKEEP_AGGREGATE); the unregistered type is T in 'with T = ...' above");
  if constexpr (registered<T>)
    return reflect<T>::name;
  else
    return {};
}

template <class A, class B>
constexpr bool registry_names_distinct() {
  static_assert(std::is_void_v<A>,
                "graphkeep: two types in a gk::Registry have the same name (A and B in "
                "'with A = ...; B = ...' above); slot paths would be ambiguous: rename one of them");
  return true;  // the assertion above is the diagnostic
}

// {i, j} of the first two equal names, or {N, N}. Empty names (unregistered
// types, already reported) do not count.
template <std::size_t N>
constexpr std::array<std::size_t, 2> first_duplicate(const std::array<std::string_view, N>& names) {
  for (std::size_t i = 0; i < N; ++i)
    for (std::size_t j = i + 1; j < N; ++j)
      if (!names[i].empty() && names[i] == names[j]) return {i, j};
  return {N, N};
}
}  // namespace detail

template <class List>
struct Registry;

template <class... Ts>
struct Registry<TypeList<Ts...>> {
  static constexpr std::size_t size = sizeof...(Ts);
  static constexpr std::array<std::string_view, size> names{detail::registry_name<Ts>()...};

 private:
  static constexpr auto duplicate = detail::first_duplicate(names);
  using padded = boost::mp11::mp_list<Ts..., void>;  // index size: no duplicate
  static_assert(detail::registry_names_distinct<boost::mp11::mp_at_c<padded, duplicate[0]>,
                                                boost::mp11::mp_at_c<padded, duplicate[1]>>());

 public:

  // Every slot of every type, in list order.
  static constexpr auto table() {
    constexpr std::size_t total = (slot_table<Ts>().size() + ... + 0);
    std::array<TableEntry, total> out{};
    [[maybe_unused]] std::size_t pos = 0;
    (
        [&] {
          for (const TableEntry& e : slot_table<Ts>()) out[pos++] = e;
        }(),
        ...);
    return out;
  }

  static void register_dynamic_types() { (register_dynamic_type(type_ops<Ts>()), ...); }

  template <class F>
  static void for_each_type(F&& f) {
    (f(std::type_identity<Ts>{}), ...);
  }
};

}  // namespace gk
