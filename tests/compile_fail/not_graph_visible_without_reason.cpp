// gk::not_graph_visible written without a reason.
#include <graphkeep/registry.h>

#include <cstdint>

namespace fp8 {

class Fp8DynamicQuant {
 public:
  Fp8DynamicQuant() = default;

 private:
  at::Tensor scale_ub_;
  at::Tensor host_amax_history_;  // CPU tensor for logging
  int64_t history_len_ = 16;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(Fp8DynamicQuant, (scale_ub_, gk::scale),
                     (host_amax_history_, gk::not_graph_visible), history_len_)
#else
  GRAPHKEEP_DESCRIBE(Fp8DynamicQuant, (scale_ub_, gk::scale),
                     (host_amax_history_, gk::not_graph_visible("CPU copy, read by the logger only")),
                     history_len_)
#endif
};

}  // namespace fp8
