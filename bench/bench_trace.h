// bench/bench_trace.h: a Kineto trace (CPU ops, CUDA runtime calls, kernels
// and copies) of one region of a bench, saved as a Chrome trace that
// bench/trace_summary.py reads. The device machine has no Nsight Systems;
// libtorch's own profiler needs nothing more than CUPTI, which ships with it.
//
//   {
//     gkbench::KinetoTrace trace(path);   // nothing when path is empty
//     ... the region ...
//   }                                     // saved here
#pragma once

#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdio>
#include <set>
#include <string>
#include <utility>

namespace gkbench {

class KinetoTrace {
 public:
  explicit KinetoTrace(std::string path) : path_(std::move(path)) {
    if (path_.empty()) return;
    namespace impl = torch::profiler::impl;
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    const std::set<impl::ActivityType> activities{impl::ActivityType::CPU, impl::ActivityType::CUDA};
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  }
  KinetoTrace(const KinetoTrace&) = delete;
  KinetoTrace& operator=(const KinetoTrace&) = delete;
  ~KinetoTrace() {
    if (path_.empty()) return;
    try {
      torch::autograd::profiler::disableProfiler()->save(path_);
      std::printf("trace: %s\n", path_.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "trace: could not save %s: %s\n", path_.c_str(), e.what());
    }
  }

 private:
  std::string path_;
};

}  // namespace gkbench
