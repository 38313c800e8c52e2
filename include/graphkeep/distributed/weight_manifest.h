// graphkeep/distributed/weight_manifest.h
//
// What a full (unsharded) checkpoint holds: names, shapes and dtypes. The
// trainer broadcasts its manifest before the first bucket; a rank whose own
// manifest differs aborts the reload on every rank, naming the differences.
//
//   gk::WeightManifest m = gk::WeightManifest::of(full_tensors);
//   std::string wire = m.serialize();   // WeightManifest::parse(wire) == m
//   std::string why = gk::WeightManifest::diff(trainers, m);   // "" when equal
#pragma once

#include <graphkeep/sources/weight_source.h>

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gk {

// The manifest of a full (unsharded) checkpoint: one entry per tensor, kept
// sorted by name, so two manifests of the same checkpoint serialize equally
// whatever order their tensors came in.
struct WeightEntry {
  std::string name;
  std::vector<std::int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  friend bool operator==(const WeightEntry&, const WeightEntry&) = default;
};

class WeightManifest {
 public:
  WeightManifest() = default;
  // Throws gk::WeightError on a duplicate name or a name with a tab or newline.
  explicit WeightManifest(std::vector<WeightEntry> entries);
  // From the tensors of a full checkpoint (each tensor once, shard 0).
  static WeightManifest of(const std::vector<NamedTensor>& tensors);
  // The inverse of serialize(); throws gk::WeightError on malformed text.
  static WeightManifest parse(std::string_view text);

  const std::vector<WeightEntry>& entries() const noexcept { return entries_; }
  std::size_t size() const noexcept { return entries_.size(); }
  // Index into entries(), or -1.
  std::int64_t index_of(std::string_view name) const;
  std::size_t total_bytes() const;

  // One line per tensor: "name<TAB>dtype<TAB>[d0, d1]".
  std::string serialize() const;
  std::uint64_t hash() const;  // FNV-1a 64 of serialize()
  // The differences of `mine` from `reference` ("" when equal), up to
  // `limit` of them, e.g. "'l2.weight' has shape [8, 16] on the trainer but
  // [8, 12] here; 'l3.bias' is missing here".
  static std::string diff(const WeightManifest& reference, const WeightManifest& mine, std::size_t limit = 8);

  friend bool operator==(const WeightManifest& a, const WeightManifest& b) { return a.entries_ == b.entries_; }

 private:
  std::vector<WeightEntry> entries_;
};

}  // namespace gk
