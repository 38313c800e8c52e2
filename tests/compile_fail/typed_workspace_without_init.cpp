// A typed workspace slot without an init policy (gk::TensorSlot with the
// default Init::unspecified) in an aggregate.
#include <graphkeep/registry.h>

#include <cstdint>

namespace cutlass_moe {

struct GroupedGemmBuffers {
  gk::Metadata problem_sizes1;
  gk::Metadata expert_offsets;
#ifdef GK_BREAK
  gk::TensorSlot<gk::Role::workspace> tile_counters;
#else
  gk::Workspace<gk::Init::zero> tile_counters;
#endif
  int64_t num_experts = 0;
};
GRAPHKEEP_AGGREGATE(GroupedGemmBuffers, problem_sizes1, expert_offsets, tile_counters, num_experts);

}  // namespace cutlass_moe
