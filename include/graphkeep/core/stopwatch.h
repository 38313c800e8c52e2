// graphkeep/core/stopwatch.h
//
// Elapsed time in milliseconds on std::chrono::steady_clock, for the phase
// times that reports carry (ReloadReport::times, the distributed reload's
// statistics). Header-only; the one home of graphkeep's timing helpers.
//
// Example:
//
//   gk::Stopwatch total;                      // starts now
//   {
//     gk::ScopedMsTimer t(report.times.pwal_ms);  // adds this block's time
//     run_pwal();
//   }
//   report.times.total_ms = total.elapsed_ms();
//
// ScopedMsTimer *adds* to its counter (a phase that runs once per layer sums
// over the layers), and adds on every exit from the block, an exception
// included.
#pragma once

#include <chrono>

namespace gk {

// Measures the time since its construction.
class Stopwatch {
 public:
  using Clock = std::chrono::steady_clock;

  Stopwatch() noexcept : start_(Clock::now()) {}

  // Milliseconds since construction, as a double (sub-millisecond resolution).
  [[nodiscard]] double elapsed_ms() const noexcept {
    return std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
  }

 private:
  Clock::time_point start_;
};

// Adds the milliseconds between its construction and its destruction to a
// counter.
class ScopedMsTimer {
 public:
  explicit ScopedMsTimer(double& total_ms) noexcept : total_ms_(total_ms) {}
  ScopedMsTimer(const ScopedMsTimer&) = delete;
  ScopedMsTimer& operator=(const ScopedMsTimer&) = delete;
  ~ScopedMsTimer() { total_ms_ += watch_.elapsed_ms(); }

 private:
  double& total_ms_;
  Stopwatch watch_;
};

}  // namespace gk
