// A std::function member: its captures may hold tensors graphkeep cannot see.
#include <graphkeep/registry.h>

#include <cstdint>
#include <functional>

namespace gemm {

class ScaledMmKernel {
 public:
  ScaledMmKernel() = default;

 private:
  at::Tensor a_scales_;
  at::Tensor b_scales_;
  std::function<void(at::Tensor&)> epilogue_;  // e.g. [bias](at::Tensor& out) { out.add_(bias); }
  int64_t m_tile_ = 128;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(ScaledMmKernel, (a_scales_, gk::scale), (b_scales_, gk::scale), epilogue_,
                     m_tile_)
#else
  GRAPHKEEP_DESCRIBE(ScaledMmKernel, (a_scales_, gk::scale), (b_scales_, gk::scale),
                     (epilogue_, gk::opaque("set once to a capture-less activation")), m_tile_)
#endif
};

}  // namespace gemm
