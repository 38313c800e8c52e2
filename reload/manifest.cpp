// The capture manifest (see manifest.h).
#include <graphkeep/core/check.h>
#include <graphkeep/reload/manifest.h>

#include <algorithm>
#include <set>

#include "reload_internal.h"

#include <torch/nn/module.h>

#include <map>
#include <sstream>
#include <string>
#include <utility>

namespace gk {

std::string_view to_string(AddressClass c) noexcept {
  switch (c) {
    case AddressClass::slot: return "slot";
    case AddressClass::pool: return "pool";
    case AddressClass::static_io: return "static_io";
    case AddressClass::library: return "library";
    case AddressClass::unknown: return "unknown";
    case AddressClass::unstable: return "unstable";
  }
  return "?";
}

std::string_view to_string(VerifyIssue::Kind k) noexcept {
  switch (k) {
    case VerifyIssue::Kind::moved: return "moved";
    case VerifyIssue::Kind::expired: return "expired";
    case VerifyIssue::Kind::unknown: return "unknown";
  }
  return "?";
}

std::size_t VerifyResult::count(VerifyIssue::Kind k) const noexcept {
  std::size_t n = 0;
  for (const auto& i : issues) n += i.kind == k ? 1 : 0;
  return n;
}

std::string VerifyResult::describe(std::size_t max_lines) const {
  std::ostringstream os;
  os << checked << " address(es) checked: " << count(VerifyIssue::Kind::moved) << " moved, "
     << count(VerifyIssue::Kind::expired) << " expired, " << count(VerifyIssue::Kind::unknown) << " unknown";
  for (std::size_t i = 0; i < issues.size() && i < max_lines; ++i) {
    const VerifyIssue& v = issues[i];
    os << "\n  " << to_string(v.kind) << ": " << v.graph << " node " << v.node_index << " (" << v.node << ") address 0x"
       << std::hex << v.address << std::dec;
    if (!v.owner.empty()) os << " in " << v.owner;
    if (!v.detail.empty()) os << ": " << v.detail;
  }
  if (issues.size() > max_lines) os << "\n  ... " << issues.size() - max_lines << " more";
  return os.str();
}

std::size_t CaptureManifest::count(AddressClass c) const noexcept {
  std::size_t n = 0;
  for (const auto& e : entries_) n += e.cls == c ? 1 : 0;
  return n;
}

std::size_t CaptureManifest::count_raw_unknown() const noexcept {
  std::size_t n = 0;
  for (const auto& e : entries_) n += e.cls == AddressClass::unknown && e.reachable == SIZE_MAX;
  return n;
}

std::size_t CaptureManifest::mark_unstable(const CaptureManifest& other) {
  auto same = [](const CapturedAddress& a, const CapturedAddress& b) {
    return a.address == b.address && a.param == b.param && a.byte_offset == b.byte_offset && a.node_name == b.node_name;
  };
  std::vector<const CapturedAddress*> theirs;  // other's raw unknown words
  for (const ManifestEntry& o : other.entries_)
    if (o.cls == AddressClass::unknown && o.reachable == SIZE_MAX) theirs.push_back(&o.use);
  std::size_t n = 0;
  for (ManifestEntry& e : entries_) {
    if (e.cls != AddressClass::unknown || e.reachable != SIZE_MAX) continue;
    const bool repeated =
        std::any_of(theirs.begin(), theirs.end(), [&](const CapturedAddress* o) { return same(*o, e.use); });
    if (!repeated) {
      e.cls = AddressClass::unstable;
      ++n;
    }
  }
  index_entries();
  return n;
}

std::size_t CaptureManifest::mark_unstable_if_free(const ReplayBackend& graph) {
  std::vector<std::size_t> index;
  std::vector<std::uintptr_t> addresses;
  for (std::size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].cls == AddressClass::unknown && entries_[i].reachable == SIZE_MAX) {
      index.push_back(i);
      addresses.push_back(entries_[i].use.address);
    }
  if (index.empty()) return 0;
  const std::vector<bool> live = graph.in_live_allocation(addresses);
  GK_INTERNAL_ASSERT(live.size() == addresses.size(), "in_live_allocation returned ", live.size(), " answers for ",
                     addresses.size(), " addresses");
  std::size_t n = 0;
  for (std::size_t k = 0; k < index.size(); ++k)
    if (!live[k]) {
      entries_[index[k]].cls = AddressClass::unstable;
      ++n;
    }
  index_entries();
  return n;
}

