// graphkeep/registry/walk.h
//
// The generated visitors. For every registered type the registry instantiates
// one `walk` function from its descriptor; nobody writes per-class visiting
// code. A walk reports, in declaration order and through nested objects,
// containers and polymorphic members:
//   - every tensor location, with its path, role and owning type;
//   - every configuration value (a non-tensor member), so a reload can tell
//     whether PWAL changed a value that a captured kernel took by value;
//   - every opaque member, with its reason;
//   - every torch::nn::Module member (the engine walks modules itself).
//
// Usage (low level; most callers want gk::for_each_slot):
//
//   struct Printer : gk::Walker {
//     void tensor(const gk::SlotPath& p, const gk::RoleSpec& r, std::string_view owner,
//                 at::Tensor& t) override { std::cout << p.str() << "\n"; }
//   };
//   Printer w;
//   gk::ObjectRef::of(kernel).walk(w);
//
// Polymorphic members (std::unique_ptr<Base>, std::shared_ptr<Base>) are
// walked as their dynamic type, which must be registered at run time with
// GRAPHKEEP_REGISTER_TYPE; an unregistered dynamic type is a
// gk::DeclarationError that names it and the path.
#pragma once

#include <graphkeep/core/check.h>
#include <graphkeep/registry/reflect.h>
#include <graphkeep/registry/slot_path.h>

#include <boost/mp11/algorithm.hpp>
#include <boost/preprocessor/cat.hpp>

#include <cmath>
#include <concepts>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>

namespace gk {

// Type-erased operations on a configuration value (a non-tensor member).
struct ConfigOps {
  bool (*equal)(const void* a, const void* b);
  std::shared_ptr<const void> (*copy)(const void* v);
  void (*assign)(void* dst, const void* src);
  std::string (*repr)(const void* v);
};

struct ConfigRef {
  void* ptr = nullptr;
  const ConfigOps* ops = nullptr;  // nullptr: not comparable (not copyable or no ==)
};

class Walker;

// Type-erased operations of a registered type.
struct TypeOps {
  std::string_view name;
  const std::type_info* type;
  void (*walk)(void* obj, Walker& w);
};

// What a walk reports. Override the callbacks you need; `path()` is the
// location of the current callback.
class Walker {
 public:
  virtual ~Walker() = default;
  virtual void tensor(const SlotPath& path, const RoleSpec& role, std::string_view owner,
                      at::Tensor& t) = 0;
  virtual void config(const SlotPath& /*path*/, std::string_view /*owner*/, ConfigRef /*value*/) {}
  virtual void opaque(const SlotPath& /*path*/, std::string_view /*owner*/, std::string_view /*reason*/) {}
  virtual void module(const SlotPath& /*path*/, std::string_view /*owner*/) {}
  // A polymorphic member holds a dynamic type that is not registered. Return
  // true to skip it (a lint collector); the default raises gk::DeclarationError.
  virtual bool unregistered_dynamic(const SlotPath& /*path*/, std::string_view /*owner*/,
                                    const std::type_info& /*dynamic_type*/) {
    return false;
  }

  SlotPath& path() noexcept { return path_; }

 private:
  SlotPath path_;
};

// A registered object, type-erased.
struct ObjectRef {
  void* ptr = nullptr;
  const TypeOps* ops = nullptr;

