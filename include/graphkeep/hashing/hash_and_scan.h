// graphkeep/hashing/hash_and_scan.h
//
// Content hashes (gk-sum64 v1, as gk::content_hashes computes them) and a
// test of every element's bits, in one read of the bytes on a CUDA device:
// a streaming reload both hashes a trainer's resident tensors and refuses a
// NaN or an infinity among them (Note [Scanning while summing] in
// hashing/cuda/content_hash.cu). Internal to graphkeep's layers (the reload
// layer calls it); not a user API.
//
//   std::vector<gk::ContentRange> ranges = ...;         // bytes of CUDA tensors
//   std::vector<gk::detail::ExponentTest> tests = ...;  // per range: {2, 0x7F80} for bfloat16
//   gk::detail::HashScan r = gk::detail::hash_and_scan(ranges, tests);
//   r.hashes[i] == gk::content_hashes(ranges)[i];
//   r.first_bad[i];  // the range's first element whose exponent bits are all set, or -1
#pragma once

#include <graphkeep/hashing/content_hash.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace gk::detail {

// How a tensor's elements are tested: `bytes`-wide little-endian words (1, 2,
// 4 or 8), bad where (word & mask) == mask (every exponent bit set: a NaN or
// an infinity). bytes 0: not tested.
struct ExponentTest {
  std::uint32_t bytes = 0;
  std::uint64_t mask = 0;
};

struct HashScan {
  std::vector<std::uint64_t> hashes;
  // The element index, from the range's first byte, of its first bad
  // element; -1 where none (or not tested).
  std::vector<std::int64_t> first_bad;
};

// Every range (of a contiguous tensor on a CUDA device, checked as
// gk::content_hashes checks it: gk::WeightError naming its position
// otherwise; starting on an element, where it is tested) hashed and tested
// by tests[i], one launch per device on its current stream; waits for the
// answers. Built without CUDA: gk::StateError, unless `ranges` is empty.
HashScan hash_and_scan(const std::vector<ContentRange>& ranges, const std::vector<ExponentTest>& tests);

// hash_and_scan in two steps: the constructor launches (checking the
// ranges), ready() asks without waiting whether the answers are in, get()
// waits for them (once). The ranges' tensors are held until then.
//
//   gk::detail::PendingHashScan scan(ranges, tests);   // launched
//   while (!scan.ready()) do_host_work();
//   gk::detail::HashScan r = scan.get();
class PendingHashScan {
 public:
  PendingHashScan(std::vector<ContentRange> ranges, std::vector<ExponentTest> tests);
  ~PendingHashScan();  // waits for the launches if get() was not called
  PendingHashScan(PendingHashScan&&) noexcept;
  PendingHashScan& operator=(PendingHashScan&&) noexcept;
  bool ready() const;
  HashScan get();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Copies every range's bytes to to[i] and hashes them (gk-sum64 v1) in the
// same read: a streaming reload's copy into captured storage yields the
// hashes of what it copied (Note [Hashing while copying] in
// hashing/cuda/content_hash.cu). The CUDA ranges of each device go in one
// launch on its current stream (in order with the caller's work there);
// get() waits for those launches only, behind an event, and returns the
// hashes in order. Ranges on the CPU are copied and hashed at once. Each
// destination is memory of the range's device, at least as long as the
// range, overlapping no range; ranges are checked as gk::content_hashes
// checks them.
//
//   gk::detail::CopiedHashes h(ranges, destinations);   // launched
//   enqueue_other_work();
//   std::vector<std::uint64_t> hashes = h.get();        // == content_hashes(ranges)
class CopiedHashes {
 public:
  CopiedHashes(std::vector<ContentRange> ranges, const std::vector<std::byte*>& to);
  ~CopiedHashes();  // waits for the launches if get() was not called
  CopiedHashes(CopiedHashes&&) noexcept;
  CopiedHashes& operator=(CopiedHashes&&) noexcept;
  // Whether get() would not wait (asks each launch's event; never blocks).
  bool ready() const;
  std::vector<std::uint64_t> get();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace gk::detail