void CaptureManifest::index_entries() {
  slots_used_.clear();
  unknown_entries_.clear();
  std::set<std::pair<std::size_t, std::size_t>> seen;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const ManifestEntry& e = entries_[i];
    if (e.cls == AddressClass::slot && seen.emplace(e.layer, e.slot).second) slots_used_.emplace_back(e.layer, e.slot);
    if (e.cls == AddressClass::unknown) unknown_entries_.push_back(i);
  }
}

std::vector<std::string> CaptureManifest::undeclared() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) {
    if (e.cls != AddressClass::unknown) continue;
    std::string s = concat("node ", e.use.node, " (", e.use.node_name, "): ");
    if (e.reachable != SIZE_MAX) {
      const ReachableTensor& r = reachable_[e.reachable];
      s += concat("address in tensor ", r.path, " (role ", to_string(r.role.role),
               r.role.reason.empty() ? "" : concat(": ", r.role.reason), ")");
    } else {
      s += "address in no tensor the collector reaches";
    }
    out.push_back(std::move(s));
  }
  return out;
}

namespace {
bool in_any(const std::vector<StaticBuffer>& bufs, std::uintptr_t a, const StaticBuffer** hit) {
  for (const auto& b : bufs)
    if (a >= b.begin && a < b.end) {
      *hit = &b;
      return true;
    }
  return false;
}
}  // namespace

CaptureManifest CaptureManifest::record(const ReplayBackend& graph, const SlotPlan& plan,
                                        const std::vector<StaticBuffer>& io, std::vector<ReachableTensor> reachable,
                                        const std::vector<AddressRange>& allowed) {
  std::vector<StaticBuffer> library = graph.library_ranges();
  library.insert(library.end(), allowed.begin(), allowed.end());
  GK_CHECK(StateError, graph.captured(), "graph '", graph.name(), "' has not been captured yet");
  CaptureManifest m;
  m.graph_ = graph.name();
  m.backend_ = &graph;
  m.reachable_ = std::move(reachable);
  for (const CapturedAddress& a : graph.addresses()) {
    ManifestEntry e;
    e.use = a;
    const StaticBuffer* buf = nullptr;
    if (auto owner = plan.find_owner(a.address)) {
      e.cls = AddressClass::slot;
      e.owner = owner->slot->name;
      e.layer = static_cast<std::size_t>(owner->layer - plan.layers().data());
      e.slot = static_cast<std::size_t>(owner->slot - owner->layer->slots.data());
      e.captured_storage = owner->slot->storage_begin();
    } else if (in_any(io, a.address, &buf)) {
      e.cls = AddressClass::static_io;
      e.owner = buf->name;
    } else if (in_any(library, a.address, &buf)) {
      e.cls = AddressClass::library;
      e.owner = buf->name;
    } else if (graph.in_private_pool(a.address)) {
      e.cls = AddressClass::pool;
    } else {
      e.cls = AddressClass::unknown;
      for (std::size_t i = 0; i < m.reachable_.size(); ++i)
        if (a.address >= m.reachable_[i].begin && a.address < m.reachable_[i].end) {
          e.reachable = i;
          e.owner = m.reachable_[i].path;
          break;
        }
    }
    m.entries_.push_back(std::move(e));
  }
  m.index_entries();
  return m;
}

// Note [Verify once per slot]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A graph reads one slot from many nodes (a weight from every batch size's
// GEMM, a ring buffer from every op), and an engine's graphs all read the same
// slots: 35 decode graphs at 8B shapes hold 300k slot entries over ~800
// slots. Whether a slot's fields still point at its captured storage does not
// depend on the entry, so it is decided once per slot (resolving its paths
// and the slots sharing its storage: SlotVerdicts), shared by every graph the
// engine verifies, and each manifest visits its distinct slots
// (slots_used_), not its entries. Entries are walked only to report a slot
// that moved, and for the unknown entries, each checked on its own.
CaptureManifest::SlotVerdicts::SlotVerdicts(const SlotPlan& plan) : plan_(plan) {
  std::size_t n = 0;
  combined_.resize(plan.layers().size());
  own_.resize(plan.layers().size());
  for (std::size_t l = 0; l < combined_.size(); ++l) {
    combined_[l].assign(plan.layers()[l].slots.size(), nullptr);
    own_[l].assign(plan.layers()[l].slots.size(), nullptr);
    n += plan.layers()[l].slots.size();
  }
  reasons_.reserve(n);
}