  template <Registered T>
  static ObjectRef of(T& obj);
  void walk(Walker& w) const { ops->walk(ptr, w); }
  explicit operator bool() const noexcept { return ptr != nullptr && ops != nullptr; }
};

// The run-time registry of dynamic types, for polymorphic members.
void register_dynamic_type(const TypeOps& ops);
const TypeOps* find_dynamic_type(const std::type_info& type) noexcept;
std::vector<const TypeOps*> registered_dynamic_types();
std::string demangle(const char* mangled);

namespace detail {

template <class T>
struct PopGuard {
  Walker& w;
  ~PopGuard() { w.path().pop(); }
};

// --- configuration values --------------------------------------------------
template <class T>
bool config_equal(const void* a, const void* b) {
  const T& x = *static_cast<const T*>(a);
  const T& y = *static_cast<const T*>(b);
  if constexpr (std::is_floating_point_v<T>) {
    return x == y || (std::isnan(x) && std::isnan(y));
  } else {
    return static_cast<bool>(x == y);
  }
}

template <class T>
std::string config_repr(const void* v) {
  const T& x = *static_cast<const T*>(v);
  constexpr bool streamable = requires(std::ostream& os) { os << x; };
  constexpr bool string_like = std::is_convertible_v<const T&, std::string_view>;
  if constexpr (streamable && (string_like || !requires { x.begin(); })) {
    std::ostringstream os;
    os << x;
    return os.str();
  } else if constexpr (requires { x.begin(); x.end(); requires requires(std::ostream& os) { os << *x.begin(); }; }) {
    std::ostringstream os;
    os << "[";
    bool first = true;
    for (const auto& e : x) {
      os << (first ? "" : ", ") << e;
      first = false;
    }
    os << "]";
    return os.str();
  } else {
    return "<" + demangle(typeid(T).name()) + ">";
  }
}

template <class T>
const ConfigOps* config_ops() {
  if constexpr (std::copy_constructible<T> && std::is_copy_assignable_v<T> &&
                std::equality_comparable<T>) {
    static const ConfigOps ops{
        &config_equal<T>,
        [](const void* v) -> std::shared_ptr<const void> {
          return std::make_shared<const T>(*static_cast<const T*>(v));
        },
        [](void* dst, const void* src) { *static_cast<T*>(dst) = *static_cast<const T*>(src); },
        &config_repr<T>};
    return &ops;
  } else {
    return nullptr;
  }
}

// --- resolve functions, one instantiation per step kind and type ------------
template <class T, std::size_t I>
void* resolve_member(void* p, const PathElem&) {
  auto& m = reflect<T>::template get<I>(*static_cast<T*>(p));
  return const_cast<void*>(static_cast<const void*>(std::addressof(m)));
}
template <class D, class B>
void* resolve_base(void* p, const PathElem&) {
  return static_cast<B*>(static_cast<D*>(p));
}
template <class O>
void* resolve_deref(void* p, const PathElem&) {
  auto& o = *static_cast<O*>(p);
  if (!o) return nullptr;
  return const_cast<void*>(static_cast<const void*>(std::addressof(*o)));
}
template <class O, class E>
void* resolve_dynamic(void* p, const PathElem& self) {
  auto& o = *static_cast<O*>(p);
  E* e = o.get();
  if (e == nullptr || typeid(*e) != *self.type) return nullptr;
  return dynamic_cast<void*>(e);
}
template <class S>
void* resolve_element(void* p, const PathElem& self) {
  auto& s = *static_cast<S*>(p);
  if (self.index >= std::size(s)) return nullptr;
  return const_cast<void*>(static_cast<const void*>(std::addressof(s[self.index])));
}
template <class Tup, std::size_t I>
void* resolve_tuple_element(void* p, const PathElem&) {
  return std::addressof(std::get<I>(*static_cast<Tup*>(p)));
}
template <class V, std::size_t I>
void* resolve_alternative(void* p, const PathElem&) {
  auto& v = *static_cast<V*>(p);
  return v.index() == I ? std::addressof(std::get<I>(v)) : nullptr;
}

template <class K>
std::string key_string(const K& k) {
  if constexpr (std::is_same_v<K, std::string>) {
    return k;
  } else if constexpr (std::is_enum_v<K>) {
    return std::to_string(static_cast<std::underlying_type_t<K>>(k));
  } else {
    return std::to_string(k);
  }
}
template <class Map>
void* resolve_key(void* p, const PathElem& self) {
  auto& m = *static_cast<Map*>(p);
  for (auto& [k, v] : m)
    if (key_string(k) == self.key) return std::addressof(v);
  return nullptr;
}

[[noreturn]] void throw_unregistered_dynamic(const SlotPath& path, std::string_view owner,
                                            const std::type_info& dynamic_type,
                                            const std::type_info& static_type);

// --- the walk ---------------------------------------------------------------
template <class T>
void walk_object(T& obj, Walker& w);

template <class M>
void walk_value(M& v, const RoleSpec& role, std::string_view owner, Walker& w) {
  using T = std::remove_cv_t<M>;
  if constexpr (std::is_same_v<T, at::Tensor>) {
    w.tensor(w.path(), role, owner, v);
  } else if constexpr (tensor_slot_type<T>) {
    w.tensor(w.path(), role.has_role() ? role : T::spec, owner, static_cast<at::Tensor&>(v));
  } else if constexpr (registered<T>) {
    walk_object(v, w);
  } else if constexpr (module_type<T>) {
    w.module(w.path(), owner);
  } else if constexpr (!classify<T>().visitable) {
    // configuration inside a container of visitable alternatives: nothing to report
  } else if constexpr (optional_like<T>::value) {
    using E = typename optional_like<T>::element;
    if (!v) return;
    if constexpr (std::is_polymorphic_v<E> && registered<E> && !std::is_same_v<T, std::optional<E>>) {
      E* e = v.get();
      const std::type_info& dyn = typeid(*e);
      const TypeOps* ops = dyn == typeid(E) ? nullptr : find_dynamic_type(dyn);
      if (dyn != typeid(E) && ops == nullptr) {
        if (w.unregistered_dynamic(w.path(), owner, dyn)) return;
        throw_unregistered_dynamic(w.path(), owner, dyn, typeid(E));
      }
      w.path().push({.kind = PathElem::Kind::dynamic, .type = &dyn, .resolve = &resolve_dynamic<T, E>});
      PopGuard<T> guard{w};
      if (ops == nullptr)
        walk_object(*e, w);
      else
        ops->walk(dynamic_cast<void*>(e), w);
    } else {
      w.path().push({.kind = PathElem::Kind::deref, .resolve = &resolve_deref<T>});
      PopGuard<T> guard{w};
      walk_value(*v, role, owner, w);
    }
  } else if constexpr (sequence_like<T>::value) {
    for (std::size_t i = 0; i < std::size(v); ++i) {
      w.path().push({.kind = PathElem::Kind::element, .index = i, .resolve = &resolve_element<T>});
      PopGuard<T> guard{w};
      walk_value(v[i], role, owner, w);
    }
  } else if constexpr (map_like<T>::value) {
    for (auto& [k, e] : v) {
      w.path().push({.kind = PathElem::Kind::key, .key = key_string(k), .resolve = &resolve_key<T>});
      PopGuard<T> guard{w};
      walk_value(e, role, owner, w);
    }
  } else if constexpr (variant_like<T>::value) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if (v.index() != I) return;
            w.path().push({.kind = PathElem::Kind::alternative, .index = I,
                           .resolve = &resolve_alternative<T, I>});
            PopGuard<T> guard{w};
            walk_value(std::get<I>(v), role, owner, w);
          }(),
          ...);
    }(std::make_index_sequence<std::variant_size_v<T>>{});
  } else if constexpr (tuple_like<T>::value) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            w.path().push({.kind = PathElem::Kind::element, .index = I,
                           .resolve = &resolve_tuple_element<T, I>});
            PopGuard<T> guard{w};
            walk_value(std::get<I>(v), role, owner, w);
          }(),
          ...);
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else {
    static_assert(sizeof(T) == 0, "graphkeep: internal: walk_value reached an unclassified type");
  }
}

