// graphkeep/hashing/content_hash.h
//
// The content hash of a tensor's bytes: one function, "gk-sum64 v1",
// computed identically on the host and on a CUDA device (graphkeep's own
// kernel, many tensors in one launch). A patch records the hash of each
// tensor it touches before and after (the delta layer), so that a patch is
// applied only to the bytes it was made from, and the result is checked to
// be the bytes it was made for.
//
//   std::uint64_t h = gk::content_hash(weight);                   // CPU or CUDA
//   std::vector<std::uint64_t> hs = gk::content_hashes(weights);  // one launch, one sync per device
//   std::string s = gk::format_content_hash(h);                   // "0123456789abcdef"
//
// Note [Content hash: gk-sum64 v1]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The bytes hashed are a contiguous tensor's numel * itemsize = n bytes from
// its first element (its data pointer, storage offset included), row-major,
// as they lie in memory. They are read as ceil(n / 8) little-endian 64-bit
// words w_j (the last one zero-padded), and, modulo 2^64,
//
//   mix(z)  = splitmix64's output function of z (Vigna's splitmix64.c)
//   hash    = mix(n ^ 0x27D4EB2F165667C5) + sum_j mix(w_j + (j + 1) * 0x9E3779B97F4A7C15)
//
// so the term of word j is the (j + 1)-th output of splitmix64 started from
// state w_j (graphkeep/hashing/sum64.h has the arithmetic; docs/delta.md a
// NumPy version in ten lines). The dtype and shape are not hashed: they are
// recorded next to the hash where it matters (a patch header records both).
//
// Why a sum (an incremental hash in the sense of Bellare and Micciancio's
// AdHash) rather than a chained one such as XXH64 (this project's earlier
// "gk-xxh64-blocks v1", whose files an engine now refuses by that name):
// changing word j from a to b changes the hash by
// mix(b + ...) - mix(a + ...), so the hash of a tensor after a sparse write
// is its hash before plus a sum over the words written, O(changed) instead of
// a read of the whole tensor (gk::overlaid_content_hashes; a weight patch's
// stage checks its target hashes that way: Note [Hashing through the
// writes]). And every word is independent, so a device reads at memory speed
// with no serial chain per lane. What it detects: each term is a bijection of
// its word, so any change confined to one word always changes the hash;
// other accidental changes (several words, moved words: the position is in
// each term) collide with probability about 2^-64. It is not a cryptographic
// hash, nor was XXH64: a party that can write the patch can write the
// weights, and a sum of 64-bit terms can be forged on purpose.
//
// Why the hash refuses a non-contiguous tensor instead of hashing
// t.contiguous(): the copy would be a hidden allocation as large as the
// tensor (on the device, in the middle of a reload), and the batched call
// promises one launch over the tensors given. The error names the tensor and
// says to pass t.contiguous().
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gk {

// The name of the function, as recorded in files that carry its hashes.
inline constexpr std::string_view kContentHashName = "gk-sum64 v1";

// The content hash of bytes in host memory (parallel over 64 KiB blocks).
std::uint64_t content_hash_bytes(std::span<const std::byte> bytes);

// The content hash of a contiguous tensor's bytes, on its device (CPU: the
// host function; CUDA: graphkeep's kernel on the current stream, then one
// synchronization). gk::WeightError for an undefined, non-strided or
// non-contiguous tensor (the message says to pass t.contiguous()) or one on
// another kind of device.
std::uint64_t content_hash(const at::Tensor& tensor);

// The content hashes of many tensors, in order: the CUDA tensors of one
// device are hashed in one kernel launch followed by one synchronization (so
// hash a layer's or a model's tensors together, not one by one); CPU tensors
// on the host. The same errors as content_hash, naming the tensor's position.
std::vector<std::uint64_t> content_hashes(const std::vector<at::Tensor>& tensors);

// Bytes [offset, offset + nbytes) of a contiguous tensor, hashed as a
// tensor of those bytes would be (the words numbered from `offset`), with no
// view made of them. A parameter that holds many checkpoint tensors as
// consecutive row ranges (a MoE's stacked experts: hundreds per parameter,
// 18,000 in a model) is hashed by range, with no view per checkpoint tensor
// to make and free (a few microseconds of host time each).
//
//   std::vector<gk::ContentRange> rows;
//   for (std::size_t e = 0; e < experts; ++e) rows.push_back({w13, e * expert_bytes, expert_bytes});
//   std::vector<std::uint64_t> hs = gk::content_hashes(rows);  // == content_hash(w13[e]) each
//
// gk::WeightError as for a tensor, and for a range past the tensor's bytes.
struct ContentRange {
  at::Tensor tensor;
  std::size_t offset = 0;
  std::size_t nbytes = 0;
};

// content_hashes() of ranges: the same launches and synchronization.
std::vector<std::uint64_t> content_hashes(const std::vector<ContentRange>& ranges);

// Where PendingContentHashes hashes CUDA tensors.
enum class HashStream : std::uint8_t {
  // A side stream of each device, after what the caller's current stream
  // holds now: the hash overlaps the caller's later work, so the tensors are
  // kept alive until the hashes are read and must not be written before then.
  side,
  // The caller's current stream, in order with its other work: later work on
  // that stream runs after the hash, so nothing is kept, and the caller may
  // drop the tensors at once (the caching allocator reuses memory in stream
  // order) or write them on that stream. Hash layer after layer this way and
  // read every layer's hashes at the end: one wait for all of them.
  current,
};

// content_hashes() in two halves, for a caller that has other work to do
// while the device hashes: the constructor checks the tensors, hashes the
// CPU ones and launches the CUDA ones (HashStream says where); get() waits
// for those launches only (an event after each), not for work the caller
// enqueued in between, and returns the hashes in order. A destructor that
// runs before get() waits for the launches.
//
//   gk::PendingContentHashes h(layer_tensors);                        // side stream
//   enqueue_other_work();
//   const std::vector<std::uint64_t> hashes = h.get();
//
//   for (layer : layers) pending.emplace_back(results(layer), gk::HashStream::current);
//   for (auto& p : pending) check(p.get());                           // one wait
class PendingContentHashes {
 public:
  explicit PendingContentHashes(std::vector<at::Tensor> tensors, HashStream where = HashStream::side);
  explicit PendingContentHashes(std::vector<ContentRange> ranges, HashStream where = HashStream::side);
  ~PendingContentHashes();
  PendingContentHashes(PendingContentHashes&&) noexcept;
  PendingContentHashes& operator=(PendingContentHashes&&) noexcept;
  // Whether get() would not wait (asks each launch's event; never blocks).
  bool ready() const;
  std::vector<std::uint64_t> get();

 private:
  struct Launch;
  std::vector<ContentRange> ranges_;
  std::vector<std::uint64_t> out_;
  std::vector<Launch> launches_;
};

// 16 lowercase hex digits, most significant first.
std::string format_content_hash(std::uint64_t hash);
// The value of 16 hex digits (either case), or std::nullopt for anything else.
std::optional<std::uint64_t> parse_content_hash(std::string_view text);

}  // namespace gk
