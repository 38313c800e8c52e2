// A raw pointer member caching a device address (workspace_.data_ptr()): a
// reload that moves the workspace leaves it dangling.
#include <graphkeep/registry.h>

#include <cstdint>
#include <utility>

namespace marlin {

class MarlinKernel {
 public:
  explicit MarlinKernel(at::Tensor workspace) : workspace_(std::move(workspace)) {
#ifdef GK_BREAK
    locks_ = workspace_.data_ptr<int>();
#endif
  }

 private:
  at::Tensor workspace_;
#ifdef GK_BREAK
  int* locks_ = nullptr;
#endif
  int64_t num_sms_ = 132;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(MarlinKernel, (workspace_, gk::workspace(gk::Init::zero)), locks_, num_sms_)
#else
  GRAPHKEEP_DESCRIBE(MarlinKernel, (workspace_, gk::workspace(gk::Init::zero)), num_sms_)
#endif
};

}  // namespace marlin
