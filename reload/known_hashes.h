// reload/known_hashes.h: content hashes of device bytes read before a
// reload's loads, for the loads to reuse (internal to the reload layer; Note
// [Scanning a resident source first] in weight_stream.cpp).
//
//   detail::KnownHashes known;
//   known.add(source_tensor, offset, nbytes, hash);   // the scan's ranges
//   if (auto h = known.find(p, n)) ...                // at a load: the same bytes, still alive
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>

namespace gk::detail {

// Content hashes (gk-sum64 v1) of tensors read before the loads, found by
// the bytes they cover. A tensor's storage is held weakly: once it is freed
// (a source yields its tensors by moving them out), its memory may hold
// another tensor, and its hash is no longer found.
class KnownHashes {
 public:
  // The hash of `nbytes` bytes of t from byte `offset`.
  void add(const at::Tensor& t, std::size_t offset, std::size_t nbytes, std::uint64_t hash);
  // The hash of the n bytes at p, where they are exactly bytes added of a
  // tensor whose storage is alive.
  std::optional<std::uint64_t> find(const void* p, std::size_t n) const;
  bool empty() const noexcept { return by_data_.empty(); }

 private:
  struct Entry {
    std::size_t nbytes;
    std::uint64_t hash;
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    const void* storage_data;
  };
  std::unordered_map<const void*, Entry> by_data_;
};

}  // namespace gk::detail
