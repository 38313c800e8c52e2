#include "site_harness.h"

#include <graphkeep/runtime/host_stream.h>
#include <graphkeep/runtime/device.h>

namespace sites {

at::Tensor slice(const at::Tensor& x, int64_t dim, int64_t start, int64_t len) {
  if (x.is_cuda()) return x.narrow(dim, start, len).contiguous();
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes[dim] = len;
  at::Tensor y = gk::runtime::empty(sizes, x.options());
  gk::hostrt::launch_aten("slice", {x}, {y}, [dim, start, len](auto& in, auto& out) {
    out[0].copy_(in[0].narrow(dim, start, len));
  });
  return y;
}

void sync(c10::Device device) { gk::runtime::synchronize(device); }

}  // namespace sites
