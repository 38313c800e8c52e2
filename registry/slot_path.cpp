#include <graphkeep/registry/slot_path.h>

namespace gk {

std::string SlotPath::str() const {
  std::string s = root_;
  for (const PathElem& e : elems_) {
    switch (e.kind) {
      case PathElem::Kind::member:
        if (!s.empty()) s += '.';
        s += e.name;
        break;
      case PathElem::Kind::element:
        s += '[';
        s += std::to_string(e.index);
        s += ']';
        break;
      case PathElem::Kind::key:
        s += '[';
        s += e.key;
        s += ']';
        break;
      case PathElem::Kind::base:
      case PathElem::Kind::deref:
      case PathElem::Kind::alternative:
      case PathElem::Kind::dynamic:
        break;
    }
  }
  return s;
}

void* SlotPath::resolve(void* root) const {
  void* p = root;
  for (const PathElem& e : elems_) {
    if (p == nullptr) return nullptr;
    p = e.resolve(p, e);
  }
  return p;
}

std::size_t SlotPath::broken_at(void* root) const {
  void* p = root;
  for (std::size_t i = 0; i < elems_.size(); ++i) {
    p = elems_[i].resolve(p, elems_[i]);
    if (p == nullptr) return i;
  }
  return elems_.size();
}

}  // namespace gk
