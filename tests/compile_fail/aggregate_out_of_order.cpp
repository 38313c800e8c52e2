// An aggregate whose fields GRAPHKEEP_AGGREGATE lists out of declaration
// order (fields of different types: the PFR field type check).
#include <graphkeep/registry.h>

#include <cstdint>

namespace machete {

struct W4A8GroupScales {
  int64_t group_size = 128;
  gk::Scale group_scales;
  gk::Metadata group_zeros;
};

#ifdef GK_BREAK
GRAPHKEEP_AGGREGATE(W4A8GroupScales, group_scales, group_size, group_zeros);
#else
GRAPHKEEP_AGGREGATE(W4A8GroupScales, group_size, group_scales, group_zeros);
#endif

}  // namespace machete
