// graphkeep/hashing/content_hash.h
//
// The content hash of a tensor's bytes: one function, "gk-xxh64-blocks v1",
// computed identically on the host (libxxhash, in parallel over blocks) and
// on a CUDA device (graphkeep's own kernel, many tensors in one launch). A
// patch records the hash of each tensor it touches before and after (the
// delta layer), so that a patch is applied only to the bytes it was made
// from, and the result is checked to be the bytes it was made for.
//
//   std::uint64_t h = gk::content_hash(weight);                   // CPU or CUDA
//   std::vector<std::uint64_t> hs = gk::content_hashes(weights);  // one launch, one sync per device
//   std::string s = gk::format_content_hash(h);                   // "0123456789abcdef"
//
// Note [Content hash: gk-xxh64-blocks v1]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The bytes hashed are a contiguous tensor's numel * itemsize bytes from its
// first element (its data pointer, storage offset included), row-major, as
// they lie in memory. They are split into blocks of 64 KiB (65,536 bytes;
// the last block may be shorter; zero bytes give no block), and
//
//   digest_i = XXH64(block_i, seed = 0)
//   hash     = XXH64(digest_0 .. digest_{n-1} as little-endian uint64 (8n bytes),
//                    seed = the total byte length)
//
// XXH64 is xxHash's 64-bit function (the reference library libxxhash; the
// Python package `xxhash` computes the same). The
// seed of the outer hash makes two byte strings of different lengths whose
// digests agree (which the block split alone would allow for a final short
// block) differ anyway. The dtype and shape are not hashed: they are
// recorded next to the hash where it matters (a patch header records both).
// Blocks make the function parallel with a fixed result: every host thread
// and every group of four device threads hashes whole blocks on its own, and
// the outer hash reads 8 bytes per 64 KiB (1/8192 of the input).
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
inline constexpr std::string_view kContentHashName = "gk-xxh64-blocks v1";
// Bytes per block (Note [Content hash: gk-xxh64-blocks v1]).
inline constexpr std::size_t kContentHashBlockBytes = 64 * 1024;

// The content hash of bytes in host memory (parallel over blocks).
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
  ~PendingContentHashes();
  PendingContentHashes(PendingContentHashes&&) noexcept;
  PendingContentHashes& operator=(PendingContentHashes&&) noexcept;
  std::vector<std::uint64_t> get();

 private:
  struct Launch;
  std::vector<at::Tensor> tensors_;
  std::vector<std::uint64_t> out_;
  std::vector<Launch> launches_;
};

// 16 lowercase hex digits, most significant first.
std::string format_content_hash(std::uint64_t hash);
// The value of 16 hex digits (either case), or std::nullopt for anything else.
std::optional<std::uint64_t> parse_content_hash(std::string_view text);

}  // namespace gk
