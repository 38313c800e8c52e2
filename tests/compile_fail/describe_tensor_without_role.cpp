// A class described with GRAPHKEEP_DESCRIBE that lists an at::Tensor member
// bare, without a role.
#include <graphkeep/registry.h>

#include <cstdint>
#include <utility>

namespace marlin {

class MarlinKernel {
 public:
  MarlinKernel(at::Tensor workspace, int64_t size_n, int64_t size_k)
      : workspace_(std::move(workspace)), size_n_(size_n), size_k_(size_k) {}

 private:
  at::Tensor workspace_;  // split-K lock counters, read and written by the kernel
  at::Tensor g_idx_sort_indices_;
  int64_t size_n_ = 0;
  int64_t size_k_ = 0;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(MarlinKernel, workspace_, (g_idx_sort_indices_, gk::permutation), size_n_,
                     size_k_)
#else
  GRAPHKEEP_DESCRIBE(MarlinKernel, (workspace_, gk::workspace(gk::Init::zero)),
                     (g_idx_sort_indices_, gk::permutation), size_n_, size_k_)
#endif
};

}  // namespace marlin
