// An aggregate registered with GRAPHKEEP_AGGREGATE whose at::Tensor field has
// neither a typed role (gk::Metadata, ...) nor a role in the macro.
#include <graphkeep/registry.h>

#include <cstdint>

namespace cutlass_moe {

struct CutlassMoeStrides {
  gk::Metadata ab_strides1;  // role in the type
  at::Tensor c_strides1;     // plain tensor: needs a role in the macro
  int64_t num_experts = 0;
};

#ifdef GK_BREAK
GRAPHKEEP_AGGREGATE(CutlassMoeStrides, ab_strides1, c_strides1, num_experts);
#else
GRAPHKEEP_AGGREGATE(CutlassMoeStrides, ab_strides1, (c_strides1, gk::metadata), num_experts);
#endif

}  // namespace cutlass_moe
