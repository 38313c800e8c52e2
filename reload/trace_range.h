// reload/trace_range.h: named ranges of the reload's host work, for a
// profiler's trace. Internal to the reload layer.
//
// Note [Ranges for the host's work]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Kineto trace of a reload (gk-online-bench --trace, bench/trace_summary.py)
// shows the ATen ops and the CUDA calls the host makes, not the C++ between
// them: in a trace of the 24-layer MoE, host time of every decoder layer
// lay outside every event (docs/performance.md, "Figures behind the
// code"). Each step of a layer's pipeline
// opens a TraceRange (a user-scope RecordFunction, the C++ side of
// torch.profiler.record_function), so the trace says which step the host's
// time went to, and trace_summary.py subtracts the ops nested in each range
// to give the step's own C++ time. With no profiler running a range costs
// one thread-local check and allocates nothing. PhaseScope adds the time to
// a ReloadReport phase as ScopedMsTimer does.
//
//   {
//     detail::PhaseScope t(rep.times.pwal_ms, "gk.pwal");
//     layer->process_weights_after_loading();
//   }
//   detail::TraceRange r("gk.record_loaded");
#pragma once

#include <graphkeep/core/stopwatch.h>

#include <memory>

namespace at {
class RecordFunction;
}

namespace gk::detail {

// A user-scope profiler range from construction to destruction. `name` must
// outlive the range (a string literal).
class TraceRange {
 public:
  explicit TraceRange(const char* name);
  ~TraceRange();
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;

 private:
  std::unique_ptr<at::RecordFunction> range_;  // null unless a profiler listens
};

// A TraceRange that also adds its time to a phase counter.
class PhaseScope {
 public:
  PhaseScope(double& total_ms, const char* name) : range_(name), timer_(total_ms) {}

 private:
  TraceRange range_;
  ScopedMsTimer timer_;
};

}  // namespace gk::detail
