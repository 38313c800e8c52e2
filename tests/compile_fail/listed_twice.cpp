// A member listed twice in GRAPHKEEP_DESCRIBE.
#include <graphkeep/registry.h>

#include <cstdint>

namespace allspark {

class AllSparkW8A16Kernel {
 public:
  AllSparkW8A16Kernel() = default;

 private:
  at::Tensor workspace_;
  at::Tensor weight_scale_;
  int64_t sm_count_ = 0;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(AllSparkW8A16Kernel, (workspace_, gk::workspace(gk::Init::zero)),
                     (weight_scale_, gk::scale), (workspace_, gk::scratch), sm_count_)
#else
  GRAPHKEEP_DESCRIBE(AllSparkW8A16Kernel, (workspace_, gk::workspace(gk::Init::zero)),
                     (weight_scale_, gk::scale), sm_count_)
#endif
};

}  // namespace allspark
