// A derived class whose base is not registered: the base's tensors would be
// invisible.
#include <graphkeep/registry.h>

#include <cstdint>

namespace moe {

class FusedMoeMethodBase {
 public:
  virtual ~FusedMoeMethodBase() = default;

 protected:
  at::Tensor w13_weight_scale_;
  at::Tensor w2_weight_scale_;
#ifndef GK_BREAK
  GRAPHKEEP_DESCRIBE(FusedMoeMethodBase, (w13_weight_scale_, gk::scale), (w2_weight_scale_, gk::scale))
#endif
};

class TritonMoeMethod : public FusedMoeMethodBase {
 public:
  TritonMoeMethod() = default;

 private:
  int64_t block_m_ = 64;
  GRAPHKEEP_DESCRIBE_DERIVED(TritonMoeMethod, (FusedMoeMethodBase), block_m_)
};

}  // namespace moe
