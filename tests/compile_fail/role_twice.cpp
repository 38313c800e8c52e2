// A field whose type carries a role (gk::Scale) and that the descriptor gives
// a role too.
#include <graphkeep/registry.h>

namespace fp8 {

struct Fp8LinearScales {
  gk::Scale weight_scale;
  gk::Scale input_scale;
  at::Tensor azp_adj;
};

#ifdef GK_BREAK
GRAPHKEEP_AGGREGATE(Fp8LinearScales, weight_scale, (input_scale, gk::scale), (azp_adj, gk::derived_weight));
#else
GRAPHKEEP_AGGREGATE(Fp8LinearScales, weight_scale, input_scale, (azp_adj, gk::derived_weight));
#endif

}  // namespace fp8
