// A member whose type is a struct that holds tensors but is not registered:
// its tensors would get no role and no path.
#include <graphkeep/registry.h>

#include <cstdint>

namespace moe_align {

struct SortedTokenBuffers {  // not registered
  at::Tensor sorted_token_ids;
  at::Tensor expert_ids;
  at::Tensor num_tokens_post_pad;
  int64_t block_m = 64;
};
#ifndef GK_BREAK
GRAPHKEEP_AGGREGATE(SortedTokenBuffers, (sorted_token_ids, gk::scratch), (expert_ids, gk::scratch),
                    (num_tokens_post_pad, gk::scratch), block_m);
#endif

class MoeAlignKernel {
 public:
  explicit MoeAlignKernel(int64_t num_experts) : num_experts_(num_experts) {}

 private:
  SortedTokenBuffers buffers_;
  int64_t num_experts_ = 0;

  GRAPHKEEP_DESCRIBE(MoeAlignKernel, buffers_, num_experts_)
};

}  // namespace moe_align
