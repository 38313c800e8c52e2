// graphkeep/delta/detail/device_upload.h: host rows (kernel job tables,
// offsets) handed to a device without waiting for it. Internal: shared by the
// delta layer and the reload engine's patch path.
//
//   std::vector<cuda::DiffTask> tasks = ...;
//   const at::Tensor t = gk::detail::upload_rows(tasks, device);  // bytes on `device`
//   launch(reinterpret_cast<const cuda::DiffTask*>(t.const_data_ptr()), ...);
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace gk::detail {

// `rows` as a 1-D byte tensor on `device`. On a CUDA device the copy goes
// through pinned memory and does not wait (a copy from pageable memory
// synchronizes the stream; the caching host allocator keeps the pinned block
// until the copy has run); on the CPU it is the host tensor itself.
template <class Row>
at::Tensor upload_rows(const std::vector<Row>& rows, c10::Device device) {
  static_assert(std::is_trivially_copyable_v<Row>, "upload_rows copies rows as bytes");
  const auto bytes = static_cast<std::int64_t>(rows.size() * sizeof(Row));
  at::Tensor host = at::empty({bytes}, at::TensorOptions(at::kByte).pinned_memory(device.is_cuda()));
  if (bytes > 0) std::memcpy(host.data_ptr(), rows.data(), static_cast<std::size_t>(bytes));
  if (device.is_cpu()) return host;
  return host.to(device, /*non_blocking=*/true);
}

}  // namespace gk::detail
