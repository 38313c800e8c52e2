// A functor member (a struct with operator()) that is not registered: a
// callable is rejected even when it is an aggregate, since its call operator
// may reach tensors its fields do not show. Registering the functor (here with
// GRAPHKEEP_AGGREGATE) makes its tensors slots with roles.
#include <graphkeep/registry.h>

#include <cstdint>

namespace epilogue {

struct BiasEpilogue {
  at::Tensor bias;
  void operator()(at::Tensor& out) const { out.add_(bias); }
};
#ifndef GK_BREAK
GRAPHKEEP_AGGREGATE(BiasEpilogue, (bias, gk::parameter));
#endif

class CutlassScaledMm {
 public:
  CutlassScaledMm() = default;

 private:
  at::Tensor a_scales_;
  BiasEpilogue epilogue_;
  int64_t n_ = 0;

  GRAPHKEEP_DESCRIBE(CutlassScaledMm, (a_scales_, gk::scale), epilogue_, n_)
};

}  // namespace epilogue
