// graphkeep/registry/member_kind.h
//
// Compile-time classification of a member's type: does it hold tensors, is it
// a registered object graphkeep can walk into, or is it something whose
// contents graphkeep cannot see (a callable, a raw pointer, a foreign class)?
//
// The registry's fail-closed checks are built on `classify<M>()`. A type is
// one of:
//   tensor           at::Tensor (needs a role) or a gk::TensorSlot (has one)
//   registered       a class described with GRAPHKEEP_DESCRIBE or an aggregate
//                    named with GRAPHKEEP_AGGREGATE: walked into
//   module           a torch::nn::Module or ModuleHolder: its parameters and
//                    buffers belong to the module tree, which the reload
//                    engine walks itself
//   tensor_free      configuration: arithmetic, enums, strings, devices,
//                    dtypes, and containers or aggregates of those
// and containers (optional, unique_ptr, shared_ptr, vector, array, map,
// variant) of them. Anything else is an error with a code that the
// descriptor macros turn into a message naming the class and the member.
//
// Extend the configuration whitelist for a class type that holds no tensor:
//
//   template <> struct gk::tensor_free_type<my::Config> : std::true_type {};
#pragma once

#include <graphkeep/registry/role.h>

#include <boost/pfr/core.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::detail {
struct ModuleHolderIndicator;
}

