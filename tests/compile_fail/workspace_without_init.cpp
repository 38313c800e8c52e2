// gk::workspace written without an init policy: a reload must know whether
// to zero the lock counters, keep them, or copy the new value.
#include <graphkeep/registry.h>

#include <cstdint>

namespace gptq {

class GptqMarlin24Kernel {
 public:
  GptqMarlin24Kernel() = default;

 private:
  at::Tensor workspace_;
  at::Tensor meta_;
  int64_t num_bits_ = 4;

#ifdef GK_BREAK
  GRAPHKEEP_DESCRIBE(GptqMarlin24Kernel, (workspace_, gk::workspace), (meta_, gk::metadata), num_bits_)
#else
  GRAPHKEEP_DESCRIBE(GptqMarlin24Kernel, (workspace_, gk::workspace(gk::Init::zero)),
                     (meta_, gk::metadata), num_bits_)
#endif
};

}  // namespace gptq
