// The run-time registry of dynamic types (for polymorphic members) and the
// error raised when a walk meets an unregistered one.
#include <graphkeep/registry/walk.h>

#include <cxxabi.h>

#include <cstdlib>
#include <mutex>
#include <typeindex>
#include <unordered_map>

namespace gk {
namespace {

struct DynamicTypes {
  std::mutex mu;
  std::unordered_map<std::type_index, const TypeOps*> by_type;
};

DynamicTypes& dynamic_types() {
  static DynamicTypes* d = new DynamicTypes();  // never destroyed: used from static initializers
  return *d;
}

}  // namespace

void register_dynamic_type(const TypeOps& ops) {
  DynamicTypes& d = dynamic_types();
  std::lock_guard<std::mutex> lock(d.mu);
  d.by_type[std::type_index(*ops.type)] = &ops;
}

const TypeOps* find_dynamic_type(const std::type_info& type) noexcept {
  DynamicTypes& d = dynamic_types();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.by_type.find(std::type_index(type));
  return it == d.by_type.end() ? nullptr : it->second;
}

std::vector<const TypeOps*> registered_dynamic_types() {
  DynamicTypes& d = dynamic_types();
  std::lock_guard<std::mutex> lock(d.mu);
  std::vector<const TypeOps*> out;
  out.reserve(d.by_type.size());
  for (const auto& [t, ops] : d.by_type) out.push_back(ops);
  return out;
}

std::string demangle(const char* mangled) {
  int status = 0;
  char* s = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string out = (status == 0 && s != nullptr) ? s : mangled;
  std::free(s);
  return out;
}

namespace detail {

void throw_unregistered_dynamic(const SlotPath& path, std::string_view owner,
                                const std::type_info& dynamic_type,
                                const std::type_info& static_type) {
  std::string dyn = demangle(dynamic_type.name());
  GK_THROW(DeclarationError, path.str(), " (a member of ", owner, ") points to a ", dyn,
                             ", which is not a registered dynamic type (the member's static type is ",
                             demangle(static_type.name()), "): describe ", dyn,
                             " with GRAPHKEEP_DESCRIBE_DERIVED and add GRAPHKEEP_REGISTER_TYPE(", dyn,
                             ") to the .cpp file that defines it");
}

}  // namespace detail
}  // namespace gk
