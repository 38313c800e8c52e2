// A member that holds a gk::TensorSlot (role in the type) next to a plain
// at::Tensor: the plain one would be walked with no role, i.e. silently left
// out of every reload.
#include <graphkeep/registry.h>

#include <cstdint>
#include <utility>

namespace fp8 {

class Fp8MoeMethod {
 public:
  Fp8MoeMethod() = default;

 private:
#ifdef GK_BREAK
  std::pair<gk::Scale, at::Tensor> w13_scales_;  // (weight scale, input scale)
#else
  std::pair<gk::Scale, gk::Scale> w13_scales_;
#endif
  int64_t num_experts_ = 0;

  GRAPHKEEP_DESCRIBE(Fp8MoeMethod, w13_scales_, num_experts_)
};

}  // namespace fp8
