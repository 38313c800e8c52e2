// reload/late_bytes.h: the bytes of a few small device tensors, copied to
// the host behind one event and read later, without ATen operations on the
// device (internal to the reload layer).
//
//   detail::LateBytes got({current, captured});  // copies enqueued now
//   enqueue_other_work();
//   got.wait();                                  // waits for the copies alone
//   if (!std::ranges::equal(got.bytes(0), got.bytes(1))) ...
//
// Note [Verdicts read late]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A check whose answer lies on the device (do these slots differ from
// their captured values?) would read it with .cpu(): a copy on the
// caller's stream and a wait for *everything* queued there, which in a
// streaming reload includes the previous layer's copy-back (Note [Copy
// back one layer late] in weight_stream.cpp). The host then idles for the
// device at every layer and the two no longer overlap, a wait per layer
// of the MoE's 48 (docs/performance.md, "Figures behind the code"). The
// bytes are copied into pinned memory behind an event right after they
// are computed; wait() waits for that event alone, and a reader that
// reads them a layer later (before the layer's commit) usually waits for
// nothing.
//
// Note [Comparing on the host]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A verdict over a few small tensors (are PWAL's stride arrays what the
// graphs captured?) computed with ATen ops costs a handful of operations per
// tensor (ne, any, reshape, then a cat and a copy to the host): each is a
// few microseconds of host time, paid at every layer of a streaming reload,
// where the host, not the device, sets the pace (docs/performance.md, "The
// same bytes in more tensors"). Their bytes are what such a check reads, and
// they are small: LateBytes copies them to pinned host memory with one
// cudaMemcpyAsync each and one event, and the host compares them with
// memcmp when it reads the verdict, late (above).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace gk::detail {

class LateBytes {
 public:
  LateBytes() = default;
  // Enqueues a copy of each tensor's bytes (in its element order: a
  // non-contiguous tensor is made contiguous first) on its device's current
  // stream; a CPU tensor is copied at once.
  explicit LateBytes(const std::vector<at::Tensor>& tensors);
  ~LateBytes();
  LateBytes(LateBytes&&) noexcept;
  LateBytes& operator=(LateBytes&&) noexcept;
  // Whether tensors were given and the bytes not yet released.
  bool pending() const noexcept { return host_.defined(); }
  // Whether wait() would not wait (asks the copies' events; never blocks).
  bool ready() const;
  // Waits for the copies (their events alone). Idempotent.
  void wait();
  // Tensor i's bytes; after wait().
  std::span<const std::byte> bytes(std::size_t i) const;
  // Frees the host buffer.
  void release();

 private:
  struct Ready;
  at::Tensor host_;
  std::vector<std::size_t> offsets_;  // tensor i: [offsets_[i], offsets_[i + 1])
  std::vector<at::Tensor> keep_;      // sources (contiguous copies) until the copies ran
  std::shared_ptr<Ready> ready_;
};

}  // namespace gk::detail
