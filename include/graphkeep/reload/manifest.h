// graphkeep/reload/manifest.h
//
// The capture manifest: the oracle that does not trust the registry. At
// capture it records every address the graph's nodes really use (from the
// replay backend: recorded host launches, or the CUDA graph's kernel,
// memcpy and memset nodes) and classifies each one:
//   slot       inside the captured storage of a planned slot (parameter,
//              buffer or declared slot)
//   pool       inside the graph's private memory pool
//   static_io  inside a registered persistent input or output buffer
//   library    inside a library's own persistent workspace (cuBLAS), or a
//              range the engine was told to allow (allow_address_range)
//   unknown    none of these: an undeclared tensor
//   unstable   a raw word that is stale bytes, not an address: a second
//              capture of the same forward did not repeat it in the same
//              kernel parameter byte, or it points into memory no live
//              allocation covers (mark_unstable, mark_unstable_if_free; Note
//              [Confirming raw addresses] in reload/capture_tracking.cpp); not verified
// After a reload, verify() checks each address again before the next replay:
//   moved      the owning slot (or the undeclared tensor's path) now points at
//              other storage while the captured one lives: stale reads
//   expired    the storage the address lay in has been freed: the graph
//              reads freed memory
//   unknown    an address still covered by nothing: refuse to replay
//
//   gk::CaptureManifest m = gk::CaptureManifest::record(graph, plan, io, collected);
//   gk::VerifyResult r = m.verify(plan);
//   if (!r.ok()) throw gk::DriftError(r.describe());
#pragma once

#include <graphkeep/capture/replay.h>
#include <graphkeep/reload/slot_plan.h>

#include <c10/core/Storage.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gk {

enum class AddressClass : std::uint8_t { slot, pool, static_io, library, unknown, unstable };
std::string_view to_string(AddressClass c) noexcept;

// A tensor the runtime collector reached (see collector.h), with its storage.
struct ReachableTensor {
  std::string path;
  RoleSpec role;
  std::uintptr_t begin = 0, end = 0;   // storage range
  c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
  // Re-resolves the tensor at `path` now (for "moved"); may return undefined.
  std::function<at::Tensor()> resolve;
};

using StaticBuffer = AddressRange;

struct ManifestEntry {
  CapturedAddress use;
  AddressClass cls = AddressClass::unknown;
  std::string owner;                  // slot path, buffer name, or the undeclared tensor's path
  std::size_t layer = 0, slot = 0;    // for cls == slot: indices into the plan
  std::uintptr_t captured_storage = 0;  // storage base at capture
  std::size_t reachable = SIZE_MAX;   // for unknown: index into the collected tensors
};

struct VerifyIssue {
  enum class Kind : std::uint8_t { moved, expired, unknown };
  Kind kind;
  std::string graph;     // the graph's name
  std::string node;      // kernel / node name
  std::size_t node_index = 0;
  std::string owner;     // slot path or undeclared tensor path ("" if none)
  std::uintptr_t address = 0;
  std::string detail;
};
std::string_view to_string(VerifyIssue::Kind k) noexcept;

struct VerifyResult {
  std::size_t checked = 0;
  std::vector<VerifyIssue> issues;
  bool ok() const noexcept { return issues.empty(); }
  std::size_t count(VerifyIssue::Kind k) const noexcept;
  std::string describe(std::size_t max_lines = 20) const;
};

class CaptureManifest {
 public:
  // Classifies every address `graph` uses. `reachable`: every tensor the
  // runtime collector found (for naming undeclared tensors and detecting
  // expiry); `io`: persistent input/output buffers. Library workspaces come
  // from the backend.
  // `allowed`: ranges the engine was told to trust (allow_address_range),
  // classified as library memory.
  static CaptureManifest record(const ReplayBackend& graph, const SlotPlan& plan,
                                const std::vector<StaticBuffer>& io,
                                std::vector<ReachableTensor> reachable,
                                const std::vector<AddressRange>& allowed = {});

  const std::string& graph_name() const noexcept { return graph_; }
  const std::vector<ManifestEntry>& entries() const noexcept { return entries_; }
  // The tensors the collector reached at capture (ManifestEntry::reachable).
  const std::vector<ReachableTensor>& reachable() const noexcept { return reachable_; }
  std::size_t count(AddressClass c) const noexcept;
  // The unknown entries as a readable list ("node k: address in tensor <path>").
  std::vector<std::string> undeclared() const;

  // The unknown entries that no collected tensor owns (raw allocations).
  std::size_t count_raw_unknown() const noexcept;
  // Reclassifies as `unstable` each raw unknown entry that `other`, a capture
  // of the same forward, does not repeat: no raw unknown entry there with the
  // same kernel, parameter, byte offset and address. Returns how many.
  std::size_t mark_unstable(const CaptureManifest& other);
  // Reclassifies as `unstable` each raw unknown entry whose address `graph`
  // reports in no live allocation (ReplayBackend::in_live_allocation).
  std::size_t mark_unstable_if_free(const ReplayBackend& graph);

  // Checks every recorded address against the plan's current state.
  VerifyResult verify(const SlotPlan& plan) const;
  // The same, sharing each slot's verdict with other manifests verified
  // against the same plan state (the engine verifies all its graphs with one
  // cache: Note [Verify once per slot] in manifest.cpp).
  class SlotVerdicts;
  VerifyResult verify(const SlotPlan& plan, SlotVerdicts& cache) const;

  const ReplayBackend* backend() const noexcept { return backend_; }

 private:
  std::string graph_;
  const ReplayBackend* backend_ = nullptr;
  std::vector<ManifestEntry> entries_;
  std::vector<ReachableTensor> reachable_;
  // Derived from entries_ by index_entries(): the distinct (layer, slot)
  // pairs the slot entries name, and the positions of the unknown entries.
  std::vector<std::pair<std::size_t, std::size_t>> slots_used_;
  std::vector<std::size_t> unknown_entries_;
  void index_entries();
};

// Per slot, whether its fields still point at the captured storage ("" when
// they do, else why not), taking the slots that share its storage into
// account. Valid for one plan state: make a new one after anything moves.
class CaptureManifest::SlotVerdicts {
 public:
  explicit SlotVerdicts(const SlotPlan& plan);
  const std::string& combined(std::size_t layer, std::size_t slot);

 private:
  const std::string& own(std::size_t layer, std::size_t slot);
  const SlotPlan& plan_;
  std::vector<std::vector<const std::string*>> combined_, own_;
  std::vector<std::string> reasons_;  // reserved up front: pointers into it stay valid
  std::string ok_;
};

}  // namespace gk
