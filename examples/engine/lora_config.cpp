// The configuration of a LoRA adapter (lora_config.h).
#include "lora_config.h"

#include <algorithm>
#include <cmath>

namespace demo {

double LoraConfig::scale() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

bool LoraConfig::targets_module(std::string_view projection) const {
  return std::find(targets.begin(), targets.end(), projection) != targets.end();
}

}  // namespace demo