const std::string& CaptureManifest::SlotVerdicts::own(std::size_t layer, std::size_t slot) {
  const std::string*& v = own_[layer][slot];
  if (v != nullptr) return *v;
  const LayerPlan& lp = plan_.layers()[layer];
  const PlannedSlot& s = lp.slots[slot];
  const void* captured = s.captured.storage().unsafeGetStorageImpl();
  auto points_elsewhere = [&](const at::Tensor* t) {
    return t == nullptr || !t->defined() || !t->has_storage() || t->storage().unsafeGetStorageImpl() != captured;
  };
  std::string why;
  if (s.kind != PlannedSlot::Kind::declared) {
    const at::Tensor t = detail::module_tensor(*lp.module, s);
    if (points_elsewhere(&t)) why = "the module's tensor now uses other storage; the graph still reads the captured one";
  }
  for (std::size_t a = 0; why.empty() && a < s.paths.size(); ++a) {
    at::Tensor* f = s.paths[a].resolve_tensor(lp.root.ptr);
    if (points_elsewhere(f))
      why = concat(lp.full_name(s.paths[a].str()), f == nullptr ? " no longer resolves" : " now points at other storage",
                   "; the graph still reads the captured storage (stale values)");
  }
  if (why.empty()) return *(v = &ok_);
  reasons_.push_back(std::move(why));
  return *(v = &reasons_.back());
}

const std::string& CaptureManifest::SlotVerdicts::combined(std::size_t layer, std::size_t slot) {
  GK_INTERNAL_ASSERT(layer < combined_.size() && slot < combined_[layer].size(),
                     "a manifest refers to a slot the plan no longer has");
  const std::string*& v = combined_[layer][slot];
  if (v != nullptr) return *v;
  // Any slot viewing the same storage counts: a view whose field moved no
  // longer describes what the graph reads (conservative, fail-closed).
  v = &own(layer, slot);
  plan_.for_each_sharing_storage(plan_.layers()[layer].slots[slot], [&](std::size_t l, std::size_t s) {
    if (v->empty() && (l != layer || s != slot)) v = &own(l, s);
  });
  return *v;
}

VerifyResult CaptureManifest::verify(const SlotPlan& plan) const {
  SlotVerdicts cache(plan);
  return verify(plan, cache);
}

VerifyResult CaptureManifest::verify(const SlotPlan& plan, SlotVerdicts& cache) const {
  VerifyResult r;
  r.checked = entries_.size();
  auto issue = [&](VerifyIssue::Kind k, const ManifestEntry& e, std::string detail) {
    r.issues.push_back(VerifyIssue{k, graph_, e.use.node_name, e.use.node, e.owner, e.use.address, std::move(detail)});
  };
  for (const auto& [layer, slot] : slots_used_) {
    const std::string& verdict = cache.combined(layer, slot);
    if (verdict.empty()) continue;
    for (const ManifestEntry& e : entries_)
      if (e.cls == AddressClass::slot && e.layer == layer && e.slot == slot) issue(VerifyIssue::Kind::moved, e, verdict);
  }
  // An unknown entry is reported again with what its tensor became.
  auto check_unknown = [&](const ManifestEntry& e) {
    if (e.reachable == SIZE_MAX)
      return issue(VerifyIssue::Kind::unknown, e, "address in no declared slot, pool or buffer (an undeclared tensor)");
    const ReachableTensor& rt = reachable_[e.reachable];
    c10::intrusive_ptr<c10::StorageImpl> alive = rt.storage.lock();
    if (!alive) return issue(VerifyIssue::Kind::expired, e, "its storage has been freed; the graph reads freed memory");
    at::Tensor now = rt.resolve ? rt.resolve() : at::Tensor();
    if (!now.defined() || !now.has_storage() || now.storage().unsafeGetStorageImpl() != alive.get())
      return issue(VerifyIssue::Kind::moved, e,
                   concat(rt.path, " now points at other storage; the graph still reads the old one (stale values)"));
    issue(VerifyIssue::Kind::unknown, e,
          concat("undeclared tensor ", rt.path, " (role ", to_string(rt.role.role),
                 rt.role.reason.empty() ? "" : concat(": ", rt.role.reason), "): declare it with a graph-visible role"));
  };
  for (std::size_t i : unknown_entries_) check_unknown(entries_[i]);
  // Issues in entry order, as a reader of the graph expects them.
  std::stable_sort(r.issues.begin(), r.issues.end(),
                   [](const VerifyIssue& a, const VerifyIssue& b) { return a.node_index < b.node_index; });
  return r;
}

}  // namespace gk
