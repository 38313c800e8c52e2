// graphkeep/registry/registry.h
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

#include <array>
#include <cstddef>
#include <string_view>

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
template <std::size_t N>
constexpr bool names_unique(const std::array<std::string_view, N>& names) {
  for (std::size_t i = 0; i < N; ++i)
    for (std::size_t j = i + 1; j < N; ++j)
      if (names[i] == names[j]) return false;
  return true;
}
}  // namespace detail

template <class List>
struct Registry;

template <class... Ts>
struct Registry<TypeList<Ts...>> {
  static_assert((Registered<Ts> && ...),
                "graphkeep: every type in a gk::Registry must be registered "
                "(GRAPHKEEP_DESCRIBE or GRAPHKEEP_AGGREGATE)");
  static constexpr std::size_t size = sizeof...(Ts);
  static constexpr std::array<std::string_view, size> names{reflect<Ts>::name...};
  static_assert(detail::names_unique(names),
                "graphkeep: two types in the registry have the same name; slot paths "
                "would be ambiguous: rename one of them");

  // Every slot of every type, in list order.
  static constexpr auto table() {
    constexpr std::size_t total = (slot_table<Ts>().size() + ... + 0);
    std::array<TableEntry, total> out{};
    std::size_t pos = 0;
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
