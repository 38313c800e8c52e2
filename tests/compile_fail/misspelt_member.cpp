// A descriptor that lists a name the class does not have (a typo, or a member
// renamed later). The first error names the class and the misspelt member at
// the descriptor's line, and the checks that need the member's type, offset
// or size are not instantiated, so no score of follow-up errors buries it.
#include <graphkeep/registry.h>

#include <cstdint>
#include <utility>

namespace marlin {

class MarlinKernel {
 public:
  MarlinKernel(at::Tensor workspace, int64_t size_n, int64_t size_k)
      : workspace_(std::move(workspace)), size_n_(size_n), size_k_(size_k) {}

 private:
  at::Tensor workspace_;  // split-K lock counters
  at::Tensor g_idx_sort_indices_;
  int64_t size_n_ = 0;
  int64_t size_k_ = 0;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(MarlinKernel, (workspace_, gk::workspace(gk::Init::zero)),
                     (g_idx_sort_indices_, gk::permutation), sizen_, size_k_)
#else
  GRAPHKEEP_DESCRIBE(MarlinKernel, (workspace_, gk::workspace(gk::Init::zero)),
                     (g_idx_sort_indices_, gk::permutation), size_n_, size_k_)
#endif
};

}  // namespace marlin
