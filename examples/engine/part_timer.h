// examples/engine/part_timer.h
//
// Where the GPU time of a decode step goes, by part of the model, for the
// benchmarks. The fast CUDA path marks where each part begins (mark_part);
// while a PartTimer is active on the thread, each mark records a CUDA event
// on the current stream, and finish() sums the time between consecutive
// marks per part. Without an active timer a mark is a thread-local read.
// Use it around an eager forward only (never while a graph is captured).
//
// Before its first event the timer queues a sleep kernel on that stream,
// long enough for the host to queue the whole forward behind it, so the
// events measure the GPU's work back to back, not the host's launch gaps of
// an eager run.
//
//   demo::PartTimer timer(device);
//   (void)eng.decode_eager(tokens, positions);
//   for (auto& [part, ms] : timer.finish()) std::printf("%s %.3f ms\n", part.c_str(), ms);
#pragma once

#include <c10/core/Device.h>

#include <map>
#include <memory>
#include <string>

namespace demo {

enum class Part { idle, embedding, norm, gemm, attention, mlp_act, moe, lm_head, sampling, lora };
const char* to_string(Part p);

// Closes the running part and opens `p` (idle: none) in the active timer, if any.
void mark_part(Part p);

class PartTimer {
 public:
  // The first mark sleeps its stream for about sleep_ms first (CUDA).
  explicit PartTimer(c10::Device device, double sleep_ms = 200);
  ~PartTimer();
  PartTimer(const PartTimer&) = delete;
  PartTimer& operator=(const PartTimer&) = delete;

  // Waits for the device; the GPU milliseconds per part (no entry for parts
  // never marked). Deactivates the timer.
  std::map<std::string, double> finish();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace demo