namespace gk {

// Specialize to true for a class type that holds no tensor and no device
// address, so it may be a plain member of a registered class.
template <class T>
struct tensor_free_type : std::false_type {};

template <> struct tensor_free_type<std::string> : std::true_type {};
template <> struct tensor_free_type<std::string_view> : std::true_type {};
template <> struct tensor_free_type<c10::Device> : std::true_type {};
template <> struct tensor_free_type<c10::TensorOptions> : std::true_type {};
template <> struct tensor_free_type<c10::Scalar> : std::true_type {};
template <class R, class P> struct tensor_free_type<std::chrono::duration<R, P>> : std::true_type {};
template <class T> struct tensor_free_type<std::atomic<T>> : std::is_arithmetic<T> {};

namespace detail {

// Converts only to a proper base class of T: T{base_probe<T>{}} compiles
// exactly when T is an aggregate whose first element is a base class.
// Boost.PFR cannot reflect such a type (its own error, "Inherited types are
// not supported", comes with a dozen more and names no member), so
// graphkeep checks this first and says what to do.
template <class T>
struct base_probe {
  template <class B, std::enable_if_t<std::is_base_of_v<B, T> && !std::is_same_v<B, T>, int> = 0>
  constexpr operator B&() const noexcept;
  template <class B, std::enable_if_t<std::is_base_of_v<B, T> && !std::is_same_v<B, T>, int> = 0>
  constexpr operator B&&() const noexcept;
};
template <class T>
constexpr bool aggregate_has_base() {
  if constexpr (!std::is_aggregate_v<T>)
    return false;
  else
    return requires { T{base_probe<T>{}}; };
}
// boost::pfr::tuple_size_v<T>, or `otherwise` for a type PFR cannot reflect
// (an aggregate with a base), without instantiating PFR's diagnostics for it.
template <class T, std::size_t otherwise = 0>
constexpr std::size_t pfr_field_count() {
  if constexpr (aggregate_has_base<T>())
    return otherwise;
  else
    return boost::pfr::tuple_size_v<T>;
}


// Why a member type is rejected. The descriptor macros map each code to a
// static_assert message that names the class, the member and the fix.
enum class member_error : std::uint8_t {
  ok,
  tensor_without_role,  // see tensor_holder_kind for what the member is
  role_on_non_tensor,
  role_twice,
  workspace_without_init,
  reason_missing,
  opaque_on_tensor,
  mixed_tensor_roles,
  unregistered_tensor_holder,
  callable,
  raw_pointer,
  reference,
  unknown_class,
  unsupported_map_key,
  derivation_on_non_derived,
};

// ---------------------------------------------------------------------------
// Registration detection
// ---------------------------------------------------------------------------
// GRAPHKEEP_DESCRIBE and GRAPHKEEP_AGGREGATE define `gk_reflect(T*)`, found by
// argument-dependent lookup; its result names the exact type it describes, so
// an undescribed class deriving from a described one is not "registered".
void gk_reflect() = delete;

template <class T>
concept registered = requires {
  typename decltype(gk_reflect(static_cast<T*>(nullptr)))::type;
  requires std::is_same_v<typename decltype(gk_reflect(static_cast<T*>(nullptr)))::type, T>;
};

template <class T>
concept tensor_slot_type = std::is_base_of_v<at::Tensor, T> && requires {
  { T::spec } -> std::convertible_to<RoleSpec>;
};

template <class T>
concept module_type = std::is_base_of_v<torch::nn::Module, T> ||
                      std::is_base_of_v<torch::detail::ModuleHolderIndicator, T>;

template <class T> struct is_std_function : std::false_type {};
template <class S> struct is_std_function<std::function<S>> : std::true_type {};

template <class T>
concept call_operator = requires { &T::operator(); };

// ---------------------------------------------------------------------------
// Container shapes graphkeep walks through
// ---------------------------------------------------------------------------
template <class T> struct optional_like : std::false_type {};  // 0 or 1 element
template <class E> struct optional_like<std::optional<E>> : std::true_type { using element = E; };
template <class E, class D> struct optional_like<std::unique_ptr<E, D>> : std::true_type { using element = E; };
template <class E> struct optional_like<std::shared_ptr<E>> : std::true_type { using element = E; };

template <class T> struct sequence_like : std::false_type {};  // indexed elements
template <class E, class A> struct sequence_like<std::vector<E, A>> : std::true_type { using element = E; };
template <class E, class A> struct sequence_like<std::deque<E, A>> : std::true_type { using element = E; };
template <class E, std::size_t N> struct sequence_like<std::array<E, N>> : std::true_type { using element = E; };
template <class E, std::size_t N> struct sequence_like<E[N]> : std::true_type { using element = E; };

template <class T> struct map_like : std::false_type {};  // keyed elements
template <class K, class E, class C, class A>
struct map_like<std::map<K, E, C, A>> : std::true_type { using key = K; using element = E; };
template <class K, class E, class H, class Q, class A>
struct map_like<std::unordered_map<K, E, H, Q, A>> : std::true_type { using key = K; using element = E; };

template <class T> struct variant_like : std::false_type {};
template <class... Es> struct variant_like<std::variant<Es...>> : std::true_type {};

template <class T, template <class...> class Tmpl>
inline constexpr bool is_instance_of = false;
template <template <class...> class Tmpl, class... As>
inline constexpr bool is_instance_of<Tmpl<As...>, Tmpl> = true;

template <class T> struct tuple_like : std::false_type {};
template <class A, class B> struct tuple_like<std::pair<A, B>> : std::true_type {};
template <class... Es> struct tuple_like<std::tuple<Es...>> : std::true_type {};

template <class K>
inline constexpr bool supported_map_key =
    std::is_same_v<K, std::string> || std::is_integral_v<K> || std::is_enum_v<K>;

// ---------------------------------------------------------------------------
// classify<M>()
// ---------------------------------------------------------------------------
struct member_kind {
  bool tensors = false;     // reaches at::Tensor values directly (not via a registered object)
  bool visitable = false;   // reaches tensors or registered objects
  bool plain = false;       // reaches a plain at::Tensor (no role in its type)
  RoleSpec typed_role{};    // the role carried by a gk::TensorSlot type, if any
  member_error error = member_error::ok;
};

constexpr member_kind merge(member_kind a, const member_kind& b) {
  a.tensors = a.tensors || b.tensors;
  a.visitable = a.visitable || b.visitable;
  a.plain = a.plain || b.plain;
  if (!a.typed_role.has_role()) a.typed_role = b.typed_role;
  if (a.error == member_error::ok) a.error = b.error;
  return a;
}

template <class M>
constexpr member_kind classify();

template <class T, std::size_t... I>
constexpr member_kind classify_pfr_fields(std::index_sequence<I...>) {
  member_kind k{};
  ((k = merge(k, classify<boost::pfr::tuple_element_t<I, T>>())), ...);
  return k;
}

template <class... Es>
constexpr member_kind classify_all() {
  member_kind k{};
  ((k = merge(k, classify<Es>())), ...);
  return k;
}

template <class T> struct classify_alternatives;
template <class... Es> struct classify_alternatives<std::variant<Es...>> {
  static constexpr member_kind value = classify_all<Es...>();
};
template <class A, class B> struct classify_alternatives<std::pair<A, B>> {
  static constexpr member_kind value = classify_all<A, B>();
};
template <class... Es> struct classify_alternatives<std::tuple<Es...>> {
  static constexpr member_kind value = classify_all<Es...>();
};

template <class M>
constexpr member_kind classify() {
  using T = std::remove_cv_t<M>;
  if constexpr (std::is_reference_v<T>) {
    return {.error = member_error::reference};
  } else if constexpr (std::is_same_v<T, at::Tensor>) {
    return {.tensors = true, .visitable = true, .plain = true};
  } else if constexpr (tensor_slot_type<T>) {
    return {.tensors = true, .visitable = true, .typed_role = T::spec};
  } else if constexpr (registered<T>) {
    return {.visitable = true};
  } else if constexpr (module_type<T>) {
    return {};  // walked by the reload engine through the module tree
  } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T> || tensor_free_type<T>::value ||
                       std::is_member_pointer_v<T> || std::is_same_v<T, std::nullptr_t>) {
    return {};
  } else if constexpr (std::is_pointer_v<T>) {
    return {.error = member_error::raw_pointer};
  } else if constexpr (is_std_function<T>::value) {
    return {.error = member_error::callable};
  } else if constexpr (optional_like<T>::value) {
    return classify<typename optional_like<T>::element>();
  } else if constexpr (sequence_like<T>::value) {
    return classify<typename sequence_like<T>::element>();
  } else if constexpr (map_like<T>::value) {
    member_kind k = classify<typename map_like<T>::element>();
    if (!supported_map_key<std::remove_cv_t<typename map_like<T>::key>> && k.visitable &&
        k.error == member_error::ok)
      k.error = member_error::unsupported_map_key;
    return k;
  } else if constexpr (variant_like<T>::value || tuple_like<T>::value) {
    return classify_alternatives<T>::value;
  } else if constexpr (std::is_class_v<T> && call_operator<T>) {
    return {.error = member_error::callable};  // a lambda or functor: captures are invisible
  } else if constexpr (std::is_class_v<T> && std::is_aggregate_v<T> && !aggregate_has_base<T>()) {
    // An unregistered aggregate: look inside with Boost.PFR. Configuration
    // structs pass; one that reaches a tensor must be registered.
    member_kind k = classify_pfr_fields<T>(std::make_index_sequence<boost::pfr::tuple_size_v<T>>{});
    if (k.error != member_error::ok) return k;
    if (k.visitable) return {.error = member_error::unregistered_tensor_holder};
    return {};
  } else if constexpr (std::is_class_v<T> && std::is_empty_v<T>) {
    return {};  // tag types, stateless policies
  } else {
    return {.error = member_error::unknown_class};
  }
}

// What a member with member_error::tensor_without_role is: a bare at::Tensor
// or a container of tensors, by its outermost template, so the message can say
// "is a std::vector of at::Tensor with no role".
enum class tensor_holder : std::uint8_t {
  tensor,  // at::Tensor itself
  vector,
  deque,
  array,    // std::array
  c_array,  // T[N]
  optional,
  unique_ptr,
  shared_ptr,
  map,
  unordered_map,
  variant,
  pair,
  tuple,
};

template <class M>
constexpr tensor_holder tensor_holder_kind() {
  using T = std::remove_cv_t<M>;
  if constexpr (std::is_array_v<T>) return tensor_holder::c_array;
  else if constexpr (is_instance_of<T, std::vector>) return tensor_holder::vector;
  else if constexpr (is_instance_of<T, std::deque>) return tensor_holder::deque;
  else if constexpr (sequence_like<T>::value) return tensor_holder::array;
  else if constexpr (is_instance_of<T, std::optional>) return tensor_holder::optional;
  else if constexpr (is_instance_of<T, std::unique_ptr>) return tensor_holder::unique_ptr;
  else if constexpr (is_instance_of<T, std::shared_ptr>) return tensor_holder::shared_ptr;
  else if constexpr (is_instance_of<T, std::map>) return tensor_holder::map;
  else if constexpr (is_instance_of<T, std::unordered_map>) return tensor_holder::unordered_map;
  else if constexpr (is_instance_of<T, std::variant>) return tensor_holder::variant;
  else if constexpr (is_instance_of<T, std::pair>) return tensor_holder::pair;
  else if constexpr (is_instance_of<T, std::tuple>) return tensor_holder::tuple;
  else return tensor_holder::tensor;
}

// The verdict on one member: its type, and the role its descriptor gave it.
template <class M>
constexpr member_error check_member(RoleSpec declared) {
  constexpr member_kind k = classify<M>();
  if (declared.role == Role::opaque) {
    // Opaque hides a member from every walk: never one that provably reaches
    // tensors (directly, through a registered type, or through an
    // unregistered struct that holds them).
    if (k.tensors || k.visitable || k.error == member_error::unregistered_tensor_holder)
      return member_error::opaque_on_tensor;
    return declared.reason.empty() ? member_error::reason_missing : member_error::ok;
  }
  if (k.error != member_error::ok) return k.error;
  RoleSpec role = declared;
  if (k.typed_role.has_role()) {
    if (declared.has_role()) return member_error::role_twice;
    // A plain at::Tensor next to a gk::TensorSlot (std::pair<gk::Scale,
    // at::Tensor>) would be walked with no role, and no descriptor role can
    // reach it without clashing with the typed one.
    if (k.plain) return member_error::mixed_tensor_roles;
    role = k.typed_role;
  }
  if (k.tensors) {
    if (!role.has_role()) return member_error::tensor_without_role;
  } else if (role.has_role()) {
    return member_error::role_on_non_tensor;
  }
  if (role.role == Role::workspace && role.init == Init::unspecified)
    return member_error::workspace_without_init;
  if (role.role == Role::not_graph_visible && role.reason.empty())
    return member_error::reason_missing;
  if (role.derive != Derive::undeclared && !role.derived()) return member_error::derivation_on_non_derived;
  return member_error::ok;
}

constexpr RoleSpec to_spec(RoleSpec s) noexcept { return s; }

}  // namespace detail
}  // namespace gk
