// An aggregate with a field that GRAPHKEEP_AGGREGATE does not list: Boost.PFR
// counts the fields.
#include <graphkeep/registry.h>

#include <cstdint>

namespace cutlass_moe {

struct CutlassMoeStrides {
  gk::Metadata ab_strides1;
  gk::Metadata c_strides1;
  gk::Metadata ab_strides2;
  gk::Metadata c_strides2;
  int64_t num_experts = 0;
};

#ifdef GK_BREAK
GRAPHKEEP_AGGREGATE(CutlassMoeStrides, ab_strides1, c_strides1, c_strides2, num_experts);
#else
GRAPHKEEP_AGGREGATE(CutlassMoeStrides, ab_strides1, c_strides1, ab_strides2, c_strides2, num_experts);
#endif

}  // namespace cutlass_moe
