// graphkeep/registry/detail/descriptor.h
//
// Private: the C++ side of GRAPHKEEP_DESCRIBE and GRAPHKEEP_AGGREGATE (the
// entries a descriptor yields, the friend the registry reads them through,
// the layout check). The macros themselves are in detail/describe_pp.h;
// users include <graphkeep/registry/describe.h> or aggregate.h.
#pragma once

#include <graphkeep/registry/member_kind.h>

#include <boost/describe/bases.hpp>
#include <boost/mp11/algorithm.hpp>
#include <boost/pfr/core.hpp>

#include <array>
#include <cstddef>
#include <limits>
#include <string_view>
#include <type_traits>

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

// Entry I of Boost.Describe's member list of a described class C, whose
// member pointer is P (see GK_DETAIL_DESCRIBE_BOOST in describe_pp.h).
template <class C, std::size_t I, auto P>
struct member_desc {
  static constexpr auto pointer() noexcept { return P; }
  static constexpr const char* name() noexcept { return access::members<C>()[I].name.data(); }
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
// context, with access to private members; the checks run in a generic lambda
// there, see Note [One error for a misspelt member] in describe_pp.h); GCC and
// Clang accept it for non-standard-layout classes, so the warning is silenced
// locally. find_gap then names the bytes (Note [Naming the unlisted bytes]). For a
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

// What covers the first prefix_size<C>() bytes, for the gap's description.
template <class C>
constexpr std::string_view prefix_name() {
  if constexpr (boost::mp11::mp_empty<boost::describe::describe_bases<C, boost::describe::mod_any_access>>::value)
    return "the vptr";
  else
    return "the bases";
}

// Note [Naming the unlisted bytes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Describe never saw the unlisted member, so its name is unknowable; its
// neighbours' names are not. find_gap widens the first uncovered window to
// the whole run of bytes that nothing listed covers and names what ends just
// before it and what starts just after it, as text: "Fp8BlockScaledKernel:
// 8 unlisted bytes at offset 8, between weight_scale_inv_ and block_n_". A
// static_assert message must be a literal, so the text travels as a template
// argument instead: GRAPHKEEP_DESCRIBE instantiates unlisted_bytes<text>
// (text is empty when nothing is missing), whose static_assert fails when the
// text is not empty, and g++ prints the argument, string included, in "In
// instantiation of 'struct gk::detail::unlisted_bytes<...>'".
struct layout_gap {
  bool found = false;
  std::size_t begin = 0;   // [begin, end): no listed member, base or vptr covers it
  std::size_t end = 0;
  char text[480]{};
  std::size_t length = 0;  // of text

  constexpr void add(std::string_view s) {
    for (char c : s)
      if (length < sizeof(text)) text[length++] = c;
  }
  constexpr void add(std::size_t n) {
    char digits[24]{};
    std::size_t k = 0;
    do {
      digits[k++] = static_cast<char>('0' + n % 10);
      n /= 10;
    } while (n != 0);
    while (k != 0) add(std::string_view(&digits[--k], 1));
  }
};

template <std::size_t N>
constexpr layout_gap find_gap(std::string_view class_name, std::size_t object_size, std::size_t prefix,
                              std::string_view prefix_name, const std::array<std::size_t, N>& offsets,
                              const std::array<std::size_t, N>& sizes,
                              const std::array<member_spec, N>& members) {
  layout_gap g;
  const std::size_t w = first_hole(object_size, prefix, offsets, sizes);
  if (w == no_hole) return g;
  g.found = true;
  // No range meets [w, w + 8): each ends at or before w, or starts at or after w + 8.
  std::string_view before = "the start of the class", after = "the end of the class";
  g.begin = 0;
  g.end = object_size;
  if (prefix != 0 && prefix <= w) {
    g.begin = prefix;
    before = prefix_name;
  }
  for (std::size_t i = 0; i < N; ++i) {
    const std::size_t lo = offsets[i], hi = offsets[i] + sizes[i];
    if (hi <= w && hi >= g.begin) {
      g.begin = hi;
      before = members[i].name;
    }
    if (lo >= w + 8 && lo < g.end) {
      g.end = lo;
      after = members[i].name;
    }
  }
  g.add(class_name);
  g.add(": ");
  g.add(g.end - g.begin);
  g.add(" unlisted bytes at offset ");
  g.add(g.begin);
  g.add(", between ");
  g.add(before);
  g.add(" and ");
  g.add(after);
  return g;
}

// The gap's text as a template argument (Length is g.length).
template <std::size_t Length>
constexpr fixed_string<Length + 1> gap_name(const layout_gap& g) {
  fixed_string<Length + 1> s;
  for (std::size_t i = 0; i < Length; ++i) s.chars[i] = g.text[i];
  return s;
}

template <fixed_string Where>
struct unlisted_bytes {
  static_assert(Where.view().empty(),
                "graphkeep: a described class has bytes that no listed member covers: the "
                "argument of gk::detail::unlisted_bytes above names the class, the listed members "
                "on either side of them, their offset and their size");
  static constexpr bool ok = true;
};

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
