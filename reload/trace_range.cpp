// TraceRange: a RecordFunction made only when a profiler listens (Note
// [Ranges for the host's work] in trace_range.h).
#include "trace_range.h"

#include <ATen/record_function.h>

namespace gk::detail {

TraceRange::TraceRange(const char* name) {
  std::optional<at::StepCallbacks> step = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE);
  if (!step) return;
  range_ = std::make_unique<at::RecordFunction>(std::move(*step));
  range_->before(name);
}

TraceRange::~TraceRange() = default;  // RecordFunction's destructor ends the range

}  // namespace gk::detail
