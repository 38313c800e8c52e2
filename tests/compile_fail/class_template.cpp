// A class template described with GRAPHKEEP_DESCRIBE: its checks run when a
// specialization is used by the registry (here through gk::slot_table).
#include <graphkeep/registry.h>

#include <cstdint>

namespace marlin {

template <int NumBits>
class MarlinMoeKernel {
 public:
  MarlinMoeKernel() = default;

 private:
  at::Tensor workspace_;
  at::Tensor sorted_token_ids_;
  int64_t num_experts_ = 0;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(MarlinMoeKernel, (workspace_, gk::workspace(gk::Init::zero)), sorted_token_ids_,
                     num_experts_)
#else
  GRAPHKEEP_DESCRIBE(MarlinMoeKernel, (workspace_, gk::workspace(gk::Init::zero)),
                     (sorted_token_ids_, gk::scratch), num_experts_)
#endif
};

static_assert(gk::slot_table<MarlinMoeKernel<4>>().size() == 2);

}  // namespace marlin
