// graphkeep/registry/slot_table.h
//
// The constexpr slot table of a registered type: every tensor location its
// descriptor declares, flattened through nested registered members, with the
// member path, role and init policy. Containers appear as `[*]`; a
// polymorphic member appears once as `dynamic` (its dynamic type is resolved
// at run time) followed by the slots of its static base type.
//
//   constexpr auto t = gk::slot_table<CutlassMoeMethod>();
//   static_assert(t[0].path_equals("fused_experts.ab_strides1"));
//   static_assert(t[0].role.role == gk::Role::metadata);
//
// gk::Registry<gk::TypeList<...>> concatenates the tables of a whole list of
// types; the `gk-slots` tool prints the project's as text or JSON.
#pragma once

#include <graphkeep/registry/reflect.h>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace gk {

inline constexpr std::size_t kMaxPathDepth = 12;

struct TableEntry {
  enum class Kind : std::uint8_t {
    tensor,   // one tensor member
    each,     // tensors inside a container: the path has a [*] segment
    dynamic,  // a polymorphic member; its dynamic type's slots are found at run time
    opaque,   // a non-tensor member declared opaque, with its reason
    module,   // a torch::nn::Module member; the module tree covers it
  };
  std::string_view root{};   // the registered type whose table this is
  std::string_view owner{};  // the type that declares the innermost member
  std::array<std::string_view, kMaxPathDepth> segments{};
  std::size_t depth = 0;
  RoleSpec role{};
  Kind kind = Kind::tensor;

  // "a.b[*].c"
  std::string path() const {
    std::string s;
    for (std::size_t i = 0; i < depth; ++i) {
      if (i > 0 && segments[i].front() != '[') s += '.';
      s += segments[i];
    }
    return s;
  }
  constexpr bool path_equals(std::string_view p) const {
    std::size_t at = 0;
    for (std::size_t i = 0; i < depth; ++i) {
      if (i > 0 && segments[i].front() != '[') {
        if (at >= p.size() || p[at] != '.') return false;
        ++at;
      }
      if (p.substr(at, segments[i].size()) != segments[i]) return false;
      at += segments[i].size();
    }
    return at == p.size();
  }
};

constexpr std::string_view to_string(TableEntry::Kind k) noexcept {
  switch (k) {
    case TableEntry::Kind::tensor: return "tensor";
    case TableEntry::Kind::each: return "each";
    case TableEntry::Kind::dynamic: return "dynamic";
    case TableEntry::Kind::opaque: return "opaque";
    case TableEntry::Kind::module: return "module";
  }
  return "?";
}

namespace detail {

inline constexpr std::string_view kEach = "[*]";

// std::variant<A, B> / std::tuple<A, B> -> mp_list<A*, B*>
template <class T>
using alternative_pointers =
    boost::mp11::mp_transform<std::add_pointer_t, boost::mp11::mp_rename<T, boost::mp11::mp_list>>;

template <class T>
constexpr std::size_t object_entries();

template <class M>
constexpr std::size_t value_entries() {
  using T = std::remove_cv_t<M>;
  if constexpr (std::is_same_v<T, at::Tensor> || tensor_slot_type<T>) {
    return 1;
  } else if constexpr (registered<T>) {
    return object_entries<T>();
  } else if constexpr (module_type<T>) {
    return 1;
  } else if constexpr (!classify<T>().visitable) {
    return 0;
  } else if constexpr (optional_like<T>::value) {
    using E = typename optional_like<T>::element;
    if constexpr (std::is_polymorphic_v<E> && registered<E> && !std::is_same_v<T, std::optional<E>>)
      return 1 + object_entries<E>();
    else
      return value_entries<E>();
  } else if constexpr (sequence_like<T>::value) {
    return value_entries<typename sequence_like<T>::element>();
  } else if constexpr (map_like<T>::value) {
    return value_entries<typename map_like<T>::element>();
  } else {  // a variant or a tuple
    std::size_t n = 0;
    boost::mp11::mp_for_each<alternative_pointers<T>>(
        [&](auto* tag) { n += value_entries<std::remove_pointer_t<decltype(tag)>>(); });
    return n;
  }
}

template <class T, std::size_t... I>
constexpr std::size_t member_entries(std::index_sequence<I...>) {
  using R = reflect<T>;
  return ([] {
    if constexpr (R::members[I].role.role == Role::opaque)
      return std::size_t{1};
    else
      return value_entries<typename R::template member_type<I>>();
  }() + ... + 0);
}

template <class T>
constexpr std::size_t object_entries() {
  using R = reflect<T>;
  std::size_t n = member_entries<T>(std::make_index_sequence<R::size>{});
  boost::mp11::mp_for_each<boost::mp11::mp_transform<std::add_pointer_t, typename R::bases>>(
      [&](auto* tag) {
        using B = std::remove_pointer_t<decltype(tag)>;
        if constexpr (registered<B>) n += object_entries<B>();
      });
  return n;
}

template <std::size_t N>
struct table_builder {
  std::array<TableEntry, N> out{};
  std::size_t pos = 0;

