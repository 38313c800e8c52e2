// gk::opaque on a member that reaches tensors through a registered type:
// opaque hides a member from every walk, so the kernel's workspace would not
// be protected. (Also rejected: opaque on an at::Tensor, a container of
// tensors, or an unregistered struct that holds tensors.)
#include <graphkeep/registry.h>

#include <cstdint>
#include <memory>

namespace marlin {

class MarlinKernel {
  at::Tensor workspace_;
  int64_t num_sms_ = 132;
  GRAPHKEEP_DESCRIBE(MarlinKernel, (workspace_, gk::workspace(gk::Init::zero)), num_sms_)
};

class GptqMarlinMethod {
 public:
  GptqMarlinMethod() = default;

 private:
  std::shared_ptr<MarlinKernel> kernel_;  // shared between layers
  at::Tensor scales_;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(GptqMarlinMethod, (kernel_, gk::opaque("shared, owned by the layer cache")),
                     (scales_, gk::scale))
#else
  GRAPHKEEP_DESCRIBE(GptqMarlinMethod, kernel_, (scales_, gk::scale))  // aliases are merged
#endif
};

}  // namespace marlin
