// A std::vector<at::Tensor> member listed bare: like a bare at::Tensor it
// needs a role, and the message says what the member is (a container's
// tensors share the role given to the member).
#include <graphkeep/registry.h>

#include <cstdint>
#include <vector>

namespace cutlass_moe {

class CutlassBlockScaledMoe {
 public:
  explicit CutlassBlockScaledMoe(int64_t num_experts) : num_experts_(num_experts) {}

 private:
  at::Tensor problem_sizes_;
  std::vector<at::Tensor> per_expert_scales_;  // one block-scale tensor per local expert
  int64_t num_experts_ = 0;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(CutlassBlockScaledMoe, (problem_sizes_, gk::metadata), per_expert_scales_,
                     num_experts_)
#else
  GRAPHKEEP_DESCRIBE(CutlassBlockScaledMoe, (problem_sizes_, gk::metadata),
                     (per_expert_scales_, gk::scale), num_experts_)
#endif
};

}  // namespace cutlass_moe
