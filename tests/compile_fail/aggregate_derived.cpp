// GRAPHKEEP_AGGREGATE on a struct that derives from a registered base:
// Boost.PFR cannot reflect inherited fields (its own diagnostic, "Inherited
// types are not supported", comes with a dozen more errors and names no
// field). graphkeep's check comes first and gives the fix. Without GK_BREAK
// the base is held as a field and listed, which is one of the two fixes.
#include <graphkeep/registry.h>

#include <cstdint>

namespace fp8_moe {

struct ExpertScales {
  gk::Scale w13_scale;
  gk::Scale w2_scale;
};
GRAPHKEEP_AGGREGATE(ExpertScales, w13_scale, w2_scale);

#ifdef GK_BREAK
struct MoeScales : ExpertScales {
  gk::Scale input_scale;
  int64_t num_experts = 0;
};
GRAPHKEEP_AGGREGATE(MoeScales, input_scale, num_experts);
#else
struct MoeScales {
  ExpertScales experts;
  gk::Scale input_scale;
  int64_t num_experts = 0;
};
GRAPHKEEP_AGGREGATE(MoeScales, experts, input_scale, num_experts);
#endif

}  // namespace fp8_moe
