// GRAPHKEEP_AGGREGATE on a struct that is not an aggregate (it has a
// constructor): it must be described with GRAPHKEEP_DESCRIBE.
#include <graphkeep/registry.h>

#include <cstdint>
#include <utility>

namespace awq {

struct AwqScales {
#ifdef GK_BREAK
  explicit AwqScales(at::Tensor s) : scales(std::move(s)) {}
#endif
  gk::Scale scales;
  gk::Metadata qzeros;
  int64_t group_size = 128;
};
GRAPHKEEP_AGGREGATE(AwqScales, scales, qzeros, group_size);

}  // namespace awq
