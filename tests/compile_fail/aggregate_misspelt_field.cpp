// An aggregate whose GRAPHKEEP_AGGREGATE lists a name that is not one of its
// fields (a typo, or a field renamed later). Boost.PFR reflects the fields by
// position, so the names come only from the macro: the one error names the
// struct and the misspelt field at the macro's line, and none of the checks
// that need the field's type, offset or role is instantiated.
#include <graphkeep/registry.h>

#include <cstdint>

namespace machete {

struct W4A8GroupScales {
  int64_t group_size = 128;
  gk::Scale group_scales;
  gk::Metadata group_zeros;
};

#ifdef GK_BREAK
GRAPHKEEP_AGGREGATE(W4A8GroupScales, group_size, group_scale, group_zeros);
#else
GRAPHKEEP_AGGREGATE(W4A8GroupScales, group_size, group_scales, group_zeros);
#endif

}  // namespace machete
