// A gk::Registry over two types with the same name in different namespaces:
// slot paths would be ambiguous.
#include <graphkeep/registry.h>

#include <cstdint>

namespace marlin {
class Kernel {
  at::Tensor workspace_;
  int64_t num_sms_ = 132;
  GRAPHKEEP_DESCRIBE(Kernel, (workspace_, gk::workspace(gk::Init::zero)), num_sms_)
};
}  // namespace marlin

namespace machete {
#ifdef GK_BREAK
class Kernel {
  at::Tensor group_scales_;
  GRAPHKEEP_DESCRIBE(Kernel, (group_scales_, gk::scale))
};
#else
class MacheteKernel {
  at::Tensor group_scales_;
  GRAPHKEEP_DESCRIBE(MacheteKernel, (group_scales_, gk::scale))
};
using Kernel = MacheteKernel;
#endif
}  // namespace machete

using Types = gk::TypeList<marlin::Kernel, machete::Kernel>;
static_assert(gk::Registry<Types>::size == 2);
