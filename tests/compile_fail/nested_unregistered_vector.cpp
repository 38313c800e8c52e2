// A std::vector of an unregistered struct that holds tensors: containers are
// looked through, so the element type must be registered.
#include <graphkeep/registry.h>

#include <cstdint>
#include <vector>

namespace lora {

struct LoraAdapterWeights {  // not registered
  at::Tensor lora_a;
  at::Tensor lora_b;
  float scaling = 1.0f;
};
#ifndef GK_BREAK
GRAPHKEEP_AGGREGATE(LoraAdapterWeights, (lora_a, gk::parameter), (lora_b, gk::parameter), scaling);
#endif

class PunicaLoraKernel {
 public:
  explicit PunicaLoraKernel(int64_t max_loras) : max_loras_(max_loras) {}

 private:
  std::vector<LoraAdapterWeights> adapters_;
  int64_t max_loras_ = 0;

  GRAPHKEEP_DESCRIBE(PunicaLoraKernel, adapters_, max_loras_)
};

}  // namespace lora
