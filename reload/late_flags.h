// reload/late_flags.h: a few verdicts computed on the device, read later
// without draining the stream (internal to the reload layer).
//
//   detail::LateFlags flags(at::cat(differs));   // bool [n], enqueued now
//   enqueue_other_work();
//   const std::vector<char> f = flags.read();    // waits for the copy alone
//
// Note [Verdicts read late]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// A check whose answer is a handful of booleans on the device (do these
// slots differ from their captured values?) would read them with .cpu():
// a copy on the caller's stream and a wait for *everything* queued there,
// which in a streaming reload includes the previous layer's copy-back (Note
// [Commit one layer late] in weight_stream.cpp). The host then idles for the
// device at every layer and the two no longer overlap: the MoE's 48 layers
// spent 27.5 ms so on an H200 (docs/gpu-runs.md, 2026-12-06 02:46). LateFlags
// copies the flags into pinned memory behind an event right after they are
// computed; read() waits for that event alone, and a reader that reads
// them a layer later (before the layer's commit) usually waits for nothing.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace gk::detail {

class LateFlags {
 public:
  LateFlags() = default;
  // `flags`: a 1-D bool tensor, on the CPU (read at once) or a CUDA device
  // (copied on the current stream after what it holds now).
  explicit LateFlags(const at::Tensor& flags);
  ~LateFlags();
  LateFlags(LateFlags&&) noexcept;
  LateFlags& operator=(LateFlags&&) noexcept;
  // Whether flags were given and not yet read.
  bool pending() const noexcept { return host_.defined(); }
  // The flags (0 or 1 each); waits for their copy only. Once.
  std::vector<char> read();

 private:
  struct Ready;
  at::Tensor host_;
  std::shared_ptr<Ready> ready_;  // (shared: its deleter is fixed where Ready is complete)
};

}  // namespace gk::detail
