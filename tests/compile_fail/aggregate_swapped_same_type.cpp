// An aggregate whose fields of the *same* type GRAPHKEEP_AGGREGATE lists
// swapped: the types match field by field, but the names and roles would land
// on the wrong fields (a reload would zero the scales and copy into the lock
// counters). The offset order check catches it.
#include <graphkeep/registry.h>

namespace nvfp4 {

struct Nvfp4MoeBuffers {
  at::Tensor input_global_scale;  // declared first
  at::Tensor locks;               // declared second
};

#ifdef GK_BREAK
GRAPHKEEP_AGGREGATE(Nvfp4MoeBuffers, (locks, gk::workspace(gk::Init::zero)),
                    (input_global_scale, gk::scale));
#else
GRAPHKEEP_AGGREGATE(Nvfp4MoeBuffers, (input_global_scale, gk::scale),
                    (locks, gk::workspace(gk::Init::zero)));
#endif

}  // namespace nvfp4
