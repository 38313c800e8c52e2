// A member whose type is a lambda's closure type: a lambda may capture
// tensors by value, out of graphkeep's sight.
#include <graphkeep/registry.h>

#include <cstdint>

namespace act {

inline constexpr auto kSiluAndMul = [](const at::Tensor& gate_up) { return gate_up; };

class FusedSiluMulQuantKernel {
 public:
  FusedSiluMulQuantKernel() = default;

 private:
  at::Tensor scale_;
  decltype(kSiluAndMul) activation_{};
  int64_t hidden_size_ = 0;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(FusedSiluMulQuantKernel, (scale_, gk::scale), activation_, hidden_size_)
#else
  GRAPHKEEP_DESCRIBE(FusedSiluMulQuantKernel, (scale_, gk::scale),
                     (activation_, gk::opaque("capture-less lambda")), hidden_size_)
#endif
};

}  // namespace act
