// A tensor role given to a member that holds no tensor.
#include <graphkeep/registry.h>

#include <cstdint>

namespace marlin {

class MarlinKernel {
 public:
  MarlinKernel() = default;

 private:
  at::Tensor workspace_;
  int64_t num_sms_ = 132;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(MarlinKernel, (workspace_, gk::workspace(gk::Init::zero)), (num_sms_, gk::scale))
#else
  GRAPHKEEP_DESCRIBE(MarlinKernel, (workspace_, gk::workspace(gk::Init::zero)), num_sms_)
#endif
};

}  // namespace marlin
