// reload/known_hashes.h: content hashes of device bytes read before a
// reload's loads, for the loads to reuse (internal to the reload layer; Note
// [Scanning a resident source first] in weight_stream.cpp).
//
//   detail::KnownHashes known([&]() -> const std::vector<std::uint64_t>& { return scan_hashes(); });
//   known.add(source_tensor, offset, nbytes, k);      // the scan's range k
//   if (auto k = known.find(p, n)) ...                // at a load: the same bytes, still alive
//   known.hash(*k);                                   // later: waits for the scan if it must
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>

namespace gk::detail {

// Content hashes (gk-sum64 v1) of tensors read before the loads, found by
// the bytes they cover. A tensor's storage is held weakly: once it is freed
// (a source yields its tensors by moving them out), its memory may hold
// another tensor, and its hash is no longer found.
class KnownHashes {
 public:
  // `values` returns every hash by its index, waiting for them if it must
  // (a scan still running on the device: Note [Scanning a resident source
  // first] in weight_stream.cpp); called from hash() alone.
  explicit KnownHashes(std::function<const std::vector<std::uint64_t>&()> values) : values_(std::move(values)) {}
  // Room for n hashes (a MoE's scan adds 9,000-18,000: no rehash between).
  void reserve(std::size_t n) { by_data_.reserve(n); }
  // Hash `index` covers `nbytes` bytes of t from byte `offset`.
  void add(const at::Tensor& t, std::size_t offset, std::size_t nbytes, std::size_t index);
  // The index of the hash of the n bytes at p, where they are exactly bytes
  // added of a tensor whose storage is alive.
  std::optional<std::size_t> find(const void* p, std::size_t n) const;
  std::uint64_t hash(std::size_t index) const { return values_().at(index); }
  bool empty() const noexcept { return by_data_.empty(); }

 private:
  struct Entry {
    std::size_t nbytes;
    std::size_t index;
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    const void* storage_data;
  };
  std::function<const std::vector<std::uint64_t>&()> values_;
  std::unordered_map<const void*, Entry> by_data_;
};

}  // namespace gk::detail
