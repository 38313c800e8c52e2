// A gk::Registry over a type list that contains an unregistered type.
#include <graphkeep/registry.h>

#include <cstdint>

namespace kernels {

class MarlinKernel {
  at::Tensor workspace_;
  int64_t num_sms_ = 132;
  GRAPHKEEP_DESCRIBE(MarlinKernel, (workspace_, gk::workspace(gk::Init::zero)), num_sms_)
};

class HadamardTransform {
  at::Tensor hadamard_matrix_;
  int64_t dim_ = 128;
#ifndef GK_BREAK
  GRAPHKEEP_DESCRIBE(HadamardTransform, (hadamard_matrix_, gk::derived_weight), dim_)
#endif
};

using Types = gk::TypeList<MarlinKernel, HadamardTransform>;
static_assert(gk::Registry<Types>::size == 2);

}  // namespace kernels
