// A described class with an at::Tensor member that its descriptor does not
// list at all: Boost.Describe cannot see it, the layout check does.
#include <graphkeep/registry.h>

#include <cstdint>

namespace fp8 {

class Fp8BlockScaledKernel {
 public:
  Fp8BlockScaledKernel(int64_t block_n, int64_t block_k) : block_n_(block_n), block_k_(block_k) {}

 private:
  at::Tensor weight_scale_inv_;
#ifdef GK_BREAK
  at::Tensor input_scale_ub_;  // added later, forgotten in the descriptor
#endif
  int64_t block_n_ = 128;
  int64_t block_k_ = 128;

  GRAPHKEEP_DESCRIBE(Fp8BlockScaledKernel, (weight_scale_inv_, gk::scale), block_n_, block_k_)
};

}  // namespace fp8
