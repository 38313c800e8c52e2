// The capture manifest (see manifest.h).
#include <graphkeep/core/check.h>
#include <graphkeep/reload/manifest.h>

#include <algorithm>

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
  return n;
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
  return m;
}

VerifyResult CaptureManifest::verify(const SlotPlan& plan) const {
  VerifyResult r;
  auto issue = [&](VerifyIssue::Kind k, const ManifestEntry& e, std::string detail) {
    r.issues.push_back(VerifyIssue{k, graph_, e.use.node_name, e.use.node, e.owner, e.use.address, std::move(detail)});
  };
  // Note [Verify once per slot]: a graph reads one slot from many nodes (a
  // weight from every batch size's GEMM, a ring buffer from every op). The
  // slot's fields are resolved once per verify(); every entry of the slot
  // shares that verdict ("" when it still points at the captured storage).
  std::map<std::pair<std::size_t, std::size_t>, std::string> slot_verdicts;
  auto slot_verdict = [&](std::size_t layer, std::size_t slot) -> const std::string& {
    auto [it, fresh] = slot_verdicts.try_emplace({layer, slot});
    if (!fresh) return it->second;
    const LayerPlan& lp = plan.layers()[layer];
    const PlannedSlot& s = lp.slots[slot];
    const void* captured = s.captured.storage().unsafeGetStorageImpl();
    auto points_elsewhere = [&](const at::Tensor* t) {
      return t == nullptr || !t->defined() || !t->has_storage() || t->storage().unsafeGetStorageImpl() != captured;
    };
    if (s.kind != PlannedSlot::Kind::declared) {
      const at::Tensor t = detail::module_tensor(*lp.module, s);
      if (points_elsewhere(&t)) {
        it->second = "the module's tensor now uses other storage; the graph still reads the captured one";
        return it->second;
      }
    }
    for (const SlotPath& p : s.paths) {
      at::Tensor* f = p.resolve_tensor(lp.root.ptr);
      if (points_elsewhere(f)) {
        it->second = concat(lp.full_name(p.str()), f == nullptr ? " no longer resolves" : " now points at other storage",
                            "; the graph still reads the captured storage (stale values)");
        break;
      }
    }
    return it->second;
  };
  // The verdict of a slot together with the slots sharing its storage, once
  // per slot: a graph has hundreds of thousands of entries but a model only
  // hundreds of slots, so the per-entry work is two vector lookups.
  std::vector<std::vector<const std::string*>> combined(plan.layers().size());
  for (std::size_t l = 0; l < combined.size(); ++l) combined[l].assign(plan.layers()[l].slots.size(), nullptr);
  for (const ManifestEntry& e : entries_) {
    ++r.checked;
    switch (e.cls) {
      case AddressClass::slot: {
        GK_INTERNAL_ASSERT(e.layer < plan.layers().size() && e.slot < plan.layers()[e.layer].slots.size(),
                           "manifest of graph ", graph_, " refers to a slot the plan no longer has");
        const std::string*& verdict = combined[e.layer][e.slot];
        if (verdict == nullptr) {
          // Any slot viewing the same storage counts: a view whose field moved
          // no longer describes what the graph reads (conservative, fail-closed).
          verdict = &slot_verdict(e.layer, e.slot);
          plan.for_each_sharing_storage(plan.layers()[e.layer].slots[e.slot], [&](std::size_t l, std::size_t s) {
            if (verdict->empty() && (l != e.layer || s != e.slot)) verdict = &slot_verdict(l, s);
          });
        }
        if (!verdict->empty()) issue(VerifyIssue::Kind::moved, e, *verdict);
        break;
      }
      case AddressClass::pool:
      case AddressClass::static_io:
      case AddressClass::library:
      case AddressClass::unstable:  // not an address the graph reads
        break;
      case AddressClass::unknown: {
        if (e.reachable == SIZE_MAX) {
          issue(VerifyIssue::Kind::unknown, e, "address in no declared slot, pool or buffer (an undeclared tensor)");
          break;
        }
        const ReachableTensor& rt = reachable_[e.reachable];
        c10::intrusive_ptr<c10::StorageImpl> alive = rt.storage.lock();
        if (!alive) {
          issue(VerifyIssue::Kind::expired, e, "its storage has been freed; the graph reads freed memory");
          break;
        }
        at::Tensor now = rt.resolve ? rt.resolve() : at::Tensor();
        if (!now.defined() || !now.has_storage() || now.storage().unsafeGetStorageImpl() != alive.get()) {
          issue(VerifyIssue::Kind::moved, e,
                concat(rt.path, " now points at other storage; the graph still reads the old one (stale values)"));
          break;
        }
        issue(VerifyIssue::Kind::unknown, e,
              concat("undeclared tensor ", rt.path, " (role ", to_string(rt.role.role),
                  rt.role.reason.empty() ? "" : concat(": ", rt.role.reason), "): declare it with a graph-visible role"));
        break;
      }
    }
  }
  return r;
}

}  // namespace gk