template <class T, std::size_t I>
void walk_member(T& obj, Walker& w) {
  using R = reflect<T>;
  using M = typename R::template member_type<I>;
  constexpr member_spec spec = R::members[I];
  auto& m = R::template get<I>(obj);
  w.path().push({.kind = PathElem::Kind::member, .name = spec.name, .resolve = &resolve_member<T, I>});
  PopGuard<T> guard{w};
  if constexpr (spec.role.role == Role::opaque) {
    w.opaque(w.path(), R::name, spec.role.reason);
  } else if constexpr (module_type<M>) {
    w.module(w.path(), R::name);
  } else if constexpr (!classify<M>().visitable) {
    w.config(w.path(), R::name, ConfigRef{const_cast<void*>(static_cast<const void*>(&m)),
                                          config_ops<std::remove_cv_t<M>>()});
  } else {
    walk_value(m, spec.role, R::name, w);
  }
}

template <class T>
void walk_object(T& obj, Walker& w) {
  using R = reflect<T>;
  boost::mp11::mp_for_each<boost::mp11::mp_transform<std::add_pointer_t, typename R::bases>>(
      [&](auto* base_tag) {
        using B = std::remove_pointer_t<decltype(base_tag)>;
        if constexpr (registered<B>) {
          w.path().push({.kind = PathElem::Kind::base, .name = reflect<B>::name,
                         .resolve = &resolve_base<T, B>});
          PopGuard<T> guard{w};
          walk_object(static_cast<B&>(obj), w);
        }
      });
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (walk_member<T, I>(obj, w), ...);
  }(std::make_index_sequence<R::size>{});
}

template <class T>
void walk_erased(void* obj, Walker& w) {
  walk_object(*static_cast<T*>(obj), w);
}

}  // namespace detail

// The type-erased operations of registered type T (one static instance).
template <Registered T>
const TypeOps& type_ops() {
  static const TypeOps ops{reflect<T>::name, &typeid(T), &detail::walk_erased<T>};
  return ops;
}

template <Registered T>
ObjectRef ObjectRef::of(T& obj) {
  return {std::addressof(obj), &type_ops<T>()};
}

// Walks a registered object with a walker.
template <Registered T>
void walk(T& obj, Walker& w) {
  detail::walk_object(obj, w);
}

namespace detail {
template <Registered T>
struct dynamic_registrar {
  dynamic_registrar() { register_dynamic_type(type_ops<T>()); }
};
}  // namespace detail

}  // namespace gk

// Registers T as a dynamic type, so a polymorphic member (a unique_ptr or
// shared_ptr to a registered base) holding a T is walked as a T. Place it in
// the .cpp file that defines T's out-of-line members, so the registration is
// linked whenever T is used.
#define GRAPHKEEP_REGISTER_TYPE(T)                                                        \
  [[maybe_unused]] static const ::gk::detail::dynamic_registrar<T> BOOST_PP_CAT(          \
      gk_dynamic_registrar_, __COUNTER__) {}
