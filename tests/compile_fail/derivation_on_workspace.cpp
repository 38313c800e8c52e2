// A derivation declared on a member that is not derived: a lock workspace
// holds no function of the checkpoint, so a patch could not skip its PWAL
// on the strength of it (Note [Declared derivations] in role.h).
#include <graphkeep/registry.h>

#include <cstdint>

namespace gptq {

class GptqMarlinKernel {
 public:
  GptqMarlinKernel() = default;

 private:
  at::Tensor workspace_;
  at::Tensor g_idx_;
  int64_t num_bits_ = 4;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(GptqMarlinKernel, (workspace_, gk::workspace(gk::Init::zero).from_shapes()),
                     (g_idx_, gk::metadata.from_shapes()), num_bits_)
#else
  GRAPHKEEP_DESCRIBE(GptqMarlinKernel, (workspace_, gk::workspace(gk::Init::zero)),
                     (g_idx_, gk::metadata.from_shapes()), num_bits_)
#endif
};

}  // namespace gptq