  constexpr void emit(TableEntry e) { out[pos++] = e; }

  static constexpr TableEntry with(TableEntry e, std::string_view segment) {
    if (e.depth >= kMaxPathDepth) throw "graphkeep: slot path nested deeper than gk::kMaxPathDepth";
    e.segments[e.depth++] = segment;
    return e;
  }

  template <class T>
  constexpr void object(const TableEntry& prefix) {
    using R = reflect<T>;
    boost::mp11::mp_for_each<boost::mp11::mp_transform<std::add_pointer_t, typename R::bases>>(
        [&](auto* tag) {
          using B = std::remove_pointer_t<decltype(tag)>;
          if constexpr (registered<B>) object<B>(prefix);
        });
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (member<T, I>(prefix), ...);
    }(std::make_index_sequence<R::size>{});
  }

  template <class T, std::size_t I>
  constexpr void member(const TableEntry& prefix) {
    using R = reflect<T>;
    constexpr member_spec spec = R::members[I];
    TableEntry e = with(prefix, spec.name);
    e.owner = R::name;
    e.role = spec.role;
    if constexpr (spec.role.role == Role::opaque) {
      e.kind = TableEntry::Kind::opaque;
      emit(e);
    } else {
      value<typename R::template member_type<I>>(e, false);
    }
  }

  template <class M>
  constexpr void value(TableEntry e, bool each) {
    using T = std::remove_cv_t<M>;
    if constexpr (std::is_same_v<T, at::Tensor> || tensor_slot_type<T>) {
      if constexpr (tensor_slot_type<T>) {
        if (!e.role.has_role()) e.role = T::spec;
      }
      e.kind = each ? TableEntry::Kind::each : TableEntry::Kind::tensor;
      emit(e);
    } else if constexpr (registered<T>) {
      object<T>(e);
    } else if constexpr (module_type<T>) {
      e.kind = TableEntry::Kind::module;
      emit(e);
    } else if constexpr (!classify<T>().visitable) {
      // configuration: not a slot
    } else if constexpr (optional_like<T>::value) {
      using E = typename optional_like<T>::element;
      if constexpr (std::is_polymorphic_v<E> && registered<E> && !std::is_same_v<T, std::optional<E>>) {
        TableEntry d = e;
        d.kind = TableEntry::Kind::dynamic;
        d.owner = reflect<E>::name;
        emit(d);
        object<E>(e);
      } else {
        value<E>(e, each);
      }
    } else if constexpr (sequence_like<T>::value) {
      value<typename sequence_like<T>::element>(with(e, kEach), true);
    } else if constexpr (map_like<T>::value) {
      value<typename map_like<T>::element>(with(e, kEach), true);
    } else {  // a variant or a tuple
      boost::mp11::mp_for_each<alternative_pointers<T>>(
          [&](auto* tag) { value<std::remove_pointer_t<decltype(tag)>>(e, each); });
    }
  }
};

}  // namespace detail

// Every slot that T's descriptor declares, as a constexpr array.
template <Registered T>
constexpr auto slot_table() {
  constexpr std::size_t n = detail::object_entries<T>();
  detail::table_builder<n> b;
  TableEntry root{};
  root.root = reflect<T>::name;
  b.template object<T>(root);
  return b.out;
}

}  // namespace gk
